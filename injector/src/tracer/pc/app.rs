//! What runs on the application's threads inside CUPTI's callbacks, at the entries of kernel
//! launches (only when work is due: [`DUE_AT`], one atomic load) and of CUDA synchronizations:
//! enabling, reading (`GetData`) and disabling PC sampling, and the windows' steps
//! ([`super::window`]). The background thread only arms operations and takes their results
//! (CUPTI calls on a context from another thread hung PyTorch); every call here takes the
//! callback's [`LiveContext`].

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use gpuprof_cupti::ids;
use gpuprof_cupti::pcsampling::PcConfig;
use gpuprof_cupti::{Callback, Context, Cupti, CuptiError, LiveContext};

use super::context::{Agg, Live as Sampled, disable_into, drain_into, enable, stop_range};
pub use super::context::{Done, Op};
use super::cubins;
use super::meter::{add_extra, at_entry, charge, count_sync, outside_syncs, own_thread, read_gap, set_detached, timed};
pub use super::meter::{app_cost, app_cost_extra};
use super::window::{DETACHED, Win, allowed, ask_detach, take_detach, window};
use crate::tracer::hooks;

/// A context being sampled, with its windows' state (windows mode).
type Live = Sampled<(Win, PcConfig, Vec<String>)>;
use crate::tracer::PcEventKind;

#[derive(Default)]
struct State {
    pending: Vec<Op>,
    /// A windowed enable the budget did not allow yet is tried again then.
    deferred_until: Option<Instant>,
    live: BTreeMap<u32, Live>,
    done: Vec<Done>,
    /// Time each device was sampled (enabled) since the last [`take`].
    sampled: BTreeMap<u32, Duration>,
}

static STATE: Mutex<State> = Mutex::new(State {
    pending: Vec::new(),
    deferred_until: None,
    live: BTreeMap::new(),
    done: Vec::new(),
    sampled: BTreeMap::new(),
});

/// When a launch next has work here (ns on [`mono_ns`]'s clock; 0: at once; `u64::MAX`: none).
static DUE_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Nanoseconds since this module's first use, for [`DUE_AT`].
fn mono_ns(t: Instant) -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    t.saturating_duration_since(*EPOCH.get_or_init(Instant::now)).as_nanos() as u64
}

/// Sets [`DUE_AT`] from what is armed and sampled.
fn set_due(s: &State) {
    let now = Instant::now();
    let mut due: Option<Instant> = None;
    let mut at = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
    if !s.pending.is_empty() {
        at(s.deferred_until.unwrap_or(now));
    }
    for l in s.live.values().filter(|l| l.failure.is_none()) {
        match &l.win {
            Some((w, _, _)) => at(w.due()),
            None => at(l.last_read.map_or(now, |t| t + read_gap())),
        }
    }
    // The epoch is taken before `now` is turned into nanoseconds, so that a first `now` is 0.
    let _ = mono_ns(now);
    DUE_AT.store(due.map_or(u64::MAX, mono_ns), Ordering::SeqCst);
}

/// Whether the launch callbacks are needed within `ahead`: an operation waits, a context is
/// sampled continuously or has a window open, or a window is due.
pub fn launches_wanted(ahead: Duration) -> bool {
    let s = state();
    ops_due(&s, ahead)
        || s.live.values().any(|l| match &l.win {
            None => l.on.is_some(),
            Some((w, _, _)) => w.is_open() || w.due_within(ahead),
        })
}

/// Whether an armed operation may run within `ahead` (not an enable the budget put off past it).
fn ops_due(s: &State, ahead: Duration) -> bool {
    !s.pending.is_empty() && s.deferred_until.is_none_or(|t| t <= Instant::now() + ahead)
}
pub fn pending_within(ahead: Duration) -> bool {
    ops_due(&state(), ahead)
}

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

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn init(cupti: &Arc<Cupti>) {
    let _ = CUPTI.set(cupti.clone());
}

/// The CUPTI handle [`init`] was given.
pub(super) fn cupti() -> Option<&'static Cupti> {
    CUPTI.get().map(|c| &**c)
}

/// Registers PC sampling's part of the subscriber's callback ([`hooks`]): module loads,
/// context teardown and synchronizations; kernel and graph launches (switched on while work may
/// be due at them, [`launches_wanted`]).
pub fn register_hooks() {
    hooks::register(hooks::User::Pc, on_callback, Some(on_launch));
}

thread_local! {
    /// This thread's launch under way: nesting depth (a runtime launch wraps the driver's) and
    /// [`hooks::launch_epoch`] when it entered (a switch of the callbacks or a finalize on
    /// another thread meanwhile means its exits never come).
    static LAUNCH: std::cell::Cell<(u32, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The launch callback: at a launch's outermost entry, the work due on its context; the
/// driver's launches counted and timed ([`super::launches`]); at the outermost exit, a finalize
/// that a window's close asked (CUPTI may be finalized in an API exit callback).
pub fn on_launch(cb: &Callback<'_>) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let entry = cb.is_api_entry();
        let driver = cb.domain() == ids::CUPTI_CB_DOMAIN_DRIVER_API;
        let epoch = hooks::launch_epoch();
        let (depth, at) = LAUNCH.with(|l| l.get());
        let depth = if at == epoch { depth } else { 0 };
        if entry {
            LAUNCH.with(|l| l.set((depth + 1, epoch)));
            if depth == 0
                && ACTIVE.load(Ordering::Relaxed)
                && mono_ns(Instant::now()) >= DUE_AT.load(Ordering::Relaxed)
                && !own_thread()
                && let Some(live) = cb.live_context()
                && let Ok(mut s) = STATE.try_lock()
            {
                run(&mut s, live);
            }
            if driver {
                super::launches::on_launch(cb);
                if let Some(ctx) = cb.api_context() {
                    super::meter::LAUNCHES_BY_CTX.count(ctx.id());
                }
                end_probe();
            }
            return;
        }
        if driver {
            super::launches::on_launch(cb);
        }
        let depth = depth.saturating_sub(1);
        LAUNCH.with(|l| l.set((depth, epoch)));
        if depth == 0
            && outside_syncs()
            && let Some(cupti) = CUPTI.get()
        {
            detach_at_exit(cupti, true);
        }
    }));
}

/// Whether a finalize at a launch's exit synchronizes first (`GPUPROF_PC_SYNC_FINALIZE=0`
/// leaves it out, to measure what it is for).
fn sync_before_finalize() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUPROF_PC_SYNC_FINALIZE").map(|v| v.trim() != "0").unwrap_or(true))
}

/// Whether any context is sampled.
pub fn sampling() -> bool {
    !state().live.is_empty()
}

/// Arms an operation for the next synchronization on its context. A disable of a context
/// between windows (nothing enabled) needs no CUDA call: it is done here.
pub fn arm(op: Op) {
    let mut s = state();
    let op = match op {
        Op::Disable { device, kind, reason } if s.live.get(&device).is_some_and(|l| l.on.is_none()) => {
            if let Some(mut l) = s.live.remove(&device) {
                count_on(&mut s.sampled, device, &mut l, false);
                // A stop while CUPTI is attached again for the next window (gpuprof holding the
                // subscriber): finalized at the next synchronization instead (see `run`'s disable).
                if kind == PcEventKind::Stopped
                    && l.win.is_some()
                    && super::window::detach_between()
                    && !DETACHED.load(Ordering::SeqCst)
                    && hooks::held_by(hooks::User::Pc)
                {
                    super::window::ask_detach_any();
                }
                s.done.push(Done::Disabled { device, kind, reason, agg: l.agg, totals: l.totals });
            }
            ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
            return;
        }
        op => op,
    };
    s.pending.push(op);
    ACTIVE.store(true, Ordering::SeqCst);
    DUE_AT.store(0, Ordering::SeqCst);
}

/// A probe of the launches ([`super::meter::PROBING`]) has seen enough of them: the launch
/// callbacks go off again unless PC sampling has work at launches (never waits: a busy
/// subscriber leaves it to the next launch).
fn end_probe() {
    use super::meter::{PROBE_LAUNCHES, PROBING};
    static SEEN: AtomicU64 = AtomicU64::new(0);
    if !PROBING.load(Ordering::Relaxed) || SEEN.fetch_add(1, Ordering::Relaxed) + 1 < PROBE_LAUNCHES {
        return;
    }
    if ACTIVE.load(Ordering::Relaxed) {
        PROBING.store(false, Ordering::SeqCst);
    } else if let Some(cupti) = CUPTI.get()
        && hooks::try_set_launches(cupti, false)
    {
        PROBING.store(false, Ordering::SeqCst);
    }
    SEEN.store(0, Ordering::Relaxed);
}

/// Takes back an enable armed for `device` that no synchronization has run yet: whether there
/// was one (then nothing was enabled, and a stop needs no disable). A lease taken back before
/// the process synchronized (ranks starting up) must not enable sampling afterwards.
pub fn cancel_enable(device: u32) -> bool {
    let mut s = state();
    let before = s.pending.len();
    s.pending.retain(|op| !matches!(op, Op::Enable { device: d, .. } if *d == device));
    let cancelled = s.pending.len() != before;
    ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
    cancelled
}

/// Between windows with CUPTI finalized ([`DETACHED`]): whether a window is due within
/// `horizon` (CUPTI must be attached again for it to open at a synchronization). Contexts
/// destroyed meanwhile (no callback said so) are dropped first, and reported gone.
pub fn window_due(horizon: Duration) -> bool {
    // The driver is asked outside the lock: releasing a context may run CUPTI's teardown
    // callback, which takes it.
    let devices: Vec<u32> = state().live.keys().copied().collect();
    let driver = super::DRIVER.get();
    let current: Vec<(u32, Option<usize>)> = devices
        .iter()
        .map(|&d| (d, driver.and_then(|drv| drv.active_primary_context(d)).map(|p| p.context().id())))
        .collect();
    let mut s = state();
    for (device, current) in current {
        if s.live.get(&device).is_some_and(|l| l.on.is_none() && current != Some(l.ctx.id()))
            && let Some(mut l) = s.live.remove(&device)
        {
            count_on(&mut s.sampled, device, &mut l, false);
            s.done.push(Done::ContextGone { device, agg: l.agg, totals: l.totals });
        }
    }
    s.live.values().any(|l| l.win.as_ref().is_some_and(|(w, _, _)| w.due_within(horizon)))
}

/// Whether any context is sampled in windows.
pub fn windowed() -> bool {
    state().live.values().any(|l| l.win.is_some())
}

/// No finalize between windows any more: the process exits (set by [`stop_all`]).
static EXITING: AtomicBool = AtomicBool::new(false);

/// At the outermost exit of a synchronization on the thread whose window closed with a disable
/// ([`ask_detach`]): `cuptiFinalize`, where CUPTI documents it safe (an API exit
/// callback), when nothing else of CUPTI is on: no context enabled or failed, no operation
/// armed, no trace's activity or pending detach, NVTX not routed through CUPTI, gpuprof's
/// thread not in CUPTI ([`hooks::try_finalizing`]). When something is busy the request waits
/// for this thread's next synchronization. The subscriber goes with the finalize; the
/// background thread subscribes again before the next window ([`window_due`]).
/// At a launch's exit (`at_launch`) the kernels it queued are still running: the process's
/// active contexts are synchronized first, as a trace's detach does, so that none completes
/// into CUPTI state the finalize freed (finalized with kernels in flight, a loop of small
/// PyTorch kernels kept running 15-25 % slower afterwards on the H200).
fn detach_at_exit(cupti: &Cupti, at_launch: bool) {
    if !take_detach() || EXITING.load(Ordering::SeqCst) {
        return;
    }
    let Ok(s) = STATE.try_lock() else { return ask_detach() };
    if !s.pending.is_empty() || s.live.values().any(|l| l.on.is_some() || l.win.is_none() || l.failure.is_some()) {
        return;
    }
    if hooks::activity()
        || crate::tracer::detach::armed()
        || crate::tracer::detach::NVTX_FORWARDED.load(Ordering::SeqCst)
    {
        return;
    }
    let Some(_finalizing) = hooks::try_finalizing() else { return ask_detach() };
    let t = Instant::now();
    if at_launch
        && sync_before_finalize()
        && let Some(driver) = super::DRIVER.get()
        && let Err(e) = driver.synchronize_active_primary_contexts()
    {
        crate::log::log!(Warn, "PC sampling: no finalize between windows: {e}");
        charge(t);
        return;
    }
    let r = cupti.finalize();
    let took = charge(t);
    add_extra(took);
    match r {
        Ok(()) => {
            hooks::ended_by_finalize();
            DETACHED.store(true, Ordering::SeqCst);
            set_detached(s.live.values().map(|l| l.ctx.id()).collect());
            if super::meter::WINDOWS.load(Ordering::Relaxed) < 20 {
                crate::log::log!(
                    Info,
                    "PC sampling: CUPTI finalized until the next window ({:.2} ms)",
                    took.as_secs_f64() * 1e3
                );
            }
        }
        Err(e) => crate::log::log!(Warn, "PC sampling: cuptiFinalize between windows: {e}"),
    }
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
                && let Some(ctx) = cb.live_context()
            {
                context_destroying(ctx);
            }
            return;
        }
        // The other domains switched on are the runtime and driver APIs.
        let Some(ctx) = cb.api_context() else { return };
        let live = cb.live_context();
        if own_thread() {
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
            && let Some(live) = live
            && let Ok(mut s) = STATE.try_lock()
        {
            run(&mut s, live);
        }
        if exit {
            timed(true);
            if outside_syncs()
                && let Some(cupti) = CUPTI.get()
            {
                detach_at_exit(cupti, false);
            }
        }
    }));
}

/// Runs on the thread whose current context is `cur` (at a launch's or synchronization's entry).
fn run(s: &mut State, cur: LiveContext<'_>) {
    let Some(cupti) = CUPTI.get() else { return };
    let ctx = cur.context();
    let ops: Vec<Op> = std::mem::take(&mut s.pending);
    let now = Instant::now();
    for op in ops {
        // A window's enable waits while the process's budget does not allow it.
        if let Op::Enable { win: Some(w), .. } = &op
            && (s.deferred_until.is_some_and(|t| t > now) || !allowed(w.budget))
        {
            if s.deferred_until.is_none_or(|t| t <= now) {
                s.deferred_until = Some(now + Duration::from_secs(1));
            }
            s.pending.push(op);
            continue;
        }
        match op {
            Op::Enable { device, ctx: c, cfg, wanted, win } if c == ctx => {
                s.deferred_until = None;
                let app_before = super::meter::APP_NS.load(Ordering::Relaxed);
                let t = Instant::now();
                let r = enable(cupti, cur, cfg.clone(), &wanted);
                charge(t);
                match r {
                    Ok((on, reasons, unknown)) => {
                        let win = win.map(|w| (Win::opened(w, app_before), cfg, wanted));
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
                super::window::end(&mut l);
                if let Some(mut on) = l.on.take() {
                    stop_range(cupti, cur, &mut on);
                    if kind == PcEventKind::Stopped {
                        let _ = drain_into(cupti, cur, &mut on, &mut l.agg, &mut l.totals);
                    }
                    // A windowed context stopped (its turn over, the session's end) leaves CUPTI
                    // as a window's close does: finalized at the next outermost exit of any
                    // thread, gpuprof's thread keeping the subscriber until then (one made again
                    // while the application launches is what `hooks` avoids).
                    if disable_into(cupti, cur, on, &mut l.agg, &mut l.totals).is_ok()
                        && l.win.is_some()
                        && super::window::detach_between()
                    {
                        super::window::ask_detach_any();
                    }
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
            window(cupti, cur, *device, l, sampled);
            continue;
        }
        if l.last_read.is_some_and(|t| t.elapsed() < read_gap()) {
            continue;
        }
        let t = Instant::now();
        l.last_read = Some(t);
        l.failure = drain(cupti, cur, l);
        charge(t);
    }
    ACTIVE.store(!s.pending.is_empty() || !s.live.is_empty(), Ordering::SeqCst);
    set_due(s);
}

/// A context is about to be destroyed (CUPTI's resource callback, on the destroying thread,
/// the context still valid): what it sampled is read and sampling disabled now, never on a
/// context that is gone; operations armed for it are dropped. The device is enabled again
/// when a new primary context appears.
fn context_destroying(live: LiveContext<'_>) {
    let Some(cupti) = CUPTI.get() else { return };
    let ctx = live.context();
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
        close(cupti, live, &mut l);
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
/// context. Results come with [`take`]. `vouch` vouches for each context still sampled (the
/// caller knows CUDA has not torn them down).
pub fn stop_all(reason: &str, vouch: &dyn Fn(Context) -> Option<LiveContext<'static>>) {
    EXITING.store(true, Ordering::SeqCst);
    let Some(cupti) = CUPTI.get() else { return };
    let mut s = state();
    s.pending.clear();
    let live = std::mem::take(&mut s.live);
    for (device, mut l) in live {
        count_on(&mut s.sampled, device, &mut l, false);
        if let Some(c) = vouch(l.ctx) {
            close(cupti, c, &mut l);
        }
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
fn close(cupti: &Cupti, c: LiveContext<'_>, l: &mut Live) {
    super::window::end(l);
    let Some(mut on) = l.on.take() else { return };
    stop_range(cupti, c, &mut on);
    if l.failure.is_none() {
        let _ = drain_into(cupti, c, &mut on, &mut l.agg, &mut l.totals);
    }
    let _ = disable_into(cupti, c, on, &mut l.agg, &mut l.totals);
}

/// Reads what CUPTI holds until it has nothing left (or the read limit). The error, and
/// whether the hardware buffer was reported full, when a read failed.
fn drain(cupti: &Cupti, c: LiveContext<'_>, l: &mut Live) -> Option<(CuptiError, bool)> {
    let on = l.on.as_mut()?;
    drain_into(cupti, c, on, &mut l.agg, &mut l.totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_before_any_synchronization_takes_the_armed_enable_back() {
        let ctx = Context::NULL;
        arm(Op::Enable { device: 7, ctx, cfg: PcConfig::default(), wanted: Vec::new(), win: None });
        assert!(pending());
        assert!(!cancel_enable(8), "another device's enable is not there");
        assert!(pending());
        assert!(cancel_enable(7));
        assert!(!pending(), "nothing left for a synchronization to run");
        assert!(!cancel_enable(7), "taken back once");
    }
}
