//! What runs on the application's threads, at a CUDA synchronization: enabling and
//! configuring PC sampling on a context, reading it (`GetData`, at most every [`READ_GAP`]),
//! and disabling it; in windows mode, opening and closing windows at the synchronizations
//! around them ([`super::window`]).
//! The work runs at the synchronization's entry by default (`GPUPROF_PC_AT=exit`: at its
//! exit): the thread is about to wait for the GPU anyway, so the time spent here overlaps
//! the GPU's queued work instead of leaving the GPU idle after the wait. On the H100, enabling or reading from the background thread while a
//! PyTorch process loaded modules and launched kernels hung or aborted the process in 2 of 5
//! runs, as `cuptiFinalize` did (see `detach`); at a synchronization's exit the thread that uses
//! the context is inside CUPTI's callback and the GPU work it waited for is done. The
//! background thread only arms operations and takes their results, and its own
//! synchronizations (before a trace's last flush) never run them: disabling from there while
//! the application launched kernels hung it.
// Safety: the PC-sampling calls need a live context (and the buffer given at configuration kept
// until disable), which only this bookkeeping knows; each call says why that holds.
#![allow(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gpuprof_cupti::ids;
use gpuprof_cupti::pcsampling::{FunctionName, PcBuffer, PcConfig, StallReasons};
use gpuprof_cupti::{Callback, Context, Cupti, CuptiError};

use super::cubins;
use super::meter::{WINDOWS, at_entry, charge, count_sync, read_gap, timed};
pub use super::meter::{app_cost, app_cost_extra};
use super::select_stalls;
use super::window::{Win, WinCfg, window};
use crate::tracer::PcEventKind;

/// Least time between two reads of a context in continuous mode (`GPUPROF_PC_READ_MS`
/// overrides it).
pub const READ_GAP: Duration = Duration::from_millis(100);
/// PCs read per `GetData` call.
const PCS_PER_READ: usize = 5000;
/// `GetData` calls per read at most.
const MAX_READS: usize = 64;

/// (function name, cubin CRC, PC offset, stall reason index) → samples.
pub type Agg = HashMap<(FunctionName, u64, u64, u32), u64>;

/// Sampling enabled on one context.
pub struct Enabled {
    /// The buffer CUPTI fills at disable; must stay put while enabled.
    pub(super) at_disable: Box<PcBuffer>,
    read: PcBuffer,
    /// Configured with start/stop control (windows are ranges of one enable).
    pub(super) ranged: bool,
    /// A range is open (sampling runs).
    pub(super) running: bool,
}

/// A context being sampled.
pub(super) struct Live {
    pub(super) ctx: Context,
    /// Sampling enabled since then and not yet counted in `State::sampled`.
    pub(super) on_since: Option<Instant>,
    /// None while a window is closed (windows of an enable each).
    pub(super) on: Option<Enabled>,
    /// Windows mode (None: continuous), with what enabling needs again.
    pub(super) win: Option<(Win, PcConfig, Vec<String>)>,
    pub(super) agg: Agg,
    pub(super) totals: (u64, u64),
    last_read: Option<Instant>,
    pub(super) failure: Option<(CuptiError, bool)>,
}

/// Operations for the next synchronization on the device's context.
pub enum Op {
    Enable {
        device: u32,
        ctx: Context,
        cfg: PcConfig,
        wanted: Vec<String>,
        /// Windows mode (None: continuous).
        win: Option<WinCfg>,
    },
    /// Disable; then report `kind` (`Healed` means enable again).
    Disable { device: u32, kind: PcEventKind, reason: String },
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
    /// Time each device was sampled (enabled) since the last [`take`].
    sampled: BTreeMap<u32, Duration>,
}

static STATE: Mutex<State> =
    Mutex::new(State { pending: Vec::new(), live: BTreeMap::new(), done: Vec::new(), sampled: BTreeMap::new() });

/// Counts the time `l` has been enabled since it was last counted, for `device`.
fn count_on(sampled: &mut BTreeMap<u32, Duration>, device: u32, l: &mut Live, still_on: bool) {
    if let Some(t) = l.on_since.take() {
        *sampled.entry(device).or_default() += t.elapsed();
        if still_on {
            l.on_since = Some(Instant::now());
        }
    }
}
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

/// Takes the results, and each live context's samples so far (device, agg, totals, failure),
/// and the time each device was sampled since the last call.
#[allow(clippy::type_complexity)]
pub fn take() -> (Vec<Done>, Vec<(u32, Agg, (u64, u64), Option<(CuptiError, bool)>)>, BTreeMap<u32, Duration>) {
    let mut s = state();
    let done = std::mem::take(&mut s.done);
    let State { live, sampled, .. } = &mut *s;
    for (d, l) in live.iter_mut() {
        count_on(sampled, *d, l, true);
    }
    let sampled = std::mem::take(&mut s.sampled);
    let reads = s
        .live
        .iter_mut()
        .map(|(&d, l)| (d, std::mem::take(&mut l.agg), std::mem::take(&mut l.totals), l.failure.take()))
        .collect();
    (done, reads, sampled)
}

/// Whether operations are still waiting for a synchronization.
pub fn pending() -> bool {
    !state().pending.is_empty()
}

/// The subscriber's callback: module loads (cubins), contexts torn down, and synchronization
/// exits.
pub fn on_callback(cb: &Callback<'_>) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if cb.domain() == ids::CUPTI_CB_DOMAIN_RESOURCE {
            if cb.cbid() == ids::CUPTI_CBID_RESOURCE_MODULE_LOADED && cubins::capturing() {
                if let Some(bytes) = cb.module_cubin() {
                    cubins::capture(bytes);
                }
            } else if cb.cbid() == ids::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING
                && let Some(ctx) = cb.resource_context()
            {
                context_destroying(ctx);
            }
            return;
        }
        // The other domains switched on are the runtime and driver APIs.
        let Some(ctx) = cb.api_context() else { return };
        if OWN_THREAD.with(|t| t.get()) {
            return;
        }
        let exit = cb.is_api_exit();
        // Costs are measured only while PC sampling has work in the process; the
        // count of synchronizations always (an atomic add per synchronization).
        if !exit {
            count_sync(ctx.id());
            if ACTIVE.load(Ordering::Relaxed) {
                timed(false);
            }
        }
        // Never wait here: the background thread holds the lock only briefly; try next time.
        if ACTIVE.load(Ordering::Relaxed)
            && exit != at_entry()
            && let Ok(mut s) = STATE.try_lock()
        {
            run(&mut s, ctx);
        }
        if exit {
            timed(true);
        }
    }));
}

/// Launches counted at their entries while launch callbacks are on ([`super::window`]).
pub(super) static LAUNCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn on_launch(cb: &Callback<'_>) {
    if cb.is_api_entry() {
        LAUNCHES.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs on the thread whose current context is `ctx` (a synchronization just returned).
fn run(s: &mut State, ctx: Context) {
    let Some(cupti) = CUPTI.get() else { return };
    let ops: Vec<Op> = std::mem::take(&mut s.pending);
    for op in ops {
        match op {
            Op::Enable { device, ctx: c, cfg, wanted, win } if c == ctx => {
                let t = Instant::now();
                let r = enable(cupti, ctx, cfg.clone(), &wanted);
                charge(t);
                match r {
                    Ok((on, reasons, unknown)) => {
                        let win = win.map(|w| (Win::opened(cupti, w), cfg, wanted));
                        s.live.insert(
                            device,
                            Live {
                                ctx,
                                on_since: Some(Instant::now()),
                                on: Some(on),
                                win,
                                agg: Agg::new(),
                                totals: (0, 0),
                                last_read: None,
                                failure: None,
                            },
                        );
                        s.done.push(Done::Enabled { device, reasons, unknown });
                    }
                    Err(error) => s.done.push(Done::EnableFailed { device, error }),
                }
            }
            Op::Disable { device, kind, reason } if s.live.get(&device).is_some_and(|l| l.ctx == ctx) => {
                let Some(mut l) = s.live.remove(&device) else { continue };
                count_on(&mut s.sampled, device, &mut l, false);
                let t = Instant::now();
                super::window::end(cupti, &mut l);
                if let Some(on) = l.on.as_mut() {
                    stop_range(cupti, ctx, on);
                    if kind == PcEventKind::Stopped {
                        let _ = drain_into(cupti, ctx, on, &mut l.agg, &mut l.totals);
                    }
                    // Safety: `ctx` is current on this thread and sampling is enabled on it.
                    let _ = unsafe { cupti.pc_disable(ctx) };
                }
                if let Some(on) = &l.on {
                    absorb(&on.at_disable, &mut l.agg, &mut l.totals);
                }
                charge(t);
                s.done.push(Done::Disabled { device, kind, reason, agg: l.agg, totals: l.totals });
            }
            other => s.pending.push(other),
        }
    }
    let State { live, sampled, .. } = &mut *s;
    for (device, l) in live.iter_mut() {
        if l.ctx != ctx || l.failure.is_some() {
            continue;
        }
        if l.win.is_some() {
            window(cupti, *device, l, sampled);
            continue;
        }
        if l.last_read.is_some_and(|t| t.elapsed() < read_gap()) {
            continue;
        }
        let t = Instant::now();
        l.last_read = Some(t);
        l.failure = drain(cupti, l);
        charge(t);
    }
    ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
}

/// A context is about to be destroyed (CUPTI's resource callback, on the destroying thread,
/// the context still valid): what it sampled is read and sampling disabled now, never on a
/// context that is gone; operations armed for it are dropped. The device is enabled again
/// when a new primary context appears.
fn context_destroying(ctx: Context) {
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
        count_on(&mut s.sampled, device, &mut l, false);
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
        count_on(&mut s.sampled, device, &mut l, false);
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
    super::window::end(cupti, l);
    let Some(on) = l.on.as_mut() else { return };
    stop_range(cupti, l.ctx, on);
    if l.failure.is_none() {
        let _ = drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals);
    }
    // Safety: sampling is enabled on the context, which is still valid.
    let _ = unsafe { cupti.pc_disable(l.ctx) };
    if let Some(on) = &l.on {
        absorb(&on.at_disable, &mut l.agg, &mut l.totals);
    }
}

/// Closes the context's open range, if any (start/stop control), before a read and disable.
fn stop_range(cupti: &Cupti, ctx: Context, on: &mut Enabled) {
    if on.ranged && on.running {
        // Safety: `ctx` is current on this thread, enabled with start/stop control, in a range.
        let _ = unsafe { cupti.pc_stop(ctx) };
        on.running = false;
    }
}

/// Enables sampling on `ctx` and configures it; with start/stop control
/// ([`PcConfig::start_stop`]) it opens the first range too.
pub(super) fn enable(
    cupti: &Cupti,
    ctx: Context,
    cfg: PcConfig,
    wanted: &[String],
) -> Result<(Enabled, StallReasons, Vec<String>), CuptiError> {
    let c = ctx;
    let t0 = Instant::now();
    // Safety: `ctx` is the context current on this thread (the one the synchronization used).
    unsafe { cupti.pc_enable(c) }?;
    let t_enable = t0.elapsed();
    let undo = |e: CuptiError| {
        // Safety: undoes the enable above on the same context.
        let _ = unsafe { cupti.pc_disable(c) };
        e
    };
    // Safety: sampling is enabled on `c`.
    let reasons = unsafe { cupti.pc_stall_reasons(c) }.map_err(undo)?;
    let (stall_index, unknown) = select_stalls(&reasons, wanted);
    let ranged = cfg.start_stop;
    let cfg = PcConfig { stall_index, ..cfg };
    let n = reasons.index.len().max(1);
    let mut at_disable = Box::new(PcBuffer::new(PCS_PER_READ, n));
    let t_reasons = t0.elapsed();
    // Safety: `at_disable` is boxed and kept in `Enabled` until disable.
    unsafe { cupti.pc_configure(c, &cfg, &mut at_disable) }.map_err(undo)?;
    if WINDOWS.load(Ordering::Relaxed) < 20 {
        crate::log::log!(
            Info,
            "PC sampling enable: cuptiPCSamplingEnable {:.2} ms, stall reasons {:.2} ms, configure {:.2} ms",
            t_enable.as_secs_f64() * 1e3,
            (t_reasons - t_enable).as_secs_f64() * 1e3,
            (t0.elapsed() - t_reasons).as_secs_f64() * 1e3
        );
    }
    if ranged {
        // Safety: enabled and configured with start/stop control just above.
        unsafe { cupti.pc_start(c) }.map_err(undo)?;
    }
    Ok((Enabled { at_disable, read: PcBuffer::new(PCS_PER_READ, n), ranged, running: ranged }, reasons, unknown))
}

/// Reads what CUPTI holds until it has nothing left (or the read limit). The error, and
/// whether the hardware buffer was reported full, when a read failed.
fn drain(cupti: &Cupti, l: &mut Live) -> Option<(CuptiError, bool)> {
    let on = l.on.as_mut()?;
    drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals)
}

pub(super) fn drain_into(
    cupti: &Cupti,
    ctx: Context,
    on: &mut Enabled,
    agg: &mut Agg,
    totals: &mut (u64, u64),
) -> Option<(CuptiError, bool)> {
    for _ in 0..MAX_READS {
        // Safety: sampling is enabled on `ctx`, current on this thread.
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

pub(super) fn absorb(buf: &PcBuffer, agg: &mut Agg, totals: &mut (u64, u64)) {
    for rec in buf.records() {
        for s in rec.stalls {
            let key = (rec.function_name, rec.cubin_crc, rec.pc_offset, s.pcSamplingStallReasonIndex);
            *agg.entry(key).or_default() += u64::from(s.samples);
        }
    }
    totals.0 += buf.total_samples();
    totals.1 += buf.dropped_samples();
}
