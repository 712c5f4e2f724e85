//! CUPTI activity tracing: the buffer callbacks (which run on CUPTI's and the application's
//! threads and only hand buffers over), and the backend the background thread drives to start,
//! flush and stop a trace and to notice when another CUPTI client displaced it.
// Safety: the `extern "C"` callbacks receive raw pointers from CUPTI; each use is commented.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError};
use gpuprof_proto::agent as pb;

use crate::cbids;
use crate::config::ApiMode;
use crate::convert::kind_of_activity;
use crate::log::log;
use crate::pool::{Buf, Pool};
use crate::records;
use crate::wake::Wake;
use gpuprof_cupti::sys::cupti as sys;
use gpuprof_cupti::{Cupti, CuptiError};

/// A buffer of raw records on its way to the background thread.
pub trait RecordSource: Send {
    /// Calls `f` with the bytes of each record (at least the record's struct size when the
    /// buffer holds it).
    fn for_each(&self, f: &mut dyn FnMut(&[u8]));
    /// Reads the C string at an address found in one of the records.
    fn read_str(&self, addr: u64) -> Option<String>;
}

pub type Completed = Box<dyn RecordSource>;

/// Milliseconds on a monotonic clock, for "last callback" bookkeeping.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// State the CUPTI callbacks reach through a static.
pub struct Shared {
    pub pid: u32,
    pub cupti: Arc<Cupti>,
    pub pool: Pool,
    pub tx: Sender<Completed>,
    pub wake: Arc<Wake>,
    /// `now_ms()` of the last buffer request or completion.
    pub last_callback_ms: AtomicU64,
    /// Records CUPTI reported dropped (cuptiActivityGetNumDroppedRecords), summed.
    pub cupti_dropped: AtomicU64,
    /// Records dropped because the queue to the background thread was full, per RecordKind.
    pub queue_dropped: [AtomicU64; 16],
    /// Buffers whose records were handed over, and those CUPTI returned that were not ours.
    pub buffers_completed: AtomicU64,
    pub foreign_buffers: AtomicU64,
}

static SHARED: OnceLock<Arc<Shared>> = OnceLock::new();

/// True while CUPTI activity kinds are enabled by this library (read by the exit handler).
pub static TRACING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Installs the callbacks' state (once per process).
pub fn install(shared: Arc<Shared>) -> Arc<Shared> {
    SHARED.get_or_init(|| shared).clone()
}

fn shared() -> Option<&'static Arc<Shared>> {
    let s = SHARED.get()?;
    // A forked child inherits the parent's CUPTI state but not its background thread.
    (s.pid == std::process::id()).then_some(s)
}

/// CUPTI asks for an empty buffer (on an application or CUPTI thread).
extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let got = catch_unwind(|| {
        let s = shared()?;
        s.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        // CUPTI owns the buffer until buffer_completed hands it back.
        s.pool.take().map(|b| (b.into_raw(), s.pool.buffer_size()))
    })
    .ok()
    .flatten();
    let (p, n) = got.unwrap_or((std::ptr::null_mut(), 0));
    // Safety: CUPTI passes valid out pointers.
    unsafe {
        *buffer = p;
        *size = n;
        *max_records = 0;
    }
}

/// CUPTI returns a buffer of records (on CUPTI's thread or the thread that flushed).
/// Only hands it over: no decoding, no I/O here.
extern "C" fn buffer_completed(ctx: sys::CUcontext, stream_id: u32, buffer: *mut u8, _size: usize, valid: usize) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let Some(s) = shared() else { return };
        s.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        // Safety: `ctx` and `stream_id` are what CUPTI passed to this callback.
        let dropped = unsafe { s.cupti.dropped_records(ctx, stream_id) } as u64;
        if dropped > 0 {
            s.cupti_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        let Some(buf) = s.pool.claim(buffer) else {
            s.foreign_buffers.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if valid == 0 {
            s.pool.put(buf);
            return;
        }
        let item: Completed = Box::new(CuptiBuffer { buf: Some(buf), valid, shared: s.clone() });
        match s.tx.try_send(item) {
            Ok(()) => {
                s.buffers_completed.fetch_add(1, Ordering::Relaxed);
                s.wake.wake();
            }
            Err(TrySendError::Full(item) | TrySendError::Disconnected(item)) => {
                item.for_each(&mut |rec| {
                    if let Some(k) = records::peek_kind(rec) {
                        s.queue_dropped[kind_of_activity(k) as usize].fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
    }));
}

/// A completed CUPTI buffer; returns itself to the pool when dropped.
struct CuptiBuffer {
    buf: Option<Buf>,
    valid: usize,
    shared: Arc<Shared>,
}

impl RecordSource for CuptiBuffer {
    fn for_each(&self, f: &mut dyn FnMut(&[u8])) {
        let Some(buf) = &self.buf else { return };
        let base = buf.as_ptr();
        // Safety: CUPTI wrote `valid` bytes of records at the start of this buffer and gave up
        // ownership in buffer_completed; nothing else writes it until it is returned.
        let whole = unsafe { std::slice::from_raw_parts(base as *const u8, self.valid) };
        // Safety: `base`/`valid` describe a completed CUPTI buffer (above).
        unsafe {
            self.shared.cupti.for_each_record(base, self.valid, |rec| {
                let off = (rec as usize).wrapping_sub(base as usize);
                if off >= whole.len() {
                    return;
                }
                let rest = &whole[off..];
                let len =
                    records::peek_kind(rest).and_then(records::record_size).map_or(rest.len(), |n| n.min(rest.len()));
                f(&rest[..len]);
            })
        };
    }

    fn read_str(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        // Safety: `addr` is a `const char*` field of a CUPTI record (kernel, marker or device
        // name): a NUL-terminated string owned by CUPTI that outlives the records.
        Some(unsafe { CStr::from_ptr(addr as usize as *const c_char) }.to_string_lossy().into_owned())
    }
}

impl Drop for CuptiBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.shared.pool.recycle(b);
        }
    }
}

/// How a trace start went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartOutcome {
    Tracing,
    /// Another CUPTI client (torch.profiler/Kineto) holds CUPTI: stood down.
    Displaced(String),
    Failed(String),
}

/// What the background thread drives. The CUPTI implementation is [`CuptiBackend`]; tests use
/// a fake that produces byte buffers.
pub trait Backend: Send {
    /// `cuptiGetVersion()` (0 when CUPTI did not load).
    fn cupti_version(&self) -> u32;
    /// Enables what `cfg` asks for.
    fn start(&mut self, cfg: &pb::TraceConfig) -> StartOutcome;
    /// Disables what `start` enabled and flushes the rest into the queue.
    fn stop(&mut self);
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

/// The trace configuration used when the daemon sends none (or an all-false one).
pub fn default_config() -> pb::TraceConfig {
    pb::TraceConfig {
        kernels: true,
        memcpy: true,
        memset: true,
        runtime_api: true,
        driver_api: true,
        sync: true,
        overhead: true,
        nvtx: true,
        external_correlation: true,
        graphs: false,
        flush_interval_ms: 0,
    }
}

/// Resolves an optional/empty configuration to the one to apply.
pub fn effective_config(cfg: Option<&pb::TraceConfig>) -> pb::TraceConfig {
    match cfg {
        Some(c)
            if c.kernels
                || c.memcpy
                || c.memset
                || c.runtime_api
                || c.driver_api
                || c.sync
                || c.overhead
                || c.nvtx
                || c.external_correlation
                || c.graphs =>
        {
            *c
        }
        Some(c) => pb::TraceConfig { flush_interval_ms: c.flush_interval_ms, ..default_config() },
        None => default_config(),
    }
}

/// Removes the parts named in `skip` (see `Config::skip`); kernels are never skipped.
pub fn apply_skip(mut cfg: pb::TraceConfig, skip: &[String]) -> pb::TraceConfig {
    for s in skip {
        match s.as_str() {
            "runtime_api" | "runtime" => cfg.runtime_api = false,
            "driver_api" | "driver" => cfg.driver_api = false,
            "memcpy" => cfg.memcpy = false,
            "memset" => cfg.memset = false,
            "sync" => cfg.sync = false,
            "overhead" => cfg.overhead = false,
            "nvtx" => cfg.nvtx = false,
            "external_correlation" => cfg.external_correlation = false,
            "graphs" => cfg.graphs = false,
            _ => {}
        }
    }
    cfg
}

/// The activity kinds a configuration enables, in enabling order.
pub fn kinds_for(cfg: &pb::TraceConfig) -> Vec<u32> {
    let mut k =
        vec![sys::CUPTI_ACTIVITY_KIND_DEVICE, sys::CUPTI_ACTIVITY_KIND_CONTEXT, sys::CUPTI_ACTIVITY_KIND_STREAM];
    if cfg.kernels {
        k.push(sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    }
    if cfg.memcpy {
        k.push(sys::CUPTI_ACTIVITY_KIND_MEMCPY);
        k.push(sys::CUPTI_ACTIVITY_KIND_MEMCPY2);
    }
    if cfg.memset {
        k.push(sys::CUPTI_ACTIVITY_KIND_MEMSET);
    }
    if cfg.sync {
        k.push(sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
    }
    if cfg.overhead {
        k.push(sys::CUPTI_ACTIVITY_KIND_OVERHEAD);
    }
    if cfg.nvtx {
        k.push(sys::CUPTI_ACTIVITY_KIND_MARKER);
    }
    if cfg.external_correlation {
        k.push(sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    }
    // Graph-level records replace per-node kernel records; with kernels on, kernels carry
    // graph ids and the cudaGraphLaunch/cuGraphLaunch API records mark the launches.
    if cfg.graphs && !cfg.kernels {
        k.push(sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE);
    }
    k
}

/// "N enables failed: first, second, third, ..." (a detail a person can read).
fn summarize(failures: &[String]) -> String {
    let shown: Vec<&str> = failures.iter().take(3).map(String::as_str).collect();
    let more = if failures.len() > 3 { ", ..." } else { "" };
    format!("{} enable call(s) failed: {}{more}", failures.len(), shown.join("; "))
}

/// How long without any buffer callback before checking for another subscriber.
const QUIET_BEFORE_PROBE: Duration = Duration::from_secs(1);

/// An API domain whose calls a trace records: its activity kind, one past its last callback
/// id, the ids gpuprof records (`cbids.rs`) and the per-id switch.
struct ApiDomain {
    name: &'static str,
    kind: sys::CUpti_ActivityKind,
    ids: u32,
    recorded: &'static [u32],
    set: fn(&Cupti, u32, bool) -> Result<(), CuptiError>,
}

static RUNTIME_API: ApiDomain = ApiDomain {
    name: "RUNTIME",
    kind: sys::CUPTI_ACTIVITY_KIND_RUNTIME,
    ids: sys::CUPTI_RUNTIME_TRACE_CBID_SIZE,
    recorded: cbids::RUNTIME,
    set: Cupti::enable_runtime_api,
};

static DRIVER_API: ApiDomain = ApiDomain {
    name: "DRIVER",
    kind: sys::CUPTI_ACTIVITY_KIND_DRIVER,
    ids: sys::CUPTI_DRIVER_TRACE_CBID_SIZE,
    recorded: cbids::DRIVER,
    set: Cupti::enable_driver_api,
};

/// CUPTI buffer settings applied at each trace start (see [`crate::config::Config`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Tuning {
    pub api_mode: ApiMode,
    /// The recorded runtime callback ids were switched on before the CUDA runtime initialised
    /// (see [`gpuprof_proto::hint`]): runtime API records need no RUNTIME kind.
    pub early_runtime: bool,
    pub prefill_buffers: usize,
    pub pinned: Option<bool>,
    pub device_buffer: Option<usize>,
}

pub struct CuptiBackend {
    shared: Arc<Shared>,
    tuning: Tuning,
    enabled: Vec<u32>,
    /// The API domains whose calls this trace records, and whether by kind (else by id).
    apis: Vec<(&'static ApiDomain, bool)>,
    displaced: bool,
    last_probe: Instant,
}

impl CuptiBackend {
    pub fn new(shared: Arc<Shared>, tuning: Tuning) -> CuptiBackend {
        CuptiBackend {
            shared,
            tuning,
            enabled: Vec::new(),
            apis: Vec::new(),
            displaced: false,
            last_probe: Instant::now(),
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
            c.set_attribute(sys::CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER, zeroed as u8),
        );
        if let Some(p) = self.tuning.pinned {
            set(
                "MEM_ALLOCATION_TYPE_HOST_PINNED",
                c.set_attribute(sys::CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, p as u8),
            );
        }
        if let Some(n) = self.tuning.device_buffer {
            set("DEVICE_BUFFER_SIZE", c.set_attribute(sys::CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE, n));
        }
        self.shared.pool.prefill(self.tuning.prefill_buffers);
    }

    /// Whether this trace records domain `d` by activity kind (else by callback id): by id when
    /// asked to (`GPUPROF_API_MODE=cbid`) or when the ids were switched on before the CUDA
    /// runtime initialised; by kind otherwise, the one way that works once the runtime runs.
    fn by_kind(&self, d: &ApiDomain) -> bool {
        match self.tuning.api_mode {
            ApiMode::Cbid => false,
            ApiMode::Kind => !(self.tuning.early_runtime && d.kind == sys::CUPTI_ACTIVITY_KIND_RUNTIME),
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

    fn displaced_detail(e: CuptiError) -> String {
        format!("{e}: another CUPTI client (e.g. torch.profiler/Kineto) holds CUPTI; gpuprof stood down")
    }
}

impl Backend for CuptiBackend {
    fn cupti_version(&self) -> u32 {
        self.cupti().version()
    }

    fn start(&mut self, cfg: &pb::TraceConfig) -> StartOutcome {
        if !self.enabled.is_empty() || !self.apis.is_empty() {
            self.stop();
        }
        self.displaced = false;
        if let Err(e) = self.cupti().probe_subscriber() {
            if e.is_other_subscriber() {
                return StartOutcome::Displaced(Self::displaced_detail(e));
            }
            log!(Warn, "subscriber probe: {e}");
        }
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
        if cfg.kernels && !self.enabled.contains(&sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            self.stop();
            return StartOutcome::Failed(format!("could not enable kernel tracing: {summary}"));
        }
        self.shared.last_callback_ms.store(now_ms(), Ordering::Relaxed);
        self.last_probe = Instant::now();
        TRACING.store(true, Ordering::SeqCst);
        StartOutcome::Tracing
    }

    fn stop(&mut self) {
        TRACING.store(false, Ordering::SeqCst);
        if self.displaced {
            // The other client owns the callbacks and the kinds now; disabling shared kinds
            // would break its trace. Leave CUPTI as it is.
            self.enabled.clear();
            self.apis.clear();
            return;
        }
        for kind in self.enabled.drain(..) {
            let _ = self.shared.cupti.activity_disable(kind);
        }
        for (d, by_kind) in std::mem::take(&mut self.apis) {
            if by_kind {
                // Back to CUPTI's default (every cbid on with the kind), for the next client.
                for cbid in 1..d.ids {
                    let _ = (d.set)(&self.shared.cupti, cbid, true);
                }
            } else {
                for &cbid in d.recorded {
                    let _ = (d.set)(&self.shared.cupti, cbid, false);
                }
            }
        }
        // Completed buffers first, then the partly filled ones.
        let _ = self.cupti().flush_all(false);
        let _ = self.cupti().flush_all(true);
    }

    fn tick(&mut self) -> Option<String> {
        if self.displaced {
            return None;
        }
        if let Err(e) = self.cupti().flush_all(false) {
            // CUPTI was finalized or re-initialised under us (e.g. by another client's teardown).
            self.displaced = true;
            TRACING.store(false, Ordering::SeqCst);
            return Some(format!("cuptiActivityFlushAll: {e}: CUPTI was reset by another client; gpuprof stood down"));
        }
        let quiet = now_ms().saturating_sub(self.shared.last_callback_ms.load(Ordering::Relaxed));
        if quiet >= QUIET_BEFORE_PROBE.as_millis() as u64 && self.last_probe.elapsed() >= QUIET_BEFORE_PROBE {
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

    fn external_drops(&self) -> ([u64; 16], u64) {
        let mut q = [0u64; 16];
        for (i, c) in self.shared.queue_dropped.iter().enumerate() {
            q[i] = c.load(Ordering::Relaxed);
        }
        (q, self.shared.cupti_dropped.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_map_to_kinds() {
        let all = kinds_for(&default_config());
        for k in [
            sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
            sys::CUPTI_ACTIVITY_KIND_MEMCPY,
            sys::CUPTI_ACTIVITY_KIND_MEMCPY2,
            sys::CUPTI_ACTIVITY_KIND_MEMSET,
            sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION,
            sys::CUPTI_ACTIVITY_KIND_OVERHEAD,
            sys::CUPTI_ACTIVITY_KIND_MARKER,
            sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
            sys::CUPTI_ACTIVITY_KIND_DEVICE,
        ] {
            assert!(all.contains(&k), "{k}");
        }
        assert!(!all.contains(&sys::CUPTI_ACTIVITY_KIND_KERNEL), "never the serializing KERNEL kind");
        assert!(!all.contains(&sys::CUPTI_ACTIVITY_KIND_RUNTIME), "API calls are selected per cbid");
        let graphs_only = pb::TraceConfig { graphs: true, ..Default::default() };
        assert!(kinds_for(&graphs_only).contains(&sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE));
    }

    #[test]
    fn skip_removes_parts_but_never_kernels() {
        let skip = vec!["runtime_api".to_string(), "nvtx".into(), "kernels".into(), "bogus".into()];
        let c = apply_skip(default_config(), &skip);
        assert!(c.kernels && !c.runtime_api && !c.nvtx && c.memcpy && c.driver_api);
    }

    #[test]
    fn empty_config_means_defaults() {
        assert_eq!(effective_config(None), default_config());
        let c = effective_config(Some(&pb::TraceConfig { flush_interval_ms: 100, ..Default::default() }));
        assert!(c.kernels && c.flush_interval_ms == 100);
        let only = pb::TraceConfig { kernels: true, ..Default::default() };
        assert_eq!(effective_config(Some(&only)), only);
    }
}
