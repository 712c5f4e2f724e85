//! What a trace switched on ([`Switches`]: activity kinds, and API domains recorded by kind or
//! by callback id) and how a stop switches it off again, on gpuprof's thread or right before
//! `cuptiFinalize` on an application thread.

use crate::cbids;
use crate::log::log;
use gpuprof_cupti::ids;
use gpuprof_cupti::{Cupti, CuptiError};

/// An API domain whose calls a trace records: its activity kind, one past its last callback
/// id, the ids gpuprof records (`cbids.rs`) and the per-id switch.
pub(super) struct ApiDomain {
    pub(super) name: &'static str,
    pub(super) kind: ids::CUpti_ActivityKind,
    pub(super) ids: u32,
    pub(super) recorded: &'static [u32],
    pub(super) set: fn(&Cupti, u32, bool) -> Result<(), CuptiError>,
}

pub(super) static RUNTIME_API: ApiDomain = ApiDomain {
    name: "RUNTIME",
    kind: ids::CUPTI_ACTIVITY_KIND_RUNTIME,
    ids: ids::CUPTI_RUNTIME_TRACE_CBID_SIZE,
    recorded: cbids::RUNTIME,
    set: Cupti::enable_runtime_api,
};

pub(super) static DRIVER_API: ApiDomain = ApiDomain {
    name: "DRIVER",
    kind: ids::CUPTI_ACTIVITY_KIND_DRIVER,
    ids: ids::CUPTI_DRIVER_TRACE_CBID_SIZE,
    recorded: cbids::DRIVER,
    set: Cupti::enable_driver_api,
};

/// What a trace switched on: its activity kinds, and the API domains it records (by kind, or
/// else by callback id).
pub(super) struct Switches {
    pub(super) kinds: Vec<u32>,
    pub(super) apis: Vec<(&'static ApiDomain, bool)>,
}

impl Switches {
    /// The stop on gpuprof's thread, CUPTI staying attached: everything off, CUPTI's default
    /// callback ids back for the next client, the trace's work waited for, the last records
    /// flushed.
    pub(super) fn off_here(self, c: &Cupti) {
        for kind in self.kinds {
            let _ = c.activity_disable(kind);
        }
        for (d, by_kind) in self.apis {
            if by_kind {
                // Back to CUPTI's default (every cbid on with the kind), for the next client.
                for cbid in 1..d.ids {
                    let _ = (d.set)(c, cbid, true);
                }
            } else {
                for &cbid in d.recorded {
                    let _ = (d.set)(c, cbid, false);
                }
            }
        }
        wait_and_flush(c);
    }

    /// The stop on an application thread inside a synchronization's exit callback, right
    /// before `cuptiFinalize` (which resets the callback ids anyway): the kinds and recorded
    /// ids off, the trace's work waited for, the last records flushed.
    pub(super) fn off_before_finalize(self, c: &Cupti) {
        for kind in self.kinds {
            let _ = c.activity_disable(kind);
        }
        for (d, by_kind) in self.apis {
            if !by_kind {
                for &cbid in d.recorded {
                    let _ = (d.set)(c, cbid, false);
                }
            }
        }
        wait_and_flush(c);
    }
}

/// Work launched while tracing completes before the last flush (its records are then whole)
/// and before CUPTI may be finalized; completed buffers first, then the partly filled ones.
pub(super) fn wait_and_flush(c: &Cupti) {
    if let Some(driver) = gpuprof_cupti::device::Driver::already_loaded() {
        match driver.synchronize_active_primary_contexts() {
            Ok(n) => log!(Debug, "waited for {n} primary context(s) before the last flush"),
            Err(e) => log!(Warn, "{e}"),
        }
    }
    let _ = c.flush_all(false);
    let _ = c.flush_all(true);
}
