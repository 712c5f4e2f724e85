//! A fake injector for PC sampling: answers StartTrace/StopTrace like the real one (tracing,
//! then idle), hands every StartPcSampling/StopPcSampling to the test, and sends what the test
//! asks for: PC sample batches, PC-sampling states, cubins in pieces, or any raw message.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpuprof_proto::agent::{
    self as wire, AgentMessage, DaemonMessage, InternedString, PcSamplingStatus, StringTable, TraceStatus,
    agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{encode_frame, read_message};

use crate::fake_agent::hello;

/// A PC-sampling command from the daemon.
#[derive(Debug, Clone, PartialEq)]
pub enum PcCommand {
    Start(wire::StartPcSampling),
    Stop(wire::StopPcSampling),
}

/// One aggregated sample, by name.
#[derive(Debug, Clone)]
pub struct FakePc {
    pub function: String,
    pub pc: u64,
    pub stall: String,
    pub count: u64,
    pub file: String,
    pub line: u32,
    pub module: String,
}

impl FakePc {
    pub fn new(function: &str, pc: u64, stall: &str, count: u64, file: &str, line: u32) -> FakePc {
        FakePc {
            function: function.into(),
            pc,
            stall: stall.into(),
            count,
            file: file.into(),
            line,
            module: String::new(),
        }
    }
}

type Out = Arc<Mutex<BufWriter<UnixStream>>>;

fn send(out: &Out, m: Msg) -> Result<()> {
    let mut buf = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut buf);
    let mut o = out.lock().unwrap();
    o.write_all(&buf)?;
    o.flush()?;
    Ok(())
}

/// A fake process with PC sampling, connected to gpuprofd.
pub struct PcAgent {
    pub process_id: u64,
    out: Out,
    commands: mpsc::Receiver<PcCommand>,
    strings: HashMap<String, u32>,
    next_string: u32,
    closed: Arc<AtomicBool>,
    last_trace: Arc<Mutex<Option<wire::TraceConfig>>>,
    /// The devices it reports work on (DeviceActivity every 300 ms while not empty).
    working: Arc<Mutex<Vec<u32>>>,
}

impl PcAgent {
    /// Connects as `exe` with devices 0..`devices` in its Hello.
    pub fn connect(socket: &Path, exe: &str, devices: u32) -> Result<PcAgent> {
        Self::connect_job(socket, exe, devices, None)
    }

    /// Like [`connect`](Self::connect), with a job identity in its Hello (e.g.
    /// [`crate::fake_agent::torchrun_job`]).
    pub fn connect_job(socket: &Path, exe: &str, devices: u32, job: Option<wire::JobIdentity>) -> Result<PcAgent> {
        let s = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        let mut input = s.try_clone()?;
        let out: Out = Arc::new(Mutex::new(BufWriter::new(s)));
        let mut h = hello(exe);
        h.devices.truncate(devices as usize);
        h.job = job;
        send(&out, Msg::Hello(h))?;
        input.set_read_timeout(Some(Duration::from_secs(10)))?;
        let welcome: DaemonMessage = read_message(&mut input, 16 << 20)?;
        let Some(daemon_message::Msg::Welcome(w)) = welcome.msg else {
            bail!("expected Welcome, got {welcome:?}");
        };
        input.set_read_timeout(None)?;
        let (tx, commands) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let (out2, closed2) = (out.clone(), closed.clone());
        let last_trace = Arc::new(Mutex::new(None));
        let last_trace2 = last_trace.clone();
        std::thread::Builder::new().name("pc-agent-commands".into()).spawn(move || {
            while let Ok(m) = read_message::<DaemonMessage, _>(&mut input, 16 << 20) {
                let state = |status: TraceStatus, session: u64| {
                    Msg::TraceState(wire::TraceState {
                        status: status as i32,
                        session_id: session,
                        detail: String::new(),
                    })
                };
                let r = match m.msg {
                    Some(daemon_message::Msg::StartTrace(t)) => {
                        *last_trace2.lock().unwrap() = Some(t.config.unwrap_or_default());
                        send(&out2, state(TraceStatus::Tracing, t.session_id))
                    }
                    Some(daemon_message::Msg::StopTrace(t)) => send(&out2, state(TraceStatus::Idle, t.session_id)),
                    Some(daemon_message::Msg::StartPcSampling(p)) => {
                        tx.send(PcCommand::Start(p)).map_err(|_| anyhow::anyhow!("test gone"))
                    }
                    Some(daemon_message::Msg::StopPcSampling(p)) => {
                        tx.send(PcCommand::Stop(p)).map_err(|_| anyhow::anyhow!("test gone"))
                    }
                    _ => Ok(()),
                };
                if r.is_err() {
                    break;
                }
            }
            closed2.store(true, Ordering::Relaxed);
        })?;
        // Like an injector in a session: reports the devices it works on about every 300 ms.
        let working = Arc::new(Mutex::new((0..devices).collect::<Vec<u32>>()));
        let (out3, closed3, working3) = (out.clone(), closed.clone(), working.clone());
        std::thread::Builder::new().name("pc-agent-activity".into()).spawn(move || {
            while !closed3.load(Ordering::Relaxed) {
                let devs = working3.lock().unwrap().clone();
                if !devs.is_empty() {
                    let devices = devs
                        .iter()
                        .map(|&d| wire::DeviceUse { device_id: d, context: true, syncs: 3, launches: 0 })
                        .collect();
                    if send(&out3, Msg::DeviceActivity(wire::DeviceActivity { devices })).is_err() {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })?;
        Ok(PcAgent {
            process_id: w.process_id,
            out,
            commands,
            strings: HashMap::new(),
            next_string: 1,
            closed,
            last_trace,
            working,
        })
    }

    /// The id of string `v`, defining it first if new ("" is 0).
    pub fn string(&mut self, v: &str) -> Result<u32> {
        if v.is_empty() {
            return Ok(0);
        }
        if let Some(id) = self.strings.get(v) {
            return Ok(*id);
        }
        let id = self.next_string;
        self.next_string += 1;
        send(&self.out, Msg::Strings(StringTable { strings: vec![InternedString { id, value: v.to_string() }] }))?;
        self.strings.insert(v.to_string(), id);
        Ok(id)
    }

    /// The next PC-sampling command within `timeout`.
    pub fn command(&self, timeout: Duration) -> Result<PcCommand> {
        self.commands.recv_timeout(timeout).context("no PC-sampling command from gpuprofd")
    }

    /// Whether a command arrives within `timeout` (None: none did).
    pub fn try_command(&self, timeout: Duration) -> Option<PcCommand> {
        self.commands.recv_timeout(timeout).ok()
    }

    /// Sends one batch covering the last millisecond with `dropped` samples lost.
    pub fn batch(&mut self, session: u64, device: u32, samples: &[FakePc], dropped: u64) -> Result<()> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos() as u64;
        self.batch_ending(session, device, samples, dropped, now)
    }

    /// Sends one batch covering the millisecond before `end_ns` (ns since the Unix epoch; the
    /// always-on profile rolls it up into that minute).
    pub fn batch_ending(
        &mut self,
        session: u64,
        device: u32,
        samples: &[FakePc],
        dropped: u64,
        end_ns: u64,
    ) -> Result<()> {
        let mut v = Vec::new();
        for s in samples {
            v.push(wire::PcSample {
                function_name_id: self.string(&s.function)?,
                pc_offset: s.pc,
                stall_reason_id: self.string(&s.stall)?,
                count: s.count,
                module_id: self.string(&s.module)?,
                file_id: self.string(&s.file)?,
                line: s.line,
            });
        }
        let counted: u64 = samples.iter().map(|s| s.count).sum();
        let now = end_ns;
        send(
            &self.out,
            Msg::PcSamples(wire::PcSampleBatch {
                session_id: session,
                device_id: device,
                samples: v,
                start_ns: now.saturating_sub(1_000_000),
                end_ns: now,
                total_samples: counted + dropped,
                dropped_samples: dropped,
                sampled_ns: 1_000_000,
            }),
        )
    }

    /// Reports a PC-sampling state.
    pub fn state(&self, session: u64, device: u32, status: PcSamplingStatus, detail: &str, heals: u32) -> Result<()> {
        send(
            &self.out,
            Msg::PcSamplingState(wire::PcSamplingState {
                session_id: session,
                device_id: device,
                status: status as i32,
                detail: detail.into(),
                heals,
                ..Default::default()
            }),
        )
    }

    /// Sends a cubin in pieces of `piece` bytes.
    pub fn cubin(&self, hash: &str, data: &[u8], piece: usize) -> Result<()> {
        for (i, c) in data.chunks(piece.max(1)).enumerate() {
            self.raw(Msg::Cubin(wire::CubinChunk {
                hash: hash.into(),
                size: data.len() as u64,
                offset: (i * piece) as u64,
                data: c.to_vec(),
            }))?;
        }
        Ok(())
    }

    /// The devices it reports work on from now on (all of its devices at connect; empty: a
    /// process that never touches a GPU, such as a launcher).
    pub fn work_on(&self, devices: &[u32]) {
        *self.working.lock().unwrap() = devices.to_vec();
    }

    /// Sends any message.
    pub fn raw(&self, m: Msg) -> Result<()> {
        send(&self.out, m)
    }

    /// Waits until gpuprofd closes the connection.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if self.closed.load(Ordering::Relaxed) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// The trace configuration of the last StartTrace received.
    pub fn last_trace_config(&self) -> Option<wire::TraceConfig> {
        *self.last_trace.lock().unwrap()
    }

    /// Says goodbye.
    pub fn goodbye(&self) -> Result<()> {
        send(&self.out, Msg::Goodbye(wire::Goodbye { reason: "done".into() }))
    }
}

/// A daemon managing GPUs 0 and 1 without starting sampler children, with the PM sampler always
/// on (its leases held idle, as when a sampler is starting), so that PC-sampling leases can be
/// granted, preempted, queued and handed back to it.
pub fn start_daemon(dir: &Path) -> Result<crate::TestDaemon> {
    start_daemon_managing(dir, "0, 1")
}

/// A daemon managing the GPUs listed ("0, 1") without starting sampler children.
pub fn start_daemon_managing(dir: &Path, gpus: &str) -> Result<crate::TestDaemon> {
    start_daemon_config(dir, gpus, "")
}

/// The same with more configuration (`extra`, TOML sections after `[sampler]`).
pub fn start_daemon_config(dir: &Path, gpus: &str, extra: &str) -> Result<crate::TestDaemon> {
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!("[sampler]\nspawn = false\nalways_on = true\ndevices = [{gpus}]\nstream_queue = 512\n{extra}"),
    )?;
    crate::TestDaemon::start_with(&dir.join("state"), &["--config", cfg.to_str().unwrap_or_default()])
}

/// `gpuprofctl ARGS`, which must succeed; its stdout.
pub fn ctl_ok(d: &crate::TestDaemon, args: &[&str]) -> String {
    let out = d.ctl(args);
    assert!(
        out.status.success(),
        "gpuprofctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts a session with `gpuprofctl --json session start ARGS`; its id.
pub fn start_session(d: &crate::TestDaemon, args: &[&str]) -> u64 {
    let mut a = vec!["--json", "session", "start"];
    a.extend_from_slice(args);
    let v: serde_json::Value = serde_json::from_str(&ctl_ok(d, &a)).unwrap();
    v["id"].as_u64().unwrap()
}

/// `gpuprofctl --json session show ID`.
pub fn show(d: &crate::TestDaemon, id: u64) -> serde_json::Value {
    serde_json::from_str(&ctl_ok(d, &["--json", "session", "show", &id.to_string()])).unwrap()
}

/// The PC-sampling state of process `proc`'s device `dev` in session `id` ("" if none).
pub fn pc_state(d: &crate::TestDaemon, id: u64, proc: u64, dev: u32) -> (String, serde_json::Value) {
    let s = show(d, id);
    let p = s["processes"].as_array().and_then(|v| v.iter().find(|p| p["process_id"] == proc)).cloned();
    let dv = p
        .and_then(|p| p["pc_sampling"].as_array().and_then(|v| v.iter().find(|x| x["device"] == dev)).cloned())
        .unwrap_or_default();
    (dv["state"].as_str().unwrap_or("").to_string(), dv)
}

/// Polls the state of a device until `ok` holds (10 s at most); returns it.
pub fn wait_pc_state(d: &crate::TestDaemon, id: u64, proc: u64, dev: u32, ok: impl Fn(&str) -> bool) -> String {
    let t = Instant::now();
    loop {
        let (s, _) = pc_state(d, id, proc, dev);
        if ok(&s) {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "session {id} process {proc} GPU {dev}: state {s:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
