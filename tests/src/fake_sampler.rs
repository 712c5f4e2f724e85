//! A fake PM sampler: speaks the real agent protocol as `AGENT_KIND_SAMPLER` for one device,
//! obeys `StartPmSampling`/`StopPmSampling` like `gpuprofd sampler` (reporting its
//! `SamplerState`), and streams synthetic samples while sampling. It can pretend that an
//! outside tool holds the hardware (answering Start with `SAMPLER_STATUS_HARDWARE_BUSY`).
//!
//! Samples are deterministic: sample `k` of a device has `start_ns = base + k * interval`
//! and value `metric_index * 1000 + k % 1000`, so a receiver can check it saw every one.
// Included by path from several test and bench targets, each using part of it.
#![allow(dead_code)]

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpuprof_proto::agent::{
    self as wire, AgentMessage, DaemonMessage, PROTOCOL_VERSION, PmSample, PmSampleBatch, SamplerStatus,
    agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{DEFAULT_MAX_FRAME_BYTES, read_message, write_frame};

/// Default metrics of the fake sampler.
pub const METRICS: [&str; 3] = [
    "gr__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
];

/// The value of metric `m` in sample `k`.
pub fn value(m: usize, k: u64) -> f64 {
    (m as u64 * 1000 + k % 1000) as f64
}

/// A command the fake received, as a short name ("start", "stop").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Start { metrics: Vec<String>, interval_ns: u64 },
    Stop { reason: String },
}

struct Shared {
    writer: Mutex<BufWriter<UnixStream>>,
    sampling: AtomicBool,
    busy: AtomicBool,
    device: u32,
}

impl Shared {
    fn send(&self, m: &AgentMessage) -> Result<()> {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        write_frame(&mut *w, m)?;
        w.flush()?;
        Ok(())
    }

    fn state(&self, s: SamplerStatus, detail: &str) -> Result<()> {
        self.send(&AgentMessage {
            msg: Some(Msg::SamplerState(wire::SamplerState {
                device_id: self.device,
                status: s as i32,
                detail: detail.to_string(),
            })),
        })
    }
}

/// One fake sampler connection.
pub struct FakeSampler {
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    /// Samples sent so far (the next sample index).
    pub next: AtomicU64,
    pub base_ns: u64,
    pub interval_ns: u64,
    pub process_id: u64,
}

impl FakeSampler {
    /// Connects for `device` and completes the handshake.
    pub fn connect(socket: &Path, device: u32) -> Result<FakeSampler> {
        let stream = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        let mut r = BufReader::new(stream.try_clone()?);
        let mut w = BufWriter::new(stream.try_clone()?);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
        let hello = wire::Hello {
            protocol_version: PROTOCOL_VERSION,
            kind: wire::AgentKind::Sampler as i32,
            pid: std::process::id(),
            exe: "/usr/bin/gpuprofd".into(),
            cmdline: vec!["gpuprof-sampler".into(), "--device".into(), device.to_string()],
            cgroup: String::new(),
            cupti_version: 130001,
            devices: vec![wire::Device {
                id: device,
                uuid: format!("GPU-00000000-fake-0000-0000-00000000000{device}"),
                name: "NVIDIA H100 80GB HBM3 (fake)".into(),
                compute_major: 9,
                compute_minor: 0,
                sm_count: 132,
                global_memory_bytes: 80 << 30,
                pci_bus_id: format!("0000:{:02x}:00.0", 0x1b + device),
            }],
            clock: Some(wire::ClockPair { realtime_ns: now, monotonic_ns: 1 }),
            agent_version: "fake".into(),
            sampler_device: device,
            job: None,
        };
        write_frame(&mut w, &AgentMessage { msg: Some(Msg::Hello(hello)) })?;
        w.flush()?;
        let welcome: DaemonMessage = read_message(&mut r, DEFAULT_MAX_FRAME_BYTES)?;
        let process_id = match welcome.msg {
            Some(daemon_message::Msg::Welcome(w)) => w.process_id,
            other => bail!("expected Welcome, got {other:?}"),
        };
        let shared = Arc::new(Shared {
            writer: Mutex::new(w),
            sampling: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            device,
        });
        let (tx, rx) = channel();
        let sh = shared.clone();
        std::thread::spawn(move || read_loop(r, sh, tx));
        Ok(FakeSampler {
            shared,
            commands: rx,
            next: AtomicU64::new(0),
            base_ns: now,
            interval_ns: 1_000_000,
            process_id,
        })
    }

    /// Pretend an outside tool holds the hardware: Start is answered with HARDWARE_BUSY.
    pub fn set_busy(&self, busy: bool) {
        self.shared.busy.store(busy, SeqCst);
    }

    /// Whether the daemon has it sampling now.
    pub fn sampling(&self) -> bool {
        self.shared.sampling.load(SeqCst)
    }

    /// The next command from the daemon.
    pub fn command(&self, timeout: Duration) -> Result<Command> {
        match self.commands.recv_timeout(timeout) {
            Ok(c) => Ok(c),
            Err(RecvTimeoutError::Timeout) => bail!("no command from the daemon within {timeout:?}"),
            Err(RecvTimeoutError::Disconnected) => bail!("connection closed"),
        }
    }

    /// Commands received within `within`.
    pub fn commands_within(&self, within: Duration) -> Vec<Command> {
        let end = Instant::now() + within;
        let mut v = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.commands.recv_timeout(left) {
                Ok(c) => v.push(c),
                Err(_) => break,
            }
        }
        v
    }

    /// Waits until sampling is on (or off).
    pub fn wait_sampling(&self, on: bool, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        while self.sampling() != on {
            if t.elapsed() > timeout {
                bail!("sampler not {} after {timeout:?}", if on { "sampling" } else { "stopped" });
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Sends `n` samples (indices next..next+n) in one batch.
    pub fn send_samples(&self, n: u64) -> Result<()> {
        let first = self.next.fetch_add(n, SeqCst);
        let samples = (first..first + n)
            .map(|k| PmSample {
                start_ns: self.base_ns + k * self.interval_ns,
                end_ns: self.base_ns + (k + 1) * self.interval_ns,
                values: (0..METRICS.len()).map(|m| value(m, k)).collect(),
            })
            .collect();
        self.shared.send(&AgentMessage {
            msg: Some(Msg::PmSamples(PmSampleBatch {
                device_id: self.shared.device,
                metrics: METRICS.iter().map(|m| m.to_string()).collect(),
                samples,
            })),
        })
    }

    /// Streams `total` samples at `rate_hz` in batches of `batch` (like a sampler decoding
    /// every `batch / rate` seconds), only while sampling.
    pub fn stream(&self, total: u64, batch: u64, rate_hz: f64) -> Result<()> {
        let t0 = Instant::now();
        let mut sent = 0;
        while sent < total {
            let n = batch.min(total - sent);
            let due = t0 + Duration::from_secs_f64((sent + n) as f64 / rate_hz);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            if self.sampling() {
                self.send_samples(n)?;
                sent += n;
            }
        }
        Ok(())
    }

    /// Closes the connection with a Goodbye.
    pub fn goodbye(self) -> Result<()> {
        self.shared.send(&AgentMessage { msg: Some(Msg::Goodbye(wire::Goodbye { reason: "test done".into() })) })
    }
}

fn read_loop(mut r: BufReader<UnixStream>, sh: Arc<Shared>, tx: Sender<Command>) {
    while let Ok(m) = read_message::<DaemonMessage, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
        let cmd = match m.msg {
            Some(daemon_message::Msg::StartPmSampling(s)) => {
                if sh.busy.load(SeqCst) {
                    sh.sampling.store(false, SeqCst);
                    let _ = sh.state(
                        SamplerStatus::HardwareBusy,
                        "cuptiPmSamplingEnable failed: CUPTI_ERROR_HARDWARE_BUSY (26)",
                    );
                } else {
                    sh.sampling.store(true, SeqCst);
                    let _ = sh.state(SamplerStatus::Sampling, "fake");
                }
                Command::Start { metrics: s.metrics, interval_ns: s.interval_ns }
            }
            Some(daemon_message::Msg::StopPmSampling(s)) => {
                sh.sampling.store(false, SeqCst);
                let _ = sh.state(SamplerStatus::Stopped, &s.reason);
                Command::Stop { reason: s.reason }
            }
            _ => continue,
        };
        if tx.send(cmd).is_err() {
            return;
        }
    }
}
