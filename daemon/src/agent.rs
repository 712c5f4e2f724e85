//! The agent socket: accepts injector and sampler connections, runs the handshake,
//! enforces the protocol and hands records to the writer.
//!
//! Every protocol violation (oversized or truncated frame, undecodable bytes, wrong
//! version, a message out of order, an undefined string id, a frame left unfinished past
//! the liveness timeout, no Hello within the handshake timeout) closes that one connection
//! with a logged reason and counts as a protocol error; other connections are unaffected.
//! A frame's memory grows with the bytes that arrive, not with the length it announces.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::{Context, Result};
use dashmap::DashMap;
use gpuprof_proto::agent::{
    self as wire, AgentMessage, DaemonMessage, PROTOCOL_VERSION, agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::encode_frame;
use prost::Message;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::PmPublished;
use crate::arbiter::Arbiter;
use crate::catalog::batch_len;
use crate::clock::now_ns;
use crate::config::AgentConfig;
use crate::ingest::{ProcessInfo, WriterHandle, WriterMsg};
use crate::kubelet::Pods;
use crate::otlp_profiles::PcProfiles;
use crate::pcsamp::PcHub;
use crate::registry::{Agent, AgentEvent, Placement, Registry};
use crate::sessions::Sessions;
use crate::stats::Stats;

pub mod check;
#[cfg(test)]
mod tests;

/// Binds the agent socket (replacing a stale file) with mode 0666: any user's CUDA
/// process may connect; identity comes from SO_PEERCRED.
pub fn bind(path: &Path) -> Result<UnixListener> {
    let l = bind_unix(path, 0o666)?;
    // A hint left by a daemon that did not stop cleanly: no session of this one is active yet.
    let _ = std::fs::remove_file(gpuprof_proto::hint::hint_path(path));
    Ok(l)
}

/// Binds a Unix socket at `path` with `mode`, removing a stale socket file first. Anything
/// else at `path` (a regular file, a device such as /dev/null, a directory) is left alone and
/// refused: a mistyped socket path must not delete what is there.
pub fn bind_unix(path: &Path, mode: u32) -> Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating socket directory {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "{} exists and is not a Unix socket; gpuprofd does not remove it: choose another socket path",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!("{} is in use by another running gpuprofd", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    let l = UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting mode of {}", path.display()))?;
    Ok(l)
}

/// What the agent connections use: the `[agent]` settings, whether PC samples go to the OTLP
/// profiles export, the writer and counters, the registry they join, the kubelet's pods (to
/// place a process), the sessions (record counts, the always-on profile, waking the
/// supervisor), PC sampling's hub and the arbiter whose leases an agent's report ends, the PC
/// samples kept for OTLP, and the ring live PM samples are published on.
#[derive(Clone, Copy)]
pub struct Connections<'a> {
    pub agent: &'a AgentConfig,
    /// `[otlp] profiles` with an endpoint: PC samples are kept for the next profiles export.
    pub otlp_profiles: bool,
    pub writer: &'a WriterHandle,
    pub stats: &'a Stats,
    pub registry: &'a Registry,
    pub pods: &'a Pods,
    pub session_records: &'a DashMap<u64, AtomicU64>,
    pub sessions: &'a Sessions,
    pub pc: &'a PcHub,
    pub arbiter: &'a Arbiter,
    pub otlp_pc: &'a PcProfiles,
    pub pm_samples: &'a broadcast::Sender<Arc<PmPublished>>,
    /// The database, read for cubins asked for (`CubinQuery`).
    pub db_path: &'a std::path::Path,
}

impl Connections<'_> {
    fn count_session_records(&self, session: u64, n: u64) {
        if let Some(c) = self.session_records.get(&session) {
            c.fetch_add(n, Relaxed);
            return;
        }
        self.session_records.entry(session).or_default().fetch_add(n, Relaxed);
    }
}

/// Accepts connections until `shutdown` fires; each is served by the future `connection`
/// makes of it (one that runs [`handle`]) until it ends.
pub async fn serve<F, Fut>(listener: UnixListener, connection: F, shutdown: CancellationToken)
where
    F: Fn(UnixStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let tracker = tokio_util::task::TaskTracker::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    tracker.spawn(connection(stream));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "agent accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
    tracker.close();
    tracker.wait().await;
}

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("connection closed by agent")]
    Closed,
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("no frame for {0:?}: agent considered dead")]
    Timeout(Duration),
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("daemon shutting down")]
    Shutdown,
}

fn proto_err(msg: impl Into<String>) -> ConnError {
    ConnError::Protocol(msg.into())
}

/// How long a new connection may take to send its Hello (at most the liveness timeout).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest frame accepted before the handshake: a Hello is a few KiB (1 MiB leaves room for a
/// long command line), so a peer that has not said who it is cannot announce a full-size frame.
pub const MAX_HELLO_BYTES: u32 = 1 << 20;

/// Reads one frame's payload into `buf` (`gpuprof_proto::frame::read_frame_async`: the body as
/// it arrives); sets `started` once the first byte has arrived.
async fn read_frame(
    r: &mut BufReader<OwnedReadHalf>,
    buf: &mut Vec<u8>,
    max: u32,
    started: &mut bool,
) -> Result<(), ConnError> {
    use gpuprof_proto::frame::FrameError;
    gpuprof_proto::frame::read_frame_async(r, buf, max, started).await.map_err(|e| match e {
        FrameError::Closed => ConnError::Closed,
        FrameError::Io(e) => ConnError::Io(e),
        FrameError::Truncated { part, .. } => proto_err(format!("truncated frame: connection ended inside the {part}")),
        e => proto_err(e.to_string()),
    })
}

/// A frame begun but not finished within the timeout (a stalled or trickling peer).
fn stalled(timeout: Duration) -> ConnError {
    proto_err(format!("frame not completed within {timeout:?}: peer stalled inside a frame"))
}

async fn read_message(
    r: &mut BufReader<OwnedReadHalf>,
    buf: &mut Vec<u8>,
    max: u32,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<AgentMessage, ConnError> {
    let mut started = false;
    tokio::select! {
        _ = shutdown.cancelled() => Err(ConnError::Shutdown),
        r = tokio::time::timeout(timeout, read_frame(r, buf, max, &mut started)) => {
            r.map_err(|_| if started { stalled(timeout) } else { ConnError::Timeout(timeout) })??;
            let m = AgentMessage::decode(buf.as_slice()).map_err(|e| proto_err(format!("malformed message: {e}")))?;
            Ok(m)
        }
    }
}

/// Serves one agent connection until it ends (or `shutdown` fires).
pub async fn handle(stream: UnixStream, d: Connections<'_>, shutdown: CancellationToken) {
    let cred = match stream.peer_cred() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "agent connection without peer credentials; closing");
            return;
        }
    };
    let pid = cred.pid().unwrap_or(0) as u32;
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let max = d.agent.max_frame_bytes;
    let timeout = Duration::from_millis(d.agent.liveness_timeout_ms);
    let mut buf = Vec::with_capacity(64 * 1024);

    // Handshake: a small frame limit and a short deadline for a peer not yet identified.
    let hs_timeout = timeout.min(HANDSHAKE_TIMEOUT);
    let (hello, kind) = match read_message(&mut rd, &mut buf, max.min(MAX_HELLO_BYTES), hs_timeout, &shutdown)
        .await
        .and_then(check::hello)
    {
        Ok(h) => h,
        Err(ConnError::Closed) | Err(ConnError::Shutdown) => return,
        Err(ConnError::Timeout(t)) => {
            reject(d, pid, &format!("protocol error: no Hello within {t:?}"));
            return;
        }
        Err(e) => {
            reject(d, pid, &e.to_string());
            return;
        }
    };
    let base_ns = hello.clock.map(|c| c.realtime_ns).filter(|t| *t > 0).unwrap_or_else(now_ns);
    let (cgroup, placement) = place(d.pods, pid, &hello.cgroup).await;
    let info = ProcessInfo {
        pid,
        uid: cred.uid(),
        gid: cred.gid(),
        agent_kind: kind,
        exe: hello.exe.clone(),
        cmdline: hello.cmdline.clone(),
        cgroup: cgroup.clone(),
        placement: placement.clone(),
        cupti_version: hello.cupti_version,
        base_ns,
        devices: hello.devices.clone(),
        job: hello.job.clone().unwrap_or_default(),
    };
    let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
    if d.writer.send(WriterMsg::RegisterProcess(info, reply_tx)).await.is_err() {
        return;
    }
    let id = match reply_rx.await {
        Ok(Ok(id)) => id,
        Ok(Err(e)) => {
            tracing::error!(pid, error = %e, "cannot register agent; closing its connection");
            return;
        }
        Err(_) => return,
    };

    let (cmd_tx, cmd_rx) = mpsc::channel::<DaemonMessage>(256);
    let welcome = DaemonMessage {
        msg: Some(daemon_message::Msg::Welcome(wire::Welcome {
            protocol_version: PROTOCOL_VERSION,
            process_id: id,
            max_frame_bytes: max,
            heartbeat_interval_ms: d.agent.heartbeat_interval_ms,
            cubin_cache: true,
        })),
    };
    let _ = cmd_tx.try_send(welcome);
    let writer_task = tokio::spawn(write_commands(wr, cmd_rx));

    let agent = Arc::new(Agent {
        id,
        pid,
        uid: cred.uid(),
        gid: cred.gid(),
        kind,
        exe: hello.exe,
        cmdline: hello.cmdline,
        cgroup,
        placement,
        ancestors: crate::cgroup::ancestors(pid),
        job: hello.job.unwrap_or_default(),
        cupti_version: hello.cupti_version,
        sampler_device: hello.sampler_device,
        devices: hello.devices,
        connected_at_ns: now_ns(),
        last_seen_ns: now_ns().into(),
        trace_state: std::sync::Mutex::new("idle".into()),
        commands: cmd_tx,
    });
    d.stats.connected_agents.fetch_add(1, Relaxed);
    d.registry.insert(agent.clone());
    tracing::info!(id, pid, uid = cred.uid(), kind, exe = %agent.exe, "agent connected");

    let mut conn = Conn {
        d,
        agent: &agent,
        check: check::Checker::new(kind),
        names: Default::default(),
        answers: Default::default(),
    };
    let result = loop {
        match read_message(&mut rd, &mut buf, max, timeout, &shutdown).await {
            Ok(m) => match conn.dispatch(m).await {
                Ok(true) => {}
                Ok(false) => break Ok(()),
                Err(e) => break Err(e),
            },
            Err(e) => break Err(e),
        }
    };
    let reason = match &result {
        Ok(()) => "goodbye".to_string(),
        Err(e) => e.to_string(),
    };
    match &result {
        Ok(()) | Err(ConnError::Closed) | Err(ConnError::Shutdown) => {
            tracing::info!(id, pid, reason = %reason, "agent disconnected")
        }
        Err(ConnError::Protocol(_)) => {
            d.stats.protocol_errors.fetch_add(1, Relaxed);
            tracing::warn!(id, pid, reason = %reason, "closing agent connection");
        }
        Err(_) => tracing::warn!(id, pid, reason = %reason, "agent connection lost"),
    }
    d.registry.remove(id, reason.clone());
    d.stats.connected_agents.fetch_sub(1, Relaxed);
    writer_task.abort();
    let _ = d.writer.send(WriterMsg::ProcessClosed { proc: id, reason }).await;
}

/// The process's cgroup and what it says about its container and pod: read from
/// `/proc/PID/cgroup` (trusted, and the host's view even inside a cgroup namespace); when that
/// is not visible (the daemon in a pid namespace without the agent), taken from the path the
/// agent reported. Pod name and namespace come from the kubelet when configured.
async fn place(pods: &Pods, pid: u32, claimed: &str) -> (String, Placement) {
    let a = crate::cgroup::of_pid(pid).unwrap_or_else(|| crate::cgroup::parse_path(claimed));
    let cgroup = a.cgroup.clone();
    let mut p = Placement::from(a);
    if !p.pod_uid.is_empty()
        && let Some(pod) = pods.lookup(&p.pod_uid).await
    {
        p.pod_name = pod.name;
        p.pod_namespace = pod.namespace;
        p.container_name = pod.containers.get(&p.container_id.to_ascii_lowercase()).cloned().unwrap_or_default();
    }
    (cgroup, p)
}

fn reject(d: Connections<'_>, pid: u32, reason: &str) {
    d.stats.protocol_errors.fetch_add(1, Relaxed);
    tracing::warn!(pid, reason, "rejecting agent connection");
}

async fn write_commands(mut wr: tokio::net::unix::OwnedWriteHalf, mut rx: mpsc::Receiver<DaemonMessage>) {
    let mut buf = Vec::new();
    while let Some(m) = rx.recv().await {
        buf.clear();
        encode_frame(&m, &mut buf);
        if wr.write_all(&buf).await.is_err() {
            break;
        }
    }
}

fn msg_name(m: &Msg) -> &'static str {
    match m {
        Msg::Hello(_) => "Hello",
        Msg::Strings(_) => "StringTable",
        Msg::Records(_) => "RecordBatch",
        Msg::Drops(_) => "DropReport",
        Msg::TraceState(_) => "TraceState",
        Msg::Heartbeat(_) => "Heartbeat",
        Msg::PmSamples(_) => "PmSampleBatch",
        Msg::PcSamples(_) => "PcSampleBatch",
        Msg::SamplerState(_) => "SamplerState",
        Msg::Goodbye(_) => "Goodbye",
        Msg::PcSamplingState(_) => "PcSamplingState",
        Msg::Cubin(_) => "CubinChunk",
        Msg::DeviceActivity(_) => "DeviceActivity",
        Msg::CubinQuery(_) => "CubinQuery",
        Msg::CubinsNotFound(_) => "CubinsNotFound",
    }
}

struct Conn<'a> {
    d: Connections<'a>,
    agent: &'a Arc<Agent>,
    /// The protocol state: string ids, drop counters, cubins half received.
    check: check::Checker,
    /// The strings defined so far, for PC sample rows pushed to stream subscribers.
    names: crate::pcsamp::names::ConnNames,
    /// The answers to its `CubinQuery`s.
    answers: crate::pcsamp::lookup::Answers,
}

impl Conn<'_> {
    /// Handles one message; Ok(false) ends the connection cleanly.
    async fn dispatch(&mut self, m: AgentMessage) -> Result<bool, ConnError> {
        let d = self.d;
        let id = self.agent.id;
        d.registry.touch(self.agent, now_ns());
        let Some(msg) = m.msg else {
            return Err(proto_err("empty message"));
        };
        self.check.message(&msg)?;
        match msg {
            Msg::Hello(_) => return Err(proto_err("Hello sent twice")),
            Msg::Strings(t) => {
                let mut values = Vec::with_capacity(t.strings.len());
                for s in t.strings {
                    self.names.push(&s.value);
                    values.push(s.value);
                }
                d.writer.send(WriterMsg::Strings { proc: id, values }).await.map_err(|_| ConnError::Shutdown)?;
            }
            Msg::Records(b) => {
                let count = batch_len(&b);
                if count == 0 {
                    return Ok(true);
                }
                if b.session_id != 0 {
                    d.count_session_records(b.session_id, count);
                    // Kernels traced on a device are work there, for the PC-sampling scheduler.
                    let mut devs: Vec<u32> = Vec::new();
                    for k in &b.kernels {
                        if !devs.contains(&k.device_id) {
                            devs.push(k.device_id);
                        }
                    }
                    if !devs.is_empty() && d.pc.activity(id, devs, std::time::Instant::now()) {
                        d.sessions.wake_supervisor();
                    }
                }
                let permit = d.writer.reserve_records(count).await.map_err(|_| ConnError::Shutdown)?;
                d.stats.queued_records.fetch_add(count, Relaxed);
                d.writer
                    .send(WriterMsg::Records { proc: id, batch: b, count, permit: Some(permit) })
                    .await
                    .map_err(|_| ConnError::Shutdown)?;
            }
            Msg::Drops(r) => {
                let counts = self.check.drops(&r, |k, n| {
                    let counter = match k {
                        Some(k) => &d.stats.kind(k).dropped_by_agents,
                        None => &d.stats.cupti_dropped,
                    };
                    counter.fetch_add(n, Relaxed);
                })?;
                d.writer.send(WriterMsg::Drops { proc: id, counts }).await.map_err(|_| ConnError::Shutdown)?;
            }
            Msg::TraceState(s) => {
                let name = check::trace_status(s.status)?;
                *self.agent.trace_state.lock().unwrap_or_else(|e| e.into_inner()) = name.to_string();
                if name == "displaced" || name == "failed" {
                    tracing::warn!(id, pid = self.agent.pid, state = name, detail = %s.detail, "agent cannot trace");
                }
                d.registry.publish(AgentEvent::TraceState {
                    id,
                    status: s.status,
                    session_id: s.session_id,
                    detail: s.detail,
                });
            }
            Msg::Heartbeat(_) => {}
            Msg::PmSamples(b) => {
                PmPublished::publish(d.pm_samples, id, crate::nvml::Source::CuptiPm, &b);
                let n = (b.samples.len() * b.metrics.len()) as u64;
                d.stats.queued_records.fetch_add(n, Relaxed);
                d.writer.send(WriterMsg::PmSamples { proc: id, batch: b }).await.map_err(|_| ConnError::Shutdown)?;
            }
            Msg::PcSamples(b) => {
                d.pc.add_batch(id, &b);
                let otlp = d.otlp_profiles;
                let streamed = d.pc.has_subscribers(b.session_id);
                if otlp || streamed {
                    let samples = self.names.rows(id, &b);
                    if otlp {
                        d.otlp_pc.add(id, b.start_ns, &samples);
                    }
                    if streamed {
                        let response = gpuprof_proto::api::StreamPcSamplesResponse {
                            samples,
                            start_ns: b.start_ns,
                            end_ns: b.end_ns,
                            dropped_samples: b.dropped_samples,
                        };
                        d.pc.publish(b.session_id, crate::pcsamp::Push { response });
                    }
                }
                d.stats.queued_records.fetch_add(b.samples.len() as u64, Relaxed);
                let rollup = b.session_id != 0 && b.session_id == d.sessions.node();
                d.writer
                    .send(WriterMsg::PcSamples { proc: id, batch: b, rollup })
                    .await
                    .map_err(|_| ConnError::Shutdown)?;
            }
            Msg::SamplerState(s) => {
                d.registry.publish(AgentEvent::SamplerState {
                    id,
                    device: s.device_id,
                    status: s.status,
                    detail: s.detail,
                });
            }
            Msg::Goodbye(_) => return Ok(false),
            Msg::PcSamplingState(s) => {
                if let Some(r) = d.pc.agent_state(id, &s).map_err(proto_err)? {
                    tracing::warn!(id, pid = self.agent.pid, device = s.device_id, reason = %r.reason, "PC sampling ended by the agent's report");
                    let _ = d.arbiter.release(r.lease, "gpuprofd", &r.reason);
                }
                if s.status == wire::PcSamplingStatus::HardwareBusy as i32
                    || s.status == wire::PcSamplingStatus::Stopped as i32
                {
                    // A retry after HARDWARE_BUSY is one of the supervisor's deadlines, and a
                    // stop may let the GPU's scheduler hand the GPU over now.
                    d.sessions.wake_supervisor();
                }
            }
            Msg::DeviceActivity(a) => {
                if d.pc.activity(id, working_devices(&a), std::time::Instant::now()) {
                    d.sessions.wake_supervisor();
                }
            }
            Msg::CubinQuery(q) => {
                let scope = crate::pcsamp::lookup::Scope::of(self.agent);
                let (db, nowhere, to) = (d.db_path.to_path_buf(), d.pc.nowhere.clone(), self.agent.commands.clone());
                // Answered beside the reading of the connection, one answer after another.
                match self.answers.task(db, scope, q.hashes, nowhere, to) {
                    Some(answer) => drop(tokio::spawn(answer)),
                    None => tracing::debug!(id, "cubin query left unanswered: two are waiting"),
                }
            }
            Msg::CubinsNotFound(n) => {
                tracing::debug!(id, cubins = n.hashes.len(), "cubins found in no mapped file");
                let scope = crate::pcsamp::lookup::Scope::of(self.agent);
                d.pc.nowhere.note(&scope, &n.hashes, std::time::Instant::now());
            }
            Msg::Cubin(c) => {
                if let Some((hash, data)) = self.check.cubin(c, |h| d.pc.cubin_known(h))?
                    && d.pc.cubin_stored(&hash)
                {
                    tracing::debug!(id, hash = %hash, bytes = data.len(), "cubin received");
                    d.writer.send(WriterMsg::Cubin { proc: id, hash, data }).await.map_err(|_| ConnError::Shutdown)?;
                }
            }
        }
        Ok(true)
    }
}

/// The devices an agent's activity report says it works on (for the GPUs' PC-sampling
/// schedulers): with a context there, and synchronizations or kernel launches seen on it.
fn working_devices(a: &gpuprof_proto::agent::DeviceActivity) -> impl Iterator<Item = u32> + '_ {
    a.devices.iter().filter(|u| u.context && (u.syncs > 0 || u.launches > 0)).map(|u| u.device_id)
}

#[cfg(test)]
mod activity_tests {
    use gpuprof_proto::agent::{DeviceActivity, DeviceUse};

    #[test]
    fn a_device_is_worked_on_with_synchronizations_or_launches_and_a_context() {
        let u = |device_id, context, syncs, launches| DeviceUse { device_id, context, syncs, launches };
        let a =
            DeviceActivity { devices: vec![u(0, true, 3, 0), u(1, true, 0, 40), u(2, true, 0, 0), u(3, false, 5, 5)] };
        assert_eq!(super::working_devices(&a).collect::<Vec<_>>(), [0, 1]);
    }
}
