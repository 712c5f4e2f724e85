//! What agent connections and other modules send to the writer thread.

use gpuprof_proto::agent::{self as wire, RecordBatch};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::catalog::Kind;

/// Facts about a newly connected agent, stored in `processes`.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub agent_kind: &'static str,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    pub placement: crate::registry::Placement,
    pub cupti_version: u32,
    /// Record times of this connection are stored relative to this.
    pub base_ns: u64,
    pub devices: Vec<wire::Device>,
    /// The distributed job the process reported.
    pub job: wire::JobIdentity,
}

/// A closure run on the writer's connection, outside any open transaction, in queue order.
pub type WriterCall = Box<dyn FnOnce(&mut Connection) + Send>;

/// Work for the writer thread.
pub enum WriterMsg {
    /// Insert the process row; replies with its id once committed.
    RegisterProcess(ProcessInfo, oneshot::Sender<Result<u64, String>>),
    /// The connection closed.
    ProcessClosed { proc: u64, reason: String },
    /// Strings defined by a connection, in id order starting after the previous ones.
    Strings { proc: u64, values: Vec<String> },
    /// Activity records; `count` is the number of records in the batch.
    /// `permit`: the batch's share of the queue's record budget
    /// ([`super::WriterHandle::reserve_records`]), returned when the writer takes the batch.
    Records { proc: u64, batch: RecordBatch, count: u64, permit: Option<tokio::sync::OwnedSemaphorePermit> },
    /// Cumulative drop counters of a connection (`None`: CUPTI's own drops, kind unknown).
    Drops { proc: u64, counts: Vec<(Option<Kind>, u64)> },
    /// PM samples from a sampler.
    PmSamples { proc: u64, batch: wire::PmSampleBatch },
    /// Device metrics read by the daemon itself (NVML, GPM) for the GPU with this UUID
    /// (`devices` row made if missing).
    DevicePm { uuid: String, name: String, pci_bus_id: String, batch: wire::PmSampleBatch },
    /// PC samples (aggregated) from an injector; `rollup`: of the node's always-on profile
    /// (summed per minute in `pc_rollup` instead of per PC in `pc_sample`).
    PcSamples { proc: u64, batch: wire::PcSampleBatch, rollup: bool },
    /// A whole cubin (reassembled from its chunks), stored once per hash.
    Cubin { proc: u64, hash: String, data: Vec<u8> },
    /// Run arbitrary writes in order (sessions, arbiter audit, ...).
    Call(WriterCall),
    /// Commit everything queued before this, then reply.
    Flush(oneshot::Sender<()>),
    /// Commit everything queued before this and stop (shutdown). Handles that are still
    /// held elsewhere get `WriterGone` from then on.
    Stop,
}
