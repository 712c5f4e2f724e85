//! What PC sampling may cost a process: a ledger of what it cost, by second, over a sliding
//! horizon ([`HORIZON`]), and the pure rules of the windows: when one opens ([`may_open`],
//! [`pace`]), when it closes ([`closes`]) and what it is charged ([`charge`]). Every cost lands in the ledger when it is paid (the calls on the application's
//! threads, the first launch's wait after an enable, CUPTI's per-launch cost while enabled);
//! CUPTI's one-time set-up at a process's first enable counts like any other cost.
//!
//! The ledger is the process's, not a lease's: a turn given back and granted again (the
//! daemon's rotation among processes sharing a GPU) finds what the last turn spent.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::launches::{LaunchTimes, SLOW_LAUNCH};

/// The stretch over which a process's PC-sampling cost stays within its budget. At the default
/// 0.5 % that allows 150 ms in any 30 s: one window with its enable, first-launch wait, disable
/// and finalize (~100-150 ms), so windows come every ~30 s through a job's life; and a run of
/// 8 s pays at most one horizon's allowance (~1.9 % of it), within a point of CUPTI's own
/// continuous sampler. A window that alone costs more than the allowance (the first one, with
/// CUPTI's set-up) opens only once nothing was spent for a whole horizon.
pub const HORIZON: Duration = Duration::from_secs(30);

/// Windows mode's settings for a context.
#[derive(Debug, Clone, Copy)]
pub struct WinCfg {
    pub window: Duration,
    /// Cost budget as a fraction of the time (0.005: 0.5 %).
    pub budget: f64,
}

/// Seconds kept (at least the horizon's, plus the one under way).
const SLOTS: usize = 64;

/// Costs by second: slot `s % SLOTS` holds second `s`'s nanoseconds.
pub(super) struct Ledger {
    second: [AtomicU64; SLOTS],
    ns: [AtomicU64; SLOTS],
}

impl Ledger {
    pub(super) const fn new() -> Ledger {
        Ledger { second: [const { AtomicU64::new(u64::MAX) }; SLOTS], ns: [const { AtomicU64::new(0) }; SLOTS] }
    }

    /// Adds `cost` at second `at`. Lock-free (it runs on the application's threads); two threads
    /// starting the same new second at once may lose one of their costs' nanoseconds.
    pub(super) fn spend_at(&self, at: u64, cost: Duration) {
        let i = (at % SLOTS as u64) as usize;
        let was = self.second[i].load(Ordering::Acquire);
        if was != at && self.second[i].compare_exchange(was, at, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.ns[i].store(0, Ordering::Release);
        }
        self.ns[i].fetch_add(cost.as_nanos() as u64, Ordering::AcqRel);
    }

    /// What was spent in the `horizon` up to second `at` (its whole seconds, `at` included).
    pub(super) fn spent_at(&self, at: u64, horizon: Duration) -> Duration {
        let secs = horizon.as_secs().clamp(1, SLOTS as u64 - 1);
        let from = at.saturating_sub(secs - 1);
        let ns: u64 = (0..SLOTS)
            .filter(|&i| {
                let s = self.second[i].load(Ordering::Acquire);
                s != u64::MAX && s >= from && s <= at
            })
            .map(|i| self.ns[i].load(Ordering::Acquire))
            .sum();
        Duration::from_nanos(ns)
    }
}

/// The process's ledger.
pub(super) static LEDGER: Ledger = Ledger::new();

/// Seconds since the ledger's epoch (its first use).
pub(super) fn now_s() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_secs()
}

/// Spends `cost` now.
pub(super) fn spend(cost: Duration) {
    if !cost.is_zero() {
        LEDGER.spend_at(now_s(), cost);
    }
}

/// What was spent in the last [`HORIZON`].
pub(super) fn spent() -> Duration {
    LEDGER.spent_at(now_s(), HORIZON)
}

/// Whether a window expected to cost `expected` may open, with `spent` spent in the last
/// `horizon`: when it fits what the budget (`budget`, a fraction) allows in a horizon, or,
/// when it alone is more, once nothing was spent for a whole horizon.
pub(super) fn may_open(spent: Duration, expected: Duration, budget: f64, horizon: Duration) -> bool {
    spent.is_zero() || spent + expected <= horizon.mul_f64(budget)
}

/// The least time from one window's open to the next's, for windows costing `cost` each: the
/// budget's pace (at most a horizon: the ledger holds back a costlier window), so that windows
/// spread evenly through a job's life instead of spending a horizon's allowance at its start.
pub(super) fn pace(cost: Duration, budget: f64) -> Duration {
    if budget <= 0.0 { HORIZON } else { cost.div_f64(budget).min(HORIZON) }
}

/// What CUPTI adds to a kernel launch while PC sampling is enabled at least (1.5 µs measured on
/// the H100's small-kernel loop; rounded up): charged per launch inside a window when the
/// launches outside it were not timed, or took as long.
const ENABLED_COST_PER_LAUNCH: Duration = Duration::from_micros(2);
/// A window stays open past its length until it has seen this many launches (a process in
/// its start-up launches little), for at most [`MAX_OPEN`].
const MIN_LAUNCHES: u64 = 32;
const MAX_OPEN: Duration = Duration::from_secs(2);
/// What being enabled costs the GPU's own work, as a fraction of the window's time (CUPTI's
/// continuous sampler cost a bf16 matmul loop 0.3-0.9 % on the H200): charged per window.
const ENABLED_GPU_SHARE: f64 = 0.01;

/// Whether a window open for `open` closes now: it has lasted its `len` from its first launch's
/// return (`first`, which waits for CUPTI) and seen [`MIN_LAUNCHES`] launches (`seen`), or has
/// been open [`MAX_OPEN`] (or its length, if longer).
pub(super) fn closes(open: Duration, len: Duration, first: Duration, seen: u64) -> bool {
    open >= len + first && (seen >= MIN_LAUNCHES || open >= MAX_OPEN.max(len))
}

/// What a window open for `open` is charged beyond its calls: the first launch's wait past a
/// plain launch's ([`SLOW_LAUNCH`]), and what its other launches took beyond a launch before it
/// (`base`; at least [`ENABLED_COST_PER_LAUNCH`] each) plus the GPU's share while enabled.
pub(super) fn charge(times: &LaunchTimes, base: Option<Duration>, open: Duration) -> (Duration, Duration) {
    let stall = times.first.saturating_sub(SLOW_LAUNCH);
    let added = base.map_or(ENABLED_COST_PER_LAUNCH, |b| times.rest_mean.saturating_sub(b));
    let per_launch = added.max(ENABLED_COST_PER_LAUNCH) * times.rest.min(u64::from(u32::MAX)) as u32
        + open.mul_f64(ENABLED_GPU_SHARE);
    (stall, per_launch)
}

/// A new window's expected cost after one that cost `last`: a moving average of the windows'
/// costs (`avg`, None before the first).
pub(super) fn expect(avg: Option<Duration>, last: Duration) -> Duration {
    match avg {
        None => last,
        Some(a) => a.mul_f64(0.5) + last.mul_f64(0.5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_ledger_sums_the_horizons_seconds_only() {
        let l = Ledger::new();
        l.spend_at(0, 100 * MS);
        l.spend_at(10, 20 * MS);
        l.spend_at(10, 5 * MS);
        assert_eq!(l.spent_at(10, HORIZON), 125 * MS);
        assert_eq!(l.spent_at(29, HORIZON), 125 * MS, "second 0 is still inside 0..=29");
        assert_eq!(l.spent_at(30, HORIZON), 25 * MS, "second 0 left the horizon");
        assert_eq!(l.spent_at(40, HORIZON), Duration::ZERO);
        // A second that comes back to a slot forgets what the slot held.
        l.spend_at(SLOTS as u64, 7 * MS);
        assert_eq!(l.spent_at(SLOTS as u64, HORIZON), 7 * MS);
    }

    #[test]
    fn a_window_closes_after_its_length_from_its_first_launch_once_it_saw_32_launches_or_2_s() {
        let (len, first) = (200 * MS, 70 * MS);
        assert!(!closes(200 * MS, len, first, 500), "the first launch's wait does not count");
        assert!(closes(270 * MS, len, first, 500));
        assert!(!closes(900 * MS, len, first, 31), "a process in its start-up launches little");
        assert!(closes(900 * MS, len, first, 32));
        assert!(closes(2000 * MS, len, first, 0), "2 s at most");
        assert!(!closes(2500 * MS, 3000 * MS, Duration::ZERO, 0), "a longer window lasts its length");
    }

    #[test]
    fn a_window_is_charged_its_first_launch_wait_and_what_its_launches_took_beyond_the_base() {
        let times = LaunchTimes {
            first: 75 * MS,
            rest_mean: Duration::from_micros(14),
            rest: 10_000,
            ..LaunchTimes::default()
        };
        let open = 300 * MS;
        let gpu = open.mul_f64(ENABLED_GPU_SHARE);
        let (stall, launches) = charge(&times, Some(Duration::from_micros(4)), open);
        assert_eq!(stall, 74 * MS, "past a plain launch's 1 ms");
        assert_eq!(launches, 100 * MS + gpu, "10 us beyond the base, 10k times");
        let (_, unknown) = charge(&times, None, open);
        assert_eq!(unknown, 20 * MS + gpu, "no base: the least per-launch cost");
        let queue_bound = LaunchTimes { rest_mean: 1600 * Duration::from_micros(1), rest: 100, ..times };
        let (_, blocked) = charge(&queue_bound, Some(1590 * Duration::from_micros(1)), open);
        assert_eq!(blocked, Duration::from_micros(1000) + gpu, "launches that wait for the queue anyway cost little");
    }

    #[test]
    fn a_window_opens_when_it_fits_the_allowance_or_nothing_was_spent() {
        let (budget, h) = (0.005, HORIZON);
        // 0.5 % of 30 s: 150 ms.
        assert!(may_open(Duration::ZERO, 400 * MS, budget, h), "nothing spent: even a costly window opens");
        assert!(may_open(50 * MS, 100 * MS, budget, h));
        assert!(!may_open(51 * MS, 100 * MS, budget, h));
        assert_eq!(pace(100 * MS, budget), Duration::from_secs(20));
        assert_eq!(pace(10 * MS, 0.0), HORIZON, "no budget: at most one per horizon");
    }

    /// A run simulated second by second: a window of `cost` (the first also `setup`) opens
    /// whenever the rules allow; how many windows it had.
    fn simulate(secs: u64, setup: Duration, cost: Duration, budget: f64) -> usize {
        let l = Ledger::new();
        let (mut last_open, mut n, mut avg) = (None::<u64>, 0, None);
        for t in 0..secs {
            let expected = avg.unwrap_or(cost);
            let paced = last_open.is_none_or(|o| Duration::from_secs(t - o) >= pace(expected, budget));
            if paced
                && may_open(
                    l.spent_at(t, HORIZON),
                    expected + if n == 0 { setup } else { Duration::ZERO },
                    budget,
                    HORIZON,
                )
            {
                l.spend_at(t, cost + if n == 0 { setup } else { Duration::ZERO });
                last_open = Some(t);
                avg = Some(expect(avg, cost));
                n += 1;
            }
        }
        n
    }

    #[test]
    fn windows_spread_over_the_run_and_no_horizon_after_the_first_spends_more_than_the_budget() {
        let (setup, cost, budget) = (120 * MS, 100 * MS, 0.005);
        let n30 = simulate(30, setup, cost, budget);
        let n60 = simulate(60, setup, cost, budget);
        let n600 = simulate(600, setup, cost, budget);
        assert!(n30 >= 1, "a 30 s run is sampled");
        let ratio = n60 as f64 / n30 as f64;
        assert!((1.0..=3.0).contains(&ratio), "a 60 s run has about twice the windows of a 30 s one: {n60} vs {n30}");
        assert!(n600 >= 18, "a 10-minute run keeps getting windows: {n600}");
        // Once the first (set-up) window left the horizon, no horizon spends more than allowed.
        let l = Ledger::new();
        let (mut last_open, mut n) = (None::<u64>, 0);
        for t in 0..600u64 {
            let paced = last_open.is_none_or(|o| Duration::from_secs(t - o) >= pace(cost, budget));
            let extra = if n == 0 { setup } else { Duration::ZERO };
            if paced && may_open(l.spent_at(t, HORIZON), cost + extra, budget, HORIZON) {
                l.spend_at(t, cost + extra);
                last_open = Some(t);
                n += 1;
            }
            if t >= HORIZON.as_secs() {
                assert!(l.spent_at(t, HORIZON) <= HORIZON.mul_f64(budget), "second {t}: over the budget");
            }
        }
    }
}
