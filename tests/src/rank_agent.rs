//! A fake injector that sends records it was given, not generated ones: once a session traces
//! it, it sends one batch (times in ns since the Unix epoch, as its Hello's clock says) and
//! obeys StopTrace like the injector. With a job identity it plays one rank of a distributed
//! job whose kernel timings a test chose.

use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpuprof_proto::agent::{
    self as wire, AgentMessage, ClockPair, DaemonMessage, InternedString, RecordBatch, StringTable, TraceStatus,
    agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{encode_frame, read_message};

use crate::fake_agent::hello;

/// What a scripted agent is and sends.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// The job identity in its Hello.
    pub job: Option<wire::JobIdentity>,
    /// Its clock in the Hello: records' times are relative to this instant (ns since the epoch).
    pub base_ns: u64,
    /// Strings defined after the handshake, with ids 1, 2, 3, ... in this order.
    pub strings: Vec<String>,
    /// The records sent when a session starts tracing it (once; the session id is set).
    pub records: RecordBatch,
}

/// A scripted agent running on a thread of this process.
pub struct ScriptedAgent {
    /// The daemon's id of this connection (processes.id).
    pub process_id: u64,
    /// The session ids it was told to trace, as it sent their records.
    pub started: mpsc::Receiver<u64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

fn send(out: &mut impl Write, m: Msg) -> Result<()> {
    let mut buf = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut buf);
    out.write_all(&buf)?;
    Ok(())
}

fn state(status: TraceStatus, session: u64, detail: &str) -> Msg {
    Msg::TraceState(wire::TraceState { status: status as i32, session_id: session, detail: detail.into() })
}

impl ScriptedAgent {
    /// Connects, says hello, defines the strings and starts obeying commands.
    pub fn start(socket: &Path, script: Script) -> Result<ScriptedAgent> {
        let s = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        let mut input = s.try_clone()?;
        let mut out = BufWriter::new(s);
        let mut h = hello("/usr/bin/python3");
        h.job = script.job.clone();
        h.clock = Some(ClockPair { realtime_ns: script.base_ns, monotonic_ns: 0 });
        send(&mut out, Msg::Hello(h))?;
        out.flush()?;
        input.set_read_timeout(Some(Duration::from_secs(10)))?;
        let welcome: DaemonMessage = read_message(&mut input, 16 << 20)?;
        let Some(daemon_message::Msg::Welcome(w)) = welcome.msg else {
            bail!("expected Welcome, got {welcome:?}");
        };
        input.set_read_timeout(None)?;
        let strings = script
            .strings
            .iter()
            .enumerate()
            .map(|(i, v)| InternedString { id: i as u32 + 1, value: v.clone() })
            .collect();
        send(&mut out, Msg::Strings(StringTable { strings }))?;
        out.flush()?;
        let (tx, commands) = mpsc::channel();
        std::thread::Builder::new().name("scripted-agent-commands".into()).spawn(move || {
            while let Ok(m) = read_message::<DaemonMessage, _>(&mut input, 16 << 20) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let (started_tx, started) = mpsc::channel();
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("scripted-agent-{}", w.process_id))
            .spawn(move || run(out, commands, script.records, stop2, started_tx))?;
        Ok(ScriptedAgent { process_id: w.process_id, started, stop, thread: Some(thread) })
    }

    /// Waits until a session has traced it and its records are sent; the session id.
    pub fn wait_started(&self, timeout: Duration) -> Result<u64> {
        self.started.recv_timeout(timeout).context("the scripted agent was not traced")
    }

    /// Says goodbye and joins the thread.
    pub fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("scripted agent panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for ScriptedAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    mut out: BufWriter<UnixStream>,
    commands: mpsc::Receiver<DaemonMessage>,
    records: RecordBatch,
    stop: Arc<AtomicBool>,
    started: mpsc::Sender<u64>,
) -> Result<()> {
    let mut records = Some(records);
    let mut last_beat = Instant::now();
    loop {
        if stop.load(Ordering::Relaxed) {
            send(&mut out, Msg::Goodbye(wire::Goodbye { reason: "done".into() }))?;
            out.flush()?;
            return Ok(());
        }
        match commands.recv_timeout(Duration::from_millis(20)) {
            Ok(DaemonMessage { msg: Some(daemon_message::Msg::StartTrace(st)) }) => {
                send(&mut out, state(TraceStatus::Tracing, st.session_id, ""))?;
                if let Some(mut b) = records.take() {
                    b.session_id = st.session_id;
                    send(&mut out, Msg::Records(b))?;
                }
                out.flush()?;
                let _ = started.send(st.session_id);
            }
            Ok(DaemonMessage { msg: Some(daemon_message::Msg::StopTrace(st)) }) => {
                send(&mut out, state(TraceStatus::Idle, st.session_id, "detached: finalized"))?;
                out.flush()?;
            }
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
        if last_beat.elapsed() > Duration::from_secs(1) {
            send(&mut out, Msg::Heartbeat(wire::Heartbeat { clock: None }))?;
            out.flush()?;
            last_beat = Instant::now();
        }
    }
}
