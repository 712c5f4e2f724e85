//! Windows mode, at a synchronization on a sampled context ([`window`]): a window opens when
//! it is due and closes once it has lasted its length; the gap to the next is set by what
//! the windows cost the application (the budget).
//!
//! Measured on the H100 with CUPTI alone (`tests/gpu/pc_floor.sh`, its loop modes): the first
//! enable in a process takes 82-126 ms (CUPTI's set-up, once per process; 15-18 ms after a
//! `cuptiFinalize`, 0.3-0.8 ms otherwise); a configure 1 ms; a `cuptiPCSamplingStart` 58-69 ms
//! with an 8 MiB hardware buffer (90-97 at 64 MiB, 286-601 at CUPTI's default 512), a stop
//! 2 ms; a disable 36-51 ms. Each blocks the application's thread, called from another thread
//! too. Once PC sampling has been enabled on a context, every later kernel launch costs more,
//! enabled (+1.5-2 µs: CUPTI's own sampler cost 17-29 % on a loop of small PyTorch kernels)
//! and still after the disable (a C loop of small launches 1.25x after one enable and disable,
//! 0.94x once `cuptiFinalize` ran too). Staying enabled costs compute-bound work too: on the
//! H200 the bf16 8192^3 matmul loop ran 0.64-0.88 % slower (three calls of `pc_sched.sh`
//! cost, COST_WARM=3, medians of 5-6) with the context enabled under start/stop control
//! between windows, also when at most one window fell in the timed 8 s, as much as CUPTI's
//! own continuous sampler (0.64-0.89 %); with each window an enable and a disable and CUPTI
//! finalized between them it ran 0.04 % and 0.36 % slower (two of those calls). So by default
//! each window is an enable without start/stop control (no start to pay) that disables at its
//! close, and, when nothing else of CUPTI is on, CUPTI is finalized at the synchronization's
//! outermost exit ([`ask_detach`], carried out in `app.rs`); the background thread subscribes
//! again shortly before the next window is due. Such a window keeps only what CUPTI sampled
//! from ~60 ms after its enable (on the H200 a 20 ms window kept the kernels of one
//! synchronization interval, a 200 ms one 70-85 % of what ran), so windows last
//! [`super::meter::WINDOW`] by default. The first kernel launch after each enable waits for
//! CUPTI (70-130 ms on the H200 in the small-kernel PyTorch loop, every window; the window's
//! other launches took microseconds). Every cost counts against the budget that spaces the
//! windows, that launch's too. `GPUPROF_PC_WINDOWS=ranges` makes windows ranges instead
//! (`cuptiPCSamplingStart` … `cuptiPCSamplingStop`, then read), the context staying enabled
//! between them while CUPTI's cost per launch (counted while a window is open) is at most
//! half the budget; `GPUPROF_PC_DETACH=0` keeps CUPTI attached between windows: each to
//! measure one against the other.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuprof_cupti::pcsampling::PcConfig;
use gpuprof_cupti::{Cupti, LiveContext};

use super::context::{Live as Sampled, disable_into, drain_into, enable};
use super::launches::{LAUNCHES, SLOW_LAUNCH, Watch};
use super::meter::{APP_NS, EXTRA_NS, MAX_DUTY, MAX_DUTY_MEASURED, WINDOWS, charge, window_read_gap};
use crate::tracer::hooks;

/// A context sampled in windows.
type Live = Sampled<(Win, PcConfig, Vec<String>)>;

/// The longest gap between windows (the budget decides below it).
const MAX_GAP: Duration = Duration::from_secs(60);
/// What CUPTI adds to a kernel launch while PC sampling is enabled: 1.5 µs measured on the
/// H100 (small-kernel loop, 8.7 µs a launch untraced, +17.5 % under CUPTI's own sampler);
/// rounded up.
const ENABLED_COST_PER_LAUNCH: Duration = Duration::from_micros(2);

thread_local! {
    /// The close of a window that disabled asks for `cuptiFinalize` at the outermost exit of
    /// the same synchronization, on the same thread ([`super::app`] carries it out when
    /// nothing else of CUPTI is on; else at a later synchronization of this thread).
    static DETACH_AT_EXIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks this thread's next outermost synchronization exit for a finalize.
pub(super) fn ask_detach() {
    DETACH_AT_EXIT.with(|d| d.set(true));
}

/// A finalize asked of whichever application thread reaches a synchronization's outermost exit
/// first: a windowed context stopped between windows (done at once, on gpuprof's thread) while
/// CUPTI was attached for the next window. The subscriber stays until then, so that it goes
/// with the finalize rather than being let go and made again at the next lease.
static DETACH_ANY: AtomicBool = AtomicBool::new(false);

/// Asks any application thread's next outermost synchronization exit for a finalize.
pub(super) fn ask_detach_any() {
    DETACH_ANY.store(true, Ordering::SeqCst);
}

/// Whether a finalize asked with [`ask_detach_any`] is still to come.
pub(super) fn detach_asked() -> bool {
    DETACH_ANY.load(Ordering::SeqCst)
}

/// Takes this thread's request for a finalize, or the one any thread may carry out: whether
/// there was one.
pub(super) fn take_detach() -> bool {
    let own = DETACH_AT_EXIT.with(|d| d.replace(false));
    // Only looked at (and taken) when no request of this thread's own was there.
    own || (DETACH_ANY.load(Ordering::Relaxed) && DETACH_ANY.swap(false, Ordering::SeqCst))
}

/// CUPTI is finalized between windows: no callback comes until the background thread
/// subscribes again before the next window is due.
pub(super) static DETACHED: AtomicBool = AtomicBool::new(false);

/// The trace's detach setting (`GPUPROF_DETACH`, [`crate::config::DetachMode`]), given once by
/// the backend: `off` keeps CUPTI attached between windows too.
static DETACH_MODE: OnceLock<crate::config::DetachMode> = OnceLock::new();

pub fn set_detach_mode(mode: crate::config::DetachMode) {
    let _ = DETACH_MODE.set(mode);
}

/// Whether a window that disables also leaves CUPTI (`cuptiFinalize`) until the next one: on
/// by default; `GPUPROF_PC_DETACH=0` (or `GPUPROF_DETACH=off`) keeps the subscriber between
/// windows. Once PC sampling has been enabled, CUPTI slows every later kernel launch even
/// after the disable (the small-kernel loop stayed ~20 % slower between windows on the H200);
/// finalizing removes that, at the price of CUPTI's set-up again at the next window's enable.
pub fn detach_between() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let off = std::env::var("GPUPROF_PC_DETACH")
            .is_ok_and(|v| ["0", "off", "no", "false"].contains(&v.trim().to_ascii_lowercase().as_str()));
        !off && DETACH_MODE.get() != Some(&crate::config::DetachMode::Off)
    })
}

/// Windows mode's settings for a context.
#[derive(Debug, Clone, Copy)]
pub struct WinCfg {
    pub window: Duration,
    /// Cost budget as a fraction of the time (0.005: 0.5 %).
    pub budget: f64,
}

/// Whether windows are ranges under start/stop control (`GPUPROF_PC_WINDOWS=ranges`) rather
/// than an enable each (the default).
pub fn ranged() -> bool {
    static RANGED: OnceLock<bool> = OnceLock::new();
    *RANGED.get_or_init(|| std::env::var("GPUPROF_PC_WINDOWS").is_ok_and(|v| v.trim() == "ranges"))
}

/// A context sampled in windows.
pub(super) struct Win {
    cfg: WinCfg,
    /// The window opened then (None: closed).
    opened: Option<Instant>,
    next_open: Instant,
    /// [`EXTRA_NS`] and [`APP_NS`] when the last window closed.
    extra_mark: u64,
    app_mark: u64,
    /// The first window opened then.
    since: Instant,
    /// Windows closed so far.
    closes: u64,
    /// What the windows cost so far: added to synchronizations, and what being enabled cost
    /// the launches (inside windows, and between them while kept enabled).
    spent: Duration,
    /// What the last window charged cost (zero until one did): what the next is expected to.
    last_charge: Duration,
    /// [`LAUNCHES`] when the window opened (None: launches are not being counted).
    launch_mark: Option<u64>,
    /// The open window's launch times (its first launch, the slowest, the slow ones).
    watch: Option<Watch>,
    /// Kernel launches per second in the last windows (a moving average; None: not yet).
    launch_rate: Option<f64>,
    /// The last close kept sampling enabled (start/stop control) then: what staying enabled
    /// costs until the next close counts against the budget too.
    kept_since: Option<Instant>,
}

impl Win {
    /// The first window, opened by the enable.
    pub(super) fn opened(cupti: &Cupti, cfg: WinCfg) -> Win {
        WINDOWS.fetch_add(1, Ordering::Relaxed);
        Win {
            cfg,
            opened: Some(Instant::now()),
            next_open: Instant::now(),
            extra_mark: EXTRA_NS.load(Ordering::Relaxed),
            app_mark: APP_NS.load(Ordering::Relaxed),
            since: Instant::now(),
            closes: 0,
            spent: Duration::ZERO,
            last_charge: Duration::ZERO,
            launch_mark: count_launches(cupti),
            watch: Some(Watch::start()),
            launch_rate: None,
            kept_since: None,
        }
    }

    /// Whether the next window opens within `horizon` (or is due already).
    pub(super) fn due_within(&self, horizon: Duration) -> bool {
        self.opened.is_none() && self.next_open <= Instant::now() + horizon
    }

    /// What keeping sampling enabled costs, as a fraction of the time (None: not known yet).
    fn enabled_cost(&self) -> Option<f64> {
        self.launch_rate.map(|r| r * ENABLED_COST_PER_LAUNCH.as_secs_f64())
    }
}

/// The gap from `now` to the next window, after one open for `open`: the next opens once what
/// the windows cost since the first (`since`), the next one's expected cost included
/// (`spent_ahead`), is within `budget` of the time since, so that the budget holds from each
/// window's open rather than being paid back after it (on a run of ~45 s, paying back left the
/// last window's cost over the budget: 0.84-1.13 % by the windows' account on the small-kernel
/// loop under a 0.5 % budget, H200); and the windows stay under `duty` of the time; at most
/// [`MAX_GAP`].
fn next_gap(open: Duration, duty: f64, since: Instant, spent_ahead: Duration, budget: f64, now: Instant) -> Duration {
    let paid = since + spent_ahead.div_f64(budget);
    open.div_f64(duty).max(paid.saturating_duration_since(now)).min(MAX_GAP)
}

/// Sampling on the context ends: the launch callbacks go off if a window counted them, and
/// its watch of their times ends.
pub(super) fn end(cupti: &Cupti, l: &mut Live) {
    if let Some((w, _, _)) = &mut l.win {
        w.watch = None;
        if w.launch_mark.take().is_some() {
            hooks::count_launches(cupti, false);
        }
    }
}

/// Starts counting launches: the count so far (None when the callbacks could not be switched on).
fn count_launches(cupti: &Cupti) -> Option<u64> {
    hooks::count_launches(cupti, true).then(|| LAUNCHES.load(Ordering::Relaxed))
}

/// Windows mode at a synchronization on the context: closes the open window once it has
/// lasted its length (stop and read; disable too when staying enabled would cost more than
/// the budget) and spaces the next so that what the windows cost stays under the budget (and
/// the duty under [`MAX_DUTY`] while that cost is not known); opens the next when it is due.
pub(super) fn window(
    cupti: &Cupti,
    c: LiveContext<'_>,
    device: u32,
    l: &mut Live,
    sampled: &mut BTreeMap<u32, Duration>,
) {
    let Some((w, cfg, wanted)) = &mut l.win else { return };
    let now = Instant::now();
    match w.opened {
        Some(at) if now.duration_since(at) >= w.cfg.window => {
            let open = now.duration_since(at);
            let times = w.watch.take().map(Watch::take).unwrap_or_default();
            if let Some(mark) = w.launch_mark.take() {
                hooks::count_launches(cupti, false);
                let rate = LAUNCHES.load(Ordering::Relaxed).saturating_sub(mark) as f64 / open.as_secs_f64();
                w.launch_rate = Some(w.launch_rate.map_or(rate, |old| 0.5 * old + 0.5 * rate));
            }
            // Kept enabled only while that costs at most half the budget (the other half is for
            // the windows themselves).
            let keep = w.enabled_cost().is_some_and(|c| c <= w.cfg.budget / 2.0);
            let t = Instant::now();
            let mut failure = None;
            let before = l.totals.0;
            let mut t_read = Duration::ZERO;
            let mut kept = false;
            let mut at_disable = None;
            if let Some(on) = l.on.as_mut() {
                if let Err(e) = on.sampling.stop(cupti, c) {
                    failure = Some((e, false));
                }
                let t_stop = t.elapsed();
                failure = failure.or(drain_into(cupti, c, on, &mut l.agg, &mut l.totals));
                t_read = t.elapsed() - t_stop;
                kept = on.sampling.ranged() && keep && failure.is_none();
            }
            if !kept {
                let mut disabled = true;
                if let Some(on) = l.on.take() {
                    match disable_into(cupti, c, on, &mut l.agg, &mut l.totals) {
                        Ok(n) => at_disable = Some(n),
                        Err(e) => {
                            // CUPTI may still sample the context: no finalize under it.
                            disabled = false;
                            failure = failure.or(Some((e, false)));
                        }
                    }
                }
                if disabled && detach_between() {
                    ask_detach();
                }
            }
            if let Some(t) = l.on_since.take() {
                *sampled.entry(device).or_default() += t.elapsed();
            }
            charge(t);
            // What the last close and this open cost, but for the first enable's one-time
            // set-up (80-260 ms in a PyTorch process), paid once whatever comes next: the time
            // their calls took on the application's threads, or what they added to the
            // synchronizations they ran in (measured at the exits; this close's own comes with
            // the next window) where that is more (a finalize between windows). A call that
            // waited while the GPU worked anyway (a stop at a compute-bound synchronization's
            // entry: ~20 ms, ~4 ms added) counts in full: windows charged what they added ran
            // the bf16 matmul loop 1.11-1.17 % slower under a 0.5 % budget on the H200
            // (`pc_sched.sh` cost, COST_WARM=3), the calls' time being about twice the cost
            // charged. And, when the window disabled, the launches' cost inside it (kept
            // enabled, that cost runs all the time and is under the budget by the choice above).
            let (extra_now, app_now) = (EXTRA_NS.load(Ordering::Relaxed), APP_NS.load(Ordering::Relaxed));
            let added = Duration::from_nanos(extra_now.saturating_sub(std::mem::replace(&mut w.extra_mark, extra_now)));
            let calls = Duration::from_nanos(app_now.saturating_sub(std::mem::replace(&mut w.app_mark, app_now)));
            // The first launch after the enable too: on the H200 one launch of each window of
            // the small-kernel loop took 80-180 ms (the windows charged ~1/2 of what they cost it).
            let stall = times.first.saturating_sub(SLOW_LAUNCH);
            let spent_before = w.spent;
            if w.closes > 0 {
                w.spent += added.max(calls) + stall;
            }
            w.closes += 1;
            if let Some(c) = w.enabled_cost() {
                // Enabled since the last close (kept then), or inside this window only.
                let on = w.kept_since.take().map_or(open, |t| now.duration_since(t));
                w.spent += on.mul_f64(c.min(10.0));
            }
            w.kept_since = kept.then_some(now);
            let charged = w.spent.saturating_sub(spent_before);
            if !charged.is_zero() {
                w.last_charge = charged;
            }
            let duty = if w.enabled_cost().is_some() { MAX_DUTY_MEASURED } else { MAX_DUTY };
            let gap = next_gap(open, duty, w.since, w.spent + w.last_charge, w.cfg.budget, Instant::now());
            w.opened = None;
            w.next_open = Instant::now() + gap;
            if WINDOWS.load(Ordering::Relaxed) < 20 {
                crate::log::log!(
                    Info,
                    "PC sampling window closed after {:.1} ms: {} {:.2} ms, read {:.2} ms, {} samples{}{}; \
                     since the last close: calls {:.2} ms, added to synchronizations {:.2} ms, {:.0} ms charged in all; \
                     {}, first launch {:.1} ms, slowest {:.1} ms (launch {} of the window), {:.1} ms in launches \
                     over 1 ms; next in {:.0} ms",
                    open.as_secs_f64() * 1e3,
                    if kept { "stop" } else { "stop and disable" },
                    (t.elapsed() - t_read).as_secs_f64() * 1e3,
                    t_read.as_secs_f64() * 1e3,
                    l.totals.0 - before,
                    at_disable
                        .map(|(pcs, n)| format!(" ({n} of them in {pcs} PCs at the disable)"))
                        .unwrap_or_default(),
                    failure.as_ref().map(|f| format!(", read failed: {}", f.0)).unwrap_or_default(),
                    calls.as_secs_f64() * 1e3,
                    added.as_secs_f64() * 1e3,
                    w.spent.as_secs_f64() * 1e3,
                    w.launch_rate.map_or("launches not counted".to_string(), |r| format!(
                        "{r:.0} launches/s (enabled costs ~{:.2} %)",
                        r * ENABLED_COST_PER_LAUNCH.as_secs_f64() * 100.0
                    )),
                    times.first.as_secs_f64() * 1e3,
                    times.slowest.as_secs_f64() * 1e3,
                    times.slowest_at,
                    times.slow.as_secs_f64() * 1e3,
                    gap.as_secs_f64() * 1e3
                );
            }
            l.failure = failure;
        }
        None if now >= w.next_open => {
            let t = Instant::now();
            let opened = match l.on.as_mut() {
                // Only a ranged window stays enabled: it opens the next range.
                Some(on) => on.sampling.start(cupti, c),
                None => {
                    // A window that will disable at its close (staying enabled costs more than
                    // the budget allows) needs no start/stop control, whose start costs more
                    // than the enable and configure together.
                    // (The close keeps it enabled only when that cost is known to be low.)
                    let ranged = cfg.start_stop && w.enabled_cost().is_some_and(|c| c <= w.cfg.budget / 2.0);
                    let cfg = PcConfig { start_stop: ranged, ..cfg.clone() };
                    enable(cupti, c, cfg, wanted).map(|(on, _, _)| l.on = Some(on))
                }
            };
            match opened {
                Ok(()) => {
                    l.on_since = Some(Instant::now());
                    w.opened = Some(Instant::now());
                    w.watch = Some(Watch::start());
                    w.launch_mark = count_launches(cupti);
                    WINDOWS.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => l.failure = Some((e, false)),
            }
            charge(t);
        }
        Some(_) if window_read_gap().is_some_and(|g| l.last_read.is_none_or(|t| t.elapsed() >= g)) => {
            // Reads inside an open window (`GPUPROF_PC_WINDOW_READ_MS`), for measuring what
            // they do to the samples a window keeps.
            let t = Instant::now();
            l.last_read = Some(t);
            if let Some(on) = l.on.as_mut() {
                l.failure = drain_into(cupti, c, on, &mut l.agg, &mut l.totals);
            }
            charge(t);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows of a steady cost on a run: (opens of charged windows with what was spent once
    /// each closed, windows in all) when each next window is spaced by what was spent
    /// (`ahead`: plus the last window's cost).
    fn run(secs: u64, cost: Duration, ahead: bool) -> (Vec<(Duration, Duration)>, usize) {
        let (open, budget) = (Duration::from_millis(200), 0.005);
        let since = Instant::now();
        let end = since + Duration::from_secs(secs);
        let (mut t, mut spent, mut last, mut charged, mut n) =
            (since + open, Duration::ZERO, Duration::ZERO, Vec::new(), 1);
        loop {
            // The first window (at the start) is not charged; each later one costs `cost`.
            let next =
                t + next_gap(open, MAX_DUTY, since, spent + if ahead { last } else { Duration::ZERO }, budget, t);
            if next + open > end {
                return (charged, n);
            }
            n += 1;
            spent += cost;
            last = cost;
            charged.push((next - since, spent));
            t = next + open;
        }
    }

    #[test]
    fn each_window_opens_only_once_the_budget_covers_its_cost_too() {
        let cost = Duration::from_millis(150);
        for secs in [45, 120, 600] {
            let (wins, n) = run(secs, cost, true);
            // The first charged window's cost is not known before it (the duty spaces it); from
            // the next on, what was spent once a window closes is within the budget of the time
            // to its open.
            for (at, spent) in wins.iter().skip(1) {
                assert!(spent.as_secs_f64() <= 0.005 * at.as_secs_f64() + 1e-9, "{secs} s: {spent:?} spent by {at:?}");
            }
            let (after, n_after) = run(secs, cost, false);
            assert!(
                after.iter().skip(1).any(|(at, spent)| spent.as_secs_f64() > 0.005 * at.as_secs_f64()),
                "{secs} s: paid back after each window, the budget is overrun at the opens"
            );
            assert!(n_after - n <= 1, "{secs} s: one window fewer at most ({n} against {n_after})");
            let whole = wins.last().map_or(Duration::ZERO, |w| w.1);
            assert!(whole.as_secs_f64() / secs as f64 <= 0.005, "{secs} s: {whole:?} in all");
        }
        let (wins, _) = run(600, cost, true);
        assert!(wins.len() >= 10, "a 10-minute run still gets windows under the budget: {}", wins.len());
    }

    /// A finalize asked of any thread is carried out once, by the first thread to look, and a
    /// thread's own request does not use it up.
    #[test]
    fn a_finalize_asked_of_any_thread_is_taken_once() {
        assert!(!take_detach(), "nothing asked");
        ask_detach_any();
        assert!(detach_asked());
        ask_detach();
        assert!(take_detach(), "this thread's own request");
        assert!(detach_asked(), "the one for any thread is still there");
        assert!(std::thread::spawn(take_detach).join().unwrap(), "another thread takes it");
        assert!(!detach_asked());
        assert!(!take_detach(), "once");
    }
}
