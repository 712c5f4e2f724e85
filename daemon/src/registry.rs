//! Live registry of connected agents (injected processes and samplers).
//!
//! Connection tasks insert and remove their entry; other parts of the daemon look
//! processes up, push commands to them, and subscribe to connect/disconnect/state events.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use dashmap::DashMap;
use gpuprof_proto::agent::DaemonMessage;
use tokio::sync::{broadcast, mpsc};

/// One connected agent.
#[derive(Debug)]
pub struct Agent {
    /// processes.id of this connection.
    pub id: u64,
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// "injector" or "sampler".
    pub kind: &'static str,
    pub exe: String,
    pub cmdline: Vec<String>,
    /// The cgroup path gpuprofd read from /proc/PID/cgroup (else the one the agent reported).
    pub cgroup: String,
    /// Container and pod the process runs in.
    pub placement: Placement,
    /// Its parent, the parent's parent, ... up to (not including) pid 1, as /proc said when it
    /// connected (empty when gpuprofd cannot see the process there): a pid target covers the
    /// process's descendants, such as the ranks a launcher started.
    pub ancestors: Vec<u32>,
    /// The distributed job the process reported (all empty when none).
    pub job: gpuprof_proto::agent::JobIdentity,
    pub cupti_version: u32,
    /// Samplers: the device they serve.
    pub sampler_device: u32,
    /// Injectors: the devices the process reported in its Hello (CUDA ordinals, UUIDs).
    pub devices: Vec<gpuprof_proto::agent::Device>,
    pub connected_at_ns: u64,
    /// Last frame received (ns since the Unix epoch).
    pub last_seen_ns: AtomicU64,
    /// Latest trace state reported (idle, tracing, displaced, failed).
    pub trace_state: std::sync::Mutex<String>,
    /// Commands to the agent; the connection's writer task drains it.
    pub commands: mpsc::Sender<DaemonMessage>,
}

#[cfg(test)]
impl Agent {
    /// An injector connection for tests: process id `id`, pid 100 + `id`, uid and gid 1000,
    /// `/usr/bin/app`, idle, no devices; commands go to `commands`.
    pub(crate) fn for_test(id: u64, commands: mpsc::Sender<DaemonMessage>) -> Agent {
        Agent {
            id,
            pid: 100 + id as u32,
            uid: 1000,
            gid: 1000,
            kind: "injector",
            exe: "/usr/bin/app".into(),
            cmdline: Vec::new(),
            cgroup: String::new(),
            placement: Default::default(),
            ancestors: Vec::new(),
            job: Default::default(),
            cupti_version: 0,
            sampler_device: 0,
            devices: Vec::new(),
            connected_at_ns: 0,
            last_seen_ns: 0.into(),
            trace_state: std::sync::Mutex::new("idle".into()),
            commands,
        }
    }
}

/// Where a process runs: its container and Kubernetes pod (empty strings when unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// Full container id (64 hex digits).
    pub container_id: String,
    /// "containerd", "cri-o", "docker", "podman", or empty when the cgroup path does not say.
    pub container_runtime: &'static str,
    /// Kubernetes pod UID.
    pub pod_uid: String,
    /// Pod name and namespace, from the kubelet's pod list when `[kubernetes]` is configured.
    pub pod_name: String,
    pub pod_namespace: String,
    /// The container's name in its pod, from the same pod list.
    pub container_name: String,
}

impl Agent {
    /// Queues a command without waiting; false if the agent is gone or its queue is full.
    pub fn send(&self, msg: DaemonMessage) -> bool {
        self.commands.try_send(msg).is_ok()
    }

    pub fn trace_state(&self) -> String {
        self.trace_state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Things that happen to agents, for sessions and the arbiter.
#[derive(Debug, Clone)]
pub enum AgentEvent {
    Connected(Arc<Agent>),
    Disconnected {
        id: u64,
        reason: String,
    },
    /// An injector's tracing state changed.
    TraceState {
        id: u64,
        status: i32,
        session_id: u64,
        detail: String,
    },
    /// A sampler's state changed.
    SamplerState {
        id: u64,
        device: u32,
        status: i32,
        detail: String,
    },
}

/// The registry itself.
pub struct Registry {
    agents: DashMap<u64, Arc<Agent>>,
    events: broadcast::Sender<AgentEvent>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry { agents: DashMap::new(), events: broadcast::channel(4096).0 }
    }
}

impl Registry {
    pub fn insert(&self, a: Arc<Agent>) {
        self.agents.insert(a.id, a.clone());
        let _ = self.events.send(AgentEvent::Connected(a));
    }

    pub fn remove(&self, id: u64, reason: String) {
        if self.agents.remove(&id).is_some() {
            let _ = self.events.send(AgentEvent::Disconnected { id, reason });
        }
    }

    pub fn get(&self, id: u64) -> Option<Arc<Agent>> {
        self.agents.get(&id).map(|e| e.value().clone())
    }

    /// A snapshot of all connected agents, ordered by id.
    pub fn all(&self) -> Vec<Arc<Agent>> {
        let mut v: Vec<_> = self.agents.iter().map(|e| e.value().clone()).collect();
        v.sort_by_key(|a| a.id);
        v
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.events.subscribe()
    }

    pub fn publish(&self, ev: AgentEvent) {
        let _ = self.events.send(ev);
    }

    pub fn touch(&self, a: &Agent, now_ns: u64) {
        a.last_seen_ns.store(now_ns, Relaxed);
    }
}
