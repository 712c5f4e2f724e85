//! Leaving CUPTI when a trace stops. Switching the kinds off is not enough: once the RUNTIME
//! kind has been on, CUPTI keeps intercepting the runtime's calls (a late-attached PyTorch
//! loop stays 1.2–1.6× slower). `cuptiFinalize` removes every hook; the next CUPTI call (the
//! next trace start) initialises CUPTI again.
//!
//! CUPTI documents two safe points: the exit of a CUDA API call (from a subscriber's callback),
//! or any thread once the buffers are flushed and nothing else calls CUPTI. The background
//! thread is the one CUPTI caller of this library and flushes before detaching, so it
//! finalizes itself by default ([`DetachMode::Finalize`]); [`DetachMode::Callback`] does it at
//! the next API exit on an application thread instead, waiting at most [`CALLBACK_WAIT`] on the
//! background thread (never on the application's). Not finalized: when another CUPTI client
//! (torch.profiler) holds CUPTI, or NVTX was routed through CUPTI (its hooks point into it).
// Safety: the API callback receives CUPTI's `cbdata` pointer; its one use is commented.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::panic::catch_unwind;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::config::DetachMode;
use gpuprof_cupti::sys::cupti as sys;
use gpuprof_cupti::{Cupti, CuptiError};

/// Set when NVTX was routed through CUPTI (`InitializeInjectionNvtx2`): NVTX then calls into
/// CUPTI's hooks for the life of the process, and CUPTI is never finalized.
pub static NVTX_FORWARDED: AtomicBool = AtomicBool::new(false);

/// Longest wait for a CUDA API exit in [`DetachMode::Callback`] before finalizing from the
/// background thread.
pub const CALLBACK_WAIT: Duration = Duration::from_millis(500);

/// The next API exit callback should finalize (whoever clears it first finalizes).
static ARMED: AtomicBool = AtomicBool::new(false);
/// The callback's `cuptiFinalize` result, or [`PENDING`].
static RESULT: AtomicU32 = AtomicU32::new(PENDING);
const PENDING: u32 = u32::MAX;

/// How a stop left CUPTI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detached {
    /// `cuptiFinalize` succeeded; where it ran.
    Finalized(&'static str),
    /// CUPTI stays attached; why.
    Kept(String),
}

impl Detached {
    /// The detail reported with the idle trace state: `detached: finalized` or why not.
    pub fn detail(&self) -> String {
        match self {
            Detached::Finalized(_) => "detached: finalized".into(),
            Detached::Kept(why) => format!("detached: not finalized ({why})"),
        }
    }
}

/// Detaches from CUPTI after a trace's last flush (see the module doc). `displaced`: another
/// CUPTI client took over during the trace.
pub fn detach(cupti: &Cupti, mode: DetachMode, displaced: bool) -> Detached {
    if mode == DetachMode::Off {
        return Detached::Kept("GPUPROF_DETACH=off".into());
    }
    if displaced {
        return Detached::Kept("another CUPTI client holds CUPTI".into());
    }
    if NVTX_FORWARDED.load(Ordering::SeqCst) {
        return Detached::Kept("NVTX is routed through CUPTI".into());
    }
    if let Err(e) = cupti.probe_subscriber()
        && e.is_other_subscriber()
    {
        return Detached::Kept(format!("another CUPTI client is subscribed: {e}"));
    }
    if mode == DetachMode::Callback {
        match at_api_exit(cupti) {
            Ok(Some(d)) => return d,
            Ok(None) => {}
            Err(e) => return Detached::Kept(format!("at an API exit: {e}")),
        }
    }
    match cupti.finalize() {
        Ok(()) => Detached::Finalized(if mode == DetachMode::Callback {
            "background thread (no CUDA call came)"
        } else {
            "background thread"
        }),
        Err(e) => Detached::Kept(format!("cuptiFinalize: {e}")),
    }
}

/// Arms [`on_api`] and waits for it. `Ok(None)`: no API exit came within [`CALLBACK_WAIT`] and
/// the callback was disarmed (the caller finalizes).
fn at_api_exit(cupti: &Cupti) -> Result<Option<Detached>, CuptiError> {
    let sub = cupti.subscribe(Some(on_api))?;
    RESULT.store(PENDING, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    let on = [sys::CUPTI_CB_DOMAIN_RUNTIME_API, sys::CUPTI_CB_DOMAIN_DRIVER_API]
        .into_iter()
        .map(|d| cupti.enable_domain(&sub, d, true))
        .collect::<Result<Vec<()>, _>>();
    if let Err(e) = on
        && ARMED.swap(false, Ordering::SeqCst)
    {
        let _ = cupti.unsubscribe(sub);
        return Err(e);
    }
    let deadline = Instant::now() + CALLBACK_WAIT;
    loop {
        let r = RESULT.load(Ordering::SeqCst);
        if r != PENDING {
            // The callback finalized CUPTI, which ended the subscriber too: `sub` goes out of
            // scope without an unsubscribe.
            return Ok(Some(if r == sys::CUPTI_SUCCESS {
                Detached::Finalized("CUDA API exit")
            } else {
                Detached::Kept(format!("cuptiFinalize at an API exit: {}", CuptiError::new(r)))
            }));
        }
        if Instant::now() >= deadline && ARMED.swap(false, Ordering::SeqCst) {
            let _ = cupti.unsubscribe(sub);
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// CUPTI calls this at the entry and exit of every runtime and driver API call while armed.
extern "C" fn on_api(_userdata: *mut c_void, _domain: sys::CUpti_CallbackDomain, _cbid: u32, cbdata: *const c_void) {
    let _ = catch_unwind(|| {
        // Safety: this subscriber switches on the RUNTIME and DRIVER API domains only, whose
        // `cbdata` is a `CUpti_CallbackData`.
        if !unsafe { gpuprof_cupti::activity::is_api_exit(cbdata) } || !ARMED.swap(false, Ordering::SeqCst) {
            return;
        }
        let code = match gpuprof_cupti::loader::shared() {
            Ok(c) => c.finalize().map_or_else(|e| e.code, |()| sys::CUPTI_SUCCESS),
            Err(_) => sys::CUPTI_ERROR_NOT_INITIALIZED,
        };
        RESULT.store(code, Ordering::SeqCst);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_say_whether_cupti_was_finalized() {
        assert_eq!(Detached::Finalized("background thread").detail(), "detached: finalized");
        assert_eq!(
            Detached::Kept("GPUPROF_DETACH=off".into()).detail(),
            "detached: not finalized (GPUPROF_DETACH=off)"
        );
    }
}
