//! Leaving CUPTI when a trace stops. Switching the kinds off is not enough: once the RUNTIME
//! kind has been on, CUPTI keeps intercepting the runtime's calls (a late-attached PyTorch
//! loop stays 1.2–1.6× slower). `cuptiFinalize` removes every hook; the next CUPTI call (the
//! next trace start) initialises CUPTI again.
//!
//! What must hold when `cuptiFinalize` runs: no kernel launched while tracing may still be
//! queued (it completes into CUPTI state that finalize frees), and no application thread may be
//! inside CUPTI. On the H100 a PyTorch process stopped while launching kernels crashed: with a
//! corrupted heap after 18 such detaches from the background thread, with a segfault after 3
//! at any API exit, after 12 at any API exit once `stop` waited for the active primary
//! contexts ([`gpuprof_cupti::device::Driver::synchronize_active_primary_contexts`]) before
//! the last flush, and after 4–8 when the kinds were switched off and flushed from the
//! background thread while finalize alone waited for a synchronization's exit. So the whole
//! stop ([`Switches::off_before_finalize`]: kinds and callback ids off, the contexts waited
//! for, the last flush) and the finalize run together where CUPTI documents finalize safe, at
//! the exit of a CUDA API call on an application thread, and only of a call that waited for
//! the GPU ([`hooks::SYNC_CALLS`]: device, context, stream and event synchronization, which PyTorch
//! makes at every `.item()` and `torch.cuda.synchronize()`): nothing of CUPTI changes under
//! the application's launches (50 of 50 busy stops clean). The process's subscriber, taken at
//! the trace's start ([`hooks`]), has the callbacks of those calls on, and the stop arms it
//! with what to switch off. A synchronization is never made inside a stream capture, so a CUDA
//! graph being captured is never disturbed. The background thread waits at most
//! [`CALLBACK_WAIT`] for that (the application's threads never wait); when the application
//! does not synchronize meanwhile, the stop stays armed ([`Detached::Pending`]) and happens at
//! its next synchronization, or is called off by the next trace start ([`Detacher::settle`],
//! which switches the trace off from the background thread) or at exit ([`disarm`]).
//!
//! Not detached: when another CUPTI client (torch.profiler) holds CUPTI, or NVTX was routed
//! through CUPTI (NVTX calls into CUPTI's hooks for the life of the process).
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::hooks::{self, User};
use super::switches::Switches;
use crate::config::DetachMode;
use gpuprof_cupti::ids;
use gpuprof_cupti::{Callback, Cupti, CuptiError};

/// Set when NVTX was routed through CUPTI (`InitializeInjectionNvtx2`).
pub static NVTX_FORWARDED: AtomicBool = AtomicBool::new(false);

/// Longest wait on the background thread for a CUDA API exit to finalize at.
pub const CALLBACK_WAIT: Duration = Duration::from_millis(500);

/// The next API exit callback should finalize (whoever clears it first owns the outcome).
static ARMED: AtomicBool = AtomicBool::new(false);
/// The callback's `cuptiFinalize` result, or [`PENDING`].
static RESULT: AtomicU32 = AtomicU32::new(PENDING);
const PENDING: u32 = u32::MAX;

/// How a stop left CUPTI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detached {
    /// `cuptiFinalize` succeeded at a CUDA API exit.
    Finalized,
    /// Armed: CUPTI is finalized at the exit of the application's next CUDA synchronization.
    Pending,
    /// CUPTI stays attached; why.
    Kept(String),
}

impl Detached {
    /// The detail reported with the idle trace state.
    pub fn detail(&self) -> String {
        match self {
            Detached::Finalized => "detached: finalized".into(),
            Detached::Pending => "detached: finalize pending (at the next CUDA synchronization)".into(),
            Detached::Kept(why) => format!("detached: not finalized ({why})"),
        }
    }
}

/// The detach of the last trace, while it may still be pending.
#[derive(Debug, Default)]
pub struct Detacher {
    /// A detach is armed and has not been seen done.
    pending: bool,
    /// Why the subscriber could not be had at the trace's start.
    unavailable: Option<String>,
    /// The outcome of the last stop, for [`Detacher::detach`].
    staged: Option<Detached>,
}

impl Detacher {
    /// At a trace's start: takes the process's subscriber ([`hooks`]) with the synchronization
    /// callbacks on, so that the stop only has to arm it.
    pub fn prepare(&mut self, cupti: &Cupti, mode: DetachMode) {
        self.unavailable = None;
        if mode == DetachMode::Off || NVTX_FORWARDED.load(Ordering::SeqCst) {
            return;
        }
        if let Err(e) = hooks::acquire(cupti, User::Detach) {
            crate::log::log!(Info, "no CUPTI subscriber for the trace: {e}");
            self.unavailable = Some(if e.is_other_subscriber() {
                format!("another CUPTI client is subscribed: {e}")
            } else {
                format!("cuptiSubscribe: {e}")
            });
        }
    }

    /// Whether a stop can end in `cuptiFinalize`: asked for, NVTX not routed through CUPTI, and
    /// the process's subscriber held since the trace's start.
    pub fn can_finalize(&self, mode: DetachMode) -> bool {
        mode == DetachMode::Finalize && !NVTX_FORWARDED.load(Ordering::SeqCst) && hooks::held_by(User::Detach)
    }

    /// The whole stop at the exit of the application's next CUDA synchronization, on its
    /// thread: `switches` off, the trace's work waited for, the last flush, `cuptiFinalize`.
    /// Waits at most [`CALLBACK_WAIT`]; after that the stop stays armed ([`Detached::Pending`])
    /// and the records CUPTI holds so far are flushed from here (later ones belong to no
    /// session). [`Detacher::detach`] reports the outcome.
    pub(super) fn stop_and_finalize(&mut self, cupti: &Cupti, switches: Switches) {
        *plan() = Some(switches);
        RESULT.store(PENDING, Ordering::SeqCst);
        ARMED.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + CALLBACK_WAIT;
        let d = loop {
            if let Some(d) = outcome() {
                break self.done(cupti, d);
            }
            if Instant::now() >= deadline {
                self.pending = true;
                let _ = cupti.flush_all(false);
                let _ = cupti.flush_all(true);
                break Detached::Pending;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        self.staged = Some(d);
    }

    /// After a trace's stop and its last records were sent: how the trace left CUPTI (see the
    /// module doc). `displaced`: another CUPTI client took over during the trace.
    pub fn detach(&mut self, cupti: &Cupti, mode: DetachMode, displaced: bool) -> Detached {
        if let Some(d) = self.staged.take() {
            return d;
        }
        hooks::release(cupti, User::Detach);
        Detached::Kept(if mode == DetachMode::Off {
            "GPUPROF_DETACH=off".into()
        } else if displaced {
            "another CUPTI client holds CUPTI".into()
        } else if NVTX_FORWARDED.load(Ordering::SeqCst) {
            "NVTX is routed through CUPTI".into()
        } else {
            self.unavailable.clone().unwrap_or_else(|| "no CUPTI subscriber".into())
        })
    }

    /// A finalize that failed leaves the subscriber to be let go here.
    fn done(&mut self, cupti: &Cupti, d: Detached) -> Detached {
        self.pending = false;
        if d != Detached::Finalized {
            hooks::release(cupti, User::Detach);
        }
        d
    }

    /// Whether a detach waits for the application's next synchronization.
    pub fn is_pending(&self) -> bool {
        self.pending
    }

    /// A pending detach that an application thread has carried out since: what became of it
    /// (reported once). `None` while none is pending or it is still armed.
    pub fn poll(&mut self, cupti: &Cupti) -> Option<Detached> {
        if !self.pending || ARMED.load(Ordering::SeqCst) {
            return None;
        }
        let d = outcome()?;
        Some(self.done(cupti, d))
    }

    /// Before CUPTI is used again (a trace start): calls a pending detach off (the subscriber
    /// stays for the new trace), or waits for the one under way on an application thread.
    /// Returns what became of it, if one was pending.
    pub fn settle(&mut self, cupti: &Cupti) -> Option<Detached> {
        if !self.pending {
            return None;
        }
        if ARMED.swap(false, Ordering::SeqCst) {
            // No CUDA synchronization came since the stop: the trace is switched off here and
            // CUPTI stays attached.
            self.pending = false;
            if let Some(switches) = plan().take() {
                switches.off_here(cupti);
            }
            return Some(Detached::Kept("called off by the next trace".into()));
        }
        // An application thread took it: wait for its result.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Some(d) = outcome() {
                return Some(self.done(cupti, d));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.pending = false;
        Some(Detached::Kept("cuptiFinalize at an API exit did not return within 2 s".into()))
    }
}

/// What the armed stop switches off before it finalizes.
static PLAN: Mutex<Option<Switches>> = Mutex::new(None);

fn plan() -> MutexGuard<'static, Option<Switches>> {
    PLAN.lock().unwrap_or_else(|p| p.into_inner())
}

/// The callback's result, once it has finalized.
fn outcome() -> Option<Detached> {
    match RESULT.load(Ordering::SeqCst) {
        PENDING => None,
        ids::CUPTI_SUCCESS => Some(Detached::Finalized),
        r => Some(Detached::Kept(format!("cuptiFinalize at an API exit: {}", CuptiError::new(r)))),
    }
}

/// Whether a trace's detach waits for a synchronization's exit (PC sampling must not finalize
/// before it).
pub fn armed() -> bool {
    ARMED.load(Ordering::SeqCst)
}

/// Calls off a pending detach for good (process exit, fork child): a CUDA call made while the
/// process tears down must not finalize CUPTI. Async-signal-safe.
pub fn disarm() {
    ARMED.store(false, Ordering::SeqCst);
}

/// Registers [`on_api`] with the process's subscriber ([`hooks`]).
pub(super) fn register_hooks() {
    hooks::register(User::Detach, on_api, None);
}

/// The subscriber's callback ([`hooks`]) at the entry and exit of runtime and driver API calls
/// (the [`hooks::SYNC_CALLS`]).
fn on_api(cb: &Callback<'_>) {
    let _ = catch_unwind(|| {
        if !cb.is_api_exit() || !ARMED.swap(false, Ordering::SeqCst) {
            return;
        }
        let code = match gpuprof_cupti::loader::shared() {
            Ok(c) => {
                // The stop itself, here where no CUDA call of this thread is under way; then
                // every buffer back before CUPTI is torn down.
                if let Some(switches) = plan().take() {
                    switches.off_before_finalize(c);
                }
                let _ = c.flush_all(true);
                let r = c.finalize();
                if r.is_ok() {
                    hooks::ended_by_finalize();
                }
                r.map_or_else(|e| e.code, |()| ids::CUPTI_SUCCESS)
            }
            Err(_) => ids::CUPTI_ERROR_NOT_INITIALIZED,
        };
        RESULT.store(code, Ordering::SeqCst);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_say_whether_cupti_was_finalized() {
        assert_eq!(Detached::Finalized.detail(), "detached: finalized");
        assert_eq!(Detached::Pending.detail(), "detached: finalize pending (at the next CUDA synchronization)");
        assert_eq!(
            Detached::Kept("GPUPROF_DETACH=off".into()).detail(),
            "detached: not finalized (GPUPROF_DETACH=off)"
        );
    }
}
