//! Tests of the session state machine. The property test drives one session through random
//! steps (agents connecting, reporting and leaving, records arriving, time passing, StopSession,
//! the persister catching up, shutdown) on the real transitions, composed as the supervisor
//! composes them, and side by side through a tiny model written from the documented rules;
//! after every step the two must agree and the invariants hold.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

#[test]
fn state_names_round_trip() {
    for s in [State::Pending, State::Active, State::Stopping, State::Completed, State::Failed, State::Interrupted] {
        assert_eq!(State::parse(s.as_str()), Some(s));
        assert_eq!(State::from_pb(s.to_pb()), Some(s));
    }
}

const MS: u64 = 1_000_000;
const FLUSH_MS: u64 = STOP_FLUSH_TIMEOUT.as_millis() as u64;
const FLUSH_GRACE_MS: u64 = STOP_FLUSH_GRACE.as_millis() as u64;
const FLUSH_MAX_MS: u64 = STOP_FLUSH_MAX.as_millis() as u64;
const TRACING: i32 = wire::TraceStatus::Tracing as i32;
const IDLE: i32 = wire::TraceStatus::Idle as i32;
const DISPLACED: i32 = wire::TraceStatus::Displaced as i32;
const FAILED: i32 = wire::TraceStatus::Failed as i32;

#[derive(Debug, Clone)]
enum Step {
    /// Time passes, then the supervisor ticks.
    Advance(u64),
    /// Records of the session arrive.
    Records(u64),
    /// A new agent connects (its id: `agent`); its command queue takes commands or is full.
    Connect { agent: u64, queue_ok: bool },
    /// A connected agent reports a trace status (unknown values included).
    Report { agent: u64, status: i32, detail: bool },
    /// A connected agent disconnects.
    Disconnect { agent: u64 },
    /// StopSession.
    Stop,
    /// The persister wrote everything so far: an ended session leaves memory.
    Persisted,
    /// The daemon shuts down (the last step that does anything).
    Shutdown,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..4000u64).prop_map(Step::Advance),
        2 => (1..30u64).prop_map(Step::Records),
        3 => (1..5u64, prop::bool::weighted(0.8)).prop_map(|(agent, queue_ok)| Step::Connect { agent, queue_ok }),
        4 => (1..5u64, prop_oneof![Just(TRACING), Just(IDLE), Just(DISPLACED), Just(FAILED), Just(0), Just(42)], any::<bool>())
            .prop_map(|(agent, status, detail)| Step::Report { agent, status, detail }),
        2 => (1..5u64).prop_map(|agent| Step::Disconnect { agent }),
        1 => Just(Step::Stop),
        1 => Just(Step::Persisted),
        1 => Just(Step::Shutdown),
    ]
}

/// How a session is started: in `start_in` ms (0: now), for `duration` ms (0: until stopped),
/// until `max_records` (0: no limit).
#[derive(Debug, Clone, Copy)]
struct Params {
    start_in: u64,
    duration: u64,
    max_records: u64,
}

fn params() -> impl Strategy<Value = Params> {
    (prop_oneof![Just(0), 1..3000u64], prop_oneof![Just(0), 1..8000u64], prop_oneof![Just(0), 1..60u64])
        .prop_map(|(start_in, duration, max_records)| Params { start_in, duration, max_records })
}

fn agent(id: u64) -> Agent {
    Agent { exe: format!("/usr/bin/app{id}"), ..Agent::for_test(id, tokio::sync::mpsc::channel(1).0) }
}

/// The agents the steps have connected: id → whether its command queue takes commands;
/// `None` once it disconnected.
type Agents = BTreeMap<u64, Option<bool>>;

fn sendable(agents: &Agents, id: u64) -> bool {
    agents.get(&id).copied().flatten().unwrap_or(false)
}

/// The real transitions, composed as the supervisor composes them (for one session).
struct Real {
    live: Option<Live>,
    t0: Instant,
    /// Records received so far.
    records: u64,
}

impl Real {
    fn new(p: Params, t0: Instant, agents: &Agents) -> Real {
        let pending = p.start_in > 0;
        let live = Live {
            id: 1,
            name: String::new(),
            state: if pending { State::Pending } else { State::Active },
            targets: vec![TargetSpec::All],
            collect: Collect::default(),
            owner_uid: 1000,
            own_only: false,
            created_ns: ns(0),
            start_at_ns: ns(p.start_in),
            started_ns: if pending { 0 } else { ns(0) },
            stopped_ns: 0,
            duration_ms: p.duration,
            max_records: p.max_records,
            procs: BTreeMap::new(),
            start_deadline: pending.then(|| t0 + Duration::from_millis(p.start_in)),
            stop_deadline: None,
            flush_deadline: None,
            flush_from: None,
            stop_reason: String::new(),
            waiters: Vec::new(),
        };
        let mut r = Real { live: Some(live), t0, records: 0 };
        if !pending {
            r.activate(0, agents);
        }
        r
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn activate(&mut self, ms: u64, agents: &Agents) {
        let now = self.at(ms);
        let Some(l) = self.live.as_mut() else { return };
        l.activate(ns(ms), now);
        for (&id, q) in agents {
            if let Some(q) = q {
                self.join(ms, id, *q);
            }
        }
    }

    fn join(&mut self, ms: u64, id: u64, queue_ok: bool) {
        let Some(l) = self.live.as_mut() else { return };
        let a = agent(id);
        if l.may_join(&a) {
            l.join(a.id, a.pid, &a.exe, ns(ms), queue_ok);
        }
    }

    fn begin_stop(&mut self, ms: u64, reason: &str, agents: &Agents) {
        let now = self.at(ms);
        let Some(l) = self.live.as_mut() else { return };
        if !l.begin_stop(reason, now, self.records) {
            return;
        }
        for (pid, m) in l.procs.iter_mut() {
            if !m.settled && !sendable(agents, *pid) {
                m.settled = true;
            }
        }
        self.maybe_finish(ms);
    }

    fn maybe_finish(&mut self, ms: u64) {
        let now = self.at(ms);
        let Some(l) = self.live.as_mut() else { return };
        if l.should_finish(now, self.records) {
            l.finish(None, ns(ms));
        }
    }

    fn tick(&mut self, ms: u64, records: u64, agents: &Agents) {
        let now = self.at(ms);
        let Some(l) = self.live.as_ref() else { return };
        match l.due(now, || records) {
            Due::Activate => self.activate(ms, agents),
            Due::Stop(reason) => self.begin_stop(ms, reason, agents),
            Due::MaybeFinish => self.maybe_finish(ms),
            Due::Nothing => {}
        }
    }

    fn report(&mut self, ms: u64, id: u64, status: i32, detail: &str) {
        let Some(l) = self.live.as_mut() else { return };
        let stopping = l.state == State::Stopping;
        let Some(m) = l.procs.get_mut(&id) else { return };
        if m.on_trace_status(status, stopping, detail).is_none() {
            return;
        }
        self.maybe_finish(ms);
    }

    fn disconnect(&mut self, ms: u64, id: u64) {
        let Some(m) = self.live.as_mut().and_then(|l| l.procs.get_mut(&id)) else { return };
        m.leave("disconnected");
        self.maybe_finish(ms);
    }

    /// The persister's part: an ended session leaves memory once its rows are written.
    fn persisted(&mut self) {
        if self.live.as_ref().is_some_and(|l| !l.state.is_open()) {
            self.live = None;
        }
    }

    fn shutdown(&mut self, ms: u64) {
        if let Some(l) = self.live.as_mut() {
            l.finish(Some(State::Interrupted), ns(ms));
        }
    }
}

fn ns(ms: u64) -> u64 {
    1_700_000_000_000 * MS + ms * MS
}

/// The model: what the documentation says, for one session.
#[derive(Debug)]
struct Model {
    state: State,
    in_memory: bool,
    reason: String,
    start_at: Option<u64>,
    stop_at: Option<u64>,
    flush_at: Option<u64>,
    /// Stopping: when the stop began and the records received when `flush_at` was last set.
    flush_from: Option<(u64, u64)>,
    /// Records received so far.
    records: u64,
    duration: u64,
    max_records: u64,
    /// Member → (state, settled).
    members: BTreeMap<u64, (&'static str, bool)>,
}

impl Model {
    fn new(p: Params, agents: &Agents) -> Model {
        let mut m = Model {
            state: State::Pending,
            in_memory: true,
            reason: String::new(),
            start_at: Some(p.start_in),
            stop_at: None,
            flush_at: None,
            flush_from: None,
            records: 0,
            duration: p.duration,
            max_records: p.max_records,
            members: BTreeMap::new(),
        };
        if p.start_in == 0 {
            m.activate(0, agents);
        }
        m
    }

    /// Pending → active at `now`: the duration counts from here, connected processes join.
    fn activate(&mut self, now: u64, agents: &Agents) {
        self.state = State::Active;
        self.start_at = None;
        self.stop_at = (self.duration > 0).then_some(now + self.duration);
        for (&id, q) in agents {
            if let Some(q) = q {
                self.join(id, *q);
            }
        }
    }

    /// Only an active session takes members, each once; a member whose StartTrace cannot be
    /// queued has failed.
    fn join(&mut self, id: u64, queue_ok: bool) {
        if self.in_memory && self.state == State::Active && !self.members.contains_key(&id) {
            self.members.insert(id, if queue_ok { ("starting", false) } else { ("failed", true) });
        }
    }

    /// Only a pending or active session stops; members that cannot be told are settled.
    fn stop(&mut self, now: u64, reason: &str, agents: &Agents) {
        if !matches!(self.state, State::Pending | State::Active) {
            return;
        }
        self.state = State::Stopping;
        self.reason = reason.into();
        self.start_at = None;
        self.stop_at = None;
        self.flush_at = Some(now + FLUSH_MS);
        self.flush_from = Some((now, self.records));
        for (id, (_, settled)) in self.members.iter_mut() {
            if !sendable(agents, *id) {
                *settled = true;
            }
        }
        self.check_finish(now);
    }

    /// A stopping session ends once every member settled, or at the flush timeout; a timeout
    /// passing while records still arrive moves on by the grace, never past the maximum.
    fn check_finish(&mut self, now: u64) {
        let mut timed_out = self.flush_at.is_some_and(|t| now >= t);
        if timed_out
            && let Some((began, seen)) = self.flush_from
            && self.records > seen
            && now < began + FLUSH_MAX_MS
        {
            self.flush_from = Some((began, self.records));
            self.flush_at = Some((now + FLUSH_GRACE_MS).min(began + FLUSH_MAX_MS));
            timed_out = false;
        }
        if self.state == State::Stopping && (timed_out || self.members.values().all(|(_, s)| *s)) {
            let failed = !self.members.is_empty() && self.members.values().all(|(st, _)| *st == "failed");
            self.end(if failed { State::Failed } else { State::Completed });
        }
    }

    fn end(&mut self, state: State) {
        if state == State::Interrupted {
            self.reason = if self.reason.is_empty() {
                "gpuprofd stopped while the session was open".into()
            } else {
                format!("{}; gpuprofd stopped before it finished", self.reason)
            };
        }
        self.state = state;
        for (st, _) in self.members.values_mut() {
            if matches!(*st, "starting" | "tracing") {
                *st = "stopped";
            }
        }
    }

    fn tick(&mut self, now: u64, records: u64, agents: &Agents) {
        match self.state {
            State::Pending if self.start_at.is_some_and(|t| now >= t) => self.activate(now, agents),
            State::Active if self.stop_at.is_some_and(|t| now >= t) => self.stop(now, "duration reached", agents),
            State::Active if self.max_records > 0 && records >= self.max_records => {
                self.stop(now, "record limit reached", agents)
            }
            _ => self.check_finish(now),
        }
    }

    /// Members take reports while the session is in memory, ended or not. A member is settled once it can no longer hold a stopping session open: idle while
    /// stopping, displaced, failed, or gone. Idle while stopping is "stopped".
    fn report(&mut self, now: u64, id: u64, status: i32) {
        if !self.in_memory {
            return;
        }
        let stopping = self.state == State::Stopping;
        let Some((st, settled)) = self.members.get_mut(&id) else { return };
        *st = match status {
            TRACING => "tracing",
            IDLE if stopping => "stopped",
            IDLE => "idle",
            DISPLACED => "displaced",
            FAILED => "failed",
            _ => return,
        };
        *settled |= matches!(status, DISPLACED | FAILED) || (status == IDLE && stopping);
        self.check_finish(now);
    }

    fn disconnect(&mut self, now: u64, id: u64) {
        if !self.in_memory {
            return;
        }
        let Some((st, settled)) = self.members.get_mut(&id) else { return };
        if !matches!(*st, "displaced" | "failed") {
            *st = "exited";
        }
        *settled = true;
        self.check_finish(now);
    }
}

/// The real session and the model agree, and the invariants hold.
fn check(real: &Real, model: &Model, ended_as: Option<State>) -> Result<(), TestCaseError> {
    let just_ended = ended_as.is_none();
    prop_assert_eq!(real.live.is_some(), model.in_memory, "in memory");
    let Some(l) = real.live.as_ref() else { return Ok(()) };
    prop_assert_eq!(l.state, model.state);
    if l.state == State::Failed {
        let prefix = format!("{}; no process could be traced (", model.reason);
        prop_assert!(l.stop_reason.starts_with(&prefix), "failed reason {:?}", l.stop_reason);
    } else {
        prop_assert_eq!(&l.stop_reason, &model.reason);
    }
    let members: BTreeMap<u64, (&str, bool)> =
        l.procs.iter().map(|(id, m)| (*id, (m.state.as_str(), m.settled))).collect();
    prop_assert_eq!(&members, &model.members);
    // Invariants.
    if let Some(s) = ended_as {
        prop_assert_eq!(l.state, s, "an ended session changed state");
    }
    match l.state {
        State::Pending => prop_assert!(l.procs.is_empty() && l.started_ns == 0 && l.start_deadline.is_some()),
        State::Active => prop_assert!(l.started_ns > 0 && l.start_deadline.is_none()),
        State::Stopping => prop_assert!(!l.stop_reason.is_empty() && l.flush_deadline.is_some()),
        State::Completed | State::Failed | State::Interrupted => {
            prop_assert!(!l.stop_reason.is_empty(), "an ended session has a reason");
            prop_assert!(l.stopped_ns > 0);
            // Until it leaves memory an ended session still takes its members' late reports.
            if just_ended {
                prop_assert!(
                    l.procs.values().all(|m| !matches!(m.state, MemberState::Starting | MemberState::Tracing))
                );
            }
        }
    }
    for m in l.procs.values() {
        if matches!(m.state.as_str(), "failed" | "displaced" | "exited") {
            prop_assert!(m.settled, "a member that is done is settled");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn session_matches_model(p in params(), steps in prop::collection::vec(step(), 1..60)) {
        let t0 = Instant::now();
        let mut agents = Agents::new();
        let mut real = Real::new(p, t0, &agents);
        let mut model = Model::new(p, &agents);
        let (mut ms, mut records, mut down) = (0u64, 0u64, false);
        let mut ended_as: Option<State> = None;
        let mut seen = BTreeSet::new();
        check(&real, &model, ended_as)?;
        for s in steps {
            if down {
                break;
            }
            match s {
                Step::Advance(d) => {
                    ms += d;
                    real.tick(ms, records, &agents);
                    model.tick(ms, records, &agents);
                }
                Step::Records(n) => {
                    records += n;
                    real.records = records;
                    model.records = records;
                }
                Step::Connect { agent, queue_ok } => {
                    // Agent ids are per connection: a known one does not connect again.
                    if !seen.insert(agent) {
                        continue;
                    }
                    agents.insert(agent, Some(queue_ok));
                    real.join(ms, agent, queue_ok);
                    model.join(agent, queue_ok);
                }
                Step::Report { agent, status, detail } => {
                    if !matches!(agents.get(&agent), Some(Some(_))) {
                        continue;
                    }
                    real.report(ms, agent, status, if detail { "why" } else { "" });
                    model.report(ms, agent, status);
                }
                Step::Disconnect { agent } => {
                    if !matches!(agents.get(&agent), Some(Some(_))) {
                        continue;
                    }
                    agents.insert(agent, None);
                    real.disconnect(ms, agent);
                    model.disconnect(ms, agent);
                }
                Step::Stop => {
                    real.begin_stop(ms, "stopped by user", &agents);
                    if model.in_memory {
                        model.stop(ms, "stopped by user", &agents);
                    }
                }
                Step::Persisted => {
                    real.persisted();
                    if !model.state.is_open() {
                        model.in_memory = false;
                    }
                }
                Step::Shutdown => {
                    real.shutdown(ms);
                    if model.in_memory && model.state.is_open() {
                        model.end(State::Interrupted);
                    }
                    down = true;
                }
            }
            check(&real, &model, ended_as)?;
            if let Some(l) = real.live.as_ref().filter(|l| !l.state.is_open()) {
                ended_as = Some(l.state);
            }
        }
    }
}
