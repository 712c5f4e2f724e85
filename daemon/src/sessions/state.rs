//! Session states and the state of each open session: its members, deadlines and waiters,
//! and the map of open sessions the sessions lock guards. No I/O here.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use gpuprof_proto::api as pb;
use tokio::sync::oneshot;

use super::spec::{Collect, TargetSpec};
use crate::registry::Agent;

/// How long a stopping session waits for its processes to flush and report idle.
pub const STOP_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

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

/// A process taking part in an open session.
#[derive(Debug, Clone)]
pub(super) struct Member {
    pub(super) pid: u32,
    pub(super) exe: String,
    pub(super) joined_ns: u64,
    /// tracing, displaced, failed, idle, stopped, exited.
    pub(super) state: String,
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
                    displaced: m.state == "displaced",
                    state: m.state.clone(),
                    joined_at_ns: m.joined_ns,
                })
                .collect(),
            records: 0,
        }
    }
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) open: BTreeMap<u64, Live>,
    /// Agent id → the session tracing it.
    pub(super) busy: HashMap<u64, u64>,
    /// What the new-process hint file holds (see [`publish_hint`](super::hints::publish_hint)).
    pub(super) hint: String,
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
}
