//! Session states and the state of each open session: its members, deadlines and waiters,
//! and the map of open sessions the sessions lock guards. No I/O here.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;
use tokio::sync::oneshot;

use super::spec::{Collect, TargetSpec};
use crate::registry::Agent;

/// How long a stopping session waits for its processes to flush and report idle.
pub const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);
/// A flush timeout that passes while the session's records are still arriving (the daemon is
/// behind reading them, e.g. under load) moves on by this much each time...
pub const STOP_FLUSH_GRACE: Duration = Duration::from_secs(1);
/// ...but never further than this after the stop began.
pub const STOP_FLUSH_MAX: Duration = Duration::from_secs(30);

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

/// Where a process stands in a session (`session_processes.state`, `SessionProcess.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// StartTrace sent, no status yet.
    Starting,
    Tracing,
    /// The agent reported it does not trace (between sessions' turns, or before its first).
    Idle,
    /// The session stopped it (or gave it to another session).
    Stopped,
    /// Another CUPTI client holds the process's CUPTI.
    Displaced,
    Failed,
    /// The process went away while a member.
    Exited,
}

impl MemberState {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberState::Starting => "starting",
            MemberState::Tracing => "tracing",
            MemberState::Idle => "idle",
            MemberState::Stopped => "stopped",
            MemberState::Displaced => "displaced",
            MemberState::Failed => "failed",
            MemberState::Exited => "exited",
        }
    }

    /// Displaced or failed: the process left the session's trace on its own account.
    pub fn fell_out(self) -> bool {
        matches!(self, MemberState::Displaced | MemberState::Failed)
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A process taking part in an open session.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) pid: u32,
    pub(super) exe: String,
    pub(super) joined_ns: u64,
    pub(super) state: MemberState,
    pub(super) detail: String,
    /// Stopping: the process reported idle, failed, displaced or went away.
    pub(super) settled: bool,
}

/// An open session.
#[derive(Debug)]
pub(super) struct Live {
    pub(super) id: u64,
    pub(super) name: String,
    pub(super) state: State,
    pub(super) targets: Vec<TargetSpec>,
    pub(super) collect: Collect,
    pub(super) owner_uid: u32,
    /// Whether targets are limited to the owner's processes (the owner is not an admin).
    pub(super) own_only: bool,
    pub(super) created_ns: u64,
    pub(super) start_at_ns: u64,
    pub(super) started_ns: u64,
    pub(super) stopped_ns: u64,
    pub(super) duration_ms: u64,
    pub(super) max_records: u64,
    pub(super) procs: BTreeMap<u64, Member>,
    pub(super) start_deadline: Option<Instant>,
    pub(super) stop_deadline: Option<Instant>,
    pub(super) flush_deadline: Option<Instant>,
    /// Stopping: when the stop began, and the session's records received when the flush
    /// deadline was last set.
    pub(super) flush_from: Option<(Instant, u64)>,
    pub(super) stop_reason: String,
    pub(super) waiters: Vec<oneshot::Sender<()>>,
}

impl Live {
    pub(super) fn covers(&self, a: &Agent) -> bool {
        a.kind == "injector" && (!self.own_only || a.uid == self.owner_uid) && self.targets.iter().any(|t| t.matches(a))
    }

    pub(super) fn to_pb(&self) -> pb::Session {
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
                    displaced: m.state == MemberState::Displaced,
                    state: m.state.as_str().to_string(),
                    joined_at_ns: m.joined_ns,
                    detail: m.detail.clone(),
                    ..Default::default()
                })
                .collect(),
            records: 0,
        }
    }

    // ------------------------------------------------------------ transitions
    //
    // The caller (the supervisor, under the sessions lock) passes the time in and carries out
    // the rest: the rows for the persister, StartTrace/StopTrace, the hint file.

    /// Whether `a` may join now: the session is active, covers it, and does not have it yet.
    /// (Whether another session holds it is the caller's check.)
    pub(super) fn may_join(&self, a: &Agent) -> bool {
        self.state == State::Active && !self.procs.contains_key(&a.id) && self.covers(a)
    }

    /// Adds process `proc` as a member: "starting" until its agent confirms with a trace state
    /// (tracing, displaced or failed), "failed" when StartTrace could not be `sent`. Returns
    /// the member's state and detail.
    pub(super) fn join(&mut self, proc: u64, pid: u32, exe: &str, now_ns: u64, sent: bool) -> (MemberState, String) {
        let (state, detail) = if sent {
            (MemberState::Starting, String::new())
        } else {
            (
                MemberState::Failed,
                "could not send StartTrace: the agent's command queue is full or it is disconnecting".to_string(),
            )
        };
        self.procs.insert(
            proc,
            Member {
                pid,
                exe: exe.to_string(),
                joined_ns: now_ns,
                state,
                detail: detail.clone(),
                settled: state != MemberState::Starting,
            },
        );
        (state, detail)
    }

    /// pending → active (a session started without a start time is created active and goes
    /// through this too): starts the duration clock.
    pub(super) fn activate(&mut self, now_ns: u64, now: Instant) {
        self.state = State::Active;
        self.started_ns = now_ns;
        self.start_deadline = None;
        if self.duration_ms > 0 {
            self.stop_deadline = Some(now + Duration::from_millis(self.duration_ms));
        }
    }

    /// active/pending → stopping for `reason`, the flush timeout counting from `now`. False
    /// (nothing changed) when the session is already stopping or has ended (an ended session
    /// stays in memory until its rows are written). The caller tells the members that are not
    /// settled to stop, and marks those it cannot tell settled.
    pub(super) fn begin_stop(&mut self, reason: &str, now: Instant, records: u64) -> bool {
        if !matches!(self.state, State::Pending | State::Active) {
            return false;
        }
        self.state = State::Stopping;
        self.stop_reason = reason.to_string();
        self.start_deadline = None;
        self.stop_deadline = None;
        self.flush_deadline = Some(now + STOP_FLUSH_TIMEOUT);
        self.flush_from = Some((now, records));
        true
    }

    /// Whether stopping → completed/failed is due at `now`: every process settled, or the flush
    /// timeout passed with no record received (`records`: the session's count so far) since the
    /// deadline was set. A deadline passing while records still arrive is moved on by
    /// [`STOP_FLUSH_GRACE`], at most to [`STOP_FLUSH_MAX`] after the stop.
    pub(super) fn should_finish(&mut self, now: Instant, records: u64) -> bool {
        if self.state != State::Stopping {
            return false;
        }
        if self.procs.values().all(|m| m.settled) {
            return true;
        }
        if self.flush_deadline.is_none_or(|t| now < t) {
            return false;
        }
        match &mut self.flush_from {
            Some((began, seen)) if records > *seen && now < *began + STOP_FLUSH_MAX => {
                *seen = records;
                self.flush_deadline = Some((now + STOP_FLUSH_GRACE).min(*began + STOP_FLUSH_MAX));
                false
            }
            _ => true,
        }
    }

    /// Ends the session in a final state (`forced`, or else completed, or failed when no
    /// process could be traced) at `now_ns`: the stop reason says why, members still starting
    /// or tracing become stopped. Returns the final state; `None` (nothing changed) when the
    /// session has ended already.
    pub(super) fn finish(&mut self, forced: Option<State>, now_ns: u64) -> Option<State> {
        if !self.state.is_open() {
            return None;
        }
        let all_failed = !self.procs.is_empty() && self.procs.values().all(|m| m.state == MemberState::Failed);
        let state = forced.unwrap_or(if all_failed { State::Failed } else { State::Completed });
        if all_failed && forced.is_none() {
            let why: Vec<String> = self
                .procs
                .values()
                .filter(|m| !m.detail.is_empty())
                .map(|m| format!("pid {}: {}", m.pid, m.detail))
                .collect();
            self.stop_reason = format!("{}; no process could be traced ({})", self.stop_reason, why.join("; "));
        }
        if state == State::Interrupted {
            self.stop_reason = if self.stop_reason.is_empty() {
                "gpuprofd stopped while the session was open".into()
            } else {
                format!("{}; gpuprofd stopped before it finished", self.stop_reason)
            };
        }
        self.state = state;
        self.stopped_ns = now_ns;
        for m in self.procs.values_mut() {
            if matches!(m.state, MemberState::Tracing | MemberState::Starting) {
                m.state = MemberState::Stopped;
            }
        }
        Some(state)
    }

    /// What the deadlines and the record limit ask of the session at `now`; `records` (read
    /// only for an active session with a limit) is the number of records received so far.
    pub(super) fn due(&self, now: Instant, records: impl FnOnce() -> u64) -> Due {
        match self.state {
            State::Pending if self.start_deadline.is_some_and(|t| now >= t) => Due::Activate,
            State::Active => {
                if self.stop_deadline.is_some_and(|t| now >= t) {
                    Due::Stop("duration reached")
                } else if self.max_records > 0 && records() >= self.max_records {
                    Due::Stop("record limit reached")
                } else {
                    Due::Nothing
                }
            }
            State::Stopping => Due::MaybeFinish,
            _ => Due::Nothing,
        }
    }
}

/// What [`Live::due`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    Nothing,
    /// The start time came: pending → active.
    Activate,
    /// The duration passed or the record limit was reached: active → stopping, for this reason.
    Stop(&'static str),
    /// Stopping: finish if every process settled or the flush timeout passed.
    MaybeFinish,
}

impl Member {
    /// The agent reported trace status `status` (a [`wire::TraceStatus`]) with `detail`, while
    /// the session is `stopping` or not. `None`: a status this daemon does not know (ignored);
    /// otherwise whether the member's state or detail changed.
    pub(super) fn on_trace_status(&mut self, status: i32, stopping: bool, detail: &str) -> Option<bool> {
        let new_state = match wire::TraceStatus::try_from(status) {
            Ok(wire::TraceStatus::Tracing) => MemberState::Tracing,
            Ok(wire::TraceStatus::Idle) if stopping => MemberState::Stopped,
            Ok(wire::TraceStatus::Idle) => MemberState::Idle,
            Ok(wire::TraceStatus::Displaced) => MemberState::Displaced,
            Ok(wire::TraceStatus::Failed) => MemberState::Failed,
            _ => return None,
        };
        if new_state != MemberState::Tracing && (stopping || new_state != MemberState::Idle) {
            self.settled = true;
        }
        if self.state != new_state || self.detail != detail {
            self.state = new_state;
            self.detail = detail.to_string();
            return Some(true);
        }
        Some(false)
    }

    /// The member's process went away (`reason`): exited, unless displaced or failed before.
    pub(super) fn leave(&mut self, reason: &str) {
        if !self.state.fell_out() {
            self.state = MemberState::Exited;
        }
        self.detail = reason.to_string();
        self.settled = true;
    }
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) open: BTreeMap<u64, Live>,
    /// Agent id → the session tracing it.
    pub(super) busy: HashMap<u64, u64>,
    /// What the new-process hint file holds (see `hints::publish_hint`).
    pub(super) hint: String,
    /// Sessions' holds on the CUPTI PM samplers (see `pm`).
    pub(super) pm: super::pm::Holds,
}

#[cfg(test)]
mod tests;
