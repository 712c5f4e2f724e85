//! What runs on the application's threads, at a CUDA synchronization: enabling and
//! configuring PC sampling on a context, reading it (`GetData`, at most every [`READ_GAP`]),
//! and disabling it; in windows mode, opening a window (enable) and closing it (read, disable)
//! at the synchronizations around it, spaced by the cost measured on the application's thread.
//! The work runs at the synchronization's entry by default (`GPUPROF_PC_AT=exit`: at its
//! exit): the thread is about to wait for the GPU anyway, so the time spent here overlaps
//! the GPU's queued work instead of leaving the GPU idle after the wait. On the H100, enabling or reading from the background thread while a
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
use super::meter::{
    EXTRA_NS, MAX_DUTY, MAX_DUTY_MEASURED, WINDOW_OPEN, WINDOWS, at_entry, charge, count_sync, outermost,
    pace_slowdown, pace_tick, read_gap, timed,
};
pub use super::meter::{app_cost, app_cost_extra};
use super::select_stalls;
use crate::tracer::PcEventKind;

/// Least time between two reads of a context in continuous mode (`GPUPROF_PC_READ_MS`
/// overrides it).
pub const READ_GAP: Duration = Duration::from_millis(100);
/// Windows mode: the longest gap between windows.
const MAX_GAP: Duration = Duration::from_secs(10);
/// PCs read per `GetData` call.
const PCS_PER_READ: usize = 5000;
/// `GetData` calls per read at most.
const MAX_READS: usize = 64;

/// (function name pointer, cubin CRC, PC offset, stall reason index) → samples.
pub type Agg = HashMap<(usize, u64, u64, u32), u64>;

/// Windows mode's settings for a context.
#[derive(Debug, Clone, Copy)]
pub struct WinCfg {
    pub window: Duration,
    /// Cost budget as a fraction of the time (0.005: 0.5 %).
    pub budget: f64,
}

/// A context sampled in windows.
struct Win {
    cfg: WinCfg,
    /// The window opened then (None: closed).
    opened: Option<Instant>,
    next_open: Instant,
    /// Time the last window's enable took on the application's thread.
    open_cost: Duration,
    /// [`EXTRA_NS`] when the last window closed.
    extra_mark: u64,
    /// Windows closed so far.
    closes: u64,
    /// The slowdown measured inside windows (a moving average; None: not yet).
    slowdown: Option<f64>,
}

/// Sampling enabled on one context.
pub struct Enabled {
    /// The buffer CUPTI fills at disable; must stay put while enabled.
    at_disable: Box<PcBuffer>,
    read: PcBuffer,
}

/// A context being sampled.
struct Live {
    ctx: usize,
    /// Sampling enabled since then and not yet counted in `State::sampled`.
    on_since: Option<Instant>,
    /// None while a window is closed.
    on: Option<Enabled>,
    /// Windows mode (None: continuous), with what enabling needs again.
    win: Option<(Win, PcConfig, Vec<String>)>,
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
        if cbdata.is_null() || OWN_THREAD.with(|t| t.get()) {
            return;
        }
        // Safety: the other domains switched on are the runtime and driver APIs, whose
        // `cbdata` is a CUpti_CallbackData.
        let exit = unsafe { gpuprof_cupti::activity::is_api_exit(cbdata) };
        // Safety: as above.
        let ctx = unsafe { (*(cbdata as *const sys::CUpti_CallbackData)).context } as usize;
        // Costs and pace are measured only while PC sampling has work in the process; the
        // count of synchronizations always (an atomic add per synchronization).
        if !exit {
            count_sync(ctx);
            if ACTIVE.load(Ordering::Relaxed) {
                if outermost() {
                    pace_tick();
                }
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

/// Runs on the thread whose current context is `ctx` (a synchronization just returned).
fn run(s: &mut State, ctx: usize) {
    let Some(cupti) = CUPTI.get() else { return };
    let ops: Vec<Op> = std::mem::take(&mut s.pending);
    for op in ops {
        match op {
            Op::Enable { device, ctx: c, cfg, wanted, win } if c == ctx => {
                let t = Instant::now();
                let r = enable(cupti, ctx, cfg.clone(), &wanted);
                let cost = charge(t);
                match r {
                    Ok((on, reasons, unknown)) => {
                        let win = win.map(|w| {
                            WINDOWS.fetch_add(1, Ordering::Relaxed);
                            WINDOW_OPEN.store(true, Ordering::Relaxed);
                            (
                                Win {
                                    cfg: w,
                                    opened: Some(Instant::now()),
                                    next_open: Instant::now(),
                                    open_cost: cost,
                                    extra_mark: EXTRA_NS.load(Ordering::Relaxed),
                                    closes: 0,
                                    slowdown: None,
                                },
                                cfg,
                                wanted,
                            )
                        });
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
                WINDOW_OPEN.store(false, Ordering::Relaxed);
                let t = Instant::now();
                if l.on.is_some() {
                    if kind == PcEventKind::Stopped {
                        let _ = drain(cupti, &mut l);
                    }
                    // Safety: `ctx` is current on this thread and sampling is enabled on it.
                    let _ = unsafe { cupti.pc_disable(ctx as sys::CUcontext) };
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

/// Windows mode at a synchronization on the context: closes the open window once it has
/// lasted its length (read, disable) and spaces the next so that what opening and closing
/// cost the application's threads stays under the budget (and the duty under [`MAX_DUTY`]);
/// opens the next when it is due.
fn window(cupti: &Cupti, device: u32, l: &mut Live, sampled: &mut BTreeMap<u32, Duration>) {
    let Some((w, cfg, wanted)) = &mut l.win else { return };
    let now = Instant::now();
    match w.opened {
        Some(at) if now.duration_since(at) >= w.cfg.window => {
            let t = Instant::now();
            let mut failure = None;
            let before = l.totals.0;
            let mut t_read = Duration::ZERO;
            if let Some(on) = l.on.as_mut() {
                failure = drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals);
                t_read = t.elapsed();
                // Safety: the context is current on this thread and sampling is enabled on it.
                let _ = unsafe { cupti.pc_disable(l.ctx as sys::CUcontext) };
                absorb(&on.at_disable, &mut l.agg, &mut l.totals);
            }
            l.on = None;
            if let Some(t) = l.on_since.take() {
                *sampled.entry(device).or_default() += t.elapsed();
            }
            charge(t);
            // What the last close and this open added to their synchronizations (measured at
            // their exits; this close's own comes with the next window).
            // The first window's enable includes CUPTI's one-time set-up (130-180 ms on an H200
            // in a PyTorch process; later enables took 0.3 ms), which says nothing of the next.
            let measured = Duration::from_nanos(EXTRA_NS.load(Ordering::Relaxed).saturating_sub(w.extra_mark));
            let first = w.closes == 0;
            let cost = if first { Duration::ZERO } else { measured };
            w.closes += 1;
            w.extra_mark = EXTRA_NS.load(Ordering::Relaxed);
            // The first window ran long on the H200 (0.1-0.4 s: the next synchronizations came
            // late after the set-up), which says nothing of the next either.
            let open = if first { w.cfg.window } else { now.duration_since(at) };
            WINDOW_OPEN.store(false, Ordering::Relaxed);
            // The budget pays for what opening and closing added to the synchronizations and
            // for the slowdown inside the window (measured from the application's pace; until
            // it is, the duty stays under MAX_DUTY).
            if let Some(s) = pace_slowdown() {
                w.slowdown = Some(w.slowdown.map_or(s, |old| 0.5 * old + 0.5 * s));
            }
            let inside = match w.slowdown {
                Some(s) => (open.as_secs_f64() * s / w.cfg.budget).max(open.as_secs_f64() / MAX_DUTY_MEASURED),
                None => open.as_secs_f64() / MAX_DUTY,
            };
            let gap = (cost.as_secs_f64() / w.cfg.budget).max(inside);
            w.opened = None;
            w.next_open = Instant::now() + Duration::from_secs_f64(gap).min(MAX_GAP);
            if WINDOWS.load(Ordering::Relaxed) < 20 {
                crate::log::log!(
                    Info,
                    "PC sampling window closed after {:.1} ms: read {:.2} ms, disable {:.2} ms, {} samples{}; \
                     added to synchronizations since the last close {:.2} ms; slowdown inside {}; next in {:.0} ms",
                    open.as_secs_f64() * 1e3,
                    t_read.as_secs_f64() * 1e3,
                    (t.elapsed() - t_read).as_secs_f64() * 1e3,
                    l.totals.0 - before,
                    failure.as_ref().map(|f| format!(", read failed: {}", f.0)).unwrap_or_default(),
                    measured.as_secs_f64() * 1e3,
                    w.slowdown.map_or("not measured yet".to_string(), |s| format!("{:.1} %", s * 100.0)),
                    gap.min(MAX_GAP.as_secs_f64()) * 1e3
                );
            }
            l.failure = failure;
        }
        None if now >= w.next_open => {
            let t = Instant::now();
            match enable(cupti, l.ctx, cfg.clone(), wanted) {
                Ok((on, _, _)) => {
                    l.on = Some(on);
                    WINDOW_OPEN.store(true, Ordering::Relaxed);
                    l.on_since = Some(Instant::now());
                    w.opened = Some(Instant::now());
                    WINDOWS.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => l.failure = Some((e, false)),
            }
            w.open_cost = charge(t);
        }
        _ => {}
    }
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
    WINDOW_OPEN.store(false, Ordering::Relaxed);
}

/// Reads what the context still holds and disables sampling on it.
fn close(cupti: &Cupti, l: &mut Live) {
    if l.on.is_none() {
        return;
    }
    if l.failure.is_none() {
        let _ = drain(cupti, l);
    }
    // Safety: sampling is enabled on the context, which is still valid.
    let _ = unsafe { cupti.pc_disable(l.ctx as sys::CUcontext) };
    if let Some(on) = &l.on {
        absorb(&on.at_disable, &mut l.agg, &mut l.totals);
    }
}

fn enable(
    cupti: &Cupti,
    ctx: usize,
    cfg: PcConfig,
    wanted: &[String],
) -> Result<(Enabled, StallReasons, Vec<String>), CuptiError> {
    let c = ctx as sys::CUcontext;
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
    Ok((Enabled { at_disable, read: PcBuffer::new(PCS_PER_READ, n) }, reasons, unknown))
}

/// Reads what CUPTI holds until it has nothing left (or the read limit). The error, and
/// whether the hardware buffer was reported full, when a read failed.
fn drain(cupti: &Cupti, l: &mut Live) -> Option<(CuptiError, bool)> {
    let on = l.on.as_mut()?;
    drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals)
}

fn drain_into(
    cupti: &Cupti,
    ctx: usize,
    on: &mut Enabled,
    agg: &mut Agg,
    totals: &mut (u64, u64),
) -> Option<(CuptiError, bool)> {
    let ctx = ctx as sys::CUcontext;
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
