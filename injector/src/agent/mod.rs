//! The injector's one background thread: owns the daemon connection (hello, commands,
//! batches, heartbeats, drop reports, reconnect with backoff), turns queued CUPTI buffers into
//! protocol messages, and drives the flush timer while tracing. Nothing here runs on CUDA's or
//! the application's threads.
//!
//! Layout: this module holds the [`Agent`] and its loop (poll, step, daemon command dispatch,
//! exit); `conn` the daemon connection (connect, framing, reconnect); `trace` trace start/stop
//! and displacement; `forward` queued buffers → batches → the socket, and drop reports;
//! `api_watch` the re-enabling of API recording when none arrives; `control` the exit handshake
//! with the `atexit` handler; `identity` what the process tells the daemon about itself.

mod api_watch;
mod conn;
mod control;
#[cfg(test)]
mod e2e;
#[cfg(test)]
mod e2e_pc;
mod forward;
mod identity;
pub mod job;
mod pc;
mod trace;

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;
use gpuprof_proto::agent::daemon_message::Msg as In;

use api_watch::ApiWatch;
use conn::{Conn, FIRST_BACKOFF};
pub use control::Control;
pub use identity::{Identity, clock_pair, parse_cgroup};
pub use pc::STILL_STOPPING;

use crate::config::Config;
use crate::convert::Converter;
use crate::log::log;
use crate::sys::{Wake, poll_readable};
use crate::tracer::{Backend, Completed};

/// While a detach left pending at the stop waits for the application: how often it is looked at.
const DETACH_POLL: Duration = Duration::from_millis(100);
/// How often a traced process reports the devices it works on (the daemon counts a process as
/// working on a GPU for `[pc] active_for`, 3 s by default, after a report).
const ACTIVITY_EVERY: Duration = Duration::from_millis(800);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Idle,
    Tracing,
    Displaced,
}

pub struct Agent<B: Backend> {
    cfg: Config,
    ident: Identity,
    backend: B,
    rx: Receiver<Completed>,
    wake: Arc<Wake>,
    control: Arc<Control>,
    conv: Converter,
    conn: Option<Conn>,
    next_connect: Instant,
    backoff: Duration,
    status: Status,
    session: u64,
    /// The session whose stop left a detach pending: told how it ended.
    detach_session: u64,
    flush_every: Duration,
    next_flush: Instant,
    /// Watches a trace with API records on until the first one arrives (see `check_api`).
    api_watch: Option<ApiWatch>,
    /// PC-sampling leases and their collection timer.
    pc: pc::PcState,
    /// When the last DeviceActivity went out.
    last_activity: Instant,
    /// Frames written on this connection (tests and logs).
    pub frames_sent: u64,
}

impl<B: Backend> Agent<B> {
    pub fn new(
        cfg: Config,
        ident: Identity,
        backend: B,
        rx: Receiver<Completed>,
        wake: Arc<Wake>,
        control: Arc<Control>,
    ) -> Self {
        let mut conv = Converter::new();
        conv.learn_devices(&ident.devices);
        let flush_every = cfg.flush_interval;
        Agent {
            cfg,
            ident,
            backend,
            rx,
            wake,
            control,
            conv,
            conn: None,
            next_connect: Instant::now(),
            backoff: FIRST_BACKOFF,
            status: Status::Idle,
            session: 0,
            detach_session: 0,
            flush_every,
            next_flush: Instant::now(),
            api_watch: None,
            pc: pc::PcState::default(),
            last_activity: Instant::now(),
            frames_sent: 0,
        }
    }

    /// Runs until the process exits (or `control` asks for exit).
    pub fn run(&mut self) {
        crate::nccl::global().set_kernel_times(self.cfg.nccl_kernel_times);
        crate::nccl::global().set_ready();
        loop {
            if self.control.exiting() {
                self.on_exit();
                self.control.finish();
                return;
            }
            self.step();
            let timeout = self.poll_timeout();
            let sock = self.conn.as_ref().map(|c| c.stream.as_raw_fd());
            let mut fds = vec![self.wake.fd()];
            fds.extend(sock);
            let ready = poll_readable(&fds, timeout);
            if ready[0] {
                self.wake.drain();
            }
            if ready.get(1).copied().unwrap_or(false) {
                self.read_socket();
            }
        }
    }

    /// One round of non-blocking work: connect if due, decode queued buffers, flush timer,
    /// heartbeat.
    pub fn step(&mut self) {
        let now = Instant::now();
        if self.conn.is_none() && now >= self.next_connect {
            self.connect();
        }
        self.drain_queue();
        if self.status == Status::Tracing && Instant::now() >= self.next_flush {
            if let Some(detail) = self.backend.tick() {
                self.displaced(detail);
            }
            self.next_flush = Instant::now() + self.flush_every;
            crate::nccl::global().flush_older_than(crate::nccl::STALE.as_nanos() as u64);
            self.send_activity();
            self.drain_queue();
            self.check_api();
            self.send_records();
            self.send_drops();
        }
        if self.pc.next.is_some_and(|t| Instant::now() >= t) {
            self.collect_pc();
        }
        if self.status == Status::Idle
            && let Some(detail) = self.backend.poll_detach()
        {
            log!(Info, "the detach left pending at the stop is done: {detail}");
            let s = std::mem::take(&mut self.detach_session);
            if s != 0 {
                self.send_state(pb::TraceStatus::Idle, s, detail);
            }
        }
        if let Some(c) = &self.conn
            && c.welcomed
            && c.last_sent.elapsed() >= c.heartbeat
        {
            self.send(Out::Heartbeat(pb::Heartbeat { clock: Some(clock_pair()) }));
            self.send_drops();
        }
    }

    /// Tells the daemon, about every [`ACTIVITY_EVERY`], on which devices this process works
    /// (for its GPUs' PC-sampling schedulers).
    fn send_activity(&mut self) {
        if self.last_activity.elapsed() < ACTIVITY_EVERY {
            return;
        }
        self.last_activity = Instant::now();
        let ids: Vec<u32> = self.ident.devices.iter().map(|d| d.id).collect();
        let devices: Vec<pb::DeviceUse> = self
            .backend
            .device_activity(&ids)
            .into_iter()
            .filter(|(_, _, syncs, launches)| *syncs > 0 || *launches > 0)
            .map(|(device_id, context, syncs, launches)| pb::DeviceUse { device_id, context, syncs, launches })
            .collect();
        log!(
            Debug,
            "device activity: {:?}",
            devices.iter().map(|d| (d.device_id, d.syncs, d.launches)).collect::<Vec<_>>()
        );
        if !devices.is_empty() {
            self.send(Out::DeviceActivity(pb::DeviceActivity { devices }));
        }
    }

    fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        let mut deadline: Option<Instant> = None;
        let mut consider = |t: Instant| deadline = Some(deadline.map_or(t, |d| d.min(t)));
        if self.conn.is_none() {
            consider(self.next_connect);
        }
        if self.status == Status::Tracing {
            consider(self.next_flush);
        }
        if let Some(t) = self.pc.next {
            consider(t);
        }
        if self.status == Status::Idle && self.backend.detach_pending() {
            consider(now + DETACH_POLL);
        }
        if let Some(c) = &self.conn
            && c.welcomed
        {
            consider(c.last_sent + c.heartbeat);
        }
        match deadline {
            None => -1,
            Some(d) => d.saturating_duration_since(now).as_millis().min(60_000) as i32,
        }
    }

    fn handle(&mut self, m: pb::DaemonMessage) {
        let Some(msg) = m.msg else { return };
        let welcomed = self.conn.as_ref().is_some_and(|c| c.welcomed);
        match msg {
            In::Welcome(w) => {
                if let Some(c) = &mut self.conn {
                    c.welcomed = true;
                    c.cubin_cache = w.cubin_cache;
                    if w.max_frame_bytes > 0 {
                        c.max_frame = w.max_frame_bytes as usize;
                    }
                    if w.heartbeat_interval_ms > 0 {
                        c.heartbeat = Duration::from_millis(u64::from(w.heartbeat_interval_ms));
                    }
                }
                self.backoff = FIRST_BACKOFF;
                log!(Info, "welcome: process id {}", w.process_id);
                self.send_state(pb::TraceStatus::Idle, 0, String::new());
            }
            _ if !welcomed => self.disconnect("command before welcome"),
            In::StartTrace(s) => self.start_trace(s),
            In::StopTrace(s) => self.stop_trace(s.session_id),
            In::StartPcSampling(p) => self.start_pc(p),
            In::StopPcSampling(p) => {
                let reason = if p.reason.is_empty() { "lease ended".to_string() } else { p.reason };
                self.stop_pc(p.device_id, &reason);
            }
            In::Cubin(c) => self.pc_cubin_piece(c),
            In::CubinAnswer(a) => self.pc_cubin_answer(a),
            In::StartPmSampling(_) | In::StopPmSampling(_) => {}
        }
    }

    /// At exit the handler has already flushed CUPTI on the exiting thread; only what is queued
    /// is sent. CUPTI is not touched from here (CUDA may be torn down by now).
    fn on_exit(&mut self) {
        if self.status == Status::Tracing {
            // NCCL collectives still waiting for kernel channels go with what they have.
            crate::nccl::global().flush_older_than(0);
            self.drain_queue();
            self.send_records();
        }
        self.send_drops();
        self.pc_exit();
        if self.conn.as_ref().is_some_and(|c| c.welcomed) {
            self.send(Out::Goodbye(pb::Goodbye { reason: "process exit".into() }));
        }
        self.status = Status::Idle;
    }
}
