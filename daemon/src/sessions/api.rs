//! The session API handlers: StartSession, StopSession, GetSession and ListSessions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuprof_proto::api as pb;
use rusqlite::params;
use tokio::sync::oneshot;

use super::spec::{Collect, TargetSpec};
use super::state::{Live, STOP_FLUSH_TIMEOUT, State};
use super::store::{fill_counts_from, list_page, load};
use super::supervisor::{activate, begin_stop};
use crate::Daemon;
use crate::access::{Caller, process_uid};
use crate::clock::now_ns;
use crate::error::{ApiError, ApiResult};

/// Open sessions at most (pending, active or stopping).
const MAX_OPEN_SESSIONS: usize = 1024;
/// Longest accepted session name.
const MAX_NAME: usize = 256;
/// The furthest future start time accepted.
const MAX_START_DELAY_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// StartSession.
pub async fn start(d: &Daemon, caller: &Caller, req: pb::StartSessionRequest) -> ApiResult<pb::Session> {
    create(d, caller, req, false).await
}

/// Creates a session; `node`: the node's always-on PC profile ([`super::node`]), known as such
/// before any process joins it.
pub(super) async fn create(
    d: &Daemon,
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
        super::pm::check(d.pm())?;
    }
    let now = now_ns();
    if req.start_at_ns > now.saturating_add(MAX_START_DELAY_NS) {
        return Err(ApiError::invalid("start_at_ns", "more than 30 days ahead (it is ns since the Unix epoch)"));
    }
    let own_only = !caller.admin;
    // Pid targets: the process must exist, be the caller's (unless admin) and be free.
    for t in &targets {
        let TargetSpec::Pid(pid) = t else { continue };
        let agents: Vec<_> = d.registry.all().into_iter().filter(|a| a.pid == *pid && a.kind == "injector").collect();
        let owner = match agents.first() {
            Some(a) => Some(a.uid),
            None => process_uid(*pid),
        };
        let Some(owner) = owner else {
            return Err(ApiError::NotFound(format!("no process with pid {pid} on this host")));
        };
        if !caller.may_access(owner) {
            return Err(caller.denied(&format!("process {pid}"), owner, &d.config.api.admin_group));
        }
        for a in &agents {
            // The always-on profile yields its processes to any other session.
            if let Some(s) = d.sessions.session_of(a.id).filter(|s| *s != d.sessions.node()) {
                return Err(ApiError::FailedPrecondition(format!(
                    "process {pid} is already traced by session {s}; stop it first (gpuprofctl session stop {s})"
                )));
            }
        }
    }
    if d.sessions.open_count() >= MAX_OPEN_SESSIONS {
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
    d.session_records.entry(id).or_default();
    let s = &d.sessions;
    if node {
        s.node.store(id, std::sync::atomic::Ordering::Relaxed);
    }
    let out = {
        let mut g = s.lock();
        g.open.insert(id, live);
        if !pending {
            activate(d.session_supervisor(), &mut g, id, now);
        }
        g.open.get(&id).map(Live::to_pb)
    };
    s.wake.notify_one();
    tracing::info!(session = id, owner = caller.uid, pending, "session started");
    let out = out.ok_or_else(|| ApiError::Internal(format!("session {id} vanished while starting")))?;
    Ok(fill_counts(d, out).await)
}

/// StopSession: stops a pending or active session and waits (bounded) until it is completed.
pub async fn stop(d: &Daemon, caller: &Caller, id: u64) -> ApiResult<pb::Session> {
    let rx = {
        let mut g = d.sessions.lock();
        // An ended session stays in memory until its rows are written: not running either.
        match g.open.get(&id).filter(|l| l.state.is_open()) {
            Some(l) if !caller.may_access(l.owner_uid) => {
                return Err(caller.denied(&format!("session {id}"), l.owner_uid, &d.config.api.admin_group));
            }
            Some(_) => {
                let (tx, rx) = oneshot::channel();
                begin_stop(d.session_supervisor(), &mut g, id, "stopped by user");
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
            d.sessions.wake.notify_one();
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
pub async fn get(d: &Daemon, caller: &Caller, id: u64) -> ApiResult<pb::Session> {
    if id == 0 {
        return Err(ApiError::invalid("session_id", "session ids start at 1"));
    }
    let live = d.sessions.lock().open.get(&id).map(|l| (l.owner_uid, l.state.is_open(), l.to_pb()));
    let s = match live {
        Some((owner, open, s)) => {
            if !caller.may_access(owner) {
                return Err(caller.denied(&format!("session {id}"), owner, &d.config.api.admin_group));
            }
            if !open {
                // Ended but not yet written: the records its processes sent before they
                // reported idle may still be queued for the writer. Counted once committed.
                let _ = d.writer.flush().await;
            }
            s
        }
        None => {
            let path = d.db_path.clone();
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
                return Err(caller.denied(&format!("session {id}"), s.owner_uid, &d.config.api.admin_group));
            }
            s
        }
    };
    Ok(fill_counts(d, s).await)
}

/// Adds record and drop counts (from the database) to a session.
async fn fill_counts(d: &Daemon, s: pb::Session) -> pb::Session {
    let fallback = s.clone();
    fill_counts_all(d, vec![s]).await.pop().unwrap_or(fallback)
}

/// Adds record and drop counts to sessions after one rollup pass, on one read connection.
async fn fill_counts_all(d: &Daemon, sessions: Vec<pb::Session>) -> Vec<pb::Session> {
    if let Err(e) = d.rollup.catch_up().await {
        tracing::warn!(error = %e, "rollup pass failed");
    }
    let path = d.db_path.clone();
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
                    super::pc::overlay(d.session_pc(), s);
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
pub async fn list(d: &Daemon, caller: &Caller, req: pb::ListSessionsRequest) -> ApiResult<pb::ListSessionsResponse> {
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
    let path = d.db_path.clone();
    let name = req.name_contains.clone();
    let (mut sessions, more) = tokio::task::spawn_blocking(move || -> ApiResult<(Vec<pb::Session>, bool)> {
        let c = crate::store::open_reader(&path)?;
        list_page(&c, before, owner, &name, &states, page)
    })
    .await??;
    // Open sessions: the in-memory state is the freshest.
    let ended_unwritten = {
        let g = d.sessions.lock();
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
