//! The process's one CUPTI subscriber (CUDA 13.0 allows one per process), shared by the two
//! things that need callbacks: a trace's detach, which finalizes CUPTI at the exit of a CUDA
//! synchronization ([`super::detach`]), and PC sampling, which works at those exits and at
//! module loads and context teardown ([`super::pc`]).
//!
//! The subscriber is made when a trace starts (or a PC lease begins) and kept until CUPTI is
//! finalized or its last user lets go. It is never made when a trace stops: on the H100 a
//! subscriber made at the stop of a trace whose process was launching kernels, and finalizing
//! in its first callback, crashed the process in 4 of 4 runs; one made at attach, in none.
// Safety: the callback forwards CUPTI's `cbdata` to the users' callbacks, which document their
// own use of it.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpuprof_cupti::activity::Subscriber;
use gpuprof_cupti::sys::cupti as sys;
use gpuprof_cupti::{Cupti, CuptiError};

/// Who holds the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// A trace whose stop finalizes CUPTI.
    Detach,
    /// PC sampling while a lease is held.
    Pc,
}

impl User {
    fn bit(self) -> u8 {
        match self {
            User::Detach => 1,
            User::Pc => 2,
        }
    }
}

struct Hooks {
    sub: Option<Subscriber>,
    users: u8,
}

static HOOKS: Mutex<Hooks> = Mutex::new(Hooks { sub: None, users: 0 });
/// Set when `cuptiFinalize` succeeded (which ended the subscriber); the handle is forgotten at
/// the next use, without taking the lock in CUPTI's callback.
static ENDED: AtomicBool = AtomicBool::new(false);

fn hooks() -> MutexGuard<'static, Hooks> {
    let mut h = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    if ENDED.swap(false, Ordering::SeqCst) {
        h.sub = None;
        h.users = 0;
    }
    h
}

/// Makes the subscriber if there is none (with every callback either user needs: module loads,
/// context teardown, and the exits of the synchronizations in [`super::detach::SYNC_CALLS`]),
/// and counts `user` among its holders. Fails when another CUPTI client holds the subscriber.
pub fn acquire(cupti: &Cupti, user: User) -> Result<(), CuptiError> {
    let mut h = hooks();
    if h.sub.is_none() {
        let s = cupti.subscribe(Some(on_callback))?;
        let res = [sys::CUPTI_CBID_RESOURCE_MODULE_LOADED, sys::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING]
            .map(|cbid| (sys::CUPTI_CB_DOMAIN_RESOURCE, cbid));
        for (domain, cbid) in res.into_iter().chain(super::detach::SYNC_CALLS) {
            if let Err(e) = cupti.enable_callback(&s, domain, cbid, true) {
                crate::log::log!(Warn, "CUPTI callback {domain}/{cbid}: {e}");
            }
        }
        h.sub = Some(s);
    }
    h.users |= user.bit();
    Ok(())
}

/// The driver's kernel and graph launches (the runtime's go through them), counted while a
/// PC-sampling window is open: what keeping sampling enabled would cost depends on the
/// launch rate ([`super::pc`]).
const LAUNCH_CALLS: [u32; 8] = [
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    sys::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    sys::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    sys::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
];

fn is_launch(domain: sys::CUpti_CallbackDomain, cbid: sys::CUpti_CallbackId) -> bool {
    domain == sys::CUPTI_CB_DOMAIN_DRIVER_API && LAUNCH_CALLS.contains(&cbid)
}

/// Switches the launch callbacks on or off. Never waits (it runs on the application's
/// threads): false when the subscriber is busy or gone, or a callback could not be switched.
pub fn count_launches(cupti: &Cupti, on: bool) -> bool {
    let Ok(h) = HOOKS.try_lock() else { return false };
    if ENDED.load(Ordering::SeqCst) {
        return false;
    }
    let Some(s) = &h.sub else { return false };
    LAUNCH_CALLS.iter().all(|&cbid| cupti.enable_callback(s, sys::CUPTI_CB_DOMAIN_DRIVER_API, cbid, on).is_ok())
}

/// Whether `user` holds the subscriber.
pub fn held_by(user: User) -> bool {
    let h = hooks();
    h.sub.is_some() && h.users & user.bit() != 0
}

/// Whether gpuprof holds the process's subscriber (a probe for other clients would only find
/// gpuprof itself).
pub fn held() -> bool {
    hooks().sub.is_some()
}

/// `user` lets go; the last one out unsubscribes.
pub fn release(cupti: &Cupti, user: User) {
    let mut h = hooks();
    h.users &= !user.bit();
    if h.users == 0
        && let Some(s) = h.sub.take()
    {
        let _ = cupti.unsubscribe(s);
    }
}

/// CUPTI was finalized (which ended the subscriber): nobody holds it any more. Lock-free, for
/// CUPTI's callback.
pub fn ended_by_finalize() {
    ENDED.store(true, Ordering::SeqCst);
}

extern "C" fn on_callback(
    userdata: *mut c_void,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    cbdata: *const c_void,
) {
    if is_launch(domain, cbid) {
        // Counted, nothing else: a trace's detach never happens under a launch.
        super::pc::on_launch(cbdata);
        return;
    }
    // PC sampling's work at a synchronization's exit comes before a finalize at the same exit.
    super::pc::on_callback(userdata, domain, cbid, cbdata);
    if domain == sys::CUPTI_CB_DOMAIN_RUNTIME_API || domain == sys::CUPTI_CB_DOMAIN_DRIVER_API {
        super::detach::on_api(userdata, domain, cbid, cbdata);
    }
}
