//! Windows mode on one context: a small state machine stepped by the application's own kernel
//! launches and synchronizations ([`window`]), so that a loop that never synchronizes is
//! sampled too.
//!
//! ```text
//!  closed ──(due, and the budget allows)──▶ open ──(lasted its length)──▶ closed
//!    │  enable at a launch's entry or a         disable (reads what CUPTI holds),
//!    │  synchronization                          then cuptiFinalize at that call's exit
//!    ▼                                           (detached until the next window is due)
//! ```
//!
//! When a window opens and what it is charged are [`super::budget`]'s pure rules; the costs go
//! to the process's ledger as they are paid. Between windows CUPTI is finalized (when nothing
//! else of CUPTI is on), so that a launch costs what it did before sampling; the background
//! thread subscribes again and switches the launch callbacks on shortly before the next window
//! is due ([`due_within`]).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpuprof_cupti::pcsampling::PcConfig;
use gpuprof_cupti::{Cupti, LiveContext};

use super::budget::{self, HORIZON, WinCfg};
use super::context::{Live as Sampled, disable_into, enable};
use super::launches::{LAUNCHES, Watch, take_base};
use super::meter::{APP_NS, SETUP_NS, WINDOWS, charge};

/// A context sampled in windows.
type Live = Sampled<(Win, PcConfig, Vec<String>)>;

/// How long a window that the budget does not allow yet waits before asking again.
const RETRY: Duration = Duration::from_secs(1);

thread_local! {
    /// The close of a window that disabled asks for `cuptiFinalize` at the outermost exit of
    /// the same call, on the same thread ([`super::app`] carries it out when nothing else of
    /// CUPTI is on; else at a later call of this thread).
    static DETACH_AT_EXIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks this thread's next outermost API exit for a finalize.
pub(super) fn ask_detach() {
    DETACH_AT_EXIT.with(|d| d.set(true));
}

/// A finalize asked of whichever application thread reaches an API exit first (a windowed
/// context stopped between windows, on gpuprof's thread, while CUPTI was attached for the next
/// window). The subscriber stays until then.
static DETACH_ANY: AtomicBool = AtomicBool::new(false);

/// Asks any application thread's next outermost API exit for a finalize.
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
    own || (DETACH_ANY.load(Ordering::Relaxed) && DETACH_ANY.swap(false, Ordering::SeqCst))
}

/// A window closed with a disable: CUPTI is to be finalized once the background thread took
/// its rows (resolving their lines calls CUPTI).
static FINALIZE_DUE: AtomicBool = AtomicBool::new(false);

pub(super) fn finalize_due() -> bool {
    FINALIZE_DUE.load(Ordering::SeqCst)
}

pub(super) fn take_finalize_due() -> bool {
    FINALIZE_DUE.swap(false, Ordering::SeqCst)
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
/// windows. Once PC sampling has been enabled, CUPTI slows every later kernel launch even after
/// the disable; finalizing removes that, at the price of CUPTI's set-up again at the next enable.
pub fn detach_between() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let off = std::env::var("GPUPROF_PC_DETACH")
            .is_ok_and(|v| ["0", "off", "no", "false"].contains(&v.trim().to_ascii_lowercase().as_str()));
        !off && DETACH_MODE.get() != Some(&crate::config::DetachMode::Off)
    })
}

/// The process's windows, whatever their lease: when the last opened (ms since the ledger's
/// epoch + 1; 0: none yet), and what a window costs (a moving average, ns; 0: not known).
static LAST_OPEN_MS: AtomicU64 = AtomicU64::new(0);
static EXPECTED_NS: AtomicU64 = AtomicU64::new(0);

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Whether a window of the process may open now under `budget`: the pace since the last open
/// is kept and the ledger's horizon has room for it.
pub(super) fn allowed(budget: f64) -> bool {
    let expected = Duration::from_nanos(EXPECTED_NS.load(Ordering::Relaxed));
    let last = LAST_OPEN_MS.load(Ordering::Relaxed);
    if last != 0 && Duration::from_millis(now_ms() - last) < budget::pace(expected, budget) {
        return false;
    }
    budget::may_open(budget::spent(), expected, budget, HORIZON)
}

/// A context sampled in windows.
pub(super) struct Win {
    cfg: WinCfg,
    /// The window opened then (None: closed).
    opened: Option<Instant>,
    /// The next window is due then (closed).
    next_open: Instant,
    /// [`APP_NS`] and [`LAUNCHES`] when the window opened.
    app_mark: u64,
    launch_mark: u64,
    /// The open window's launch times (its first launch, the slowest).
    watch: Option<Watch>,
    /// A launch's mean time before the window opened (None: not timed).
    base: Option<Duration>,
}

impl Win {
    /// A window opened by the enable that just ran.
    pub(super) fn opened(cfg: WinCfg, app_before: u64) -> Win {
        let mut w =
            Win { cfg, opened: None, next_open: Instant::now(), app_mark: 0, launch_mark: 0, watch: None, base: None };
        w.open_now(app_before);
        w
    }

    fn open_now(&mut self, app_before: u64) {
        WINDOWS.fetch_add(1, Ordering::Relaxed);
        LAST_OPEN_MS.store(now_ms(), Ordering::Relaxed);
        self.opened = Some(Instant::now());
        self.app_mark = app_before;
        self.launch_mark = LAUNCHES.load(Ordering::Relaxed);
        self.base = take_base();
        self.watch = Some(Watch::start());
    }

    /// Whether the next window opens within `horizon` (or is due already).
    pub(super) fn due_within(&self, horizon: Duration) -> bool {
        self.opened.is_none() && self.next_open <= Instant::now() + horizon
    }

    /// When the next step is due: the open window's close, or the next open.
    pub(super) fn due(&self) -> Instant {
        match self.opened {
            Some(at) => at + self.cfg.window,
            None => self.next_open,
        }
    }

    pub(super) fn is_open(&self) -> bool {
        self.opened.is_some()
    }
}

/// Sampling on the context ends: its watch of the launches ends.
pub(super) fn end(l: &mut Live) {
    if let Some((w, _, _)) = &mut l.win {
        w.watch = None;
    }
}

/// One step of the context's windows at an application's launch or synchronization on it:
/// closes the open window once it has lasted its length; opens the next when it is due and
/// the budget allows.
pub(super) fn window(
    cupti: &Cupti,
    c: LiveContext<'_>,
    device: u32,
    l: &mut Live,
    sampled: &mut BTreeMap<u32, Duration>,
) {
    let Some((w, cfg, wanted)) = &mut l.win else { return };
    let now = Instant::now();
    // A window's length counts from its first launch's return (which waits for CUPTI).
    let first = w.watch.as_ref().map_or(Duration::ZERO, Watch::first);
    let seen = LAUNCHES.load(Ordering::Relaxed).saturating_sub(w.launch_mark);
    match w.opened {
        Some(at) if budget::closes(now.duration_since(at), w.cfg.window, first, seen) => {
            let open = now.duration_since(at);
            let times = w.watch.take().map(Watch::take).unwrap_or_default();
            let launches = LAUNCHES.load(Ordering::Relaxed).saturating_sub(w.launch_mark);
            let t = Instant::now();
            let before = l.totals.0;
            let mut failure = None;
            let mut at_disable = None;
            if let Some(on) = l.on.take() {
                match disable_into(cupti, c, on, &mut l.agg, &mut l.totals) {
                    Ok(n) => {
                        at_disable = Some(n);
                        if detach_between() {
                            FINALIZE_DUE.store(true, Ordering::SeqCst);
                        }
                    }
                    // CUPTI may still sample the context: no finalize under it.
                    Err(e) => failure = Some((e, false)),
                }
            }
            if let Some(t) = l.on_since.take() {
                *sampled.entry(device).or_default() += t.elapsed();
            }
            let t_close = charge(t);
            // The first launch after the enable waits for CUPTI to start the hardware; the
            // others each paid what being enabled added to them (their mean time against a
            // launch's before the window).
            let (stall, per_launch) = budget::charge(&times, w.base, open);
            budget::spend(stall + per_launch);
            let app_now = APP_NS.load(Ordering::Relaxed);
            let calls = Duration::from_nanos(app_now.saturating_sub(w.app_mark));
            let setup = Duration::from_nanos(SETUP_NS.swap(0, Ordering::Relaxed));
            let cost = calls + stall + per_launch;
            // The window that paid CUPTI's one-time set-up says little of the next ones: the
            // ledger holds what it cost, and the next window's pace waits for one without it.
            let old = EXPECTED_NS.load(Ordering::Relaxed);
            let expected = if setup.is_zero() {
                let e = budget::expect((old != 0).then(|| Duration::from_nanos(old)), cost);
                EXPECTED_NS.store(e.as_nanos().max(1) as u64, Ordering::Relaxed);
                e
            } else {
                Duration::from_nanos(old)
            };
            let gap = budget::pace(expected, w.cfg.budget);
            w.opened = None;
            w.next_open = at + gap;
            if WINDOWS.load(Ordering::Relaxed) < 20 {
                crate::log::log!(
                    Info,
                    "PC sampling window closed after {:.1} ms: disable {:.2} ms, {} samples{}{}; window cost {:.1} ms \
                     (calls {:.1}, first launch {:.1}, {} launches {:.1} us each against {} before{}), {:.0} ms spent \
                     in the last {} s; next in {:.1} s",
                    open.as_secs_f64() * 1e3,
                    t_close.as_secs_f64() * 1e3,
                    l.totals.0 - before,
                    at_disable
                        .map(|(pcs, n)| format!(" ({n} of them in {pcs} PCs at the disable)"))
                        .unwrap_or_default(),
                    failure
                        .as_ref()
                        .map(|f: &(gpuprof_cupti::CuptiError, bool)| format!(", failed: {}", f.0))
                        .unwrap_or_default(),
                    cost.as_secs_f64() * 1e3,
                    calls.as_secs_f64() * 1e3,
                    times.first.as_secs_f64() * 1e3,
                    launches,
                    times.rest_mean.as_secs_f64() * 1e6,
                    w.base.map_or("none timed".to_string(), |b| format!("{:.1} us", b.as_secs_f64() * 1e6)),
                    if setup.is_zero() {
                        String::new()
                    } else {
                        format!(", CUPTI's set-up {:.1} ms", setup.as_secs_f64() * 1e3)
                    },
                    budget::spent().as_secs_f64() * 1e3,
                    HORIZON.as_secs(),
                    w.next_open.saturating_duration_since(Instant::now()).as_secs_f64()
                );
            }
            l.failure = failure;
        }
        None if now >= w.next_open => {
            if !allowed(w.cfg.budget) {
                w.next_open = now + RETRY;
                return;
            }
            let app_before = APP_NS.load(Ordering::Relaxed);
            let t = Instant::now();
            let r = enable(cupti, c, cfg.clone(), wanted);
            charge(t);
            match r {
                Ok((on, _, _)) => {
                    l.on = Some(on);
                    l.on_since = Some(Instant::now());
                    w.open_now(app_before);
                }
                Err(e) => l.failure = Some((e, false)),
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
