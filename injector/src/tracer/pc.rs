//! Continuous PC sampling through CUPTI, driven from the background thread: enable and configure
//! on each leased device's primary context (as soon as it exists), read with `GetData` at every
//! collection, aggregate per (function, PC, stall reason), heal a hardware buffer stuck full,
//! stand down on HARDWARE_BUSY, and resolve PCs to source lines from the cubins captured at
//! module load.
//!
//! Cubins: while any device is leased the library holds a CUPTI subscriber with the module
//! load callback on (the one subscriber a process may have on CUDA 13.0; it is given up when
//! the last lease ends, before any detach). Each loaded module's cubin is copied once per CRC,
//! up to `GPUPROF_PC_CUBIN_MAX_MIB` (default 512) in all. Modules loaded before the lease are
//! not seen: their PCs carry no source line.
// Safety: the resource callback receives raw pointers from CUPTI; each use is commented.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use gpuprof_cupti::device::Driver;
use gpuprof_cupti::pcsampling::{PcBuffer, PcConfig, StallReasons, module_cubin};
use gpuprof_cupti::sys::cupti as sys;
use gpuprof_cupti::{Cupti, CuptiError, activity::Subscriber};

use super::backend::{PcBatch, PcEvent, PcEventKind, PcOutput, PcRequest, PcRow};
use crate::log::log;

/// CUPTI's prefix of every stall reason name.
pub const STALL_PREFIX: &str = "smsp__pcsamp_warps_issue_";
/// PCs read per `GetData` call.
const PCS_PER_READ: usize = 5000;
/// Reads per device per collection at most (then the rest waits for the next one).
const MAX_READS: usize = 64;
/// Time spent resolving source lines per collection at most.
const LINE_BUDGET: Duration = Duration::from_millis(100);

/// Cubins captured at module load, by CUPTI CRC.
struct Cubins {
    map: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
    bytes: AtomicUsize,
    max_bytes: usize,
    skipped: AtomicU64,
    cupti: Arc<Cupti>,
}

static CUBINS: OnceLock<Cubins> = OnceLock::new();
/// The process's CUDA driver (for making a context current).
static DRIVER: OnceLock<Driver> = OnceLock::new();
/// Cubins are kept only while a lease is held.
static CAPTURE: AtomicBool = AtomicBool::new(false);

fn cubin_budget() -> usize {
    let mib = std::env::var("GPUPROF_PC_CUBIN_MAX_MIB").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(512);
    mib << 20
}

/// Keeps a copy of a loaded module's cubin (once per CRC, within the budget); its CRC.
fn capture(bytes: &[u8]) -> Option<u64> {
    let c = CUBINS.get()?;
    let crc = c.cupti.cubin_crc(bytes).ok()?;
    if !CAPTURE.load(Ordering::Relaxed) {
        return Some(crc);
    }
    let mut map = c.map.lock().unwrap_or_else(|p| p.into_inner());
    if map.contains_key(&crc) {
        return Some(crc);
    }
    if c.bytes.load(Ordering::Relaxed) + bytes.len() > c.max_bytes {
        c.skipped.fetch_add(1, Ordering::Relaxed);
        return Some(crc);
    }
    c.bytes.fetch_add(bytes.len(), Ordering::Relaxed);
    map.insert(crc, Arc::new(bytes.to_vec()));
    Some(crc)
}

/// CUPTI asks for a module's CRC (at load, and for the modules loaded before sampling began).
extern "C" fn on_crc(cubin: *const c_void, size: usize, crc: *mut u64) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if cubin.is_null() || size == 0 || crc.is_null() {
            return;
        }
        // Safety: CUPTI passes `size` bytes of cubin, valid during this call.
        let bytes = unsafe { std::slice::from_raw_parts(cubin as *const u8, size) };
        if let Some(v) = capture(bytes) {
            // Safety: CUPTI's out pointer for the CRC.
            unsafe { *crc = v };
        }
    }));
}

/// The subscriber's callback: module loads (cubins) and, while an operation is armed, the exit
/// of a CUDA synchronization, where it runs.
extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if domain == sys::CUPTI_CB_DOMAIN_RESOURCE {
            if cbid == sys::CUPTI_CBID_RESOURCE_MODULE_LOADED {
                // Safety: a MODULE_LOADED resource callback's data; the slice is used only here.
                if let Some(bytes) = unsafe { module_cubin(cbdata) } {
                    capture(bytes);
                }
            }
            return;
        }
        // Safety: the other domains switched on are the runtime and driver APIs.
        if unsafe { gpuprof_cupti::activity::is_api_exit(cbdata) } && OPS_ARMED.swap(false, Ordering::SeqCst) {
            run_ops();
        }
    }));
}

/// Sampling enabled on one context.
struct Enabled {
    ctx: usize,
    /// The buffer CUPTI fills at disable; must stay put while enabled.
    at_disable: Box<PcBuffer>,
    read: PcBuffer,
}

type Agg = HashMap<(usize, u64, u64, u32), u64>;

/// Reads what CUPTI holds into `agg` until it has nothing left (or the read limit). The error,
/// and whether the hardware buffer was reported full, when a read failed.
fn drain(cupti: &Cupti, on: &mut Enabled, agg: &mut Agg, totals: &mut (u64, u64)) -> Option<(CuptiError, bool)> {
    let ctx = on.ctx as sys::CUcontext;
    // GetData reads the context current on the calling thread.
    match DRIVER.get() {
        // Safety: the context is live while sampling is enabled on it.
        Some(d) => unsafe { d.with_context(ctx, || drain_current(cupti, on, agg, totals)) },
        None => drain_current(cupti, on, agg, totals),
    }
}

fn drain_current(cupti: &Cupti, on: &mut Enabled, agg: &mut Agg, totals: &mut (u64, u64)) -> Option<(CuptiError, bool)> {
    let ctx = on.ctx as sys::CUcontext;
    for _ in 0..MAX_READS {
        // Safety: sampling is enabled on `ctx`, a primary context of this process.
        let r = unsafe { cupti.pc_get_data(ctx, &mut on.read) };
        absorb(&on.read, agg, totals);
        match r {
            Ok(()) if on.read.remaining_pcs() > 0 => continue,
            Ok(()) => return None,
            Err(e) => return Some((e, on.read.hardware_buffer_full())),
        }
    }
    None
}

fn absorb(buf: &PcBuffer, agg: &mut Agg, totals: &mut (u64, u64)) {
    for rec in buf.records() {
        for s in rec.stalls {
            let key = (rec.function_name as usize, rec.cubin_crc, rec.pc_offset, s.pcSamplingStallReasonIndex);
            *agg.entry(key).or_default() += u64::from(s.samples);
        }
    }
    totals.0 += buf.total_samples();
    totals.1 += buf.dropped_samples();
}

/// What to do with a context at a synchronization's exit.
enum OpKind {
    /// Read the rest and disable; then report `kind` with the reason.
    Stop(PcEventKind, String),
    /// Disable (the hardware buffer is stuck full); enabled again from the background thread.
    Heal(String),
}

/// Disabling sampling from the background thread while the application launches kernels hung
/// the application on the H100; it runs at the exit of a CUDA synchronization instead, on the
/// thread that synchronized (the application's, or the background thread's own as a fallback).
struct Op {
    device: u32,
    kind: OpKind,
    on: Enabled,
    agg: Agg,
    totals: (u64, u64),
    disabled: Option<Result<(), CuptiError>>,
}

static OPS: Mutex<Vec<Op>> = Mutex::new(Vec::new());
static OPS_ARMED: AtomicBool = AtomicBool::new(false);
static DONE: Mutex<Vec<Op>> = Mutex::new(Vec::new());

fn run_ops() {
    let Some(c) = CUBINS.get() else { return };
    let ops: Vec<Op> = std::mem::take(&mut *OPS.lock().unwrap_or_else(|p| p.into_inner()));
    let mut done = Vec::with_capacity(ops.len());
    for mut op in ops {
        if matches!(op.kind, OpKind::Stop(..)) {
            let _ = drain(&c.cupti, &mut op.on, &mut op.agg, &mut op.totals);
        }
        let ctx = op.on.ctx as sys::CUcontext;
        // Safety: the context was live when sampling was enabled on it.
        let disable = || unsafe { c.cupti.pc_disable(ctx) };
        op.disabled = Some(match DRIVER.get() {
            // Safety: as above.
            Some(d) => unsafe { d.with_context(ctx, disable) },
            None => disable(),
        });
        absorb(&op.on.at_disable, &mut op.agg, &mut op.totals);
        done.push(op);
    }
    DONE.lock().unwrap_or_else(|p| p.into_inner()).extend(done);
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Sampling, or waiting for the context to exist.
    Live,
    /// An operation is armed for the context.
    Waiting,
    /// Stopped: sent once more, then forgotten with this event.
    Closed(PcEventKind, String),
}

struct Dev {
    req: PcRequest,
    on: Option<Enabled>,
    reasons: Option<StallReasons>,
    agg: Agg,
    totals: (u64, u64),
    since_ns: u64,
    phase: Phase,
}

/// The PC sampler of a [`CuptiBackend`](super::CuptiBackend).
pub struct PcSampler {
    cupti: Arc<Cupti>,
    devs: HashMap<u32, Dev>,
    sub: Option<Subscriber>,
    sync_callbacks: bool,
    armed_at: Option<Instant>,
    crc_registered: bool,
    events: Vec<PcEvent>,
    names: HashMap<usize, (Arc<str>, CString)>,
    strs: HashMap<String, Arc<str>>,
    lines: HashMap<(u64, usize, u64), (Arc<str>, u32)>,
    no_line: Arc<str>,
}

impl PcSampler {
    pub fn new(cupti: Arc<Cupti>) -> PcSampler {
        PcSampler {
            cupti,
            devs: HashMap::new(),
            sub: None,
            sync_callbacks: false,
            armed_at: None,
            crc_registered: false,
            events: Vec::new(),
            names: HashMap::new(),
            strs: HashMap::new(),
            lines: HashMap::new(),
            no_line: Arc::from(""),
        }
    }

    /// Whether this sampler holds the process's CUPTI subscriber (the backend's probe for
    /// other subscribers must not run meanwhile).
    pub fn holds_subscriber(&self) -> bool {
        self.sub.is_some()
    }

    fn event(&mut self, device: u32, kind: PcEventKind, detail: impl Into<String>) {
        let detail = detail.into();
        log!(Info, "PC sampling on device {device}: {kind:?} {detail}");
        self.events.push(PcEvent { device, kind, detail });
    }

    fn subscribe(&mut self) {
        let _ = CUBINS.get_or_init(|| Cubins {
            map: Mutex::new(HashMap::new()),
            bytes: AtomicUsize::new(0),
            max_bytes: cubin_budget(),
            skipped: AtomicU64::new(0),
            cupti: self.cupti.clone(),
        });
        CAPTURE.store(true, Ordering::Relaxed);
        if !self.crc_registered {
            self.crc_registered = true;
            if let Err(e) = self.cupti.register_compute_crc(Some(on_crc)) {
                log!(Debug, "PC sampling: compute-CRC callback: {e}");
            }
        }
        if self.sub.is_some() {
            return;
        }
        match self.cupti.subscribe(Some(on_callback)) {
            Ok(s) => {
                if let Err(e) =
                    self.cupti.enable_callback(&s, sys::CUPTI_CB_DOMAIN_RESOURCE, sys::CUPTI_CBID_RESOURCE_MODULE_LOADED, true)
                {
                    log!(Warn, "PC sampling: module-load callback: {e}; no source lines for new modules");
                }
                self.sub = Some(s);
                self.sync_callbacks = false;
            }
            Err(e) => log!(Warn, "PC sampling: cannot subscribe to CUPTI ({e}): no cubins for source lines"),
        }
    }

    fn set_sync_callbacks(&mut self, on: bool) {
        let Some(s) = &self.sub else { return };
        if self.sync_callbacks == on {
            return;
        }
        for (domain, cbid) in super::detach::SYNC_CALLS {
            let _ = self.cupti.enable_callback(s, domain, cbid, on);
        }
        self.sync_callbacks = on;
    }

    fn release_if_idle(&mut self) {
        if self.devs.is_empty() && OPS.lock().map(|o| o.is_empty()).unwrap_or(true) {
            CAPTURE.store(false, Ordering::Relaxed);
            if let Some(s) = self.sub.take() {
                let _ = self.cupti.unsubscribe(s);
            }
            self.sync_callbacks = false;
        }
    }

    pub fn start(&mut self, req: PcRequest) -> Result<(), String> {
        if !(req.period_log2 == 0 || (5..=31).contains(&req.period_log2)) {
            return Err(format!("sampling period 2^{} is outside 2^5..2^31", req.period_log2));
        }
        if DRIVER.get().is_none()
            && let Some(d) = Driver::already_loaded()
        {
            let _ = DRIVER.set(d);
        }
        if DRIVER.get().is_none() {
            return Err("the CUDA driver is not loaded in this process".into());
        }
        if let Some(d) = self.devs.get(&req.device) {
            if d.req == req && d.phase == Phase::Live {
                return Ok(());
            }
            if d.phase != Phase::Live {
                return Err("the previous lease on this device is still stopping".into());
            }
            self.stop(req.device, "replaced by a new lease");
            return Err("the previous lease on this device is still stopping".into());
        }
        self.subscribe();
        let device = req.device;
        let dev = Dev {
            req,
            on: None,
            reasons: None,
            agg: HashMap::new(),
            totals: (0, 0),
            since_ns: gpuprof_cupti::clock::realtime_ns(),
            phase: Phase::Live,
        };
        self.devs.insert(device, dev);
        self.try_enable(device);
        Ok(())
    }

    /// Stops sampling on `device`: the context is read and disabled at the next CUDA
    /// synchronization; reported by a later collection.
    pub fn stop(&mut self, device: u32, reason: &str) {
        let Some(d) = self.devs.get_mut(&device) else { return };
        if d.phase != Phase::Live {
            return;
        }
        match d.on.take() {
            Some(on) => {
                d.phase = Phase::Waiting;
                self.arm(Op {
                    device,
                    kind: OpKind::Stop(PcEventKind::Stopped, reason.to_string()),
                    on,
                    agg: HashMap::new(),
                    totals: (0, 0),
                    disabled: None,
                });
            }
            None => d.phase = Phase::Closed(PcEventKind::Stopped, reason.to_string()),
        }
    }

    pub fn devices(&self) -> Vec<u32> {
        self.devs.iter().filter(|(_, d)| d.phase == Phase::Live).map(|(&k, _)| k).collect()
    }

    fn arm(&mut self, op: Op) {
        OPS.lock().unwrap_or_else(|p| p.into_inner()).push(op);
        self.set_sync_callbacks(true);
        self.armed_at.get_or_insert_with(Instant::now);
        OPS_ARMED.store(true, Ordering::SeqCst);
    }

    /// Runs armed operations now: waits for the application's synchronization up to `wait`,
    /// then synchronizes on this thread (whose exit runs them here).
    fn settle_ops(&mut self, wait: Duration) {
        if OPS.lock().map(|o| o.is_empty()).unwrap_or(true) {
            self.armed_at = None;
            return;
        }
        let since = *self.armed_at.get_or_insert_with(Instant::now);
        while since.elapsed() < wait {
            if OPS.lock().map(|o| o.is_empty()).unwrap_or(true) {
                self.armed_at = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if self.sub.is_some()
            && self.sync_callbacks
            && let Some(driver) = DRIVER.get()
        {
            let _ = driver.synchronize_active_primary_contexts();
        }
        if !OPS.lock().map(|o| o.is_empty()).unwrap_or(true) {
            // No subscriber to call back: after the synchronization above, here.
            OPS_ARMED.store(false, Ordering::SeqCst);
            run_ops();
        }
        self.armed_at = None;
    }

    /// Takes the operations that ran: their samples join the device's, and the device goes on
    /// (heal) or closes (stop).
    fn take_done(&mut self) {
        let done: Vec<Op> = std::mem::take(&mut *DONE.lock().unwrap_or_else(|p| p.into_inner()));
        for op in done {
            let Some(d) = self.devs.get_mut(&op.device) else { continue };
            for (k, v) in op.agg {
                *d.agg.entry(k).or_default() += v;
            }
            d.totals.0 += op.totals.0;
            d.totals.1 += op.totals.1;
            if let Some(Err(e)) = &op.disabled {
                log!(Debug, "PC sampling disable on device {}: {e}", op.device);
            }
            match op.kind {
                OpKind::Stop(kind, reason) => d.phase = Phase::Closed(kind, reason),
                OpKind::Heal(why) => {
                    d.phase = Phase::Live;
                    self.event(op.device, PcEventKind::Healed, why);
                }
            }
        }
        if OPS.lock().map(|o| o.is_empty()).unwrap_or(true) {
            self.set_sync_callbacks(false);
        }
    }

    /// Enables and configures sampling on the device's primary context, if it is active.
    fn try_enable(&mut self, device: u32) {
        let Some(driver) = DRIVER.get() else { return };
        let Some(d) = self.devs.get(&device) else { return };
        if d.on.is_some() || d.phase != Phase::Live {
            return;
        }
        let Some(pctx) = driver.active_primary_context(device) else {
            return; // no context yet: tried again at each collection
        };
        let ctx = pctx.handle();
        let cupti = self.cupti.clone();
        let req = d.req.clone();
        let r = pctx.with_current(|| -> Result<(Enabled, StallReasons, Vec<String>), CuptiError> {
            // Safety: `ctx` is retained by `pctx` for this call and current on this thread.
            unsafe { cupti.pc_enable(ctx) }?;
            // Safety: as above; sampling is enabled on `ctx`.
            let reasons = match unsafe { cupti.pc_stall_reasons(ctx) } {
                Ok(r) => r,
                Err(e) => {
                    // Safety: undoes the enable above on the same live context.
                    let _ = unsafe { cupti.pc_disable(ctx) };
                    return Err(e);
                }
            };
            let (stall_index, unknown) = select_stalls(&reasons, &req.stall_reasons);
            let cfg = PcConfig {
                period_log2: if req.period_log2 == 0 { 10 } else { req.period_log2 },
                stall_index,
                scratch_bytes: (req.scratch_buffer_mib as usize) << 20,
                hw_bytes: (req.hw_buffer_mib as usize) << 20,
            };
            let n = reasons.index.len().max(1);
            let mut at_disable = Box::new(PcBuffer::new(PCS_PER_READ, n));
            // Safety: `at_disable` is boxed and kept in `Enabled` until disable.
            if let Err(e) = unsafe { cupti.pc_configure(ctx, &cfg, &mut at_disable) } {
                // Safety: undoes the enable above on the same live context.
                let _ = unsafe { cupti.pc_disable(ctx) };
                return Err(e);
            }
            Ok((Enabled { ctx: ctx as usize, at_disable, read: PcBuffer::new(PCS_PER_READ, n) }, reasons, unknown))
        });
        drop(pctx);
        match r {
            Ok((on, reasons, unknown)) => {
                let mut detail = format!("period 2^{}", if req.period_log2 == 0 { 10 } else { req.period_log2 });
                if !unknown.is_empty() {
                    detail.push_str(&format!("; unknown stall reasons ignored: {}", unknown.join(", ")));
                }
                if self.sub.is_none() {
                    detail.push_str("; no source lines (another CUPTI client holds the subscriber)");
                }
                if let Some(d) = self.devs.get_mut(&device) {
                    d.on = Some(on);
                    d.reasons = Some(reasons);
                    d.since_ns = gpuprof_cupti::clock::realtime_ns();
                }
                self.event(device, PcEventKind::Sampling, detail);
            }
            Err(e) => {
                let kind = if e.is_hardware_busy() { PcEventKind::HardwareBusy } else { PcEventKind::Failed };
                if let Some(d) = self.devs.get_mut(&device) {
                    d.phase = Phase::Closed(kind, e.to_string());
                }
            }
        }
    }

    /// Reads one device; a failed read arms a heal (buffer stuck full) or a stop.
    fn read_device(&mut self, dev: u32) {
        let Some(d) = self.devs.get_mut(&dev) else { return };
        let Some(mut on) = d.on.take() else { return };
        match drain(&self.cupti, &mut on, &mut d.agg, &mut d.totals) {
            None => d.on = Some(on),
            Some((e, full)) => {
                d.phase = Phase::Waiting;
                let kind = if full || e.code == sys::CUPTI_ERROR_OUT_OF_MEMORY {
                    OpKind::Heal(format!("hardware buffer full ({e}); sampling restarted"))
                } else {
                    // 999 (unknown) is what GetData returns when an outside client took the monitor.
                    let busy = e.is_hardware_busy() || e.code == sys::CUPTI_ERROR_UNKNOWN;
                    log!(Warn, "PC sampling on device {dev} stopped: {e}");
                    OpKind::Stop(if busy { PcEventKind::HardwareBusy } else { PcEventKind::Failed }, e.to_string())
                };
                self.arm(Op { device: dev, kind, on, agg: HashMap::new(), totals: (0, 0), disabled: None });
            }
        }
    }

    /// Collects every device: runs what is armed (waiting up to `wait` for the application's
    /// synchronization), enables devices whose context appeared, reads, resolves lines, and
    /// hands out the batches and events.
    pub fn collect(&mut self, wait: Duration) -> PcOutput {
        self.settle_ops(wait);
        self.take_done();
        let keys: Vec<u32> = self.devs.keys().copied().collect();
        for dev in &keys {
            self.try_enable(*dev);
            self.read_device(*dev);
        }
        let now = gpuprof_cupti::clock::realtime_ns();
        let mut out = PcOutput::default();
        let deadline = Instant::now() + LINE_BUDGET;
        let mut need_cubins: Vec<u64> = Vec::new();
        for dev in keys {
            let Some(mut d) = self.devs.remove(&dev) else { continue };
            let mut rows = Vec::with_capacity(d.agg.len());
            for ((fptr, crc, pc, stall), count) in std::mem::take(&mut d.agg) {
                let function = self.name(fptr);
                let stall_name = match &d.reasons {
                    Some(r) if !r.name(stall).is_empty() => self.intern(r.name(stall)),
                    _ => self.intern(&format!("stall_{stall}")),
                };
                let (file, line) = self.line(crc, fptr, pc, deadline);
                if crc != 0 && !need_cubins.contains(&crc) {
                    need_cubins.push(crc);
                }
                rows.push(PcRow {
                    function,
                    pc_offset: pc,
                    stall: stall_name,
                    count,
                    module: if crc == 0 { String::new() } else { format!("{crc:016x}") },
                    file,
                    line,
                });
            }
            if !rows.is_empty() || d.totals != (0, 0) {
                out.batches.push(PcBatch {
                    device: dev,
                    start_ns: d.since_ns,
                    end_ns: now,
                    rows,
                    total_samples: d.totals.0,
                    dropped_samples: d.totals.1,
                });
            }
            d.totals = (0, 0);
            d.since_ns = now;
            if let Phase::Closed(kind, reason) = &d.phase {
                self.event(dev, *kind, reason.clone());
            } else {
                self.devs.insert(dev, d);
            }
        }
        self.release_if_idle();
        if let Some(c) = CUBINS.get() {
            let map = c.map.lock().unwrap_or_else(|p| p.into_inner());
            out.cubins = need_cubins.iter().filter_map(|crc| map.get(crc).map(|b| (format!("{crc:016x}"), b.clone()))).collect();
        }
        out.events = std::mem::take(&mut self.events);
        out
    }

    fn name(&mut self, fptr: usize) -> Arc<str> {
        if let Some((n, _)) = self.names.get(&fptr) {
            return n.clone();
        }
        let c = if fptr == 0 {
            CString::default()
        } else {
            // Safety: CUPTI's function-name string for a PC record: NUL-terminated and never
            // freed by CUPTI (the client owns it; gpuprof keeps it for the process's life).
            unsafe { CStr::from_ptr(fptr as *const c_char) }.to_owned()
        };
        let n: Arc<str> = Arc::from(c.to_string_lossy().as_ref());
        self.names.insert(fptr, (n.clone(), c));
        n
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(n) = self.strs.get(s) {
            return n.clone();
        }
        let n: Arc<str> = Arc::from(s);
        self.strs.insert(s.to_string(), n.clone());
        n
    }

    /// The source line of a PC, from the captured cubin (cached; `("", 0)` when unknown, or
    /// past the time budget and tried again next time).
    fn line(&mut self, crc: u64, fptr: usize, pc: u64, deadline: Instant) -> (Arc<str>, u32) {
        if let Some((f, l)) = self.lines.get(&(crc, fptr, pc)) {
            return (f.clone(), *l);
        }
        if crc == 0 || fptr == 0 || Instant::now() >= deadline {
            return (self.no_line.clone(), 0);
        }
        let Some(cubin) = CUBINS.get().and_then(|c| c.map.lock().ok().and_then(|m| m.get(&crc).cloned())) else {
            return (self.no_line.clone(), 0);
        };
        self.name(fptr);
        let Some((_, cname)) = self.names.get(&fptr) else { return (self.no_line.clone(), 0) };
        let r = match self.cupti.sass_to_source(&cubin, cname, pc) {
            Ok(Some((file, line))) => (self.intern(&file), line),
            _ => (self.no_line.clone(), 0),
        };
        self.lines.insert((crc, fptr, pc), r.clone());
        r
    }
}

/// The stall indexes to configure for the requested names (empty request: all) and the
/// requested names that matched none. A name matches CUPTI's with or without the prefix, and
/// also its "_not_issued" variant.
pub fn select_stalls(reasons: &StallReasons, wanted: &[String]) -> (Vec<u32>, Vec<String>) {
    if wanted.is_empty() {
        // Every reason but the "_not_issued" variants, which count the same samples again.
        let idx = reasons
            .index
            .iter()
            .zip(&reasons.names)
            .filter(|(_, n)| !n.ends_with("_not_issued"))
            .map(|(i, _)| *i)
            .collect();
        return (idx, Vec::new());
    }
    let mut idx = Vec::new();
    let mut unknown = Vec::new();
    for w in wanted {
        let w = w.strip_prefix(STALL_PREFIX).unwrap_or(w);
        let mut hit = false;
        for (i, n) in reasons.index.iter().zip(&reasons.names) {
            let short = n.strip_prefix(STALL_PREFIX).unwrap_or(n);
            if (short == w || short.strip_suffix("_not_issued") == Some(w)) && !idx.contains(i) {
                idx.push(*i);
                hit = true;
            }
        }
        if !hit {
            unknown.push(w.to_string());
        }
    }
    (idx, unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_selection_accepts_short_and_full_names() {
        let r = StallReasons {
            index: vec![1, 2, 3],
            names: vec![
                format!("{STALL_PREFIX}stalled_long_scoreboard"),
                format!("{STALL_PREFIX}stalled_long_scoreboard_not_issued"),
                format!("{STALL_PREFIX}stalled_barrier"),
            ],
        };
        let (i, u) = select_stalls(&r, &["stalled_long_scoreboard".into(), "nope".into()]);
        assert_eq!(i, vec![1, 2]);
        assert_eq!(u, vec!["nope".to_string()]);
        let (i, u) = select_stalls(&r, &[format!("{STALL_PREFIX}stalled_barrier")]);
        assert_eq!((i, u.len()), (vec![3], 0));
        assert_eq!(select_stalls(&r, &[]), (vec![1, 3], vec![]), "all but the _not_issued variants");
    }
}
