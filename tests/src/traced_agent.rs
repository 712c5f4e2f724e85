//! A fake injector that obeys the daemon's commands like the real one: idle after the
//! handshake, records tagged with the session on `StartTrace` (at a chosen rate), a last
//! batch and `TraceState idle` on `StopTrace`, or `TraceState displaced` when told to play
//! a process whose own profiler holds CUPTI.
//!
//! Run it in the test process ([`TracedAgent::start`]; all such agents share the test's
//! pid) or as a child process (`gpuprof-traced-agent`, [`spawn_process`]) when each needs
//! its own pid or uid.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpuprof_proto::agent::{
    self as wire, AgentMessage, DaemonMessage, InternedString, RecordBatch, StringTable, TraceStatus,
    agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{encode_frame, read_message};

use crate::fake_agent::{count, hello};
use crate::records::{KERNEL_NAMES, MARKER_NAMES, Mix, RecordGen};

/// How a traced agent behaves.
#[derive(Debug, Clone)]
pub struct TracedConfig {
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    /// Records per second while tracing.
    pub rate: f64,
    /// Records per batch.
    pub batch: usize,
    /// Stop sending after this many records per session (0: no limit).
    pub per_session: u64,
    /// Answer StartTrace with `displaced` and send nothing.
    pub displaced: bool,
    pub mix: Mix,
    pub seed: u64,
    /// `spawn_process` only: the agent process moves itself into this cgroup directory (writes
    /// its pid to `cgroup.procs`) before it connects. Needs root.
    pub join_cgroup: Option<std::path::PathBuf>,
    /// The job identity sent in the Hello (`spawn_process`: its launcher, job id, rank and
    /// world size; the parent pid is the agent process's own parent).
    pub job: Option<wire::JobIdentity>,
}

impl Default for TracedConfig {
    fn default() -> Self {
        TracedConfig {
            exe: "/usr/bin/python3".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            cgroup: "/kubepods/pod-1234/abcdef".into(),
            rate: 20_000.0,
            batch: 100,
            per_session: 0,
            displaced: false,
            mix: Mix::default(),
            seed: 1,
            join_cgroup: None,
            job: None,
        }
    }
}

/// Records sent per session (table name → count).
pub type SentBySession = BTreeMap<u64, crate::Sent>;

/// Something that happened on the agent, for tests that wait on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Started(u64),
    /// Session and records sent for it.
    Stopped(u64, u64),
}

/// An agent running on a thread of this process.
pub struct TracedAgent {
    pub process_id: u64,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
    pub sent: Arc<Mutex<SentBySession>>,
    pub events: mpsc::Receiver<Event>,
}

impl TracedAgent {
    /// Connects and starts obeying commands.
    pub fn start(socket: &Path, cfg: TracedConfig) -> Result<TracedAgent> {
        let (process_id, conn) = Conn::connect(socket, &cfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(SentBySession::new()));
        let (ev_tx, events) = mpsc::channel();
        let (s2, sent2) = (stop.clone(), sent.clone());
        let thread = std::thread::Builder::new()
            .name(format!("traced-agent-{process_id}"))
            .spawn(move || conn.run(cfg, s2, sent2, ev_tx))?;
        Ok(TracedAgent { process_id, stop, thread: Some(thread), sent, events })
    }

    /// Records sent for a session so far.
    pub fn sent_for(&self, session: u64) -> u64 {
        self.sent.lock().unwrap().get(&session).map(|s| s.values().sum()).unwrap_or(0)
    }

    /// Waits for the next event.
    pub fn wait_event(&self, timeout: Duration) -> Result<Event> {
        self.events.recv_timeout(timeout).context("no event from the traced agent")
    }

    /// Says goodbye and joins the thread.
    pub fn finish(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("traced agent panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for TracedAgent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Conn {
    out: BufWriter<UnixStream>,
    commands: mpsc::Receiver<DaemonMessage>,
    records: RecordGen,
}

fn send(out: &mut impl Write, m: Msg) -> Result<()> {
    let mut buf = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut buf);
    out.write_all(&buf)?;
    Ok(())
}

fn trace_state(status: TraceStatus, session: u64, detail: &str) -> Msg {
    Msg::TraceState(wire::TraceState { status: status as i32, session_id: session, detail: detail.into() })
}

impl Conn {
    fn connect(socket: &Path, cfg: &TracedConfig) -> Result<(u64, Conn)> {
        let s = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        let mut input = s.try_clone()?;
        let mut out = BufWriter::with_capacity(256 << 10, s);
        let mut h = hello(&cfg.exe);
        h.cmdline = cfg.cmdline.clone();
        h.cgroup = cfg.cgroup.clone();
        h.pid = std::process::id();
        h.job = cfg.job.clone();
        send(&mut out, Msg::Hello(h))?;
        out.flush()?;
        input.set_read_timeout(Some(Duration::from_secs(10)))?;
        let welcome: DaemonMessage = read_message(&mut input, 16 << 20)?;
        let Some(daemon_message::Msg::Welcome(w)) = welcome.msg else {
            bail!("expected Welcome, got {welcome:?}");
        };
        input.set_read_timeout(None)?;
        let mut records = RecordGen::new(cfg.seed, cfg.mix);
        let mut t = StringTable::default();
        let mut next = 1u32;
        for v in KERNEL_NAMES {
            records.kernel_name_ids.push(next);
            t.strings.push(InternedString { id: next, value: v.to_string() });
            next += 1;
        }
        for v in MARKER_NAMES {
            records.marker_name_ids.push(next);
            t.strings.push(InternedString { id: next, value: v.to_string() });
            next += 1;
        }
        send(&mut out, Msg::Strings(t))?;
        out.flush()?;
        let (tx, commands) = mpsc::channel();
        std::thread::Builder::new().name("traced-agent-commands".into()).spawn(move || {
            while let Ok(m) = read_message::<DaemonMessage, _>(&mut input, 16 << 20) {
                if tx.send(m).is_err() {
                    break;
                }
            }
        })?;
        Ok((w.process_id, Conn { out, commands, records }))
    }

    fn run(
        mut self,
        cfg: TracedConfig,
        stop: Arc<AtomicBool>,
        sent: Arc<Mutex<SentBySession>>,
        events: mpsc::Sender<Event>,
    ) -> Result<()> {
        let mut tracing: Option<(u64, Instant, u64)> = None; // session, since, records sent
        let mut last_beat = Instant::now();
        loop {
            if stop.load(Ordering::Relaxed) {
                send(&mut self.out, Msg::Goodbye(wire::Goodbye { reason: "done".into() }))?;
                self.out.flush()?;
                return Ok(());
            }
            let wait = match tracing {
                Some(_) => Duration::from_millis(1),
                None => Duration::from_millis(20),
            };
            match self.commands.recv_timeout(wait) {
                Ok(DaemonMessage { msg: Some(daemon_message::Msg::StartTrace(st)) }) => {
                    if cfg.displaced {
                        send(
                            &mut self.out,
                            trace_state(
                                TraceStatus::Displaced,
                                st.session_id,
                                "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
                            ),
                        )?;
                    } else {
                        send(&mut self.out, trace_state(TraceStatus::Tracing, st.session_id, ""))?;
                        tracing = Some((st.session_id, Instant::now(), 0));
                    }
                    self.out.flush()?;
                    let _ = events.send(Event::Started(st.session_id));
                }
                Ok(DaemonMessage { msg: Some(daemon_message::Msg::StopTrace(st)) }) => {
                    let n = match tracing {
                        Some((s, _, n)) if s == st.session_id => n,
                        _ => 0,
                    };
                    tracing = None;
                    // As the injector does once it has detached from CUPTI.
                    send(&mut self.out, trace_state(TraceStatus::Idle, st.session_id, "detached: finalized"))?;
                    self.out.flush()?;
                    let _ = events.send(Event::Stopped(st.session_id, n));
                }
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // The daemon closed the connection.
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
            }
            if let Some((session, since, n)) = &mut tracing {
                let due = (since.elapsed().as_secs_f64() * cfg.rate) as u64;
                let cap = if cfg.per_session > 0 { cfg.per_session } else { u64::MAX };
                while *n < due.min(cap) || (*n == 0 && cap > 0) {
                    let k = (cfg.batch as u64).min(cap - *n) as usize;
                    let mut b = RecordBatch { session_id: *session, ..Default::default() };
                    self.records.fill(&mut b, k);
                    count(sent.lock().unwrap().entry(*session).or_default(), &b);
                    send(&mut self.out, Msg::Records(b))?;
                    *n += k as u64;
                }
                self.out.flush()?;
            } else if last_beat.elapsed() > Duration::from_secs(1) {
                send(&mut self.out, Msg::Heartbeat(wire::Heartbeat { clock: None }))?;
                self.out.flush()?;
                last_beat = Instant::now();
            }
        }
    }
}

/// A traced agent in its own process (binary `gpuprof-traced-agent`), so that it has its
/// own pid (and, with `uid`, its own user).
pub struct AgentProcess {
    pub child: Child,
    pub process_id: u64,
    pub pid: u32,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

/// Starts `gpuprof-traced-agent` and waits until it is connected.
pub fn spawn_process(socket: &Path, cfg: &TracedConfig, uid: Option<u32>) -> Result<AgentProcess> {
    let mut cmd = Command::new(crate::bin_path("gpuprof-traced-agent"));
    cmd.arg("--socket").arg(socket).arg("--exe").arg(&cfg.exe).arg("--cgroup").arg(&cfg.cgroup);
    cmd.arg("--rate").arg(cfg.rate.to_string()).arg("--batch").arg(cfg.batch.to_string());
    cmd.arg("--per-session").arg(cfg.per_session.to_string()).arg("--seed").arg(cfg.seed.to_string());
    if cfg.displaced {
        cmd.arg("--displaced");
    }
    if let Some(dir) = &cfg.join_cgroup {
        cmd.arg("--join-cgroup").arg(dir);
    }
    if let Some(j) = &cfg.job {
        cmd.arg("--job-launcher").arg(&j.launcher).arg("--job-id").arg(&j.job_id);
        for (flag, v) in [("--rank", j.rank), ("--local-rank", j.local_rank), ("--world-size", j.world_size)] {
            if let Some(v) = v {
                cmd.arg(flag).arg(v.to_string());
            }
        }
    }
    cmd.arg("--").args(&cfg.cmdline);
    if let Some(uid) = uid {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(uid);
    }
    let mut child =
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().context("spawning gpuprof-traced-agent")?;
    let stdout: ChildStdout = child.stdout.take().context("no stdout")?;
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let first = lines.recv_timeout(Duration::from_secs(20)).context("gpuprof-traced-agent did not connect")?;
    let process_id = first
        .strip_prefix("process_id ")
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected first line {first:?}"))?;
    let pid = child.id();
    Ok(AgentProcess { stdin: child.stdin.take(), child, process_id, pid, lines })
}

impl AgentProcess {
    /// Waits for a line "started S" or "stopped S N" (other lines are skipped).
    pub fn wait_event(&self, timeout: Duration) -> Result<Event> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).context("no event from gpuprof-traced-agent")?;
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["started", s] => return Ok(Event::Started(s.parse()?)),
                ["stopped", s, n] => return Ok(Event::Stopped(s.parse()?, n.parse()?)),
                _ => {}
            }
        }
    }

    /// Closes stdin: the agent says goodbye and exits.
    pub fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let st = self.child.wait()?;
        if !st.success() {
            bail!("gpuprof-traced-agent exited with {st}");
        }
        Ok(())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if let Ok(None) = self.child.try_wait() {
            std::thread::sleep(Duration::from_millis(50));
            if let Ok(None) = self.child.try_wait() {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}

/// A finished session over one traced agent (exe `python3`) that sent `per` records, started
/// and stopped with `gpuprofctl session`; the agent stays connected.
pub fn recorded_session(d: &crate::TestDaemon, per: u64) -> (u64, TracedAgent) {
    let cfg = TracedConfig {
        exe: "/usr/bin/python3".into(),
        cmdline: vec!["python3".into()],
        per_session: per,
        rate: 200_000.0,
        batch: 500,
        ..Default::default()
    };
    let agent = TracedAgent::start(&d.agent_socket, cfg).expect("traced agent");
    let out = d.ctl(&["session", "start", "--exe", "python3", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")["id"].as_u64().expect("id");
    assert_eq!(agent.wait_event(Duration::from_secs(10)).expect("started"), Event::Started(id));
    let t = Instant::now();
    while agent.sent_for(id) < per {
        assert!(t.elapsed() < Duration::from_secs(30), "the agent sent {} of {per}", agent.sent_for(id));
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = d.ctl(&["session", "stop", &id.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (id, agent)
}

/// Rows of record table (or view) `table` stored for `session`.
pub fn stored_rows(c: &rusqlite::Connection, table: &str, session: u64) -> u64 {
    c.query_row(&format!("SELECT count(*) FROM {table} WHERE session = ?1"), [session as i64], |r| r.get::<_, i64>(0))
        .expect("count") as u64
}
