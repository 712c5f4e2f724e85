//! Profiling sessions: which processes to trace, what to collect, when to start and stop.
//!
//! A session moves pending → active → stopping → completed | failed, or to interrupted
//! when the daemon stops while it is open. Its row in `sessions` (and its members in
//! `session_processes`) follow every transition, so a restart finds open sessions and
//! marks them interrupted ([`recover`]) instead of forgetting them; their records stay.
//!
//! Open sessions live in memory ([`Sessions`]); one supervisor task ([`spawn`]) reacts to
//! agents connecting (late join), disconnecting and reporting trace states (displaced),
//! and to deadlines (start time, duration, record limit, flush timeout). Commands go to
//! injectors as `StartTrace`/`StopTrace`. Database writes are queued in order to one
//! persister task that runs them on the writer connection.
//!
//! A process is traced for one session at a time: broad targets skip processes another
//! session holds (they join once it ends), a pid target that is held is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{self as wire, DaemonMessage, daemon_message};
use gpuprof_proto::api as pb;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, broadcast, mpsc, oneshot};

use crate::Daemon;
use crate::access::{Caller, process_uid};
use crate::clock::now_ns;
use crate::error::{ApiError, ApiResult};
use crate::ingest::WriterHandle;
use crate::registry::{Agent, AgentEvent};

/// How long a stopping session waits for its processes to flush and report idle.
pub const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);
/// How often record limits are checked while a session with one is active.
const LIMIT_POLL: Duration = Duration::from_millis(5);
/// Open sessions at most (pending, active or stopping).
const MAX_OPEN_SESSIONS: usize = 1024;
/// Longest accepted session name.
const MAX_NAME: usize = 256;
/// The furthest future start time accepted.
const MAX_START_DELAY_NS: u64 = 30 * 24 * 3600 * 1_000_000_000;

/// Session states as stored in `sessions.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Pending,
    Active,
    Stopping,
    Completed,
    Failed,
    Interrupted,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Active => "active",
            State::Stopping => "stopping",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<State> {
        Some(match s {
            "pending" => State::Pending,
            "active" => State::Active,
            "stopping" => State::Stopping,
            "completed" => State::Completed,
            "failed" => State::Failed,
            "interrupted" => State::Interrupted,
            _ => return None,
        })
    }

    pub fn to_pb(self) -> pb::SessionState {
        match self {
            State::Pending => pb::SessionState::Pending,
            State::Active => pb::SessionState::Active,
            State::Stopping => pb::SessionState::Stopping,
            State::Completed => pb::SessionState::Completed,
            State::Failed => pb::SessionState::Failed,
            State::Interrupted => pb::SessionState::Interrupted,
        }
    }

    pub fn from_pb(s: pb::SessionState) -> Option<State> {
        Some(match s {
            pb::SessionState::Unspecified => return None,
            pb::SessionState::Pending => State::Pending,
            pb::SessionState::Active => State::Active,
            pb::SessionState::Stopping => State::Stopping,
            pb::SessionState::Completed => State::Completed,
            pb::SessionState::Failed => State::Failed,
            pb::SessionState::Interrupted => State::Interrupted,
        })
    }

    pub fn is_open(self) -> bool {
        matches!(self, State::Pending | State::Active | State::Stopping)
    }
}

/// One target, as stored (JSON) in `sessions.targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetSpec {
    Pid(u32),
    ExeName(String),
    ExePattern(String),
    Cgroup(String),
    All,
}

impl TargetSpec {
    fn from_pb(t: &pb::Target) -> ApiResult<TargetSpec> {
        use pb::target::Target as T;
        Ok(match &t.target {
            None => {
                return Err(ApiError::invalid(
                    "targets",
                    "a target has none of pid, exe_name, exe_pattern, cgroup, all",
                ));
            }
            Some(T::Pid(0)) => return Err(ApiError::invalid("targets.pid", "pid 0 is not a process")),
            Some(T::Pid(p)) => TargetSpec::Pid(*p),
            Some(T::ExeName(n)) if n.is_empty() || n.contains('/') => {
                return Err(ApiError::invalid(
                    "targets.exe_name",
                    format!("{n:?} is not an executable base name (e.g. \"python3\"); use exe_pattern for paths"),
                ));
            }
            Some(T::ExeName(n)) => TargetSpec::ExeName(n.clone()),
            Some(T::ExePattern(p)) => {
                if p.is_empty() {
                    return Err(ApiError::invalid("targets.exe_pattern", "the pattern is empty"));
                }
                if let Err(e) = gpuprof_proto::glob::check(p) {
                    return Err(ApiError::invalid("targets.exe_pattern", format!("{p:?}: {e}")));
                }
                TargetSpec::ExePattern(p.clone())
            }
            Some(T::Cgroup(c)) if c.is_empty() => {
                return Err(ApiError::invalid("targets.cgroup", "the cgroup substring is empty"));
            }
            Some(T::Cgroup(c)) => TargetSpec::Cgroup(c.clone()),
            Some(T::All(true)) => TargetSpec::All,
            Some(T::All(false)) => {
                return Err(ApiError::invalid("targets.all", "all must be true when given (it selects every process)"));
            }
        })
    }

    pub fn to_pb(&self) -> pb::Target {
        use pb::target::Target as T;
        pb::Target {
            target: Some(match self {
                TargetSpec::Pid(p) => T::Pid(*p),
                TargetSpec::ExeName(n) => T::ExeName(n.clone()),
                TargetSpec::ExePattern(p) => T::ExePattern(p.clone()),
                TargetSpec::Cgroup(c) => T::Cgroup(c.clone()),
                TargetSpec::All => T::All(true),
            }),
        }
    }

    /// Whether the connected agent is covered by this target.
    pub fn matches(&self, a: &Agent) -> bool {
        match self {
            TargetSpec::Pid(p) => a.pid == *p,
            TargetSpec::ExeName(n) => gpuprof_proto::hint::exe_name_matches(n, &a.exe, &a.cmdline),
            TargetSpec::ExePattern(p) => gpuprof_proto::hint::exe_pattern_matches(p, &a.exe, &a.cmdline),
            TargetSpec::Cgroup(c) => a.cgroup.contains(c.as_str()),
            TargetSpec::All => true,
        }
    }
}

/// What a session collects, as stored (JSON) in `sessions.collect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collect {
    pub preset: String,
    #[serde(default)]
    pub pc_sampling: bool,
    #[serde(default)]
    pub pc_sampling_period_log2: u32,
    #[serde(default)]
    pub pm_metrics: Vec<String>,
}

impl Collect {
    fn from_pb(c: Option<&pb::CollectOptions>) -> ApiResult<Collect> {
        let c = c.cloned().unwrap_or_default();
        let preset = if c.preset.is_empty() { "default".to_string() } else { c.preset };
        if !matches!(preset.as_str(), "kernels" | "default" | "full") {
            return Err(ApiError::invalid(
                "collect.preset",
                format!("unknown preset {preset:?}; use \"kernels\", \"default\" or \"full\""),
            ));
        }
        // Refused rather than silently ignored: the injector has no PC sampling yet, and PM
        // metrics come from the device samplers ([sampler] metrics, StreamPmSamples).
        if c.pc_sampling {
            return Err(ApiError::invalid(
                "collect.pc_sampling",
                "PC sampling in sessions is not supported by this gpuprofd yet; leave it unset",
            ));
        }
        if !c.pm_metrics.is_empty() {
            return Err(ApiError::invalid(
                "collect.pm_metrics",
                "per-session PM metrics are not supported yet; the device samplers collect the metrics in \
                 [sampler] metrics for every GPU (gpuprofctl pm watch, StreamPmSamples)",
            ));
        }
        let p = c.pc_sampling_period_log2;
        if p != 0 && !(5..=31).contains(&p) {
            return Err(ApiError::invalid("collect.pc_sampling_period_log2", format!("{p} is outside 5..31 (0: 10)")));
        }
        if c.pm_metrics.iter().any(|m| m.trim().is_empty()) {
            return Err(ApiError::invalid("collect.pm_metrics", "a metric name is empty"));
        }
        Ok(Collect {
            preset,
            pc_sampling: c.pc_sampling,
            pc_sampling_period_log2: if p == 0 && c.pc_sampling { 10 } else { p },
            pm_metrics: c.pm_metrics,
        })
    }

    pub fn to_pb(&self) -> pb::CollectOptions {
        pb::CollectOptions {
            preset: self.preset.clone(),
            pc_sampling: self.pc_sampling,
            pc_sampling_period_log2: self.pc_sampling_period_log2,
            pm_metrics: self.pm_metrics.clone(),
        }
    }

    /// The activity kinds the injector enables for this preset.
    pub fn trace_config(&self) -> wire::TraceConfig {
        let full = self.preset == "full";
        let default = full || self.preset == "default";
        wire::TraceConfig {
            kernels: true,
            memcpy: default,
            memset: default,
            runtime_api: default,
            driver_api: full,
            // SYNCHRONIZATION and EXTERNAL_CORRELATION make CUPTI intercept every sync and
            // every framework op (measured on the H100: +0.35x and +0.12x on a PyTorch loop of
            // small kernels); the sync API calls themselves are still recorded by default.
            sync: full,
            overhead: full,
            nvtx: default,
            external_correlation: full,
            graphs: default,
            flush_interval_ms: 0,
        }
    }
}

/// A process taking part in an open session.
#[derive(Debug, Clone)]
struct Member {
    pid: u32,
    exe: String,
    joined_ns: u64,
    /// tracing, displaced, failed, idle, stopped, exited.
    state: String,
    detail: String,
    /// Stopping: the process reported idle, failed, displaced or went away.
    settled: bool,
}

/// An open session.
#[derive(Debug)]
struct Live {
    id: u64,
    name: String,
    state: State,
    targets: Vec<TargetSpec>,
    collect: Collect,
    owner_uid: u32,
    /// Whether targets are limited to the owner's processes (the owner is not an admin).
    own_only: bool,
    created_ns: u64,
    start_at_ns: u64,
    started_ns: u64,
    stopped_ns: u64,
    duration_ms: u64,
    max_records: u64,
    procs: BTreeMap<u64, Member>,
    start_deadline: Option<Instant>,
    stop_deadline: Option<Instant>,
    flush_deadline: Option<Instant>,
    stop_reason: String,
    waiters: Vec<oneshot::Sender<()>>,
}

impl Live {
    fn covers(&self, a: &Agent) -> bool {
        a.kind == "injector" && (!self.own_only || a.uid == self.owner_uid) && self.targets.iter().any(|t| t.matches(a))
    }

    fn to_pb(&self) -> pb::Session {
        pb::Session {
            id: self.id,
            name: self.name.clone(),
            state: self.state.to_pb() as i32,
            targets: self.targets.iter().map(TargetSpec::to_pb).collect(),
            collect: Some(self.collect.to_pb()),
            owner_uid: self.owner_uid,
            created_at_ns: self.created_ns,
            start_at_ns: self.start_at_ns,
            started_at_ns: self.started_ns,
            stopped_at_ns: self.stopped_ns,
            duration_ms: self.duration_ms,
            max_records: self.max_records,
            stop_reason: self.stop_reason.clone(),
            processes: self
                .procs
                .iter()
                .map(|(id, m)| pb::SessionProcess {
                    process_id: *id,
                    pid: m.pid,
                    exe: m.exe.clone(),
                    records: 0,
                    dropped: 0,
                    displaced: m.state == "displaced",
                    state: m.state.clone(),
                    joined_at_ns: m.joined_ns,
                })
                .collect(),
            records: 0,
        }
    }
}

/// A database write, queued in the order the in-memory state changed.
enum Op {
    State {
        id: u64,
        state: State,
        started_ns: Option<u64>,
        stopped_ns: Option<u64>,
        reason: Option<String>,
    },
    Join {
        session: u64,
        proc: u64,
        joined_ns: u64,
        state: String,
        detail: String,
    },
    Member {
        session: u64,
        proc: u64,
        state: String,
        detail: String,
        left_ns: Option<u64>,
    },
    /// The session reached a final state: forget it in memory once written, then wake waiters.
    Finished {
        id: u64,
        waiters: Vec<oneshot::Sender<()>>,
    },
    /// Reply once everything before is written.
    Barrier(oneshot::Sender<()>),
}

#[derive(Default)]
struct Inner {
    open: BTreeMap<u64, Live>,
    /// Agent id → the session tracing it.
    busy: HashMap<u64, u64>,
    /// What the new-process hint file holds (see [`publish_hint`]).
    hint: String,
}

/// The session manager, one per daemon.
pub struct Sessions {
    inner: Arc<Mutex<Inner>>,
    ops: mpsc::UnboundedSender<Op>,
    wake: Notify,
}

impl Sessions {
    /// The owner of session `id` while it is open; `None` once it has ended (or never was).
    pub fn live_owner(&self, id: u64) -> Option<u32> {
        self.lock().open.get(&id).map(|l| l.owner_uid)
    }

    /// Creates the manager and its persister, the task that writes session rows through
    /// `writer` in order; the caller spawns it (the `runtime` module does).
    pub fn new(writer: WriterHandle) -> (Sessions, impl Future<Output = ()> + Send + 'static) {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (ops, rx) = mpsc::unbounded_channel();
        let persister = persist(writer, rx, inner.clone());
        (Sessions { inner, ops, wake: Notify::new() }, persister)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn op(&self, op: Op) {
        // The persister lives as long as this sender; a send fails only during teardown.
        let _ = self.ops.send(op);
    }

    /// Sessions pending, active or stopping.
    pub fn open_count(&self) -> usize {
        self.lock().open.len()
    }

    /// The session an agent is traced for, if any.
    pub fn session_of(&self, agent_id: u64) -> Option<u64> {
        self.lock().busy.get(&agent_id).copied()
    }

    /// Waits until every state change so far is in the database.
    pub async fn persisted(&self) {
        let (tx, rx) = oneshot::channel();
        self.op(Op::Barrier(tx));
        let _ = rx.await;
    }
}

/// Marks sessions left open by a previous run as interrupted. Runs at start, before agents connect.
pub fn recover(conn: &Connection) -> rusqlite::Result<usize> {
    let now = now_ns() as i64;
    let n = conn.execute(
        "UPDATE sessions SET state = 'interrupted', stopped_ns = coalesce(stopped_ns, ?1),
           stop_reason = CASE WHEN coalesce(stop_reason, '') = ''
                              THEN 'gpuprofd stopped while the session was open'
                              ELSE stop_reason || '; gpuprofd stopped before it finished' END
         WHERE state IN ('pending', 'active', 'stopping')",
        [now],
    )?;
    conn.execute(
        "UPDATE session_processes SET left_ns = coalesce(left_ns, ?1),
           state = CASE WHEN state = 'tracing' THEN 'exited' ELSE state END
         WHERE left_ns IS NULL AND session IN (SELECT id FROM sessions WHERE state = 'interrupted')",
        [now],
    )?;
    if n > 0 {
        tracing::warn!(sessions = n, "marked sessions left open by the previous run as interrupted");
    }
    Ok(n)
}

// ---------------------------------------------------------------- requests

/// StartSession.
pub async fn start(d: &Daemon, caller: &Caller, req: pb::StartSessionRequest) -> ApiResult<pb::Session> {
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
            if let Some(s) = d.sessions.session_of(a.id) {
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
        stop_reason: String::new(),
        waiters: Vec::new(),
    };
    d.session_records.entry(id).or_default();
    let s = &d.sessions;
    let out = {
        let mut g = s.lock();
        g.open.insert(id, live);
        if !pending {
            activate(d, &mut g, id, now);
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
        match g.open.get(&id) {
            Some(l) if !caller.may_access(l.owner_uid) => {
                return Err(caller.denied(&format!("session {id}"), l.owner_uid, &d.config.api.admin_group));
            }
            Some(_) => {
                let (tx, rx) = oneshot::channel();
                begin_stop(d, &mut g, id, "stopped by user");
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
    let live = d.sessions.lock().open.get(&id).map(|l| (l.owner_uid, l.to_pb()));
    let s = match live {
        Some((owner, s)) => {
            if !caller.may_access(owner) {
                return Err(caller.denied(&format!("session {id}"), owner, &d.config.api.admin_group));
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
    if let Err(e) = crate::rollup::catch_up(d).await {
        tracing::warn!(error = %e, "rollup pass failed");
    }
    let path = d.db_path.clone();
    let original = sessions.clone();
    let mut sessions = sessions;
    let r = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<pb::Session>> {
        let c = crate::store::open_reader(&path)?;
        for s in &mut sessions {
            let procs: Vec<u64> = s.processes.iter().map(|p| p.process_id).collect();
            let records = crate::query::session_record_counts(&c, s.id)?;
            let drops = session_drops(&c, s.id, &procs)?;
            for p in &mut s.processes {
                p.records = records.get(&p.process_id).copied().unwrap_or(0);
                p.dropped = drops.get(&p.process_id).copied().unwrap_or(0);
            }
            s.records = records.values().sum();
        }
        Ok(sessions)
    })
    .await;
    match r {
        Ok(Ok(v)) => v,
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

/// Records each process dropped while in the session: its cumulative drops now (or when it
/// left) minus those when it joined.
fn session_drops(c: &Connection, session: u64, procs: &[u64]) -> rusqlite::Result<HashMap<u64, u64>> {
    let mut out = HashMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT sp.proc, coalesce(sp.drops_at_leave, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = sp.proc))
                - sp.drops_at_join
         FROM session_processes sp WHERE sp.session = ?1",
    )?;
    let mut rows = stmt.query([session as i64])?;
    while let Some(r) = rows.next()? {
        let p: i64 = r.get(0)?;
        let n: i64 = r.get(1)?;
        out.insert(p as u64, n.max(0) as u64);
    }
    for p in procs {
        out.entry(*p).or_insert(0);
    }
    Ok(out)
}

fn load_targets(json: &str) -> Vec<pb::Target> {
    serde_json::from_str::<Vec<TargetSpec>>(json).unwrap_or_default().iter().map(TargetSpec::to_pb).collect()
}

fn load_collect(json: &str) -> pb::CollectOptions {
    serde_json::from_str::<Collect>(json).unwrap_or_default().to_pb()
}

const SESSION_COLS: &str =
    "id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, coalesce(started_ns, 0),
     coalesce(stopped_ns, 0), duration_ms, max_records, coalesce(stop_reason, '')";

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<pb::Session> {
    let state: String = r.get(2)?;
    let targets: String = r.get(3)?;
    let collect: String = r.get(4)?;
    Ok(pb::Session {
        id: r.get::<_, i64>(0)? as u64,
        name: r.get(1)?,
        state: State::parse(&state).map(|s| s.to_pb()).unwrap_or_default() as i32,
        targets: load_targets(&targets),
        collect: Some(load_collect(&collect)),
        owner_uid: r.get(5)?,
        created_at_ns: r.get::<_, i64>(6)? as u64,
        start_at_ns: r.get::<_, i64>(7)? as u64,
        started_at_ns: r.get::<_, i64>(8)? as u64,
        stopped_at_ns: r.get::<_, i64>(9)? as u64,
        duration_ms: r.get::<_, i64>(10)? as u64,
        max_records: r.get::<_, i64>(11)? as u64,
        stop_reason: r.get(12)?,
        processes: Vec::new(),
        records: 0,
    })
}

/// A session and its processes from the database.
pub fn load(c: &Connection, id: u64) -> rusqlite::Result<Option<pb::Session>> {
    let Some(mut s) = c
        .prepare_cached(&format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"))?
        .query_row([id as i64], session_from_row)
        .optional()?
    else {
        return Ok(None);
    };
    load_members(c, &mut s)?;
    Ok(Some(s))
}

fn load_members(c: &Connection, s: &mut pb::Session) -> rusqlite::Result<()> {
    let mut stmt = c.prepare_cached(
        "SELECT sp.proc, p.pid, p.exe, sp.state, sp.joined_ns
         FROM session_processes sp JOIN processes p ON p.id = sp.proc
         WHERE sp.session = ?1 ORDER BY sp.proc",
    )?;
    s.processes = stmt
        .query_map([s.id as i64], |r| {
            let state: String = r.get(3)?;
            Ok(pb::SessionProcess {
                process_id: r.get::<_, i64>(0)? as u64,
                pid: r.get(1)?,
                exe: r.get(2)?,
                records: 0,
                dropped: 0,
                displaced: state == "displaced",
                state,
                joined_at_ns: r.get::<_, i64>(4)? as u64,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(())
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
        let state_list = serde_json::to_string(&states).map_err(|e| ApiError::Internal(e.to_string()))?;
        let mut stmt = c.prepare(&format!(
            "SELECT {SESSION_COLS} FROM sessions
             WHERE id < ?1
               AND (?2 IS NULL OR owner_uid = ?2)
               AND (?3 = '' OR instr(name, ?3) > 0)
               AND (?4 = '[]' OR state IN (SELECT value FROM json_each(?4)))
             ORDER BY id DESC LIMIT ?5"
        ))?;
        let mut v = stmt
            .query_map(params![before, owner, name, state_list, page + 1], session_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let more = v.len() as i64 > page;
        v.truncate(page as usize);
        for s in &mut v {
            load_members(&c, s)?;
        }
        Ok((v, more))
    })
    .await??;
    // Open sessions: the in-memory state is the freshest.
    {
        let g = d.sessions.lock();
        for s in &mut sessions {
            if let Some(l) = g.open.get(&s.id) {
                *s = l.to_pb();
            }
        }
    }
    let next = if more { sessions.last().map(|s| s.id.to_string()).unwrap_or_default() } else { String::new() };
    Ok(pb::ListSessionsResponse { sessions: fill_counts_all(d, sessions).await, next_page_token: next })
}

// ---------------------------------------------------------------- transitions (under the lock)

fn start_trace(id: u64, collect: &Collect) -> DaemonMessage {
    DaemonMessage {
        msg: Some(daemon_message::Msg::StartTrace(wire::StartTrace {
            session_id: id,
            config: Some(collect.trace_config()),
        })),
    }
}

fn stop_trace(id: u64) -> DaemonMessage {
    DaemonMessage { msg: Some(daemon_message::Msg::StopTrace(wire::StopTrace { session_id: id })) }
}

/// pending → active: joins every free matching process.
fn activate(d: &Daemon, g: &mut Inner, id: u64, now: u64) {
    let Some(l) = g.open.get_mut(&id) else { return };
    l.state = State::Active;
    l.started_ns = now;
    l.start_deadline = None;
    if l.duration_ms > 0 {
        l.stop_deadline = Some(Instant::now() + Duration::from_millis(l.duration_ms));
    }
    d.sessions.op(Op::State { id, state: State::Active, started_ns: Some(now), stopped_ns: None, reason: None });
    for a in d.registry.all() {
        try_join(d, g, id, &a);
    }
    publish_hint(d, g);
}

/// The new-process hint lines for the active sessions that record runtime API calls: the
/// targets a process can be matched on when it starts (see [`gpuprof_proto::hint`]).
fn hint_lines(g: &Inner) -> String {
    let mut out = String::new();
    for l in g.open.values().filter(|l| l.state == State::Active && l.collect.trace_config().runtime_api) {
        let uid = l.own_only.then_some(l.owner_uid);
        for t in &l.targets {
            let line = match t {
                TargetSpec::All => gpuprof_proto::hint::line(uid, "all", ""),
                TargetSpec::Pid(p) => gpuprof_proto::hint::line(uid, "pid", &p.to_string()),
                TargetSpec::ExeName(n) => gpuprof_proto::hint::line(uid, "exe_name", n),
                TargetSpec::Cgroup(c) => gpuprof_proto::hint::line(uid, "cgroup", c),
                TargetSpec::ExePattern(p) => gpuprof_proto::hint::line(uid, "exe_pattern", p),
            };
            if let Some(line) = line {
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}

/// With `agent.api_from_start` (the default), rewrites the new-process hint file next to the agent socket
/// when the active sessions changed (removes it when no session awaits new processes). A failure only costs new
/// processes the cheaper way of recording API calls, so it is logged, not returned.
fn publish_hint(d: &Daemon, g: &mut Inner) {
    if !d.config.agent.api_from_start {
        return;
    }
    let text = hint_lines(g);
    if text == g.hint {
        return;
    }
    let path = gpuprof_proto::hint::hint_path(&d.config.agent_socket);
    let r = if text.is_empty() {
        std::fs::remove_file(&path).or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
    } else {
        let tmp = path.with_extension("new-processes.tmp");
        std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &path))
    };
    match r {
        Ok(()) => g.hint = text,
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not update the new-process hint"),
    }
}

/// Joins `a` to session `id` if the session is active, covers it, and it is free.
fn try_join(d: &Daemon, g: &mut Inner, id: u64, a: &Agent) -> bool {
    if g.busy.contains_key(&a.id) {
        return false;
    }
    let Some(l) = g.open.get_mut(&id) else { return false };
    if l.state != State::Active || l.procs.contains_key(&a.id) || !l.covers(a) {
        return false;
    }
    let now = now_ns();
    // "starting" until the agent confirms with a trace state (tracing, displaced or failed).
    let (state, detail) = if a.send(start_trace(id, &l.collect)) {
        ("starting", String::new())
    } else {
        ("failed", "could not send StartTrace: the agent's command queue is full or it is disconnecting".to_string())
    };
    l.procs.insert(
        a.id,
        Member {
            pid: a.pid,
            exe: a.exe.clone(),
            joined_ns: now,
            state: state.into(),
            detail: detail.clone(),
            settled: state != "starting",
        },
    );
    if state == "starting" {
        g.busy.insert(a.id, id);
    }
    tracing::info!(session = id, process = a.id, pid = a.pid, state, "process joined session");
    d.sessions.op(Op::Join { session: id, proc: a.id, joined_ns: now, state: state.into(), detail });
    true
}

/// Joins `a` to the oldest active session that covers it.
fn join_any(d: &Daemon, g: &mut Inner, a: &Agent) {
    let ids: Vec<u64> = g.open.iter().filter(|(_, l)| l.state == State::Active).map(|(id, _)| *id).collect();
    for id in ids {
        if try_join(d, g, id, a) {
            return;
        }
    }
}

/// active/pending → stopping: tells every tracing process to stop.
fn begin_stop(d: &Daemon, g: &mut Inner, id: u64, reason: &str) {
    let Some(l) = g.open.get_mut(&id) else { return };
    if l.state == State::Stopping {
        return;
    }
    l.state = State::Stopping;
    l.stop_reason = reason.to_string();
    l.start_deadline = None;
    l.stop_deadline = None;
    l.flush_deadline = Some(Instant::now() + STOP_FLUSH_TIMEOUT);
    d.sessions.op(Op::State {
        id,
        state: State::Stopping,
        started_ns: None,
        stopped_ns: None,
        reason: Some(reason.into()),
    });
    for (pid, m) in l.procs.iter_mut() {
        if m.settled {
            continue;
        }
        let sent = d.registry.get(*pid).is_some_and(|a| a.send(stop_trace(id)));
        if !sent {
            m.settled = true;
        }
    }
    tracing::info!(session = id, reason, "session stopping");
    publish_hint(d, g);
    maybe_finish(d, g, id);
}

/// stopping → completed/failed once every process settled (or the flush timeout passed).
fn maybe_finish(d: &Daemon, g: &mut Inner, id: u64) {
    let Some(l) = g.open.get(&id) else { return };
    if l.state != State::Stopping {
        return;
    }
    let timed_out = l.flush_deadline.is_some_and(|t| Instant::now() >= t);
    if !timed_out && !l.procs.values().all(|m| m.settled) {
        return;
    }
    finish(d, g, id, None);
}

/// Ends a session in a final state (`None`: completed, or failed when no process could be traced).
fn finish(d: &Daemon, g: &mut Inner, id: u64, forced: Option<State>) {
    let Some(l) = g.open.get_mut(&id) else { return };
    let now = now_ns();
    let all_failed = !l.procs.is_empty() && l.procs.values().all(|m| m.state == "failed");
    let state = forced.unwrap_or(if all_failed { State::Failed } else { State::Completed });
    if all_failed && forced.is_none() {
        let why: Vec<String> =
            l.procs.values().filter(|m| !m.detail.is_empty()).map(|m| format!("pid {}: {}", m.pid, m.detail)).collect();
        l.stop_reason = format!("{}; no process could be traced ({})", l.stop_reason, why.join("; "));
    }
    if state == State::Interrupted {
        l.stop_reason = if l.stop_reason.is_empty() {
            "gpuprofd stopped while the session was open".into()
        } else {
            format!("{}; gpuprofd stopped before it finished", l.stop_reason)
        };
    }
    l.state = state;
    l.stopped_ns = now;
    let mut freed = Vec::new();
    for (pid, m) in l.procs.iter_mut() {
        if g.busy.get(pid) == Some(&id) {
            g.busy.remove(pid);
            freed.push(*pid);
        }
        if m.state == "tracing" || m.state == "starting" {
            m.state = "stopped".into();
        }
        d.sessions.op(Op::Member {
            session: id,
            proc: *pid,
            state: m.state.clone(),
            detail: m.detail.clone(),
            left_ns: Some(now),
        });
    }
    d.sessions.op(Op::State {
        id,
        state,
        started_ns: None,
        stopped_ns: Some(now),
        reason: Some(l.stop_reason.clone()),
    });
    let waiters = std::mem::take(&mut l.waiters);
    d.sessions.op(Op::Finished { id, waiters });
    d.session_records.remove(&id);
    tracing::info!(session = id, state = state.as_str(), reason = %l.stop_reason, "session ended");
    // Freed processes may be wanted by other active sessions.
    if state != State::Interrupted {
        for pid in freed {
            if let Some(a) = d.registry.get(pid) {
                join_any(d, g, &a);
            }
        }
    }
}

// ---------------------------------------------------------------- supervisor

/// The supervisor: follows agents joining and leaving, ends sessions on their duration or
/// record limit, and when the daemon shuts down marks open sessions interrupted.
pub async fn supervise(d: Arc<Daemon>, mut events: broadcast::Receiver<AgentEvent>) {
    loop {
        let next = next_wakeup(&d);
        tokio::select! {
            _ = d.shutdown.cancelled() => break,
            ev = events.recv() => match ev {
                Ok(ev) => on_event(&d, ev),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "session supervisor missed agent events; resynchronizing");
                    resync(&d);
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = d.sessions.wake.notified() => {}
            _ = sleep_until(next) => {}
        }
        tick(&d);
    }
    // Shutdown: stop tracing everywhere and record the sessions as interrupted.
    {
        let mut g = d.sessions.lock();
        let ids: Vec<u64> = g.open.keys().copied().collect();
        for id in ids {
            if let Some(l) = g.open.get(&id) {
                for pid in l.procs.keys() {
                    if let Some(a) = d.registry.get(*pid) {
                        a.send(stop_trace(id));
                    }
                }
            }
            finish(&d, &mut g, id, Some(State::Interrupted));
        }
    }
    d.sessions.persisted().await;
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t.into()).await,
        None => std::future::pending().await,
    }
}

fn next_wakeup(d: &Daemon) -> Option<Instant> {
    let g = d.sessions.lock();
    let mut next: Option<Instant> = None;
    let mut consider = |t: Option<Instant>| {
        if let Some(t) = t {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
    };
    for l in g.open.values() {
        consider(l.start_deadline);
        consider(l.stop_deadline);
        consider(l.flush_deadline);
        if l.state == State::Active && l.max_records > 0 {
            consider(Some(Instant::now() + LIMIT_POLL));
        }
    }
    next
}

/// Applies deadlines and record limits.
fn tick(d: &Daemon) {
    let now = Instant::now();
    let mut g = d.sessions.lock();
    let ids: Vec<u64> = g.open.keys().copied().collect();
    for id in ids {
        let Some(l) = g.open.get(&id) else { continue };
        match l.state {
            State::Pending if l.start_deadline.is_some_and(|t| now >= t) => activate(d, &mut g, id, now_ns()),
            State::Active => {
                if l.stop_deadline.is_some_and(|t| now >= t) {
                    begin_stop(d, &mut g, id, "duration reached");
                } else if l.max_records > 0 {
                    let n =
                        d.session_records.get(&id).map(|c| c.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0);
                    if n >= l.max_records {
                        begin_stop(d, &mut g, id, "record limit reached");
                    }
                }
            }
            State::Stopping => maybe_finish(d, &mut g, id),
            _ => {}
        }
    }
}

fn on_event(d: &Daemon, ev: AgentEvent) {
    let mut g = d.sessions.lock();
    match ev {
        AgentEvent::Connected(a) => join_any(d, &mut g, &a),
        AgentEvent::Disconnected { id, reason } => {
            g.busy.remove(&id);
            let sessions: Vec<u64> =
                g.open.iter().filter(|(_, l)| l.procs.contains_key(&id)).map(|(s, _)| *s).collect();
            for s in sessions {
                if let Some(m) = g.open.get_mut(&s).and_then(|l| l.procs.get_mut(&id)) {
                    if m.state != "displaced" && m.state != "failed" {
                        m.state = "exited".into();
                    }
                    m.detail = reason.clone();
                    m.settled = true;
                    d.sessions.op(Op::Member {
                        session: s,
                        proc: id,
                        state: m.state.clone(),
                        detail: reason.clone(),
                        left_ns: Some(now_ns()),
                    });
                }
                maybe_finish(d, &mut g, s);
            }
        }
        AgentEvent::TraceState { id, status, session_id, detail } => {
            let sid = if session_id != 0 { Some(session_id) } else { g.busy.get(&id).copied() };
            let Some(sid) = sid else { return };
            let Some(l) = g.open.get_mut(&sid) else { return };
            let stopping = l.state == State::Stopping;
            let Some(m) = l.procs.get_mut(&id) else { return };
            let new_state = match wire::TraceStatus::try_from(status) {
                Ok(wire::TraceStatus::Tracing) => "tracing",
                Ok(wire::TraceStatus::Idle) if stopping => "stopped",
                Ok(wire::TraceStatus::Idle) => "idle",
                Ok(wire::TraceStatus::Displaced) => "displaced",
                Ok(wire::TraceStatus::Failed) => "failed",
                _ => return,
            };
            if new_state != "tracing" && (stopping || new_state != "idle") {
                m.settled = true;
            }
            if m.state != new_state || m.detail != detail {
                m.state = new_state.into();
                m.detail = detail.clone();
                d.sessions.op(Op::Member { session: sid, proc: id, state: new_state.into(), detail, left_ns: None });
            }
            maybe_finish(d, &mut g, sid);
        }
        AgentEvent::SamplerState { .. } => {}
    }
}

/// After missed events: join connected processes that should be in sessions, and mark members that are gone.
fn resync(d: &Daemon) {
    let agents = d.registry.all();
    let gone: Vec<u64> = {
        let g = d.sessions.lock();
        g.open.values().flat_map(|l| l.procs.keys().copied()).filter(|p| d.registry.get(*p).is_none()).collect()
    };
    for id in gone {
        on_event(d, AgentEvent::Disconnected { id, reason: "disconnected".into() });
    }
    let mut g = d.sessions.lock();
    for a in agents {
        join_any(d, &mut g, &a);
    }
}

// ---------------------------------------------------------------- persister

async fn persist(writer: WriterHandle, mut rx: mpsc::UnboundedReceiver<Op>, inner: Arc<Mutex<Inner>>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let mut finished = Vec::new();
        let mut barriers = Vec::new();
        let mut writes = Vec::new();
        for op in batch.drain(..) {
            match op {
                Op::Finished { id, waiters } => finished.push((id, waiters)),
                Op::Barrier(tx) => barriers.push(tx),
                other => writes.push(other),
            }
        }
        if !writes.is_empty() {
            match writer.call(move |c| apply(c, writes)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "cannot record session state"),
                Err(_) => tracing::warn!("writer gone; session state changes not recorded"),
            }
        }
        {
            let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
            for (id, _) in &finished {
                if g.open.get(id).is_some_and(|l| !l.state.is_open()) {
                    g.open.remove(id);
                }
            }
        }
        for (_, waiters) in finished {
            for w in waiters {
                let _ = w.send(());
            }
        }
        for b in barriers {
            let _ = b.send(());
        }
    }
}

fn apply(c: &mut Connection, ops: Vec<Op>) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    for op in ops {
        match op {
            Op::State { id, state, started_ns, stopped_ns, reason } => {
                tx.execute(
                    "UPDATE sessions SET state = ?2, started_ns = coalesce(?3, started_ns),
                       stopped_ns = coalesce(?4, stopped_ns), stop_reason = coalesce(?5, stop_reason)
                     WHERE id = ?1",
                    params![
                        id as i64,
                        state.as_str(),
                        started_ns.map(|v| v as i64),
                        stopped_ns.map(|v| v as i64),
                        reason
                    ],
                )?;
            }
            Op::Join { session, proc, joined_ns, state, detail } => {
                tx.execute(
                    "INSERT INTO session_processes(session, proc, joined_ns, state, detail, drops_at_join)
                     VALUES (?1, ?2, ?3, ?4, ?5, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = ?2))
                     ON CONFLICT(session, proc) DO UPDATE SET state = excluded.state, detail = excluded.detail",
                    params![session as i64, proc as i64, joined_ns as i64, state, detail],
                )?;
            }
            Op::Member { session, proc, state, detail, left_ns } => {
                tx.execute(
                    "UPDATE session_processes SET state = ?3, detail = ?4, left_ns = coalesce(left_ns, ?5),
                       drops_at_leave = CASE WHEN ?5 IS NULL THEN drops_at_leave
                         ELSE coalesce(drops_at_leave, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = ?2)) END
                     WHERE session = ?1 AND proc = ?2",
                    params![session as i64, proc as i64, state, detail, left_ns.map(|v| v as i64)],
                )?;
            }
            Op::Finished { .. } | Op::Barrier(_) => {}
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_round_trip() {
        for s in [State::Pending, State::Active, State::Stopping, State::Completed, State::Failed, State::Interrupted] {
            assert_eq!(State::parse(s.as_str()), Some(s));
            assert_eq!(State::from_pb(s.to_pb()), Some(s));
        }
    }

    #[test]
    fn targets_validate() {
        use pb::target::Target as T;
        let t = |x| pb::Target { target: Some(x) };
        assert!(TargetSpec::from_pb(&t(T::Pid(0))).is_err());
        assert!(TargetSpec::from_pb(&t(T::ExeName("/usr/bin/python3".into()))).is_err());
        assert!(TargetSpec::from_pb(&t(T::ExePattern("[abc".into()))).is_err());
        assert!(TargetSpec::from_pb(&t(T::All(false))).is_err());
        assert!(TargetSpec::from_pb(&pb::Target { target: None }).is_err());
        assert_eq!(TargetSpec::from_pb(&t(T::All(true))).unwrap(), TargetSpec::All);
        let json = serde_json::to_string(&vec![TargetSpec::Pid(3), TargetSpec::All]).unwrap();
        assert_eq!(json, r#"[{"pid":3},"all"]"#);
    }

    fn agent(pid: u32, uid: u32, exe: &str, cmdline: &[&str], cgroup: &str) -> Agent {
        Agent {
            id: 1,
            pid,
            uid,
            gid: uid,
            kind: "injector",
            exe: exe.into(),
            cmdline: cmdline.iter().map(|s| s.to_string()).collect(),
            cgroup: cgroup.into(),
            cupti_version: 0,
            sampler_device: 0,
            connected_at_ns: 0,
            last_seen_ns: 0.into(),
            trace_state: std::sync::Mutex::new("idle".into()),
            commands: tokio::sync::mpsc::channel(1).0,
        }
    }

    #[test]
    fn targets_match() {
        let a = agent(
            42,
            1000,
            "/opt/conda/bin/python3.11",
            &["python", "train_gpt.py", "--lr=1"],
            "/kubepods/burstable/pod9f3a/c0ffee",
        );
        assert!(TargetSpec::Pid(42).matches(&a));
        assert!(!TargetSpec::Pid(43).matches(&a));
        assert!(TargetSpec::ExeName("python3.11".into()).matches(&a));
        assert!(TargetSpec::ExeName("python".into()).matches(&a), "argv[0] counts too");
        assert!(!TargetSpec::ExeName("python3".into()).matches(&a));
        assert!(TargetSpec::ExePattern("*train*.py".into()).matches(&a));
        assert!(TargetSpec::ExePattern("/opt/conda/*".into()).matches(&a));
        assert!(!TargetSpec::ExePattern("*eval*".into()).matches(&a));
        assert!(TargetSpec::Cgroup("pod9f3a".into()).matches(&a));
        assert!(!TargetSpec::Cgroup("pod0000".into()).matches(&a));
        assert!(TargetSpec::All.matches(&a));
    }

    #[test]
    fn presets() {
        assert!(Collect::from_pb(Some(&pb::CollectOptions { preset: "bogus".into(), ..Default::default() })).is_err());
        assert!(Collect::from_pb(Some(&pb::CollectOptions { pc_sampling: true, ..Default::default() })).is_err());
        let pm = pb::CollectOptions { pm_metrics: vec!["sm__cycles_active.avg".into()], ..Default::default() };
        assert!(Collect::from_pb(Some(&pm)).is_err());
        let c = Collect::from_pb(None).unwrap();
        assert_eq!(c.preset, "default");
        let k = Collect { preset: "kernels".into(), ..Default::default() }.trace_config();
        assert!(k.kernels && !k.memcpy && !k.runtime_api);
        let f = Collect { preset: "full".into(), ..Default::default() }.trace_config();
        assert!(f.driver_api && f.overhead && f.nvtx && f.sync && f.external_correlation);
        let d = Collect::from_pb(None).unwrap().trace_config();
        assert!(d.memcpy && d.runtime_api && d.nvtx && !d.sync && !d.external_correlation && !d.driver_api);
    }

    #[test]
    fn recover_marks_open_sessions_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap().storage;
        let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
        for (i, st) in ["active", "completed", "pending", "stopping"].iter().enumerate() {
            c.execute(
                "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns,
                                      duration_ms, max_records, stop_reason) VALUES (?1, '', ?2, '[]', '{}', 0, 0, 0, 0, 0, '')",
                params![i as i64 + 1, st],
            )
            .unwrap();
        }
        assert_eq!(recover(&c).unwrap(), 3);
        let states: Vec<String> = c
            .prepare("SELECT state FROM sessions ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(states, ["interrupted", "completed", "interrupted", "interrupted"]);
    }
}
