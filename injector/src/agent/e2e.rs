//! End to end over a real Unix socket: a scripted daemon, a fake backend that produces
//! CUPTI-layout byte buffers, and the agent loop on its own thread.

use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;
use gpuprof_proto::agent::daemon_message::Msg as In;
use gpuprof_proto::frame::{read_message, write_frame};

use super::api_watch::API_WATCH_ATTEMPTS;
use super::{Agent, Control, Identity};
use crate::config::Config;
use crate::records::tests::kernel_bytes;
use crate::sys::Wake;
use crate::tracer::{
    Backend, Completed, CubinAnswer, PcBackend, PcBatch, PcEvent, PcEventKind, PcOutput, PcRequest, PcRow,
    RecordSource, StartOutcome,
};

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
    pc: Option<(PcRequest, u32)>,
    pc_stopped: Option<String>,
    /// The stop leaves the detach pending; it is done at the third poll.
    pending_detach: Option<u32>,
    /// gpuprofd's last answer to a cubin query, told back as a state's detail.
    cubin_answer: Option<CubinAnswer>,
}
impl PcBackend for FakeBackend {
    fn pc_start(&mut self, req: PcRequest) -> Result<(), String> {
        if req.device == 7 {
            return Err("no device 7".into());
        }
        if self.pc_stopped.is_some() {
            return Err(super::STILL_STOPPING.into());
        }
        self.pc = Some((req, 0));
        Ok(())
    }
    fn pc_stop(&mut self, _device: u32, reason: &str) {
        self.pc_stopped = Some(reason.to_string());
    }
    /// Device 1 stops slowly (as when the application makes no CUDA call for a while): the
    /// stop is done at the next collection, not at once.
    fn pc_finish(&mut self) -> PcOutput {
        if self.pc.as_ref().is_some_and(|(r, _)| r.device == 1) {
            return PcOutput::default();
        }
        self.pc_collect()
    }
    fn device_activity(&mut self, devices: &[u32]) -> Vec<(u32, bool, u64, u64)> {
        // Works on its first device only (synchronizing), launches on its second without
        // synchronizing; a context on every one.
        devices
            .iter()
            .enumerate()
            .map(|(i, &d)| (d, true, if i == 0 { 5 } else { 0 }, if i == 1 { 9 } else { 0 }))
            .collect()
    }
    fn pc_cubin_answer(&mut self, answer: CubinAnswer) {
        self.cubin_answer = Some(answer);
    }
    fn pc_collect(&mut self) -> PcOutput {
        let mut out = PcOutput::default();
        let Some((req, n)) = &mut self.pc else { return out };
        *n += 1;
        // Device 3 was attached late: it asks gpuprofd for three cubins and reports one found
        // in no mapped file, then tells what the answer held.
        if req.device == 3 {
            if *n == 1 {
                out.cubin_query = ["00000000000000aa", "00000000000000bb", "00000000000000cc"].map(String::from).into();
                out.cubins_not_found = vec!["00000000000000dd".into()];
            }
            if let Some(a) = self.cubin_answer.take() {
                let cubins: Vec<(String, usize)> = a.cubins.iter().map(|(h, b)| (h.clone(), b.len())).collect();
                let detail = format!("answer: {cubins:?} nowhere {:?} unknown {:?}", a.nowhere, a.unknown);
                out.events.push(PcEvent { device: 3, kind: PcEventKind::Sampling, detail });
            }
            return out;
        }
        // Device 2 samples in windows: nothing is read before its first window closes (here,
        // its fourth collection).
        if req.device == 2 && *n < 4 {
            if *n == 1 {
                out.events.push(PcEvent { device: 2, kind: PcEventKind::Sampling, detail: "period 2^15".into() });
            }
            return out;
        }
        let f: Arc<str> = Arc::from("_Z4axpyPfS_f");
        let row = |stall: &str, count| PcRow {
            function: f.clone(),
            pc_offset: 0x40,
            stall: Arc::from(stall),
            count,
            module: "00000000deadbeef".into(),
            file: Arc::from("/src/axpy.cu"),
            line: 12,
        };
        out.batches.push(PcBatch {
            device: req.device,
            start_ns: 1,
            end_ns: 2,
            rows: vec![row("stalled_long_scoreboard", 30), row("selected", 10)],
            total_samples: 45,
            dropped_samples: 5,
            sampled_ns: 1_000_000,
        });
        if *n == 1 {
            out.events.push(PcEvent { device: req.device, kind: PcEventKind::Sampling, detail: "period 2^10".into() });
        }
        out.cubins.push(("00000000deadbeef".into(), Arc::new(vec![7u8; (5 << 20) / 2])));
        if let Some(reason) = self.pc_stopped.take() {
            out.events.push(PcEvent { device: req.device, kind: PcEventKind::Stopped, detail: reason });
            self.pc = None;
        }
        out
    }
    /// What the exiting thread read when it disabled sampling: one batch of 99 samples.
    fn pc_exit(&mut self) -> PcOutput {
        let mut out = PcOutput::default();
        let Some((req, _)) = self.pc.take() else { return out };
        out.batches.push(PcBatch {
            device: req.device,
            start_ns: 3,
            end_ns: 4,
            rows: vec![PcRow {
                function: Arc::from("_Z4axpyPfS_f"),
                pc_offset: 0x80,
                stall: Arc::from("selected"),
                count: 99,
                module: String::new(),
                file: Arc::from(""),
                line: 0,
            }],
            total_samples: 99,
            dropped_samples: 0,
            sampled_ns: 0,
        });
        out.events.push(PcEvent { device: req.device, kind: PcEventKind::Stopped, detail: "process exit".into() });
        out
    }
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
    fn detach(&mut self) -> String {
        match self.pending_detach {
            Some(_) => "detached: finalize pending (at the next CUDA synchronization)".into(),
            None => "detached: finalized".into(),
        }
    }
    fn detach_pending(&self) -> bool {
        self.pending_detach.is_some_and(|n| n < 3)
    }
    fn poll_detach(&mut self) -> Option<String> {
        let n = self.pending_detach.as_mut().filter(|n| **n < 3)?;
        *n += 1;
        (*n == 3).then(|| "detached: finalized".into())
    }
    fn tick(&mut self) -> Option<String> {
        self.displace_on_tick.then(|| "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39): test".to_string())
    }
    fn external_drops(&self) -> ([u64; gpuprof_proto::kinds::SLOTS], u64) {
        ([0; gpuprof_proto::kinds::SLOTS], 0)
    }
    fn reapply_api(&mut self) -> bool {
        self.reapplied.fetch_add(1, Ordering::SeqCst);
        true
    }
}

pub(super) fn daemon_send(s: &mut UnixStream, m: In) {
    write_frame(s, &pb::DaemonMessage { msg: Some(m) }).unwrap();
}

pub(super) fn next(s: &mut UnixStream) -> Out {
    let m: pb::AgentMessage = read_message(s, 8 << 20).expect("agent message");
    m.msg.expect("non-empty")
}

/// Reads messages until `pred` matches one, returning all read.
pub(super) fn until(s: &mut UnixStream, pred: impl Fn(&Out) -> bool) -> Vec<Out> {
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

/// Starts a trace of session `session` and waits until the agent says it is tracing.
pub(super) fn start_tracing(s: &mut UnixStream, session: u64) {
    daemon_send(s, In::StartTrace(pb::StartTrace { session_id: session, config: None }));
    until(s, |m| matches!(m, Out::TraceState(t) if t.status == pb::TraceStatus::Tracing as i32));
}

/// Accepts the agent's connection, reads its hello and welcomes it (no heartbeats).
pub(super) fn accept_welcomed(listener: &UnixListener) -> UnixStream {
    let (mut s, _) = listener.accept().unwrap();
    assert!(matches!(next(&mut s), Out::Hello(_)));
    daemon_send(
        &mut s,
        In::Welcome(pb::Welcome {
            protocol_version: 1,
            process_id: 1,
            max_frame_bytes: 4 << 20,
            heartbeat_interval_ms: 0,
            cubin_cache: true,
        }),
    );
    s
}

pub(super) type Started =
    (UnixListener, Arc<Control>, Arc<Wake>, std::thread::JoinHandle<()>, Arc<std::sync::atomic::AtomicU32>);

pub(super) fn start_agent(dir: &std::path::Path, displace: bool) -> Started {
    start_agent_with(dir, displace, None)
}

fn start_agent_with(dir: &std::path::Path, displace: bool, pending_detach: Option<u32>) -> Started {
    let sock = dir.join("agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(16);
    let wake = Arc::new(Wake::new().unwrap());
    let control = Arc::new(Control::default());
    let cfg = Config { socket: sock, flush_interval: Duration::from_millis(20), ..Config::default() };
    let devices = (0..2).map(|id| pb::Device { id, ..Default::default() }).collect();
    let job = pb::JobIdentity { job_id: "run-42".into(), rank: Some(1), ..Default::default() };
    let ident = Identity { pid: 4242, exe: "/usr/bin/python3".into(), devices, job: Some(job), ..Default::default() };
    let reapplied = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let backend = FakeBackend {
        tx,
        wake: wake.clone(),
        n: 20_000,
        tail: 5,
        displace_on_tick: displace,
        reapplied: reapplied.clone(),
        pc: None,
        pc_stopped: None,
        pending_detach,
        cubin_answer: None,
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
    let job = hello.job.clone().unwrap_or_default();
    assert_eq!((job.job_id.as_str(), job.rank), ("run-42", Some(1)), "the job identity travels with the hello");
    assert_eq!(hello.kind, pb::AgentKind::Injector as i32);
    assert!(hello.clock.unwrap().realtime_ns > 1_600_000_000_000_000_000);
    daemon_send(
        &mut s,
        In::Welcome(pb::Welcome {
            protocol_version: 1,
            process_id: 1,
            max_frame_bytes: 4 << 20,
            heartbeat_interval_ms: 50,
            cubin_cache: false,
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
    match rest.last() {
        Some(Out::TraceState(t)) => {
            assert_eq!(t.session_id, 9);
            assert_eq!(t.detail, "detached: finalized", "the idle state says how CUPTI was left");
        }
        other => panic!("expected the idle state last, got {other:?}"),
    }
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

/// A detach left pending at the stop: the idle state says so, and once the application carried
/// it out the session is told how it ended (the daemon updates the member's detail).
#[test]
fn a_traced_process_reports_the_devices_it_works_on() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    daemon_send(&mut s, In::StartTrace(pb::StartTrace { session_id: 9, config: None }));
    let seen = until(&mut s, |m| matches!(m, Out::DeviceActivity(_)));
    let Some(Out::DeviceActivity(a)) = seen.last() else { panic!() };
    assert_eq!(
        a.devices,
        [
            pb::DeviceUse { device_id: 0, context: true, syncs: 5, launches: 0 },
            pb::DeviceUse { device_id: 1, context: true, syncs: 0, launches: 9 },
        ],
        "a device launched on without a synchronization is worked on too"
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "reported within a flush or two: {:?}", t0.elapsed());
    assert!(control.request_exit(&wake, Duration::from_secs(2)));
    h.join().unwrap();
}

#[test]
fn a_lease_granted_while_the_last_is_still_stopping_starts_once_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    start_tracing(&mut s, 5);
    let start = || {
        In::StartPcSampling(pb::StartPcSampling {
            session_id: 5,
            device_id: 1,
            flush_interval_ms: 100,
            ..Default::default()
        })
    };
    let state = |st: pb::PcSamplingStatus| move |m: &Out| matches!(m, Out::PcSamplingState(x) if x.status == st as i32);
    daemon_send(&mut s, start());
    until(&mut s, state(pb::PcSamplingStatus::Sampling));
    // The turn ends and the next begins before the application let the first stop.
    daemon_send(
        &mut s,
        In::StopPcSampling(pb::StopPcSampling { session_id: 5, device_id: 1, reason: "turn over".into() }),
    );
    daemon_send(&mut s, start());
    let seen = until(&mut s, state(pb::PcSamplingStatus::Stopped));
    assert!(!seen.iter().any(state(pb::PcSamplingStatus::Failed)), "not refused: {seen:?}");
    let seen = until(&mut s, state(pb::PcSamplingStatus::Sampling));
    assert!(!seen.iter().any(state(pb::PcSamplingStatus::Failed)), "{seen:?}");
    // And it samples: batches of the new lease.
    until(&mut s, |m| matches!(m, Out::PcSamples(b) if b.session_id == 5 && b.device_id == 1));
    assert!(control.request_exit(&wake, Duration::from_secs(2)));
    h.join().unwrap();
}

#[test]
fn a_pending_detach_is_reported_to_its_session_once_done() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent_with(dir.path(), false, Some(0));
    let mut s = accept_welcomed(&listener);
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    start_tracing(&mut s, 9);
    daemon_send(&mut s, In::StopTrace(pb::StopTrace { session_id: 9 }));
    let idle = |m: &Out| matches!(m, Out::TraceState(t) if t.status == pb::TraceStatus::Idle as i32);
    let Some(Out::TraceState(first)) = until(&mut s, idle).pop() else { panic!() };
    assert_eq!(
        (first.session_id, first.detail.as_str()),
        (9, "detached: finalize pending (at the next CUDA synchronization)")
    );
    let t0 = Instant::now();
    let Some(Out::TraceState(done)) = until(&mut s, idle).pop() else { panic!() };
    assert_eq!((done.session_id, done.detail.as_str()), (9, "detached: finalized"));
    assert!(t0.elapsed() < Duration::from_secs(2), "polled while pending, not at the next heartbeat");
    assert!(control.request_exit(&wake, Duration::from_secs(2)));
    until(&mut s, |m| matches!(m, Out::Goodbye(_)));
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
        In::Welcome(pb::Welcome { protocol_version: 1, process_id: 1, max_frame_bytes: 0, ..Default::default() }),
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
        pc: None,
        pc_stopped: None,
        pending_detach: None,
        cubin_answer: None,
    };
    let (c2, w2) = (control.clone(), wake.clone());
    let h = std::thread::spawn(move || Agent::new(cfg, Identity::default(), backend, rx, w2, c2).run());
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    assert!(control.request_exit(&wake, Duration::from_secs(5)));
    assert!(t0.elapsed() < Duration::from_millis(100));
    h.join().unwrap();
}
