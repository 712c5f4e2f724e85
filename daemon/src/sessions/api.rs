//! The session API handlers: StartSession, StopSession, GetSession and ListSessions.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuprof_proto::api as pb;
use rusqlite::params;
use tokio::sync::oneshot;

use super::spec::{Collect, TargetSpec};
use super::state::{Live, STOP_FLUSH_TIMEOUT, State};
use super::store::{fill_counts_from, list_page, load};
use super::supervisor::{Supervisor, activate, begin_stop};
use crate::access::{Caller, process_uid};
use crate::clock::now_ns;
use crate::error::{ApiError, ApiResult};
use crate::ingest::WriterHandle;
use crate::rollup::Rollup;

/// What the session handlers use: the transitions' parts (the sessions, the connected agents,
/// the record counts, PM and PC sampling), the writer that inserts sessions and flushes before a
/// read, the database read for ended sessions, the rollup brought up to date before counting,
/// and the admin group named in a refusal.
#[derive(Clone, Copy)]
pub(crate) struct Handlers<'a> {
    pub supervisor: Supervisor<'a>,
    pub writer: &'a WriterHandle,
    pub db_path: &'a Path,
    pub rollup: &'a Rollup,
    pub admin_group: &'a str,
}

/// Open sessions at most (pending, active or stopping).
const MAX_OPEN_SESSIONS: usize = 1024;
/// Longest accepted session name.
const MAX_NAME: usize = 256;
/// The furthest future start time accepted.
const MAX_START_DELAY_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// StartSession.
pub(crate) async fn start(d: Handlers<'_>, caller: &Caller, req: pb::StartSessionRequest) -> ApiResult<pb::Session> {
    create(d, caller, req, false).await
}

/// Creates a session; `node`: the node's always-on PC profile ([`super::node`]), known as such
/// before any process joins it.
pub(super) async fn create(
    d: Handlers<'_>,
    caller: &Caller,
    req: pb::StartSessionRequest,
    node: bool,
) -> ApiResult<pb::Session> {
    caller.require_authenticated()?;
    if req.name.chars().count() > MAX_NAME {
        return Err(ApiError::invalid("name", format!("longer than {MAX_NAME} characters")));
    }
    if req.targets.is_empty() {
        return Err(ApiError::invalid(
            "targets",
            "at least one target is needed: a pid, exe_name, exe_pattern, cgroup, or all",
        ));
    }
    let targets = req.targets.iter().map(TargetSpec::from_pb).collect::<ApiResult<Vec<_>>>()?;
    let collect = Collect::from_pb(req.collect.as_ref())?;
    if collect.pm_sampling_rate_hz > 0 {
        // CUPTI PM sampling takes the GPUs' performance monitors from everyone else.
        crate::access::require_operator(caller, "start CUPTI PM sampling with a session")?;
        super::pm::check(d.supervisor.pm)?;
    }
    let now = now_ns();
    if req.start_at_ns > now.saturating_add(MAX_START_DELAY_NS) {
        return Err(ApiError::invalid("start_at_ns", "more than 30 days ahead (it is ns since the Unix epoch)"));
    }
    let own_only = !caller.admin;
    // Pid targets: the process must exist, be the caller's (unless admin) and be free.
    for t in &targets {
        let TargetSpec::Pid(pid) = t else { continue };
        let agents: Vec<_> =
            d.supervisor.registry.all().into_iter().filter(|a| a.pid == *pid && a.kind == "injector").collect();
        let owner = match agents.first() {
            Some(a) => Some(a.uid),
            None => process_uid(*pid),
        };
        let Some(owner) = owner else {
            return Err(ApiError::NotFound(format!("no process with pid {pid} on this host")));
        };
        if !caller.may_access(owner) {
            return Err(caller.denied(&format!("process {pid}"), owner, d.admin_group));
        }
        for a in &agents {
            // The always-on profile yields its processes to any other session.
            if let Some(s) = d.supervisor.sessions.session_of(a.id).filter(|s| *s != d.supervisor.sessions.node()) {
                return Err(ApiError::FailedPrecondition(format!(
                    "process {pid} is already traced by session {s}; stop it first (gpuprofctl session stop {s})"
                )));
            }
        }
    }
    if d.supervisor.sessions.open_count() >= MAX_OPEN_SESSIONS {
        return Err(ApiError::ResourceExhausted(format!(
            "{MAX_OPEN_SESSIONS} sessions are open; stop some before starting more"
        )));
    }

    let pending = req.start_at_ns > now;
    let state = if pending { State::Pending } else { State::Active };
    let targets_json = serde_json::to_string(&targets).map_err(|e| ApiError::Internal(e.to_string()))?;
    let collect_json = serde_json::to_string(&collect).map_err(|e| ApiError::Internal(e.to_string()))?;
    let (name, owner, start_at, dur, max) =
        (req.name.clone(), caller.uid, req.start_at_ns, req.duration_ms, req.max_records);
    let id = d
        .writer
        .call(move |c| -> rusqlite::Result<u64> {
            c.execute(
                "INSERT INTO sessions(name, state, targets, collect, owner_uid, created_ns, start_at_ns, started_ns,
                                      duration_ms, max_records, stop_reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, '')",
                params![
                    name,
                    state.as_str(),
                    targets_json,
                    collect_json,
                    owner,
                    now as i64,
                    start_at as i64,
                    if pending { None } else { Some(now as i64) },
                    dur as i64,
                    max as i64
                ],
            )?;
            Ok(c.last_insert_rowid() as u64)
        })
        .await??;

    let start_deadline = pending.then(|| Instant::now() + Duration::from_nanos(req.start_at_ns - now));
    let live = Live {
        id,
        name: req.name,
        state,
        targets,
        collect,
        owner_uid: caller.uid,
        own_only,
        created_ns: now,
        start_at_ns: req.start_at_ns,
        started_ns: if pending { 0 } else { now },
        stopped_ns: 0,
        duration_ms: req.duration_ms,
        max_records: req.max_records,
        procs: BTreeMap::new(),
        start_deadline,
        stop_deadline: None,
        flush_deadline: None,
        flush_from: None,
        stop_reason: String::new(),
        waiters: Vec::new(),
    };
    d.supervisor.session_records.entry(id).or_default();
    let s = d.supervisor.sessions;
    if node {
        s.node.store(id, std::sync::atomic::Ordering::Relaxed);
    }
    let out = {
        let mut g = s.lock();
        g.open.insert(id, live);
        if !pending {
            activate(d.supervisor, &mut g, id, now);
        }
        g.open.get(&id).map(Live::to_pb)
    };
    s.wake.notify_one();
    tracing::info!(session = id, owner = caller.uid, pending, "session started");
    let out = out.ok_or_else(|| ApiError::Internal(format!("session {id} vanished while starting")))?;
    Ok(fill_counts(d, out).await)
}

/// StopSession: stops a pending or active session and waits (bounded) until it is completed.
pub(crate) async fn stop(d: Handlers<'_>, caller: &Caller, id: u64) -> ApiResult<pb::Session> {
    let rx = {
        let mut g = d.supervisor.sessions.lock();
        // An ended session stays in memory until its rows are written: not running either.
        match g.open.get(&id).filter(|l| l.state.is_open()) {
            Some(l) if !caller.may_access(l.owner_uid) => {
                return Err(caller.denied(&format!("session {id}"), l.owner_uid, d.admin_group));
            }
            Some(_) => {
                let (tx, rx) = oneshot::channel();
                begin_stop(d.supervisor, &mut g, id, "stopped by user");
                if let Some(l) = g.open.get_mut(&id) {
                    l.waiters.push(tx);
                }
                Some(rx)
            }
            None => None,
        }
    };
    match rx {
        Some(rx) => {
            d.supervisor.sessions.wake.notify_one();
            let _ = tokio::time::timeout(STOP_FLUSH_TIMEOUT + Duration::from_secs(2), rx).await;
            // Records a process sent before reporting idle are queued ahead of this flush: once
            // it returns they are committed, so the caller's next query sees all of them.
            let _ = d.writer.flush().await;
            get(d, caller, id).await
        }
        None => {
            // Not open: either finished (stopping it again is an error) or unknown.
            let s = get(d, caller, id).await?;
            let state = pb::SessionState::try_from(s.state).unwrap_or_default().as_str_name();
            Err(ApiError::FailedPrecondition(format!(
                "session {id} is not running (state {}); nothing to stop",
                state.trim_start_matches("SESSION_STATE_").to_lowercase()
            )))
        }
    }
}

/// GetSession.
pub(crate) async fn get(d: Handlers<'_>, caller: &Caller, id: u64) -> ApiResult<pb::Session> {
    if id == 0 {
        return Err(ApiError::invalid("session_id", "session ids start at 1"));
    }
    let live = d.supervisor.sessions.lock().open.get(&id).map(|l| (l.owner_uid, l.state.is_open(), l.to_pb()));
    let s = match live {
        Some((owner, open, s)) => {
            if !caller.may_access(owner) {
                return Err(caller.denied(&format!("session {id}"), owner, d.admin_group));
            }
            if !open {
                // Ended but not yet written: the records its processes sent before they
                // reported idle may still be queued for the writer. Counted once committed.
                let _ = d.writer.flush().await;
            }
            s
        }
        None => {
            let path = d.db_path.to_path_buf();
            let row = tokio::task::spawn_blocking(move || -> ApiResult<Option<pb::Session>> {
                let c = crate::store::open_reader(&path)?;
                Ok(load(&c, id)?)
            })
            .await??;
            let Some(s) = row else {
                return Err(ApiError::NotFound(format!(
                    "no session {id} (gpuprofctl session list shows the sessions)"
                )));
            };
            if !caller.may_access(s.owner_uid) {
                return Err(caller.denied(&format!("session {id}"), s.owner_uid, d.admin_group));
            }
            s
        }
    };
    Ok(fill_counts(d, s).await)
}

/// Adds record and drop counts (from the database) to a session.
async fn fill_counts(d: Handlers<'_>, s: pb::Session) -> pb::Session {
    let fallback = s.clone();
    fill_counts_all(d, vec![s]).await.pop().unwrap_or(fallback)
}

/// Adds record and drop counts to sessions after one rollup pass, on one read connection.
async fn fill_counts_all(d: Handlers<'_>, sessions: Vec<pb::Session>) -> Vec<pb::Session> {
    if let Err(e) = d.rollup.catch_up().await {
        tracing::warn!(error = %e, "rollup pass failed");
    }
    let path = d.db_path.to_path_buf();
    let original = sessions.clone();
    let mut sessions = sessions;
    let r = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<pb::Session>> {
        let c = crate::store::open_reader(&path)?;
        fill_counts_from(&c, &mut sessions)?;
        Ok(sessions)
    })
    .await;
    match r {
        Ok(Ok(mut v)) => {
            // Open sessions: PC sampling as it is now.
            for s in &mut v {
                if pb::SessionState::try_from(s.state).ok().and_then(State::from_pb).is_some_and(State::is_open) {
                    super::pc::overlay(d.supervisor.pc, s);
                }
            }
            v
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot count session records");
            original
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot count session records");
            original
        }
    }
}

/// ListSessions: newest first, filtered, paged by id.
pub(crate) async fn list(
    d: Handlers<'_>,
    caller: &Caller,
    req: pb::ListSessionsRequest,
) -> ApiResult<pb::ListSessionsResponse> {
    let page = match req.page_size {
        0 => 50,
        n if n > 1000 => return Err(ApiError::invalid("page_size", format!("{n} is above the maximum of 1000"))),
        n => n as i64,
    };
    let before: i64 =
        if req.page_token.is_empty() {
            i64::MAX
        } else {
            req.page_token.parse::<i64>().ok().filter(|t| *t > 0).ok_or_else(|| {
                ApiError::invalid("page_token", "not a token from ListSessionsResponse.next_page_token")
            })?
        };
    let mut states = Vec::new();
    for s in &req.states {
        let st = pb::SessionState::try_from(*s)
            .ok()
            .and_then(State::from_pb)
            .ok_or_else(|| ApiError::invalid("states", format!("{s} is not a session state")))?;
        states.push(st.as_str());
    }
    let owner: Option<u32> = if caller.admin { None } else { Some(caller.uid) };
    if !caller.authenticated {
        return Ok(pb::ListSessionsResponse::default());
    }
    let path = d.db_path.to_path_buf();
    let name = req.name_contains.clone();
    let (mut sessions, more) = tokio::task::spawn_blocking(move || -> ApiResult<(Vec<pb::Session>, bool)> {
        let c = crate::store::open_reader(&path)?;
        list_page(&c, before, owner, &name, &states, page)
    })
    .await??;
    // Open sessions: the in-memory state is the freshest.
    let ended_unwritten = {
        let g = d.supervisor.sessions.lock();
        let mut ended = false;
        for s in &mut sessions {
            if let Some(l) = g.open.get(&s.id) {
                *s = l.to_pb();
                ended |= !l.state.is_open();
            }
        }
        ended
    };
    if ended_unwritten {
        // As in GetSession: their last records may still be queued for the writer.
        let _ = d.writer.flush().await;
    }
    let next = if more { sessions.last().map(|s| s.id.to_string()).unwrap_or_default() } else { String::new() };
    Ok(pb::ListSessionsResponse { sessions: fill_counts_all(d, sessions).await, next_page_token: next })
}

#[cfg(test)]
pub(super) mod tests {
    use dashmap::DashMap;

    use super::*;
    use crate::arbiter::Arbiter;
    use crate::ingest::TestWriter;
    use crate::pcsamp::PcHub;
    use crate::registry::Registry;
    use crate::sessions::Sessions;
    use crate::sessions::pc::Pc;
    use crate::sessions::pm::Pm;

    /// The handlers' parts, owned, on a fresh database: no daemon.
    pub(in crate::sessions) struct Parts {
        _dir: tempfile::TempDir,
        db: std::path::PathBuf,
        cfg: crate::config::Config,
        arbiter: std::sync::Arc<Arbiter>,
        writer: TestWriter,
        pub sessions: Sessions,
        hub: PcHub,
        registry: Registry,
        records: DashMap<u64, std::sync::atomic::AtomicU64>,
        rollup: Rollup,
        persister: tokio::task::JoinHandle<()>,
    }

    impl Parts {
        pub(in crate::sessions) fn new() -> Parts {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = crate::config::Config::from_toml("").unwrap();
            cfg.agent_socket = dir.path().join("agent.sock");
            let db = dir.path().join("t.db");
            let conn = crate::store::open_writer(&db, &cfg.storage).unwrap();
            let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
            let writer = TestWriter::start(conn, &cfg.ingest);
            let (sessions, persister) = Sessions::new(writer.handle.clone());
            let hub = PcHub::new(16, crate::pcsamp::sched::SchedConfig::from_config(&cfg.pc));
            let rollup = Rollup::new(db.clone(), writer.handle.clone());
            let persister = tokio::spawn(persister);
            let records = DashMap::new();
            let registry = Registry::default();
            Parts { _dir: dir, db, cfg, arbiter, writer, sessions, hub, registry, records, rollup, persister }
        }

        pub(in crate::sessions) fn handlers(&self) -> Handlers<'_> {
            let pc = Pc {
                settings: &self.cfg.pc,
                busy_retry: self.cfg.sampler.pc_busy_retry.0,
                hub: &self.hub,
                arbiter: &self.arbiter,
                found: &[],
                registry: &self.registry,
                sessions: &self.sessions,
            };
            Handlers {
                supervisor: Supervisor {
                    sessions: &self.sessions,
                    registry: &self.registry,
                    session_records: &self.records,
                    agent: &self.cfg.agent,
                    agent_socket: &self.cfg.agent_socket,
                    pm: Pm { sampler: &self.cfg.sampler, arbiter: &self.arbiter },
                    pc,
                },
                writer: &self.writer.handle,
                db_path: &self.db,
                rollup: &self.rollup,
                admin_group: &self.cfg.api.admin_group,
            }
        }

        pub(in crate::sessions) async fn stop(self) {
            self.sessions.persisted().await;
            drop(self.sessions);
            self.persister.await.unwrap();
            self.writer.stop().await;
        }
    }

    fn all(name: &str) -> pb::StartSessionRequest {
        pb::StartSessionRequest {
            name: name.into(),
            targets: vec![pb::Target { target: Some(pb::target::Target::All(true)) }],
            ..Default::default()
        }
    }

    /// Built from their parts, no daemon: a session without targets is refused; one started
    /// is active, read back and listed; another user may not read it; stopped, it has ended
    /// and a second stop says it is not running.
    #[tokio::test]
    async fn session_handlers_without_a_daemon() {
        let p = Parts::new();
        let h = p.handlers();
        let root = Caller::root();
        let e = start(h, &root, pb::StartSessionRequest::default()).await.unwrap_err();
        assert!(e.to_string().contains("at least one target"), "{e}");

        let s = start(h, &root, all("first")).await.unwrap();
        assert_eq!(s.state, pb::SessionState::Active as i32);
        assert!(p.sessions.is_open(s.id));
        let got = get(h, &root, s.id).await.unwrap();
        assert_eq!((got.name.as_str(), got.state), ("first", pb::SessionState::Active as i32));
        let listed = list(h, &root, pb::ListSessionsRequest::default()).await.unwrap();
        assert_eq!(listed.sessions.iter().map(|x| x.id).collect::<Vec<_>>(), [s.id]);
        let user = Caller { uid: 1000, gid: 1000, pid: None, admin: false, authenticated: true };
        assert!(get(h, &user, s.id).await.is_err());
        assert!(list(h, &user, pb::ListSessionsRequest::default()).await.unwrap().sessions.is_empty());

        let stopped = stop(h, &root, s.id).await.unwrap();
        assert!(!p.sessions.is_open(s.id));
        let state = pb::SessionState::try_from(stopped.state).ok().and_then(State::from_pb);
        assert!(state.is_some_and(|st| !st.is_open()), "{state:?}");
        let e = stop(h, &root, s.id).await.unwrap_err();
        assert!(e.to_string().contains("is not running"), "{e}");
        let e = get(h, &root, 99).await.unwrap_err();
        assert!(e.to_string().contains("no session 99"), "{e}");
        p.stop().await;
    }
}
