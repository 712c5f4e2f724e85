//! Windows mode, at a synchronization on a sampled context ([`window`]): a window opens when
//! it is due and closes once it has lasted its length; the gap to the next is set by what
//! the windows cost the application's threads (the budget).
//!
//! A window is a range of one enable by default: the context is enabled once with CUPTI's
//! start/stop control, and each window is `cuptiPCSamplingStart` … `cuptiPCSamplingStop`,
//! then read. Enabling and disabling per window (`GPUPROF_PC_WINDOWS=reenable`, the first
//! design) took 50-140 ms per enable and per disable on the H100 and H200, during which the
//! application stalled: a 20 ms window cost ~150 ms.
// Safety: CUPTI calls on the context current on the synchronizing thread; each is commented.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gpuprof_cupti::Cupti;
use gpuprof_cupti::sys::cupti as sys;

use super::app::{Live, absorb, drain_into, enable};
use super::meter::{EXTRA_NS, MAX_DUTY, MAX_DUTY_MEASURED, WINDOW_OPEN, WINDOWS, charge, pace_slowdown};

/// The longest gap between windows.
const MAX_GAP: Duration = Duration::from_secs(10);

/// Windows mode's settings for a context.
#[derive(Debug, Clone, Copy)]
pub struct WinCfg {
    pub window: Duration,
    /// Cost budget as a fraction of the time (0.005: 0.5 %).
    pub budget: f64,
}

/// Whether windows are ranges of one enable (the default) rather than an enable each
/// (`GPUPROF_PC_WINDOWS=reenable`, kept to measure one against the other).
pub fn ranged() -> bool {
    static RANGED: OnceLock<bool> = OnceLock::new();
    *RANGED.get_or_init(|| std::env::var("GPUPROF_PC_WINDOWS").map(|v| v.trim() != "reenable").unwrap_or(true))
}

/// A context sampled in windows.
pub(super) struct Win {
    cfg: WinCfg,
    /// The window opened then (None: closed).
    opened: Option<Instant>,
    next_open: Instant,
    /// Time the last window's opening took on the application's thread.
    open_cost: Duration,
    /// [`EXTRA_NS`] when the last window closed.
    extra_mark: u64,
    /// Windows closed so far.
    closes: u64,
    /// The slowdown measured inside windows (a moving average; None: not yet).
    slowdown: Option<f64>,
}

impl Win {
    /// The first window, opened by the enable that took `open_cost`.
    pub(super) fn opened(cfg: WinCfg, open_cost: Duration) -> Win {
        WINDOWS.fetch_add(1, Ordering::Relaxed);
        WINDOW_OPEN.store(true, Ordering::Relaxed);
        Win {
            cfg,
            opened: Some(Instant::now()),
            next_open: Instant::now(),
            open_cost,
            extra_mark: EXTRA_NS.load(Ordering::Relaxed),
            closes: 0,
            slowdown: None,
        }
    }
}

/// Windows mode at a synchronization on the context: closes the open window once it has
/// lasted its length (stop and read, or read and disable) and spaces the next so that what
/// opening and closing cost the application's threads stays under the budget (and the duty
/// under [`MAX_DUTY`]); opens the next when it is due.
pub(super) fn window(cupti: &Cupti, device: u32, l: &mut Live, sampled: &mut BTreeMap<u32, Duration>) {
    let Some((w, cfg, wanted)) = &mut l.win else { return };
    let now = Instant::now();
    match w.opened {
        Some(at) if now.duration_since(at) >= w.cfg.window => {
            let t = Instant::now();
            let mut failure = None;
            let before = l.totals.0;
            let mut t_read = Duration::ZERO;
            let mut keep = false;
            if let Some(on) = l.on.as_mut() {
                let c = l.ctx as sys::CUcontext;
                if on.ranged {
                    // Safety: the context is current on this thread, enabled with start/stop
                    // control and in a range.
                    if let Err(e) = unsafe { cupti.pc_stop(c) } {
                        failure = Some((e, false));
                    }
                    on.running = false;
                    let t_stop = t.elapsed();
                    failure = failure.or(drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals));
                    t_read = t.elapsed() - t_stop;
                    keep = true;
                } else {
                    failure = drain_into(cupti, l.ctx, on, &mut l.agg, &mut l.totals);
                    t_read = t.elapsed();
                    // Safety: the context is current on this thread and sampling is enabled on it.
                    let _ = unsafe { cupti.pc_disable(c) };
                    absorb(&on.at_disable, &mut l.agg, &mut l.totals);
                }
            }
            if !keep {
                l.on = None;
            }
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
                    "PC sampling window closed after {:.1} ms: read {:.2} ms, {} {:.2} ms, {} samples{}; \
                     added to synchronizations since the last close {:.2} ms; slowdown inside {}; next in {:.0} ms",
                    open.as_secs_f64() * 1e3,
                    t_read.as_secs_f64() * 1e3,
                    if keep { "stop" } else { "disable" },
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
            let opened = match l.on.as_mut() {
                Some(on) => {
                    // Safety: the context is current on this thread and enabled with
                    // start/stop control (a window kept enabled is ranged), out of a range.
                    let r = unsafe { cupti.pc_start(l.ctx as sys::CUcontext) };
                    on.running = r.is_ok();
                    r
                }
                None => enable(cupti, l.ctx, cfg.clone(), wanted).map(|(on, _, _)| l.on = Some(on)),
            };
            match opened {
                Ok(()) => {
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
