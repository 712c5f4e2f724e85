//! The injector's one background thread: owns the daemon connection (hello, commands,
//! batches, heartbeats, drop reports, reconnect with backoff), turns queued CUPTI buffers into
//! protocol messages, and drives the flush timer while tracing. Nothing here runs on CUDA's or
//! the application's threads.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;
use gpuprof_proto::agent::daemon_message::Msg as In;
use prost::Message;

use crate::config::Config;
use crate::convert::Converter;
use crate::log::log;
use crate::tracer::{Backend, Completed, StartOutcome, effective_config};
use crate::wake::{Wake, poll_readable};

/// Largest daemon frame accepted (commands are small).
const MAX_IN_FRAME: usize = 1 << 20;
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Exit handshake between the `atexit` handler and the background thread.
#[derive(Default)]
pub struct Control {
    exit: AtomicBool,
    done: Mutex<bool>,
    cv: Condvar,
    /// True while a daemon connection is up (an exit with none needs no wait).
    pub connected: AtomicBool,
}

impl Control {
    /// Asks the background thread to flush and say goodbye; waits at most `timeout`.
    pub fn request_exit(&self, wake: &Wake, timeout: Duration) -> bool {
        self.exit.store(true, Ordering::SeqCst);
        wake.wake();
        if !self.connected.load(Ordering::SeqCst) {
            return true;
        }
        let Ok(g) = self.done.lock() else { return false };
        match self.cv.wait_timeout_while(g, timeout, |done| !*done) {
            Ok((g, _)) => *g,
            Err(_) => false,
        }
    }

    fn exiting(&self) -> bool {
        self.exit.load(Ordering::SeqCst)
    }

    fn finish(&self) {
        if let Ok(mut g) = self.done.lock() {
            *g = true;
        }
        self.cv.notify_all();
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Idle,
    Tracing,
    Displaced,
}

struct Conn {
    stream: UnixStream,
    rbuf: Vec<u8>,
    welcomed: bool,
    max_frame: usize,
    heartbeat: Duration,
    last_sent: Instant,
    last_drops: pb::DropReport,
}

/// What the process tells the daemon about itself.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub pid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    pub devices: Vec<pb::Device>,
}

impl Identity {
    pub fn of_this_process(devices: Vec<pb::Device>) -> Identity {
        let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
        let cmdline = std::fs::read("/proc/self/cmdline")
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let cgroup = parse_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        Identity { pid: std::process::id(), exe, cmdline, cgroup, devices }
    }
}

/// The unified (v2) cgroup path, else the first hierarchy's.
pub fn parse_cgroup(s: &str) -> String {
    let mut first = None;
    for line in s.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if id == "0" {
            return path.to_string();
        }
        first.get_or_insert_with(|| path.to_string());
    }
    first.unwrap_or_default()
}

pub fn clock_pair() -> pb::ClockPair {
    use gpuprof_cupti::clock;
    pb::ClockPair { realtime_ns: clock::realtime_ns(), monotonic_ns: clock::monotonic_ns() }
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
    flush_every: Duration,
    next_flush: Instant,
    /// Watches a trace with API records on until the first one arrives (see `check_api`).
    api_watch: Option<ApiWatch>,
    /// Frames written on this connection (tests and logs).
    pub frames_sent: u64,
}

/// Kernel and API record counts when the watch (re)started, and the re-enables done.
#[derive(Debug, Clone, Copy)]
struct ApiWatch {
    kernels: u64,
    api: u64,
    attempts: u32,
}

/// Kernels without a single API record after which API recording is switched off and on again.
const API_WATCH_KERNELS: u64 = 64;
/// How often that is tried in one trace.
const API_WATCH_ATTEMPTS: u32 = 3;

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
            flush_every,
            next_flush: Instant::now(),
            api_watch: None,
            frames_sent: 0,
        }
    }

    /// Runs until the process exits (or `control` asks for exit).
    pub fn run(&mut self) {
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
            self.drain_queue();
            self.check_api();
            self.send_records();
            self.send_drops();
        }
        if let Some(c) = &self.conn
            && c.welcomed
            && c.last_sent.elapsed() >= c.heartbeat
        {
            self.send(Out::Heartbeat(pb::Heartbeat { clock: Some(clock_pair()) }));
            self.send_drops();
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

    fn connect(&mut self) {
        match UnixStream::connect(&self.cfg.socket) {
            Ok(stream) => {
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                crate::socket_fd::publish(stream.as_raw_fd());
                log!(Info, "connected to {}", self.cfg.socket.display());
                self.conn = Some(Conn {
                    stream,
                    rbuf: Vec::new(),
                    welcomed: false,
                    max_frame: gpuprof_proto::frame::DEFAULT_MAX_FRAME_BYTES as usize,
                    heartbeat: Duration::from_secs(10),
                    last_sent: Instant::now(),
                    last_drops: pb::DropReport::default(),
                });
                self.control.connected.store(true, Ordering::SeqCst);
                self.conv.reset_connection();
                let hello = pb::Hello {
                    protocol_version: pb::PROTOCOL_VERSION,
                    kind: pb::AgentKind::Injector as i32,
                    pid: self.ident.pid,
                    exe: self.ident.exe.clone(),
                    cmdline: self.ident.cmdline.clone(),
                    cgroup: self.ident.cgroup.clone(),
                    cupti_version: self.backend.cupti_version(),
                    devices: self.ident.devices.clone(),
                    clock: Some(clock_pair()),
                    agent_version: env!("CARGO_PKG_VERSION").to_string(),
                    sampler_device: 0,
                };
                self.send(Out::Hello(hello));
            }
            Err(e) => {
                log!(Debug, "connect {}: {e}; retry in {:?}", self.cfg.socket.display(), self.backoff);
                self.next_connect = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(self.cfg.max_backoff);
            }
        }
    }

    fn disconnect(&mut self, why: &str) {
        if self.conn.take().is_none() {
            return;
        }
        crate::socket_fd::publish(-1);
        log!(Info, "daemon connection closed: {why}");
        self.control.connected.store(false, Ordering::SeqCst);
        // The session belongs to the connection: stop tracing and drop what is queued.
        if self.status == Status::Tracing {
            self.backend.stop();
        }
        self.status = Status::Idle;
        self.session = 0;
        self.conv.set_session(0);
        let dropped: Vec<Completed> = self.rx.try_iter().collect();
        for item in dropped {
            item.for_each(&mut |rec| {
                if let Some(k) = crate::records::peek_kind(rec) {
                    self.conv.count_drop(crate::convert::kind_of_activity(k), 1);
                }
            });
        }
        let _ = self.conv.take_messages();
        self.conv.reset_connection();
        self.next_connect = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(self.cfg.max_backoff);
    }

    fn send(&mut self, msg: Out) -> bool {
        let Some(c) = &mut self.conn else { return false };
        let m = pb::AgentMessage { msg: Some(msg) };
        if m.encoded_len() > c.max_frame {
            log!(Warn, "dropping a {} byte frame over the daemon's limit", m.encoded_len());
            if let Some(pb::agent_message::Msg::Records(b)) = &m.msg {
                self.conv.count_batch_dropped(b);
            }
            return false;
        }
        let mut buf = Vec::with_capacity(m.encoded_len() + 4);
        gpuprof_proto::frame::encode_frame(&m, &mut buf);
        match c.stream.write_all(&buf) {
            Ok(()) => {
                c.last_sent = Instant::now();
                self.frames_sent += 1;
                true
            }
            Err(e) => {
                let why = format!("write: {e}");
                self.disconnect(&why);
                false
            }
        }
    }

    fn read_socket(&mut self) {
        let Some(c) = &mut self.conn else { return };
        let mut tmp = [0u8; 16 << 10];
        match c.stream.read(&mut tmp) {
            Ok(0) => return self.disconnect("closed by daemon"),
            Ok(n) => c.rbuf.extend_from_slice(&tmp[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted || e.kind() == std::io::ErrorKind::WouldBlock => {
                return;
            }
            Err(e) => return self.disconnect(&format!("read: {e}")),
        }
        loop {
            let Some(c) = &mut self.conn else { return };
            if c.rbuf.len() < 4 {
                return;
            }
            let len = u32::from_le_bytes([c.rbuf[0], c.rbuf[1], c.rbuf[2], c.rbuf[3]]) as usize;
            if len > MAX_IN_FRAME {
                return self.disconnect(&format!("daemon frame of {len} bytes over {MAX_IN_FRAME}"));
            }
            if c.rbuf.len() < 4 + len {
                return;
            }
            let msg = pb::DaemonMessage::decode(&c.rbuf[4..4 + len]);
            c.rbuf.drain(..4 + len);
            match msg {
                Ok(m) => self.handle(m),
                Err(e) => return self.disconnect(&format!("malformed daemon message: {e}")),
            }
        }
    }

    fn handle(&mut self, m: pb::DaemonMessage) {
        let Some(msg) = m.msg else { return };
        let welcomed = self.conn.as_ref().is_some_and(|c| c.welcomed);
        match msg {
            In::Welcome(w) => {
                if let Some(c) = &mut self.conn {
                    c.welcomed = true;
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
            In::StartPcSampling(p) => {
                log!(Warn, "PC sampling for session {} not supported by this injector build", p.session_id);
            }
            In::StopPcSampling(_) | In::StartPmSampling(_) | In::StopPmSampling(_) => {}
        }
    }

    fn start_trace(&mut self, s: pb::StartTrace) {
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

    /// CUPTI can miss hooking the CUDA runtime when a trace starts while the runtime is still
    /// initialising (seen in PyTorch processes): kernels then arrive but no API call ever does.
    /// Once `API_WATCH_KERNELS` kernels came without one, API recording is switched off and on
    /// again (at most `API_WATCH_ATTEMPTS` times); the first API record ends the watch.
    fn check_api(&mut self) {
        let Some(w) = self.api_watch else { return };
        let kernels = self.conv.sent[pb::RecordKind::Kernel as usize];
        let api = self.conv.sent[pb::RecordKind::Api as usize];
        if api > w.api || w.attempts >= API_WATCH_ATTEMPTS {
            self.api_watch = None;
            return;
        }
        if kernels.saturating_sub(w.kernels) < API_WATCH_KERNELS {
            return;
        }
        let redone = self.backend.reapply_api();
        log!(Info, "{} kernels and no API record: API recording re-enabled ({redone})", kernels - w.kernels);
        self.api_watch = redone.then_some(ApiWatch { kernels, api, attempts: w.attempts + 1 });
    }

    fn stop_trace(&mut self, session_id: u64) {
        if self.status == Status::Idle || (session_id != 0 && session_id != self.session) {
            return;
        }
        if self.status == Status::Tracing {
            self.backend.stop();
            self.drain_queue();
            self.send_records();
        }
        self.send_drops();
        let ended = self.session;
        self.status = Status::Idle;
        self.session = 0;
        self.conv.set_session(0);
        self.send_state(pb::TraceStatus::Idle, ended, String::new());
    }

    fn displaced(&mut self, detail: String) {
        log!(Warn, "{detail}");
        self.drain_queue();
        self.send_records();
        self.status = Status::Displaced;
        let s = self.session;
        self.send_state(pb::TraceStatus::Displaced, s, detail);
    }

    fn send_state(&mut self, status: pb::TraceStatus, session_id: u64, detail: String) {
        self.send(Out::TraceState(pb::TraceState { status: status as i32, session_id, detail }));
    }

    /// Decodes every queued buffer into the converter, sending full batches on the way.
    fn drain_queue(&mut self) {
        while let Ok(item) = self.rx.try_recv() {
            if self.status != Status::Tracing && self.status != Status::Displaced {
                continue; // late buffers of a stopped trace with no connection: dropped
            }
            let conv = &mut self.conv;
            let mut full = false;
            item.for_each(&mut |rec| {
                conv.push_raw(rec, &|a| item.read_str(a));
                full |= conv.full();
            });
            drop(item);
            if full || self.conv.full() {
                self.send_records();
            }
        }
    }

    fn send_records(&mut self) {
        if self.conn.as_ref().is_none_or(|c| !c.welcomed) {
            return;
        }
        for m in self.conv.take_messages() {
            if let Some(msg) = m.msg
                && !self.send(msg)
            {
                return;
            }
        }
    }

    fn send_drops(&mut self) {
        let (queue, cupti) = self.backend.external_drops();
        let mut report = self.conv.drop_report(cupti);
        for (i, &n) in queue.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if let Some(c) = report.counts.iter_mut().find(|c| c.kind == i as i32) {
                c.dropped += n;
            } else {
                report.counts.push(pb::DropCount { kind: i as i32, dropped: n });
            }
        }
        let Some(c) = &self.conn else { return };
        if !c.welcomed || report == c.last_drops {
            return;
        }
        let sent = report.clone();
        if self.send(Out::Drops(report))
            && let Some(c) = &mut self.conn
        {
            c.last_drops = sent;
        }
    }

    /// At exit the handler has already flushed CUPTI on the exiting thread; only what is queued
    /// is sent. CUPTI is not touched from here (CUDA may be torn down by now).
    fn on_exit(&mut self) {
        if self.status == Status::Tracing {
            self.drain_queue();
            self.send_records();
        }
        self.send_drops();
        if self.conn.as_ref().is_some_and(|c| c.welcomed) {
            self.send(Out::Goodbye(pb::Goodbye { reason: "process exit".into() }));
        }
        self.status = Status::Idle;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths() {
        assert_eq!(parse_cgroup("0::/kubepods/pod1/abc\n"), "/kubepods/pod1/abc");
        assert_eq!(parse_cgroup("12:cpu,cpuacct:/docker/x\n11:memory:/docker/x\n"), "/docker/x");
        assert_eq!(parse_cgroup(""), "");
    }
}

/// End to end over a real Unix socket: a scripted daemon, a fake backend that produces
/// CUPTI-layout byte buffers, and the agent loop on its own thread.
#[cfg(test)]
mod e2e {
    use super::*;
    use crate::records::tests::kernel_bytes;
    use crate::tracer::RecordSource;
    use crossbeam_channel::Sender;
    use gpuprof_proto::frame::{read_message, write_frame};
    use std::os::unix::net::UnixListener;

    struct FakeBuffer(Vec<Vec<u8>>);
    impl RecordSource for FakeBuffer {
        fn for_each(&self, f: &mut dyn FnMut(&[u8])) {
            for r in &self.0 {
                f(r);
            }
        }
        fn read_str(&self, addr: u64) -> Option<String> {
            Some(format!("kernel_{addr:x}"))
        }
    }

    /// Queues `n` kernels when a trace starts, and `tail` more when it stops (a final flush).
    struct FakeBackend {
        tx: Sender<Completed>,
        wake: Arc<Wake>,
        n: u32,
        tail: u32,
        displace_on_tick: bool,
        reapplied: Arc<std::sync::atomic::AtomicU32>,
    }
    impl FakeBackend {
        fn queue(&self, first: u32, n: u32) {
            let recs =
                (first..first + n).map(|i| kernel_bytes(i, 1000 + u64::from(i), 2000 + u64::from(i), 0xabc)).collect();
            self.tx.send(Box::new(FakeBuffer(recs))).unwrap();
            self.wake.wake();
        }
    }
    impl Backend for FakeBackend {
        fn cupti_version(&self) -> u32 {
            130001
        }
        fn start(&mut self, cfg: &pb::TraceConfig) -> StartOutcome {
            assert!(cfg.kernels);
            self.queue(1, self.n);
            StartOutcome::Tracing
        }
        fn stop(&mut self) {
            self.queue(self.n + 1, self.tail);
        }
        fn tick(&mut self) -> Option<String> {
            self.displace_on_tick.then(|| "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39): test".to_string())
        }
        fn external_drops(&self) -> ([u64; 16], u64) {
            ([0; 16], 0)
        }
        fn reapply_api(&mut self) -> bool {
            self.reapplied.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    fn daemon_send(s: &mut UnixStream, m: In) {
        write_frame(s, &pb::DaemonMessage { msg: Some(m) }).unwrap();
    }

    fn next(s: &mut UnixStream) -> Out {
        let m: pb::AgentMessage = read_message(s, 8 << 20).expect("agent message");
        m.msg.expect("non-empty")
    }

    /// Reads messages until `pred` matches one, returning all read.
    fn until(s: &mut UnixStream, pred: impl Fn(&Out) -> bool) -> Vec<Out> {
        let mut seen = Vec::new();
        loop {
            let m = next(s);
            let done = pred(&m);
            seen.push(m);
            if done {
                return seen;
            }
        }
    }

    fn start_agent(
        dir: &std::path::Path,
        displace: bool,
    ) -> (UnixListener, Arc<Control>, Arc<Wake>, std::thread::JoinHandle<()>, Arc<std::sync::atomic::AtomicU32>) {
        let sock = dir.join("agent.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(16);
        let wake = Arc::new(Wake::new().unwrap());
        let control = Arc::new(Control::default());
        let cfg = Config { socket: sock, flush_interval: Duration::from_millis(20), ..Config::default() };
        let ident = Identity { pid: 4242, exe: "/usr/bin/python3".into(), ..Default::default() };
        let reapplied = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let backend = FakeBackend {
            tx,
            wake: wake.clone(),
            n: 20_000,
            tail: 5,
            displace_on_tick: displace,
            reapplied: reapplied.clone(),
        };
        let (c2, w2) = (control.clone(), wake.clone());
        let h = std::thread::spawn(move || Agent::new(cfg, ident, backend, rx, w2, c2).run());
        (listener, control, wake, h, reapplied)
    }

    #[test]
    fn hello_trace_stop_and_exit_over_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (listener, control, wake, h, reapplied) = start_agent(dir.path(), false);
        let (mut s, _) = listener.accept().unwrap();
        let Out::Hello(hello) = next(&mut s) else { panic!("hello first") };
        assert_eq!(hello.protocol_version, pb::PROTOCOL_VERSION);
        assert_eq!((hello.pid, hello.cupti_version), (4242, 130001));
        assert_eq!(hello.kind, pb::AgentKind::Injector as i32);
        assert!(hello.clock.unwrap().realtime_ns > 1_600_000_000_000_000_000);
        daemon_send(
            &mut s,
            In::Welcome(pb::Welcome {
                protocol_version: 1,
                process_id: 1,
                max_frame_bytes: 4 << 20,
                heartbeat_interval_ms: 50,
            }),
        );
        let idle = until(&mut s, |m| matches!(m, Out::TraceState(_)));
        let Some(Out::TraceState(st)) = idle.last() else { panic!() };
        assert_eq!(st.status, pb::TraceStatus::Idle as i32);

        daemon_send(&mut s, In::StartTrace(pb::StartTrace { session_id: 9, config: None }));
        let mut strings = 0;
        let mut kernels = Vec::new();
        let mut tracing = false;
        while kernels.len() < 20_000 {
            match next(&mut s) {
                Out::Strings(t) => {
                    assert_eq!(kernels.len(), 0, "strings precede the records using them");
                    strings += t.strings.len();
                }
                Out::Records(b) => {
                    assert_eq!(b.session_id, 9);
                    kernels.extend(b.kernels);
                }
                Out::TraceState(t) => {
                    assert_eq!((t.status, t.session_id), (pb::TraceStatus::Tracing as i32, 9));
                    tracing = true;
                }
                Out::Heartbeat(_) | Out::Drops(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(tracing);
        assert_eq!(strings, 1, "one kernel name, interned once");
        assert!(kernels.iter().all(|k| k.name_id == 1));
        let mut ids: Vec<u32> = kernels.iter().map(|k| k.correlation_id).collect();
        ids.dedup();
        assert_eq!(ids.len(), 20_000);

        daemon_send(&mut s, In::StopTrace(pb::StopTrace { session_id: 9 }));
        let rest = until(&mut s, |m| matches!(m, Out::TraceState(t) if t.status == pb::TraceStatus::Idle as i32));
        let tail: usize = rest.iter().map(|m| if let Out::Records(b) = m { b.kernels.len() } else { 0 }).sum();
        assert_eq!(tail, 5, "the final flush is sent before the idle state");
        // 20,000 kernels and no API record with API recording on: re-enabled, at most 3 times.
        let n = reapplied.load(Ordering::SeqCst);
        assert!((1..=API_WATCH_ATTEMPTS).contains(&n), "re-enabled {n} times");

        let t0 = Instant::now();
        let ok = control.request_exit(&wake, Duration::from_secs(2));
        assert!(ok && t0.elapsed() < Duration::from_secs(1));
        let bye = until(&mut s, |m| matches!(m, Out::Goodbye(_)));
        assert!(matches!(bye.last(), Some(Out::Goodbye(_))));
        h.join().unwrap();
    }

    #[test]
    fn reports_displacement_and_reconnects_after_a_daemon_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (listener, control, wake, h, _) = start_agent(dir.path(), true);
        let (mut s, _) = listener.accept().unwrap();
        assert!(matches!(next(&mut s), Out::Hello(_)));
        daemon_send(
            &mut s,
            In::Welcome(pb::Welcome {
                protocol_version: 1,
                process_id: 1,
                max_frame_bytes: 0,
                heartbeat_interval_ms: 0,
            }),
        );
        daemon_send(&mut s, In::StartTrace(pb::StartTrace { session_id: 3, config: None }));
        let seen = until(&mut s, |m| matches!(m, Out::TraceState(t) if t.status == pb::TraceStatus::Displaced as i32));
        let Some(Out::TraceState(t)) = seen.last() else { panic!() };
        assert_eq!(t.session_id, 3);
        assert!(t.detail.contains("39"), "{}", t.detail);

        // Daemon restart: the connection drops; the agent reconnects and says hello again.
        drop(s);
        let (mut s2, _) = listener.accept().unwrap();
        assert!(matches!(next(&mut s2), Out::Hello(_)));
        control.request_exit(&wake, Duration::from_millis(10));
        h.join().unwrap();
    }

    #[test]
    fn no_daemon_is_a_silent_no_op_and_exit_does_not_wait() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, rx) = crossbeam_channel::bounded(4);
        let wake = Arc::new(Wake::new().unwrap());
        let control = Arc::new(Control::default());
        let cfg = Config { socket: dir.path().join("absent.sock"), ..Config::default() };
        let backend = FakeBackend {
            tx,
            wake: wake.clone(),
            n: 1,
            tail: 0,
            displace_on_tick: false,
            reapplied: Default::default(),
        };
        let (c2, w2) = (control.clone(), wake.clone());
        let h = std::thread::spawn(move || Agent::new(cfg, Identity::default(), backend, rx, w2, c2).run());
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        assert!(control.request_exit(&wake, Duration::from_secs(5)));
        assert!(t0.elapsed() < Duration::from_millis(100));
        h.join().unwrap();
    }
}
