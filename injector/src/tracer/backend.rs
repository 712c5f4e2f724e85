//! What the background thread drives: a trace backend, and the buffers of raw records it queues.

use gpuprof_proto::agent as pb;

/// A buffer of raw records on its way to the background thread.
pub trait RecordSource: Send {
    /// Calls `f` with the bytes of each record (at least the record's struct size when the
    /// buffer holds it).
    fn for_each(&self, f: &mut dyn FnMut(&[u8]));
    /// Reads the C string at an address found in one of the records.
    fn read_str(&self, addr: u64) -> Option<String>;
}

pub type Completed = Box<dyn RecordSource>;

/// How a trace start went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    Tracing,
    /// Another CUPTI client (torch.profiler/Kineto) holds CUPTI: stood down.
    Displaced(String),
    Failed(String),
}

/// What the background thread drives. The CUPTI implementation is
/// [`CuptiBackend`](super::CuptiBackend); tests use a fake that produces byte buffers.
pub trait Backend: Send + PcBackend {
    /// `cuptiGetVersion()` (0 when CUPTI did not load).
    fn cupti_version(&self) -> u32;
    /// Enables what `cfg` asks for.
    fn start(&mut self, cfg: &pb::TraceConfig) -> StartOutcome;
    /// Disables what `start` enabled and flushes the rest into the queue.
    fn stop(&mut self);
    /// After `stop` and the last records were sent: leaves CUPTI (see
    /// [`detach`](super::detach)). Returns the detail reported with the idle state.
    fn detach(&mut self) -> String {
        String::new()
    }
    /// While idle: the outcome of a detach left pending at the stop, once the application
    /// carried it out (logged, reported once).
    fn poll_detach(&mut self) -> Option<String> {
        None
    }
    /// Whether a detach left pending at the stop waits for the application (polled often
    /// meanwhile, so that its outcome is reported soon after it happens).
    fn detach_pending(&self) -> bool {
        false
    }
    /// Periodic flush while tracing. `Some(detail)` when another client displaced the trace.
    fn tick(&mut self) -> Option<String>;
    /// Drops counted outside the converter: (per-kind queue drops, CUPTI's own drops).
    fn external_drops(&self) -> ([u64; gpuprof_proto::kinds::SLOTS], u64);
    /// Switches API recording off and on again (the trace started while the CUDA runtime was
    /// initialising and CUPTI missed hooking it), or from callback ids to the activity kind when
    /// ids switched on at initialisation did not take. False when there was nothing to redo.
    fn reapply_api(&mut self) -> bool {
        false
    }
}

/// The backend's answer to a PC-sampling start while the device's last lease is still stopping.
pub const STILL_STOPPING: &str = "the previous lease on this device is still stopping";

/// A PC-sampling lease the daemon granted for one device, as the backend needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcRequest {
    pub session: u64,
    /// CUDA device ordinal in this process.
    pub device: u32,
    /// Period as a power of two of SM cycles (5..31; 0: 10).
    pub period_log2: u32,
    /// Stall reasons to collect, without CUPTI's "smsp__pcsamp_warps_issue_" prefix (empty: all).
    pub stall_reasons: Vec<String>,
    pub hw_buffer_mib: u32,
    pub scratch_buffer_mib: u32,
    /// Sample for as long as the lease lasts instead of in windows.
    pub continuous: bool,
    /// Windows: each window's length in ms (0: 20).
    pub window_ms: u32,
    /// Windows: the cost budget in parts per million (0: 5000).
    pub cost_budget_ppm: u32,
}

/// What happened to PC sampling on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcEventKind {
    /// Sampling began on the device's context.
    Sampling,
    /// Stopped on request; hardware released.
    Stopped,
    /// Could not start or had to stop.
    Failed,
    /// Another client holds the performance monitor; stopped.
    HardwareBusy,
    /// The hardware buffer was stuck full; disabled and enabled again.
    Healed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcEvent {
    pub device: u32,
    pub kind: PcEventKind,
    pub detail: String,
}

/// Samples of one (function, PC, stall reason) in a period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcRow {
    /// The function name as CUPTI reports it (mangled).
    pub function: std::sync::Arc<str>,
    pub pc_offset: u64,
    /// The stall reason as CUPTI names it.
    pub stall: std::sync::Arc<str>,
    pub count: u64,
    /// The cubin's CRC as 16 hex digits ("" when unknown).
    pub module: String,
    /// Source file and line ("" and 0 when unknown).
    pub file: std::sync::Arc<str>,
    pub line: u32,
}

/// One device's samples since the previous collection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PcBatch {
    pub device: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub rows: Vec<PcRow>,
    pub total_samples: u64,
    pub dropped_samples: u64,
    /// Time sampling was enabled in the period (windows: their total).
    pub sampled_ns: u64,
}

/// What a PC collection produced.
#[derive(Default)]
pub struct PcOutput {
    pub batches: Vec<PcBatch>,
    pub events: Vec<PcEvent>,
    /// Cubins by hash, for the hashes the batches name (the agent sends each once).
    pub cubins: Vec<(String, std::sync::Arc<Vec<u8>>)>,
    /// Cubins of modules loaded before sampling began, to ask the daemon for before looking in
    /// the mapped files (the answer comes to [`PcBackend::pc_cubin_answer`]).
    pub cubin_query: Vec<String>,
    /// Cubins looked for in the mapped files and found in none.
    pub cubins_not_found: Vec<String>,
}

/// The daemon's answer to a cubin query: the cubins it had (hash, bytes), those a process of
/// the same user found in no mapped file lately, and those it does not know.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CubinAnswer {
    pub cubins: Vec<(String, Vec<u8>)>,
    pub nowhere: Vec<String>,
    pub unknown: Vec<String>,
}

/// PC sampling, driven by the background thread while the daemon grants leases.
pub trait PcBackend {
    /// Starts sampling on `req.device` (when its context exists; else at a later collection).
    fn pc_start(&mut self, req: PcRequest) -> Result<(), String> {
        let _ = req;
        Err("PC sampling is not available in this backend".into())
    }
    /// Stops sampling on `device`; what it still held comes with the next [`PcBackend::pc_collect`].
    fn pc_stop(&mut self, device: u32, reason: &str) {
        let _ = (device, reason);
    }
    /// Reads what every sampling device collected.
    fn pc_collect(&mut self) -> PcOutput {
        PcOutput::default()
    }
    /// After stops: waits briefly for them to complete (see [`PcBackend::pc_stop`]), then collects.
    fn pc_finish(&mut self) -> PcOutput {
        self.pc_collect()
    }
    /// At exit, after the exiting thread read and disabled every context: what remains to send.
    /// Makes no CUDA or CUPTI call.
    fn pc_exit(&mut self) -> PcOutput {
        PcOutput::default()
    }
    /// The daemon answered a cubin query ([`PcOutput::cubin_query`]).
    fn pc_cubin_answer(&mut self, answer: CubinAnswer) {
        let _ = answer;
    }
    /// Devices with a lease (sampling or waiting for their context).
    fn pc_devices(&self) -> Vec<u32> {
        Vec::new()
    }
    /// Per device of `devices` (CUDA ordinals): whether the process has an active primary
    /// context there and the CUDA synchronizations on it since the last call.
    fn device_activity(&mut self, devices: &[u32]) -> Vec<(u32, bool, u64, u64)> {
        let _ = devices;
        Vec::new()
    }
}
