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
pub trait Backend: Send {
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
    /// Periodic flush while tracing. `Some(detail)` when another client displaced the trace.
    fn tick(&mut self) -> Option<String>;
    /// Drops counted outside the converter: (per-kind queue drops, CUPTI's own drops).
    fn external_drops(&self) -> ([u64; 16], u64);
    /// Switches API recording off and on again (the trace started while the CUDA runtime was
    /// initialising and CUPTI missed hooking it), or from callback ids to the activity kind when
    /// ids switched on at initialisation did not take. False when there was nothing to redo.
    fn reapply_api(&mut self) -> bool {
        false
    }
}
