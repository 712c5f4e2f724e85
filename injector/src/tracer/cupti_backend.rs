//! [`CuptiBackend`]: starts, flushes and stops a trace through CUPTI and notices when another
//! CUPTI client displaced it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;

use super::backend::{Backend, PcBackend, PcOutput, PcRequest, StartOutcome};
use super::callbacks::{Shared, TRACING, buffer_completed, buffer_requested, now_ms};
use super::detach::{self, Detached, Detacher};
use super::hooks;
use super::pc::{self, PcSampler};
use super::switches::{ApiDomain, DRIVER_API, RUNTIME_API, Switches};
use super::trace_config::kinds_for;
use crate::config::{ApiMode, DetachMode};
use crate::log::log;
use gpuprof_cupti::ids;
use gpuprof_cupti::{Cupti, CuptiError};

/// "N enables failed: first, second, third, ..." (a detail a person can read).
fn summarize(failures: &[String]) -> String {
    let shown: Vec<&str> = failures.iter().take(3).map(String::as_str).collect();
    let more = if failures.len() > 3 { ", ..." } else { "" };
    format!("{} enable call(s) failed: {}{more}", failures.len(), shown.join("; "))
}

/// How long without any buffer callback before checking for another subscriber.
const QUIET_BEFORE_PROBE: Duration = Duration::from_secs(1);

/// Hooks the runtime's API callbacks inside `cuInit` without recording the calls gpuprof
/// records: switches on one runtime callback id that applications rarely call
/// (`cudaProfilerStart`). Once a runtime callback id is on before the CUDA runtime initialises,
/// ids switched on later record too, so a late trace records API calls by id instead of by the
/// RUNTIME kind (which makes CUPTI intercept every runtime call). True when CUPTI took it.
///
/// Measured alternatives (H100, PyTorch loop of small kernels, traced late): the recorded ids
/// switched on and off again inside `cuInit`, 1.41x and 20 % of the API records lost; the rare
/// id switched on and off again, 1.43x; hooking again after a finalizing detach (the runtime
/// already running), no API records and 1.08x after the stop.
pub fn hook_runtime(cupti: &Cupti) -> bool {
    cupti.enable_runtime_api(ids::CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000, true).is_ok()
}

/// CUPTI buffer settings applied at each trace start (see [`crate::config::Config`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    pub api_mode: ApiMode,
    /// The recorded runtime callback ids were switched on, or the runtime hooked
    /// ([`hook_runtime`]), before the CUDA runtime initialised (see [`gpuprof_proto::hint`]):
    /// runtime API records need no RUNTIME kind.
    pub early_runtime: bool,
    pub prefill_buffers: usize,
    pub pinned: Option<bool>,
    pub device_buffer: Option<usize>,
    pub detach: DetachMode,
}

pub struct CuptiBackend {
    shared: Arc<Shared>,
    tuning: Tuning,
    enabled: Vec<u32>,
    /// The API domains whose calls this trace records, and whether by kind (else by id).
    apis: Vec<(&'static ApiDomain, bool)>,
    displaced: bool,
    last_probe: Instant,
    detacher: Detacher,
    pc: PcSampler,
    /// [`hooks::finalizations`] when last looked at: PC sampling finalizes CUPTI between its
    /// windows too, which ends what was hooked inside `cuInit` as a detach does.
    finalizations: u64,
}

impl CuptiBackend {
    pub fn new(shared: Arc<Shared>, tuning: Tuning) -> CuptiBackend {
        // The subscriber's callback runs what these register.
        pc::register_hooks();
        pc::set_detach_mode(tuning.detach);
        detach::register_hooks();
        CuptiBackend {
            tuning,
            enabled: Vec::new(),
            apis: Vec::new(),
            finalizations: 0,
            displaced: false,
            last_probe: Instant::now(),
            detacher: Detacher::default(),
            pc: PcSampler::new(shared.cupti.clone()),
            shared,
        }
    }

    fn cupti(&self) -> &Cupti {
        &self.shared.cupti
    }

    /// Buffer attributes, set before the callbacks are registered and any kind is enabled (as
    /// CUPTI asks), and the pool's first buffers. A refused attribute is logged and skipped.
    fn apply_tuning(&self) {
        let c = self.cupti();
        let set = |name: &str, r: Result<(), CuptiError>| {
            if let Err(e) = r {
                log!(Warn, "{name}: {e}");
            }
        };
        let zeroed = self.shared.pool.zeroed();
        set(
            "ZEROED_OUT_ACTIVITY_BUFFER",
            c.set_attribute(ids::CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, zeroed as u8),
        );
        if let Some(p) = self.tuning.pinned {
            set(
                "MEM_ALLOCATION_TYPE_HOST_PINNED",
                c.set_attribute(ids::CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, p as u8),
            );
        }
        if let Some(n) = self.tuning.device_buffer {
            set("DEVICE_BUFFER_SIZE", c.set_attribute(ids::CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, n));
        }
        self.shared.pool.prefill(self.tuning.prefill_buffers);
    }

    /// Whether this trace records domain `d` by activity kind (else by callback id): by id when
    /// asked to (`GPUPROF_API_MODE=cbid`) or when the ids were switched on before the CUDA
    /// runtime initialised; by kind otherwise, the one way that works once the runtime runs.
    fn by_kind(&self, d: &ApiDomain) -> bool {
        match self.tuning.api_mode {
            ApiMode::Cbid => false,
            ApiMode::Kind => !(self.tuning.early_runtime && d.kind == ids::CUPTI_ACTIVITY_KIND_RUNTIME),
        }
    }

    /// Switches API recording of `d` on: the kind with the ids gpuprof does not record off, or
    /// only the recorded ids.
    fn enable_api(&mut self, d: &'static ApiDomain, by_kind: bool) -> Result<(), String> {
        if by_kind {
            self.cupti().activity_enable(d.kind).map_err(|e| format!("kind {}: {e}", d.name))?;
            if !self.enabled.contains(&d.kind) {
                self.enabled.push(d.kind);
            }
            for cbid in (1..d.ids).filter(|c| !d.recorded.contains(c)) {
                let _ = (d.set)(self.cupti(), cbid, false);
            }
            return Ok(());
        }
        let mut first = None;
        for &cbid in d.recorded {
            if let Err(e) = (d.set)(self.cupti(), cbid, true) {
                first.get_or_insert(format!("{} cbid {cbid}: {e}", d.name));
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn after_detach(&mut self, d: &Detached) {
        if *d == Detached::Finalized {
            // The callback ids switched on inside cuInit went with CUPTI: from now on API
            // calls are recorded as for a late attach (hooking the runtime again once it runs
            // records nothing by id).
            self.tuning.early_runtime = false;
        }
    }

    fn displaced_detail(e: CuptiError) -> String {
        format!("{e}: another CUPTI client (e.g. torch.profiler/Kineto) holds CUPTI; gpuprof stood down")
    }
}

impl Backend for CuptiBackend {
    fn cupti_version(&self) -> u32 {
        self.cupti().version()
    }

    fn start(&mut self, cfg: &pb::TraceConfig) -> StartOutcome {
        let _cupti = hooks::background();
        if !self.enabled.is_empty() || !self.apis.is_empty() {
            self.stop();
        }
        self.displaced = false;
        let cupti = self.shared.cupti.clone();
        if let Some(d) = self.detacher.settle(&cupti) {
            log!(Info, "the last trace's pending detach: {}", d.detail());
            self.after_detach(&d);
        }
        if hooks::finalizations() != self.finalizations {
            self.finalizations = hooks::finalizations();
            self.after_detach(&Detached::Finalized);
        }
        // A subscriber gpuprof holds (kept from the last trace, or PC sampling's) is no sign of
        // another client.
        if !hooks::held()
            && let Err(e) = self.cupti().probe_subscriber()
        {
            if e.is_other_subscriber() {
                return StartOutcome::Displaced(Self::displaced_detail(e));
            }
            log!(Warn, "subscriber probe: {e}");
        }
        // A finalize between PC-sampling windows must not come while this trace switches on.
        hooks::set_activity(true);
        self.detacher.prepare(&cupti, self.tuning.detach);
        self.apply_tuning();
        if let Err(e) = self.cupti().register_callbacks(Some(buffer_requested), Some(buffer_completed)) {
            return StartOutcome::Failed(format!("cuptiActivityRegisterCallbacks: {e}"));
        }
        let mut failures = Vec::new();
        if cfg.sync {
            let _ = self.cupti().enable_all_sync_records(false);
        }
        for kind in kinds_for(cfg) {
            match self.cupti().activity_enable(kind) {
                Ok(()) => self.enabled.push(kind),
                Err(e) => failures.push(format!("kind {kind}: {e}")),
            }
        }
        for (wanted, d) in [(cfg.runtime_api, &RUNTIME_API), (cfg.driver_api, &DRIVER_API)] {
            if !wanted {
                continue;
            }
            let by_kind = self.by_kind(d);
            if let Err(e) = self.enable_api(d, by_kind) {
                failures.push(e);
            }
            self.apis.push((d, by_kind));
        }
        let summary = summarize(&failures);
        if !failures.is_empty() {
            log!(Warn, "trace start: {summary}");
        }
        if cfg.kernels && !self.enabled.contains(&ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            self.stop();
            return StartOutcome::Failed(format!("could not enable kernel tracing: {summary}"));
        }
        self.shared.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        self.last_probe = Instant::now();
        hooks::set_activity(!self.enabled.is_empty() || !self.apis.is_empty());
        TRACING.store(true, Ordering::SeqCst);
        StartOutcome::Tracing
    }

    fn stop(&mut self) {
        let _cupti = hooks::background();
        TRACING.store(false, Ordering::SeqCst);
        hooks::set_activity(false);
        if self.pc.devices().is_empty() {
            // A PC-sampling session awaited this process but sampled nothing: what was taken
            // at cuInit for it goes (before the finalize below looks at the subscriber).
            pc::release_from_start(&self.shared.cupti);
        }
        if self.displaced {
            // The other client owns the callbacks and the kinds now; disabling shared kinds
            // would break its trace. Leave CUPTI as it is.
            self.enabled.clear();
            self.apis.clear();
            return;
        }
        let switches = Switches { kinds: std::mem::take(&mut self.enabled), apis: std::mem::take(&mut self.apis) };
        if self.detacher.can_finalize(self.tuning.detach) {
            // The whole stop on an application thread, at a synchronization's exit: nothing of
            // CUPTI changes under the application's launches (see `detach`).
            let cupti = self.shared.cupti.clone();
            self.detacher.stop_and_finalize(&cupti, switches);
            return;
        }
        if switches.kinds.is_empty() && switches.apis.is_empty() && !hooks::held() {
            // Nothing was on, and PC sampling finalized CUPTI between its windows: a CUPTI
            // call here would only initialise it again.
            return;
        }
        switches.off_here(self.cupti());
    }

    fn detach(&mut self) -> String {
        let _cupti = hooks::background();
        let cupti = self.shared.cupti.clone();
        let d = self.detacher.detach(&cupti, self.tuning.detach, self.displaced);
        log!(Info, "trace stopped, {}", d.detail());
        self.after_detach(&d);
        d.detail()
    }

    fn detach_pending(&self) -> bool {
        self.detacher.is_pending()
    }

    fn poll_detach(&mut self) -> Option<String> {
        let _cupti = hooks::background();
        let d = self.detacher.poll(&self.shared.cupti.clone())?;
        self.after_detach(&d);
        Some(d.detail())
    }

    fn tick(&mut self) -> Option<String> {
        let _cupti = hooks::background();
        // A trace with nothing on (a PC-only session) has no records to flush, and no CUPTI
        // call may initialise CUPTI again while PC sampling has it finalized between windows.
        if self.displaced || (self.enabled.is_empty() && self.apis.is_empty()) {
            return None;
        }
        if let Err(e) = self.cupti().flush_all(false) {
            // CUPTI was finalized or re-initialised under us (e.g. by another client's teardown).
            self.displaced = true;
            TRACING.store(false, Ordering::SeqCst);
            return Some(format!("cuptiActivityFlushAll: {e}: CUPTI was reset by another client; gpuprof stood down"));
        }
        let quiet = now_ms().saturating_sub(self.shared.last_callback_ms.load(Ordering::Relaxed));
        // While gpuprof holds the process's subscriber (a trace that will detach, PC sampling),
        // a probe would only find gpuprof itself; another client's cuptiSubscribe fails then.
        if quiet >= QUIET_BEFORE_PROBE.as_millis() as u64
            && self.last_probe.elapsed() >= QUIET_BEFORE_PROBE
            && !hooks::held()
        {
            self.last_probe = Instant::now();
            if let Err(e) = self.cupti().probe_subscriber()
                && e.is_other_subscriber()
            {
                self.displaced = true;
                TRACING.store(false, Ordering::SeqCst);
                return Some(Self::displaced_detail(e));
            }
        }
        None
    }

    fn reapply_api(&mut self) -> bool {
        let _cupti = hooks::background();
        if self.displaced || self.apis.is_empty() {
            return false;
        }
        for i in 0..self.apis.len() {
            let (d, by_kind) = self.apis[i];
            let c = &self.shared.cupti;
            if by_kind {
                let _ = c.activity_disable(d.kind);
                let _ = c.activity_enable(d.kind);
            } else if self.tuning.api_mode == ApiMode::Kind {
                // The ids switched on early did not take: record by kind from now on.
                log!(Info, "no {} API records by callback id; recording by activity kind", d.name);
                if self.enable_api(d, true).is_ok() {
                    self.apis[i].1 = true;
                }
            } else {
                for &cbid in d.recorded {
                    let _ = (d.set)(c, cbid, false);
                    let _ = (d.set)(c, cbid, true);
                }
            }
        }
        true
    }

    fn external_drops(&self) -> ([u64; gpuprof_proto::kinds::SLOTS], u64) {
        let mut q = [0u64; gpuprof_proto::kinds::SLOTS];
        for (i, c) in self.shared.queue_dropped.iter().enumerate() {
            q[i] = c.load(Ordering::Relaxed);
        }
        (q, self.shared.cupti_dropped.load(Ordering::Relaxed))
    }
}

impl PcBackend for CuptiBackend {
    fn pc_start(&mut self, req: PcRequest) -> Result<(), String> {
        let _cupti = hooks::background();
        if self.displaced {
            return Err("another CUPTI client holds CUPTI".into());
        }
        self.pc.start(req)
    }
    fn pc_stop(&mut self, device: u32, reason: &str) {
        let _cupti = hooks::background();
        self.pc.stop(device, reason);
    }
    fn pc_collect(&mut self) -> PcOutput {
        let _cupti = hooks::background();
        self.pc.collect(Duration::ZERO)
    }
    fn pc_finish(&mut self) -> PcOutput {
        let _cupti = hooks::background();
        self.pc.collect(detach::CALLBACK_WAIT * 4)
    }
    fn pc_exit(&mut self) -> PcOutput {
        self.pc.collect_at_exit()
    }
    fn pc_cubin_answer(&mut self, answer: crate::tracer::CubinAnswer) {
        let _cupti = hooks::background();
        self.pc.cubin_answer(answer);
    }
    fn pc_devices(&self) -> Vec<u32> {
        self.pc.devices()
    }
    fn device_activity(&mut self, devices: &[u32]) -> Vec<(u32, bool, u64, u64)> {
        pc::device_activity(devices)
    }
}
