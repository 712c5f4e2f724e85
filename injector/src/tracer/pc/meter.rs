//! What PC sampling costs the application and where the application works, measured on its
//! own threads: the synchronizations and launches per context (for the daemon's scheduler,
//! `device_activity`), the time PC-sampling calls take ([`charge`], which goes to the
//! budget's ledger) and what they add to the synchronizations they run in ([`timed`]), and the
//! settings read from the environment for measurements.

use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::tracer::hooks;

/// Time spent in PC-sampling calls on the application's threads, and windows opened, since
/// the process started (for the log and the cost figures).
pub(super) static APP_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub(super) static WINDOWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// (time in PC-sampling calls on application threads, windows opened) so far.
pub fn app_cost() -> (Duration, u64) {
    (Duration::from_nanos(APP_NS.load(Ordering::Relaxed)), WINDOWS.load(Ordering::Relaxed))
}

/// What PC sampling added to the application's synchronizations, as measured (see [`timed`]).
pub(super) static EXTRA_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What PC-sampling calls added to the synchronizations they ran in, so far.
pub fn app_cost_extra() -> Duration {
    Duration::from_nanos(EXTRA_NS.load(Ordering::Relaxed))
}

thread_local! {
    /// This thread's synchronization in progress: nesting depth (a runtime call wraps a driver
    /// call), its start, and this thread's work time then.
    static SYNC: std::cell::Cell<(u32, Option<Instant>, u64)> = const { std::cell::Cell::new((0, None, 0)) };
    /// [`hooks::finalizations`] when this thread last entered a synchronization: a finalize
    /// on another thread while this one waited ends the callbacks, so its exit never came and
    /// its depth starts again from 0.
    static EPOCH: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Time this thread spent in PC-sampling calls.
    static WORK_NS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// How long this thread's synchronizations take without PC-sampling work (a moving average, ns).
    static PLAIN_NS: std::cell::Cell<f64> = const { std::cell::Cell::new(-1.0) };
}

/// The time since `t` was spent in PC-sampling calls on this application thread: it goes to
/// the process's ledger ([`super::budget`]) and the totals.
pub(super) fn charge(t: Instant) -> Duration {
    let d = t.elapsed();
    super::budget::spend(d);
    APP_NS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    WORK_NS.with(|w| w.set(w.get() + d.as_nanos() as u64));
    d
}

/// Times this thread's synchronizations: at the outermost exit, a synchronization in which
/// PC-sampling work ran adds what it took beyond a plain one (work at an exit adds all of its
/// time: the GPU waited) to [`EXTRA_NS`]; a plain one updates the average.
pub(super) fn timed(exit: bool) {
    let (mut depth, t0, w0) = SYNC.with(|s| s.get());
    if !exit {
        let epoch = hooks::finalizations();
        if EPOCH.with(|e| e.replace(epoch)) != epoch {
            depth = 0;
        }
        let start = if depth == 0 { (Some(Instant::now()), WORK_NS.with(|w| w.get())) } else { (t0, w0) };
        SYNC.with(|s| s.set((depth + 1, start.0, start.1)));
        return;
    }
    if depth == 0 {
        return;
    }
    let depth = depth - 1;
    SYNC.with(|s| s.set((depth, if depth == 0 { None } else { t0 }, w0)));
    let (0, Some(t0)) = (depth, t0) else { return };
    let total = t0.elapsed().as_nanos() as f64;
    let worked = WORK_NS.with(|w| w.get()).saturating_sub(w0) as f64;
    let plain = PLAIN_NS.with(|p| p.get());
    if worked > 0.0 {
        let extra = if at_entry() { (total - plain.max(0.0)).clamp(0.0, worked) } else { worked };
        EXTRA_NS.fetch_add(extra as u64, Ordering::Relaxed);
    } else {
        PLAIN_NS.with(|p| p.set(if plain < 0.0 { total } else { 0.9 * plain + 0.1 * total }));
    }
}

/// Whether this thread is inside no synchronization (after the outermost one's exit): a runtime
/// synchronization wraps a driver one, and CUPTI may be finalized only once both exits were
/// seen, or the outer exit never comes and the thread's timing stays nested.
pub(super) fn outside_syncs() -> bool {
    SYNC.with(|s| s.get().0 == 0)
}

/// Adds to what PC sampling added to the synchronizations, for work done after the
/// synchronization's timing closed (the finalize between windows).
pub(super) fn add_extra(d: Duration) {
    EXTRA_NS.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
}

/// Counts per CUDA context since the last [`PerContext::take`], for the daemon's PC-sampling
/// scheduler (which process works on which GPU): a few slots of (context, count), lock-free.
pub(super) struct PerContext {
    ctx: [std::sync::atomic::AtomicUsize; SYNC_SLOTS],
    n: [std::sync::atomic::AtomicU64; SYNC_SLOTS],
}

const SYNC_SLOTS: usize = 16;

impl PerContext {
    const fn new() -> PerContext {
        PerContext {
            ctx: [const { std::sync::atomic::AtomicUsize::new(0) }; SYNC_SLOTS],
            n: [const { std::sync::atomic::AtomicU64::new(0) }; SYNC_SLOTS],
        }
    }

    /// One more on `ctx` (a context past the slots is not counted).
    pub(super) fn count(&self, ctx: usize) {
        if ctx == 0 {
            return;
        }
        for i in 0..SYNC_SLOTS {
            let c = self.ctx[i].load(Ordering::Relaxed);
            if c == ctx
                || (c == 0 && self.ctx[i].compare_exchange(0, ctx, Ordering::Relaxed, Ordering::Relaxed).is_ok())
                || self.ctx[i].load(Ordering::Relaxed) == ctx
            {
                self.n[i].fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// The counts per context since the last call.
    pub(super) fn take(&self) -> Vec<(usize, u64)> {
        (0..SYNC_SLOTS)
            .filter_map(|i| {
                let c = self.ctx[i].load(Ordering::Relaxed);
                let n = self.n[i].swap(0, Ordering::Relaxed);
                (c != 0 && n > 0).then_some((c, n))
            })
            .collect()
    }
}

/// CUDA synchronizations and kernel launches per context, while their callbacks are on.
pub(super) static SYNCS: PerContext = PerContext::new();
pub(super) static LAUNCHES_BY_CTX: PerContext = PerContext::new();

pub(super) fn count_sync(ctx: usize) {
    SYNCS.count(ctx);
}

/// Where the work runs: at a synchronization's entry (true, the default) or its exit.
pub(super) fn at_entry() -> bool {
    static AT: OnceLock<bool> = OnceLock::new();
    *AT.get_or_init(|| std::env::var("GPUPROF_PC_AT").map(|v| v.trim() != "exit").unwrap_or(true))
}

/// A number from the environment variable `name` (None when unset or not a number).
fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// How often CUPTI's worker thread wakes, in ms (`GPUPROF_PC_WORKER_MS`, else `default`; 0:
/// CUPTI's default, 100 ms). A disable waits for the worker's wake-up.
pub(super) fn worker_ms(default: u32) -> u32 {
    static MS: OnceLock<Option<u32>> = OnceLock::new();
    MS.get_or_init(|| env_num("GPUPROF_PC_WORKER_MS")).unwrap_or(default)
}

/// Whether rows get source lines (`GPUPROF_PC_LINES=0` leaves them out, and with them every
/// CUPTI call of the background thread after a window: to measure what those cost).
pub(super) fn lines_on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUPROF_PC_LINES").map(|v| v.trim() != "0").unwrap_or(true))
}

/// CUPTI's scratch buffer in MiB: the lease's (`leased`, 0 when it does not say), else
/// `GPUPROF_PC_SCRATCH_MIB` (for measuring what its size does to the samples a window keeps),
/// else 0 (CUPTI's default).
pub(super) fn scratch_mib_or(leased: u32) -> usize {
    static MIB: OnceLock<usize> = OnceLock::new();
    if leased != 0 {
        return leased as usize;
    }
    *MIB.get_or_init(|| env_num("GPUPROF_PC_SCRATCH_MIB").unwrap_or(0))
}

/// CUPTI's hardware buffer in MiB when the lease does not say (`GPUPROF_PC_HW_MIB`, for
/// measuring what its size costs; else `default`, 0: CUPTI's own).
pub(super) fn hw_mib(default: usize) -> usize {
    static MIB: OnceLock<Option<usize>> = OnceLock::new();
    MIB.get_or_init(|| env_num("GPUPROF_PC_HW_MIB").filter(|m| *m > 0)).unwrap_or(default)
}

/// A window's length: `GPUPROF_PC_WINDOW_MS` (for measuring what the length does to a
/// window's samples and cost), else the lease's (`leased` ms; 0: [`WINDOW`]).
pub(super) fn window_len(leased: u32) -> Duration {
    static MS: OnceLock<Option<u64>> = OnceLock::new();
    match (*MS.get_or_init(|| env_num("GPUPROF_PC_WINDOW_MS").filter(|m| *m > 0)), leased) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, 0) => WINDOW,
        (None, leased) => Duration::from_millis(u64::from(leased)),
    }
}

/// A window's length when the lease does not say. CUPTI keeps only what it sampled from about
/// 60 ms after an enable, so a window of 200 ms keeps most of what ran in it.
pub const WINDOW: Duration = Duration::from_millis(200);

/// Least time between two reads of a context in continuous mode (`GPUPROF_PC_READ_MS`
/// overrides it).
pub const READ_GAP: Duration = Duration::from_millis(100);

pub(super) fn read_gap() -> Duration {
    static GAP: OnceLock<Duration> = OnceLock::new();
    *GAP.get_or_init(|| env_num("GPUPROF_PC_READ_MS").map(Duration::from_millis).unwrap_or(READ_GAP))
}

/// The contexts whose windows left CUPTI finalized (see [`set_detached`]); atomics, since an
/// application thread sets them.
static DETACHED_CTX: [std::sync::atomic::AtomicUsize; SYNC_SLOTS] =
    [const { std::sync::atomic::AtomicUsize::new(0) }; SYNC_SLOTS];

/// Sets the contexts that are between windows with CUPTI finalized (empty once CUPTI is
/// attached again).
pub(super) fn set_detached(ctxs: Vec<usize>) {
    for (i, slot) in DETACHED_CTX.iter().enumerate() {
        slot.store(ctxs.get(i).copied().unwrap_or(0), Ordering::SeqCst);
    }
}

/// A probe of the launches: the launch callbacks switched on only to see whether the process
/// launches kernels (it synchronized nowhere, and nothing else needs them); the launch
/// callback switches them off again after [`PROBE_LAUNCHES`] launches.
pub(super) static PROBING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
pub(super) const PROBE_LAUNCHES: u64 = 8;

/// The contexts between windows with CUPTI finalized.
pub(super) fn detached_contexts() -> Vec<usize> {
    DETACHED_CTX.iter().map(|c| c.load(Ordering::SeqCst)).filter(|&c| c != 0).collect()
}

/// CUPTI's one-time set-up (the process's first enable), ns: counted in the ledger when paid,
/// but not in what later windows are expected to cost.
pub(super) static SETUP_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// Set on the injector's own threads: their synchronizations run nothing here.
    static OWN_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as the injector's own.
pub fn mark_own_thread() {
    OWN_THREAD.with(|t| t.set(true));
}

/// Whether the calling thread is one of the injector's own.
pub(super) fn own_thread() -> bool {
    OWN_THREAD.with(|t| t.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window length a lease gets (GPUPROF_PC_WINDOW_MS unset, as in `cargo test`).
    #[test]
    fn window_length_is_the_lease_s_or_200_ms() {
        assert!(std::env::var_os("GPUPROF_PC_WINDOW_MS").is_none(), "unset GPUPROF_PC_WINDOW_MS to run this test");
        assert_eq!(window_len(0), Duration::from_millis(200));
        assert_eq!(window_len(500), Duration::from_millis(500));
    }
}
