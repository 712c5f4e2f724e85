//! Watching a trace with API records on until the first one arrives.

use gpuprof_proto::agent as pb;

use super::Agent;
use crate::log::log;
use crate::tracer::Backend;

/// Kernel and API record counts when the watch (re)started, and the re-enables done.
#[derive(Debug, Clone, Copy)]
pub(super) struct ApiWatch {
    pub(super) kernels: u64,
    pub(super) api: u64,
    pub(super) attempts: u32,
}

/// Kernels without a single API record after which API recording is switched off and on again.
const API_WATCH_KERNELS: u64 = 64;
/// How often that is tried in one trace.
pub(super) const API_WATCH_ATTEMPTS: u32 = 3;

impl<B: Backend> Agent<B> {
    /// CUPTI can miss hooking the CUDA runtime when a trace starts while the runtime is still
    /// initialising (seen in PyTorch processes): kernels then arrive but no API call ever does.
    /// Once `API_WATCH_KERNELS` kernels came without one, API recording is switched off and on
    /// again (at most `API_WATCH_ATTEMPTS` times); the first API record ends the watch.
    pub(super) fn check_api(&mut self) {
        let Some(w) = self.api_watch else { return };
        let kernels = self.conv.sent[pb::RecordKind::Kernel as usize];
        let api = self.conv.sent[pb::RecordKind::Api as usize];
        if api > w.api || w.attempts >= API_WATCH_ATTEMPTS {
            self.api_watch = None;
            return;
        }
        if kernels.saturating_sub(w.kernels) < API_WATCH_KERNELS {
            return;
        }
        let redone = self.backend.reapply_api();
        log!(Info, "{} kernels and no API record: API recording re-enabled ({redone})", kernels - w.kernels);
        self.api_watch = redone.then_some(ApiWatch { kernels, api, attempts: w.attempts + 1 });
    }
}
