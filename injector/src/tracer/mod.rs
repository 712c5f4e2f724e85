//! CUPTI activity tracing: the buffer callbacks (which run on CUPTI's and the application's
//! threads and only hand buffers over), and the backend the background thread drives to start,
//! flush and stop a trace and to notice when another CUPTI client displaced it.
//!
//! Layout: `backend` holds the interface the background thread drives ([`Backend`],
//! [`RecordSource`]); `callbacks` the CUPTI buffer callbacks and the state they reach
//! ([`Shared`]); `cupti_backend` the CUPTI implementation ([`CuptiBackend`]); `trace_config` the
//! trace configuration and the activity kinds it enables; `switches` what a trace switched on
//! and how a stop switches it off; `detach` leaving CUPTI when a trace stops (`cuptiFinalize`);
//! `hooks` the process's one CUPTI subscriber, whose callback runs what `pc` and `detach`
//! registered with it (it names neither).

mod backend;
mod callbacks;
mod cupti_backend;
pub mod detach;
mod hooks;
mod pc;
mod switches;
mod trace_config;

pub use backend::{
    Backend, Completed, CubinAnswer, PcBackend, PcBatch, PcEvent, PcEventKind, PcOutput, PcRequest, PcRow,
    RecordSource, STILL_STOPPING, StartOutcome,
};
pub(crate) use callbacks::vouch_at_exit;
pub use callbacks::{Shared, TRACING, install, now_ms};
pub use cupti_backend::{CuptiBackend, Tuning, hook_runtime};
pub(crate) use pc::capture_from_start as pc_capture_from_start;
pub use pc::{STALL_PREFIX, select_stalls, stop_at_exit as pc_stop_at_exit};
pub use trace_config::{apply_skip, default_config, effective_config, kinds_for};
