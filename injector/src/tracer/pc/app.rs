//! What runs on the application's threads, at the exit of a CUDA synchronization: enabling and
//! configuring PC sampling on a context, reading it (`GetData`, at most every [`READ_GAP`]),
//! and disabling it. On the H100, enabling or reading from the background thread while a
//! PyTorch process loaded modules and launched kernels hung or aborted the process in 2 of 5
//! runs, as `cuptiFinalize` did (see `detach`); at a synchronization's exit the thread that uses
//! the context is inside CUPTI's callback and the GPU work it waited for is done. The
//! background thread only arms operations and takes their results, and its own
//! synchronizations (before a trace's last flush) never run them: disabling from there while
//! the application launched kernels hung it.
// Safety: the callback receives CUPTI's `cbdata`; each use is commented.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gpuprof_cupti::pcsampling::{PcBuffer, PcConfig, StallReasons, module_cubin};
use gpuprof_cupti::sys::cupti as sys;
use gpuprof_cupti::{Cupti, CuptiError};

use super::cubins;
use super::select_stalls;
use crate::tracer::PcEventKind;

/// Least time between two reads of a context.
pub const READ_GAP: Duration = Duration::from_millis(100);
/// PCs read per `GetData` call.
const PCS_PER_READ: usize = 5000;
/// `GetData` calls per read at most.
const MAX_READS: usize = 64;

/// (function name pointer, cubin CRC, PC offset, stall reason index) → samples.
pub type Agg = HashMap<(usize, u64, u64, u32), u64>;

/// Sampling enabled on one context.
pub struct Enabled {
    /// The buffer CUPTI fills at disable; must stay put while enabled.
    at_disable: Box<PcBuffer>,
    read: PcBuffer,
}

/// A context being sampled.
struct Live {
    ctx: usize,
    on: Enabled,
    agg: Agg,
    totals: (u64, u64),
    last_read: Option<Instant>,
    failure: Option<(CuptiError, bool)>,
}

/// Operations for the next synchronization on the device's context.
pub enum Op {
    Enable {
        device: u32,
        ctx: usize,
        cfg: PcConfig,
        wanted: Vec<String>,
    },
    /// Disable; then report `kind` (`Healed` means enable again).
    Disable {
        device: u32,
        kind: PcEventKind,
        reason: String,
    },
}

/// Results for the background thread.
pub enum Done {
    Enabled {
        device: u32,
        reasons: StallReasons,
        unknown: Vec<String>,
    },
    EnableFailed {
        device: u32,
        error: CuptiError,
    },
    Disabled {
        device: u32,
        kind: PcEventKind,
        reason: String,
        agg: Agg,
        totals: (u64, u64),
    },
    /// The context was being destroyed: read, disabled, and the device waits for a new one.
    ContextGone {
        device: u32,
        agg: Agg,
        totals: (u64, u64),
    },
}

#[derive(Default)]
struct State {
    pending: Vec<Op>,
    live: BTreeMap<u32, Live>,
    done: Vec<Done>,
}

static STATE: Mutex<State> = Mutex::new(State { pending: Vec::new(), live: BTreeMap::new(), done: Vec::new() });
/// Work for synchronization exits (operations pending or contexts to read).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static CUPTI: OnceLock<Arc<Cupti>> = OnceLock::new();

thread_local! {
    /// Set on the injector's own threads: their synchronizations run nothing here.
    static OWN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as the injector's own.
pub fn mark_own_thread() {
    OWN_THREAD.with(|t| t.set(true));
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn init(cupti: &Arc<Cupti>) {
    let _ = CUPTI.set(cupti.clone());
}

/// Arms an operation for the next synchronization on its context.
pub fn arm(op: Op) {
    let mut s = state();
    s.pending.push(op);
    ACTIVE.store(true, Ordering::SeqCst);
}

/// Takes the results, and each live context's samples so far (device, agg, totals, failure).
#[allow(clippy::type_complexity)]
pub fn take() -> (Vec<Done>, Vec<(u32, Agg, (u64, u64), Option<(CuptiError, bool)>)>) {
    let mut s = state();
    let done = std::mem::take(&mut s.done);
    let reads = s
        .live
        .iter_mut()
        .map(|(&d, l)| (d, std::mem::take(&mut l.agg), std::mem::take(&mut l.totals), l.failure.take()))
        .collect();
    (done, reads)
}

/// Whether operations are still waiting for a synchronization.
pub fn pending() -> bool {
    !state().pending.is_empty()
}

/// The subscriber's callback: module loads (cubins), contexts torn down, and synchronization
/// exits.
pub extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if domain == sys::CUPTI_CB_DOMAIN_RESOURCE {
            if cbid == sys::CUPTI_CBID_RESOURCE_MODULE_LOADED && cubins::capturing() {
                // Safety: a MODULE_LOADED resource callback's data; the slice is used only here.
                if let Some(bytes) = unsafe { module_cubin(cbdata) } {
                    cubins::capture(bytes);
                }
            } else if cbid == sys::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING && !cbdata.is_null() {
                // Safety: a resource callback's data is a CUpti_ResourceData.
                let ctx = unsafe { (*(cbdata as *const sys::CUpti_ResourceData)).context } as usize;
                context_destroying(ctx);
            }
            return;
        }
        if !ACTIVE.load(Ordering::Relaxed) || OWN_THREAD.with(|t| t.get()) {
            return;
        }
        // Safety: the other domains switched on are the runtime and driver APIs, whose
        // `cbdata` is a CUpti_CallbackData.
        if !unsafe { gpuprof_cupti::activity::is_api_exit(cbdata) } {
            return;
        }
        // Safety: as above.
        let ctx = unsafe { (*(cbdata as *const sys::CUpti_CallbackData)).context } as usize;
        // Never wait here: the background thread holds the lock only briefly; try next time.
        if let Ok(mut s) = STATE.try_lock() {
            run(&mut s, ctx);
        }
    }));
}

/// Runs on the thread whose current context is `ctx` (a synchronization just returned).
fn run(s: &mut State, ctx: usize) {
    let Some(cupti) = CUPTI.get() else { return };
    let ops: Vec<Op> = std::mem::take(&mut s.pending);
    for op in ops {
        match op {
            Op::Enable { device, ctx: c, cfg, wanted } if c == ctx => match enable(cupti, ctx, cfg, &wanted) {
                Ok((on, reasons, unknown)) => {
                    s.live.insert(
                        device,
                        Live { ctx, on, agg: Agg::new(), totals: (0, 0), last_read: None, failure: None },
                    );
                    s.done.push(Done::Enabled { device, reasons, unknown });
                }
                Err(error) => s.done.push(Done::EnableFailed { device, error }),
            },
            Op::Disable { device, kind, reason } if s.live.get(&device).is_some_and(|l| l.ctx == ctx) => {
                let Some(mut l) = s.live.remove(&device) else { continue };
                if kind == PcEventKind::Stopped {
                    let _ = drain(cupti, &mut l);
                }
                // Safety: `ctx` is current on this thread and sampling is enabled on it.
                let _ = unsafe { cupti.pc_disable(ctx as sys::CUcontext) };
                absorb(&l.on.at_disable, &mut l.agg, &mut l.totals);
                s.done.push(Done::Disabled { device, kind, reason, agg: l.agg, totals: l.totals });
            }
            other => s.pending.push(other),
        }
    }
    for l in s.live.values_mut() {
        if l.ctx != ctx || l.failure.is_some() || l.last_read.is_some_and(|t| t.elapsed() < READ_GAP) {
            continue;
        }
        l.last_read = Some(Instant::now());
        l.failure = drain(cupti, l);
    }
    ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
}

/// A context is about to be destroyed (CUPTI's resource callback, on the destroying thread,
/// the context still valid): what it sampled is read and sampling disabled now, never on a
/// context that is gone; operations armed for it are dropped. The device is enabled again
/// when a new primary context appears.
fn context_destroying(ctx: usize) {
    let Some(cupti) = CUPTI.get() else { return };
    let mut s = state();
    let mut gone: Vec<u32> = Vec::new();
    s.pending.retain(|op| match op {
        Op::Enable { device, ctx: c, .. } if *c == ctx => {
            gone.push(*device);
            false
        }
        _ => true,
    });
    let devices: Vec<u32> = s.live.iter().filter(|(_, l)| l.ctx == ctx).map(|(&d, _)| d).collect();
    for device in devices {
        let Some(mut l) = s.live.remove(&device) else { continue };
        s.pending.retain(|op| !matches!(op, Op::Disable { device: d, .. } if *d == device));
        close(cupti, &mut l);
        s.done.push(Done::ContextGone { device, agg: l.agg, totals: l.totals });
    }
    for device in gone {
        s.done.push(Done::ContextGone { device, agg: Agg::new(), totals: (0, 0) });
    }
    ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
}

/// At process exit, on the exiting thread: every context still sampled is read and disabled
/// before CUDA tears down (a context destroyed earlier was closed by [`context_destroying`]),
/// so what the last second sampled is kept and nothing of CUPTI's sampling outlives its
/// context. Results come with [`take`].
pub fn stop_all(reason: &str) {
    let Some(cupti) = CUPTI.get() else { return };
    let mut s = state();
    s.pending.clear();
    let live = std::mem::take(&mut s.live);
    for (device, mut l) in live {
        close(cupti, &mut l);
        s.done.push(Done::Disabled {
            device,
            kind: PcEventKind::Stopped,
            reason: reason.to_string(),
            agg: l.agg,
            totals: l.totals,
        });
    }
    ACTIVE.store(false, Ordering::SeqCst);
}

/// Reads what the context still holds and disables sampling on it.
fn close(cupti: &Cupti, l: &mut Live) {
    if l.failure.is_none() {
        let _ = drain(cupti, l);
    }
    // Safety: sampling is enabled on the context, which is still valid.
    let _ = unsafe { cupti.pc_disable(l.ctx as sys::CUcontext) };
    absorb(&l.on.at_disable, &mut l.agg, &mut l.totals);
}

fn enable(
    cupti: &Cupti,
    ctx: usize,
    cfg: PcConfig,
    wanted: &[String],
) -> Result<(Enabled, StallReasons, Vec<String>), CuptiError> {
    let c = ctx as sys::CUcontext;
    // Safety: `ctx` is the context current on this thread (the one the synchronization used).
    unsafe { cupti.pc_enable(c) }?;
    let undo = |e: CuptiError| {
        // Safety: undoes the enable above on the same context.
        let _ = unsafe { cupti.pc_disable(c) };
        e
    };
    // Safety: sampling is enabled on `c`.
    let reasons = unsafe { cupti.pc_stall_reasons(c) }.map_err(undo)?;
    let (stall_index, unknown) = select_stalls(&reasons, wanted);
    let cfg = PcConfig { stall_index, ..cfg };
    let n = reasons.index.len().max(1);
    let mut at_disable = Box::new(PcBuffer::new(PCS_PER_READ, n));
    // Safety: `at_disable` is boxed and kept in `Enabled` until disable.
    unsafe { cupti.pc_configure(c, &cfg, &mut at_disable) }.map_err(undo)?;
    Ok((Enabled { at_disable, read: PcBuffer::new(PCS_PER_READ, n) }, reasons, unknown))
}

/// Reads what CUPTI holds until it has nothing left (or the read limit). The error, and
/// whether the hardware buffer was reported full, when a read failed.
fn drain(cupti: &Cupti, l: &mut Live) -> Option<(CuptiError, bool)> {
    let ctx = l.ctx as sys::CUcontext;
    for _ in 0..MAX_READS {
        // Safety: sampling is enabled on `ctx`, current on this thread.
        let r = unsafe { cupti.pc_get_data(ctx, &mut l.on.read) };
        absorb(&l.on.read, &mut l.agg, &mut l.totals);
        match r {
            Ok(()) if l.on.read.remaining_pcs() > 0 => continue,
            Ok(()) => return None,
            Err(e) => return Some((e, l.on.read.hardware_buffer_full())),
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
