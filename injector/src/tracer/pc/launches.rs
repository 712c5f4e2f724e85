//! Kernel launches counted and timed while the launch callbacks are on: how many the process
//! made, how long a launch took outside windows ([`take_base`]), and, per open window, its
//! first launch (which waits for CUPTI to start the hardware), its slowest, and the time of the
//! others: what being enabled cost the window's launches.
//!
//! Each open window watches the launches from its own open ([`Watch`]), so that windows of
//! two devices of one process open at once keep their own first launch: neither's open or
//! close takes the other's. A launch counts in every window open while it runs: CUPTI's
//! callbacks say nothing cheap of the device, and a stall after an enable holds the process's
//! launches to any device.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Launches counted at their entries while launch callbacks are on.
pub(super) static LAUNCHES: AtomicU64 = AtomicU64::new(0);

/// A launch that takes longer waited for something (a launch is microseconds).
pub(super) const SLOW_LAUNCH: Duration = Duration::from_millis(1);

/// Windows watched at once (one per sampled device of the process; a window past them keeps
/// no launch times).
const SLOTS: usize = 16;
/// A slot no window holds.
const FREE: u64 = u64::MAX;
/// A slot being set up by the window taking it.
const CLAIMED: u64 = u64::MAX - 1;

/// One open window's launch times.
struct Slot {
    /// [`LAUNCHES`] at the window's open (or [`FREE`], [`CLAIMED`]).
    mark: AtomicU64,
    first_ns: AtomicU64,
    slowest_ns: AtomicU64,
    slowest_at: AtomicU64,
    slow_ns: AtomicU64,
    /// The launches after the first: their time and number.
    rest_ns: AtomicU64,
    rest_n: AtomicU64,
}

static WATCHED: [Slot; SLOTS] = [const {
    Slot {
        mark: AtomicU64::new(FREE),
        first_ns: AtomicU64::new(0),
        slowest_ns: AtomicU64::new(0),
        slowest_at: AtomicU64::new(0),
        slow_ns: AtomicU64::new(0),
        rest_ns: AtomicU64::new(0),
        rest_n: AtomicU64::new(0),
    }
}; SLOTS];

/// Launches no window watched: their time and number since the last [`take_base`].
static BASE_NS: AtomicU64 = AtomicU64::new(0);
static BASE_N: AtomicU64 = AtomicU64::new(0);

/// The mean time of a launch no window watched since the last call (None: fewer than 16).
pub(super) fn take_base() -> Option<Duration> {
    let (ns, n) = (BASE_NS.swap(0, Ordering::Relaxed), BASE_N.swap(0, Ordering::Relaxed));
    (n >= 16).then(|| Duration::from_nanos(ns / n))
}

thread_local! {
    /// When this thread's launch under way entered (launch callbacks on), and its number.
    static LAUNCH_ENTRY: std::cell::Cell<Option<(Instant, u64)>> = const { std::cell::Cell::new(None) };
}

/// The launch callback (entry and exit of each kernel launch while callbacks are on).
pub fn on_launch(cb: &gpuprof_cupti::Callback<'_>) {
    if cb.is_api_entry() {
        let n = LAUNCHES.fetch_add(1, Ordering::Relaxed) + 1;
        LAUNCH_ENTRY.with(|e| e.set(Some((Instant::now(), n))));
    } else if let Some((t, n)) = LAUNCH_ENTRY.with(|e| e.take()) {
        launch_took(t.elapsed(), n);
    }
}

/// Launch number `n` (of [`LAUNCHES`]) took `d`: it counts in each window watching since
/// before it.
fn launch_took(d: Duration, n: u64) {
    let ns = d.as_nanos() as u64;
    let mut watched = false;
    for s in &WATCHED {
        let mark = s.mark.load(Ordering::Acquire);
        if mark >= CLAIMED || n <= mark {
            continue;
        }
        watched = true;
        let at = n - mark;
        if at == 1 {
            s.first_ns.store(ns, Ordering::Relaxed);
        } else {
            s.rest_ns.fetch_add(ns, Ordering::Relaxed);
            s.rest_n.fetch_add(1, Ordering::Relaxed);
        }
        if s.slowest_ns.fetch_max(ns, Ordering::Relaxed) < ns {
            s.slowest_at.store(at, Ordering::Relaxed);
        }
        if d > SLOW_LAUNCH {
            s.slow_ns.fetch_add(ns, Ordering::Relaxed);
        }
    }
    if !watched {
        BASE_NS.fetch_add(ns, Ordering::Relaxed);
        BASE_N.fetch_add(1, Ordering::Relaxed);
    }
}

/// A window's launch times ([`Watch::take`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct LaunchTimes {
    pub slowest: Duration,
    /// The slowest launch's place among the window's launches (1: the first).
    pub slowest_at: u64,
    /// The time of the launches that took over [`SLOW_LAUNCH`].
    pub slow: Duration,
    /// The first launch of the window: its time beyond [`SLOW_LAUNCH`] is what the enable left
    /// for the first launch to do.
    pub first: Duration,
    /// The mean time of the window's other launches, and their number.
    pub rest_mean: Duration,
    pub rest: u64,
}

/// An open window's watch of the launches since its open; dropping it lets its slot go.
#[derive(Debug)]
pub(super) struct Watch(Option<usize>);

impl Watch {
    /// Watches the launches from now (no slot free: it keeps nothing).
    pub(super) fn start() -> Watch {
        for (i, s) in WATCHED.iter().enumerate() {
            if s.mark.compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                for v in [&s.first_ns, &s.slowest_ns, &s.slowest_at, &s.slow_ns, &s.rest_ns, &s.rest_n] {
                    v.store(0, Ordering::Relaxed);
                }
                s.mark.store(LAUNCHES.load(Ordering::Relaxed), Ordering::Release);
                return Watch(Some(i));
            }
        }
        Watch(None)
    }

    /// The launch times since [`Watch::start`]; the watch ends.
    pub(super) fn take(self) -> LaunchTimes {
        let Some(i) = self.0 else { return LaunchTimes::default() };
        let s = &WATCHED[i];
        let rest = s.rest_n.load(Ordering::Relaxed);
        LaunchTimes {
            slowest: Duration::from_nanos(s.slowest_ns.load(Ordering::Relaxed)),
            slowest_at: s.slowest_at.load(Ordering::Relaxed),
            slow: Duration::from_nanos(s.slow_ns.load(Ordering::Relaxed)),
            first: Duration::from_nanos(s.first_ns.load(Ordering::Relaxed)),
            rest_mean: Duration::from_nanos(s.rest_ns.load(Ordering::Relaxed).checked_div(rest).unwrap_or(0)),
            rest,
        }
    }

    /// The window's first launch's time so far (zero until it returned).
    pub(super) fn first(&self) -> Duration {
        self.0.map_or(Duration::ZERO, |i| Duration::from_nanos(WATCHED[i].first_ns.load(Ordering::Relaxed)))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(i) = self.0.take() {
            WATCHED[i].mark.store(FREE, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The slots and the launch count are the process's: one test at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Launches as the callbacks report them: numbered at entry, timed at exit.
    fn launch(d: Duration) {
        let n = LAUNCHES.fetch_add(1, Ordering::Relaxed) + 1;
        launch_took(d, n);
    }

    #[test]
    fn each_open_window_keeps_its_own_first_launch_slowest_and_slow_time() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let a = Watch::start();
        launch(Duration::from_micros(5));
        launch(Duration::from_millis(40));
        // A second device's window opens while the first is open: neither takes the other's.
        let b = Watch::start();
        launch(Duration::from_millis(2));
        launch(Duration::from_micros(900));
        let want_b = LaunchTimes {
            slowest: Duration::from_millis(2),
            slowest_at: 1,
            slow: Duration::from_millis(2),
            first: Duration::from_millis(2),
            rest_mean: Duration::from_micros(900),
            rest: 1,
        };
        assert_eq!(b.take(), want_b);
        launch(Duration::from_millis(3));
        let want_a = LaunchTimes {
            slowest: Duration::from_millis(40),
            slowest_at: 2,
            slow: Duration::from_millis(45),
            first: Duration::from_micros(5),
            rest_mean: Duration::from_micros(11_475),
            rest: 4,
        };
        assert_eq!(a.take(), want_a, "b's open and close left a's times alone");
        // A launch under way at the open (numbered before it) is not the window's first.
        let n = LAUNCHES.fetch_add(1, Ordering::Relaxed) + 1;
        let c = Watch::start();
        launch_took(Duration::from_millis(70), n);
        launch(Duration::from_micros(7));
        let got = c.take();
        assert_eq!((got.first, got.slowest), (Duration::from_micros(7), Duration::from_micros(7)));
    }

    #[test]
    fn launches_no_window_watches_make_the_base_once_there_are_16() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let _ = take_base();
        for _ in 0..15 {
            launch(Duration::from_micros(4));
        }
        assert_eq!(take_base(), None, "15 are too few");
        for i in 0..16 {
            launch(Duration::from_micros(if i % 2 == 0 { 3 } else { 5 }));
        }
        let w = Watch::start();
        launch(Duration::from_millis(9));
        assert_eq!(take_base(), Some(Duration::from_micros(4)), "a watched launch is not in the base");
        drop(w);
    }

    #[test]
    fn windows_past_the_slots_keep_nothing_and_a_closed_window_frees_its_slot() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let held: Vec<Watch> = (0..SLOTS).map(|_| Watch::start()).collect();
        assert!(held.iter().all(|w| w.0.is_some()), "no other watch is open");
        let past = Watch::start();
        launch(Duration::from_millis(5));
        assert_eq!(past.take(), LaunchTimes::default(), "no slot: nothing kept");
        drop(held);
        let again = Watch::start();
        launch(Duration::from_millis(5));
        assert_eq!(again.take().first, Duration::from_millis(5), "a slot is free again");
    }
}
