//! Trace start and stop on the daemon's command, and standing down when displaced.

use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;

use super::api_watch::ApiWatch;
use super::{Agent, Status};
use crate::log::log;
use crate::tracer::{Backend, StartOutcome, effective_config};

impl<B: Backend> Agent<B> {
    pub(super) fn start_trace(&mut self, s: pb::StartTrace) {
        // A detach still pending is settled by the start (logged there), not reported.
        self.detach_session = 0;
        if self.status != Status::Idle {
            let prev = self.session;
            self.stop_trace(prev);
        }
        let cfg = crate::tracer::apply_skip(effective_config(s.config.as_ref()), &self.cfg.skip);
        self.session = s.session_id;
        self.conv.set_session(s.session_id);
        self.flush_every = if cfg.flush_interval_ms > 0 {
            Duration::from_millis(u64::from(cfg.flush_interval_ms).clamp(10, 10_000))
        } else {
            self.cfg.flush_interval
        };
        match self.backend.start(&cfg) {
            StartOutcome::Tracing => {
                self.status = Status::Tracing;
                crate::nccl::global().set_active(true);
                self.api_watch = (cfg.runtime_api || cfg.driver_api).then(|| ApiWatch {
                    kernels: self.conv.sent[pb::RecordKind::Kernel as usize],
                    api: self.conv.sent[pb::RecordKind::Api as usize],
                    attempts: 0,
                });
                self.next_flush = Instant::now() + self.flush_every;
                self.conv.replay_topology();
                self.send_records();
                self.send_state(pb::TraceStatus::Tracing, s.session_id, String::new());
            }
            StartOutcome::Displaced(d) => {
                self.status = Status::Displaced;
                log!(Warn, "{d}");
                self.send_state(pb::TraceStatus::Displaced, s.session_id, d);
            }
            StartOutcome::Failed(d) => {
                log!(Warn, "trace start failed: {d}");
                self.session = 0;
                self.conv.set_session(0);
                self.send_state(pb::TraceStatus::Failed, s.session_id, d);
            }
        }
    }

    pub(super) fn stop_trace(&mut self, session_id: u64) {
        if self.status == Status::Idle || (session_id != 0 && session_id != self.session) {
            return;
        }
        let mut detail = String::new();
        // PC sampling ends first: it holds the subscriber a detach needs.
        self.stop_all_pc("trace stopped");
        crate::nccl::global().set_active(false);
        if self.status == Status::Tracing {
            self.backend.stop();
            self.drain_queue();
            self.send_records();
            detail = self.backend.detach();
        }
        self.send_drops();
        let ended = self.session;
        self.detach_session = if self.backend.detach_pending() { ended } else { 0 };
        self.status = Status::Idle;
        self.session = 0;
        self.conv.set_session(0);
        self.send_state(pb::TraceStatus::Idle, ended, detail);
    }

    pub(super) fn displaced(&mut self, detail: String) {
        log!(Warn, "{detail}");
        crate::nccl::global().set_active(false);
        self.drain_queue();
        self.send_records();
        self.status = Status::Displaced;
        let s = self.session;
        self.send_state(pb::TraceStatus::Displaced, s, detail);
    }

    pub(super) fn send_state(&mut self, status: pb::TraceStatus, session_id: u64, detail: String) {
        self.send(Out::TraceState(pb::TraceState { status: status as i32, session_id, detail }));
    }
}
