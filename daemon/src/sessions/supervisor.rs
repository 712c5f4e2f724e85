//! Transitions of open sessions with what they take outside (commands to agents, rows queued
//! for the persister, the hint file), and the supervisor task that drives them from agent
//! events and deadlines.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use gpuprof_proto::agent::{self as wire, DaemonMessage, daemon_message};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::Sessions;
use super::hints::publish_hint;
use super::pc::Pc;
use super::pm::Pm;
use super::spec::Collect;
use super::state::{Due, Inner, MemberState, State};
use super::store::Op;
use crate::clock::now_ns;
use crate::config::AgentConfig;
use crate::registry::{Agent, AgentEvent, Registry};

/// What the sessions' transitions and their supervisor use: the sessions, the connected agents
/// (to join and command), the records counted per session (for record limits), the agent
/// settings and socket (for the hint file next to it), and the members' PM and PC sampling.
#[derive(Clone, Copy)]
pub(crate) struct Supervisor<'a> {
    pub sessions: &'a Sessions,
    pub registry: &'a Registry,
    pub session_records: &'a DashMap<u64, AtomicU64>,
    pub agent: &'a AgentConfig,
    pub agent_socket: &'a Path,
    pub pm: Pm<'a>,
    pub pc: Pc<'a>,
}

/// How often record limits are checked while a session with one is active.
const LIMIT_POLL: Duration = Duration::from_millis(5);

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
pub(super) fn activate(d: Supervisor<'_>, g: &mut Inner, id: u64, now: u64) {
    let Some(l) = g.open.get_mut(&id) else { return };
    l.activate(now, Instant::now());
    d.sessions.op(Op::State { id, state: State::Active, started_ns: Some(now), stopped_ns: None, reason: None });
    let collect = l.collect.clone();
    for a in d.registry.all() {
        try_join(d, g, id, &a);
    }
    super::pm::start(d.pm, &mut g.pm, id, &collect);
    publish_hint(d.agent, d.agent_socket, d.sessions.node(), g);
}

/// Joins `a` to session `id` if the session is active, covers it, and it is free (or held
/// by the always-on profile, which gives it up).
fn try_join(d: Supervisor<'_>, g: &mut Inner, id: u64, a: &Agent) -> bool {
    if !g.open.get(&id).is_some_and(|l| l.may_join(a)) {
        return false;
    }
    if let Some(&held) = g.busy.get(&a.id) {
        let node = d.sessions.node();
        if held != node || id == node {
            return false;
        }
        yield_to(d, g, node, a.id, id);
    }
    let Some(l) = g.open.get_mut(&id) else { return false };
    let now = now_ns();
    let sent = a.send(start_trace(id, &l.collect));
    let (state, detail) = l.join(a.id, a.pid, &a.exe, now, sent);
    if state == MemberState::Starting {
        super::pc::request(d.pc, id, &l.collect, a);
        g.busy.insert(a.id, id);
    }
    tracing::info!(session = id, process = a.id, pid = a.pid, state = state.as_str(), "process joined session");
    d.sessions.op(Op::Join { session: id, proc: a.id, joined_ns: now, state, detail });
    true
}

/// The always-on profile (`node`) gives process `proc` to session `to`: the member leaves it
/// (its StartTrace for `to` stops the profile's trace in the process) with its PC sampling.
fn yield_to(d: Supervisor<'_>, g: &mut Inner, node: u64, proc: u64, to: u64) {
    g.busy.remove(&proc);
    if g.open.get_mut(&node).and_then(|l| l.procs.remove(&proc)).is_some() {
        super::pc::forget(d.pc, node, proc, &format!("stopped (traced by session {to})"), true);
        d.sessions.op(Op::Member {
            session: node,
            proc,
            state: MemberState::Stopped,
            detail: format!("traced by session {to}"),
            left_ns: Some(now_ns()),
        });
        tracing::info!(session = node, process = proc, to, "always-on profile gave a process to a session");
    }
}

/// Joins `a` to the oldest active session that covers it; the always-on profile last.
fn join_any(d: Supervisor<'_>, g: &mut Inner, a: &Agent) {
    let node = d.sessions.node();
    let mut ids: Vec<u64> = g.open.iter().filter(|(_, l)| l.state == State::Active).map(|(id, _)| *id).collect();
    ids.sort_by_key(|id| (*id == node, *id));
    for id in ids {
        if try_join(d, g, id, a) {
            return;
        }
    }
}

/// active/pending → stopping: tells every tracing process to stop.
pub(super) fn begin_stop(d: Supervisor<'_>, g: &mut Inner, id: u64, reason: &str) {
    let records = session_records(d, id);
    let Some(l) = g.open.get_mut(&id) else { return };
    if !l.begin_stop(reason, Instant::now(), records) {
        return;
    }
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
    super::pc::stop(d.pc, id);
    super::pm::stop(&mut g.pm, id);
    tracing::info!(session = id, reason, "session stopping");
    publish_hint(d.agent, d.agent_socket, d.sessions.node(), g);
    maybe_finish(d, g, id);
}

/// stopping → completed/failed once every process settled (or the flush timeout passed).
fn maybe_finish(d: Supervisor<'_>, g: &mut Inner, id: u64) {
    let records = session_records(d, id);
    let Some(l) = g.open.get_mut(&id) else { return };
    if l.should_finish(Instant::now(), records) {
        finish(d, g, id, None);
    }
}

/// Records received for session `id` so far.
fn session_records(d: Supervisor<'_>, id: u64) -> u64 {
    d.session_records.get(&id).map(|c| c.load(std::sync::atomic::Ordering::Relaxed)).unwrap_or(0)
}

/// Ends a session in a final state (`None`: completed, or failed when no process could be traced).
fn finish(d: Supervisor<'_>, g: &mut Inner, id: u64, forced: Option<State>) {
    super::pm::stop(&mut g.pm, id);
    let Some(l) = g.open.get_mut(&id) else { return };
    let now = now_ns();
    let Some(state) = l.finish(forced, now) else { return };
    let mut freed = Vec::new();
    for (pid, m) in l.procs.iter() {
        if g.busy.get(pid) == Some(&id) {
            g.busy.remove(pid);
            freed.push(*pid);
        }
        d.sessions.op(Op::Member {
            session: id,
            proc: *pid,
            state: m.state,
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
    super::pc::finish(d.pc, id);
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
pub(crate) async fn supervise(
    d: Supervisor<'_>,
    mut events: broadcast::Receiver<AgentEvent>,
    shutdown: CancellationToken,
) {
    // The hint's hook line holds while no session is active.
    publish_hint(d.agent, d.agent_socket, d.sessions.node(), &mut d.sessions.lock());
    loop {
        let next = next_wakeup(d);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            ev = events.recv() => match ev {
                Ok(ev) => on_event(d, ev),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "session supervisor missed agent events; resynchronizing");
                    resync(d);
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = d.sessions.wake.notified() => {}
            _ = sleep_until(next) => {}
        }
        tick(d);
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
            finish(d, &mut g, id, Some(State::Interrupted));
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

fn next_wakeup(d: Supervisor<'_>) -> Option<Instant> {
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
    consider(super::pm::next_renewal(d.pm, &g.pm));
    consider(super::pc::next_busy_retry(d.pc));
    consider(super::pc::next_schedule(d.pc));
    next
}

/// Applies deadlines and record limits.
fn tick(d: Supervisor<'_>) {
    let now = Instant::now();
    let mut g = d.sessions.lock();
    let ids: Vec<u64> = g.open.keys().copied().collect();
    for id in ids {
        let Some(l) = g.open.get(&id) else { continue };
        match l.due(now, || session_records(d, id)) {
            Due::Activate => activate(d, &mut g, id, now_ns()),
            Due::Stop(reason) => begin_stop(d, &mut g, id, reason),
            Due::MaybeFinish => maybe_finish(d, &mut g, id),
            Due::Nothing => {}
        }
    }
    super::pm::renew_due(d.pm, &mut g.pm, now);
    super::pc::retry_busy(d.pc, &g);
    super::pc::schedule(d.pc);
}

fn on_event(d: Supervisor<'_>, ev: AgentEvent) {
    let mut g = d.sessions.lock();
    match ev {
        AgentEvent::Connected(a) => join_any(d, &mut g, &a),
        AgentEvent::Disconnected { id, reason } => {
            g.busy.remove(&id);
            let sessions: Vec<u64> =
                g.open.iter().filter(|(_, l)| l.procs.contains_key(&id)).map(|(s, _)| *s).collect();
            for s in sessions {
                if let Some(m) = g.open.get_mut(&s).and_then(|l| l.procs.get_mut(&id)) {
                    m.leave(&reason);
                    super::pc::left(d.pc, s, id, "stopped (process left)");
                    d.sessions.op(Op::Member {
                        session: s,
                        proc: id,
                        state: m.state,
                        detail: reason.clone(),
                        left_ns: Some(now_ns()),
                    });
                }
                // The always-on profile forgets processes once gone (it lives for weeks).
                if s == d.sessions.node()
                    && let Some(l) = g.open.get_mut(&s)
                {
                    l.procs.remove(&id);
                    super::pc::forget(d.pc, s, id, "stopped (process left)", false);
                }
                maybe_finish(d, &mut g, s);
            }
        }
        AgentEvent::TraceState { id, status, session_id, detail } => {
            let sid = if session_id != 0 { Some(session_id) } else { g.busy.get(&id).copied() };
            let Some(sid) = sid else { return };
            let open = g.open.get(&sid).is_some_and(|l| l.state.is_open());
            if !open {
                // How a process that stopped left CUPTI, known only after the session ended.
                if session_id != 0 && status == wire::TraceStatus::Idle as i32 && detail.starts_with("detached: ") {
                    d.sessions.op(Op::Detail { session: sid, proc: id, detail });
                }
                return;
            }
            let Some(l) = g.open.get_mut(&sid) else { return };
            let stopping = l.state == State::Stopping;
            let Some(m) = l.procs.get_mut(&id) else { return };
            let Some(changed) = m.on_trace_status(status, stopping, &detail) else { return };
            if changed {
                // A process that cannot be traced (CUPTI held by another profiler, or failing)
                // gives its PC-sampling leases back.
                if m.state.fell_out() {
                    super::pc::left(d.pc, sid, id, &format!("stopped (process {})", m.state));
                }
                d.sessions.op(Op::Member { session: sid, proc: id, state: m.state, detail, left_ns: None });
            }
            maybe_finish(d, &mut g, sid);
        }
        AgentEvent::SamplerState { .. } => {}
    }
}

/// After missed events: join connected processes that should be in sessions, and mark members that are gone.
fn resync(d: Supervisor<'_>) {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use tokio::sync::mpsc;

    use super::super::spec::TargetSpec;
    use super::super::state::Live;
    use super::*;
    use crate::pcsamp::PcHub;
    use crate::pcsamp::sched::SchedConfig;

    fn agent(id: u64) -> (Arc<Agent>, mpsc::Receiver<DaemonMessage>) {
        let (commands, rx) = mpsc::channel(8);
        (Arc::new(Agent::for_test(id, commands)), rx)
    }

    fn session(id: u64) -> Live {
        Live {
            id,
            name: String::new(),
            state: State::Pending,
            targets: vec![TargetSpec::All],
            collect: Collect::default(),
            owner_uid: 1000,
            own_only: false,
            created_ns: 1,
            start_at_ns: 0,
            started_ns: 0,
            stopped_ns: 0,
            duration_ms: 0,
            max_records: 0,
            procs: BTreeMap::new(),
            start_deadline: None,
            stop_deadline: None,
            flush_deadline: None,
            flush_from: None,
            stop_reason: String::new(),
            waiters: Vec::new(),
        }
    }

    async fn next(rx: &mut mpsc::Receiver<DaemonMessage>) -> Option<daemon_message::Msg> {
        tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("a command in time").and_then(|m| m.msg)
    }

    /// Built from its parts, no daemon: activating a session sends StartTrace to the connected
    /// process; the supervisor joins a process that connects later, and at shutdown sends
    /// StopTrace to both, ends the session interrupted and forgets its record count.
    #[tokio::test]
    async fn transitions_and_supervisor_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = crate::config::Config::from_toml("").unwrap();
        cfg.agent_socket = dir.path().join("agent.sock");
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let (sessions, persister) = Sessions::new(writer.handle.clone());
        let persister = tokio::spawn(persister);
        let hub = PcHub::new(16, SchedConfig::from_config(&cfg.pc));
        let registry = Registry::default();
        let records = DashMap::new();
        let d = Supervisor {
            sessions: &sessions,
            registry: &registry,
            session_records: &records,
            agent: &cfg.agent,
            agent_socket: &cfg.agent_socket,
            pm: Pm { sampler: &cfg.sampler, arbiter: &arbiter },
            pc: Pc {
                settings: &cfg.pc,
                busy_retry: cfg.sampler.pc_busy_retry.0,
                hub: &hub,
                arbiter: &arbiter,
                found: &[],
                registry: &registry,
                sessions: &sessions,
            },
        };
        let (a1, mut rx1) = agent(1);
        registry.insert(a1);
        records.insert(9, AtomicU64::new(0));
        {
            let mut g = sessions.lock();
            g.open.insert(9, session(9));
            activate(d, &mut g, 9, now_ns());
            assert_eq!(g.open[&9].state, State::Active);
            assert_eq!(g.busy.get(&1), Some(&9));
        }
        assert!(matches!(next(&mut rx1).await, Some(daemon_message::Msg::StartTrace(t)) if t.session_id == 9));

        let shutdown = CancellationToken::new();
        let (a2, mut rx2) = agent(2);
        let drive = async {
            registry.insert(a2);
            assert!(matches!(next(&mut rx2).await, Some(daemon_message::Msg::StartTrace(t)) if t.session_id == 9));
            assert_eq!(sessions.session_of(2), Some(9));
            shutdown.cancel();
        };
        tokio::join!(supervise(d, registry.subscribe(), shutdown.clone()), drive);
        for rx in [&mut rx1, &mut rx2] {
            assert!(matches!(next(rx).await, Some(daemon_message::Msg::StopTrace(t)) if t.session_id == 9));
        }
        assert_eq!(sessions.open_count(), 0);
        assert!(sessions.session_of(1).is_none() && records.is_empty());

        drop(sessions);
        persister.await.unwrap();
        writer.stop().await;
    }
}
