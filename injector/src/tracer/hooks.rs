//! The process's one CUPTI subscriber (CUDA 13.0 allows one per process), shared by the two
//! things that need callbacks: a trace's detach, which finalizes CUPTI at the exit of a CUDA
//! synchronization, and PC sampling, which works at those exits and at module loads and context
//! teardown. A leaf: each registers its part of the callback ([`register`]) when the backend is
//! made, and the callback calls what was registered.
//!
//! The subscriber is made when a trace starts, a PC lease begins, or inside `cuInit` when a
//! PC-sampling session awaits the process (for its module loads), and kept until CUPTI is
//! finalized or its last user lets go. It is never made when a trace stops: on the H100 a
//! subscriber made at the stop of a trace whose process was launching kernels, and finalizing
//! in its first callback, crashed the process in 4 of 4 runs; one made at attach, in none.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use gpuprof_cupti::activity::Subscriber;
use gpuprof_cupti::ids;
use gpuprof_cupti::{Callback, Cupti, CuptiError};

/// Who holds the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum User {
    /// A trace whose stop finalizes CUPTI.
    Detach,
    /// PC sampling while a lease is held (or awaited: from `cuInit`, until the trace stops).
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
    /// The launch callbacks are on ([`set_launches`]), under this subscriber.
    launches: bool,
}

static HOOKS: Mutex<Hooks> = Mutex::new(Hooks { sub: None, users: 0, launches: false });
/// Set when `cuptiFinalize` succeeded (which ended the subscriber); the handle is forgotten at
/// the next use, without taking the lock in CUPTI's callback.
static ENDED: AtomicBool = AtomicBool::new(false);

fn hooks() -> MutexGuard<'static, Hooks> {
    let mut h = HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    if ENDED.swap(false, Ordering::SeqCst) {
        h.sub = None;
        h.users = 0;
        h.launches = false;
    }
    h
}

/// The calls at whose exit a trace's detach finalizes CUPTI and PC sampling does its work:
/// each waited for the GPU (runtime and driver spellings; the runtime's go through the
/// driver's).
pub const SYNC_CALLS: [(ids::CUpti_CallbackDomain, u32); 9] = [
    (ids::CUPTI_CB_DOMAIN_RUNTIME_API, ids::CUPTI_RUNTIME_TRACE_CBID_cudaDeviceSynchronize_v3020),
    (ids::CUPTI_CB_DOMAIN_RUNTIME_API, ids::CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020),
    (ids::CUPTI_CB_DOMAIN_RUNTIME_API, ids::CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_ptsz_v7000),
    (ids::CUPTI_CB_DOMAIN_RUNTIME_API, ids::CUPTI_RUNTIME_TRACE_CBID_cudaEventSynchronize_v3020),
    (ids::CUPTI_CB_DOMAIN_DRIVER_API, ids::CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize),
    (ids::CUPTI_CB_DOMAIN_DRIVER_API, ids::CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2),
    (ids::CUPTI_CB_DOMAIN_DRIVER_API, ids::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize),
    (ids::CUPTI_CB_DOMAIN_DRIVER_API, ids::CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz),
    (ids::CUPTI_CB_DOMAIN_DRIVER_API, ids::CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize),
];

/// A user's part of the subscriber's callback.
pub type Handler = fn(&Callback<'_>);

/// PC sampling's handlers (every callback but a launch; launches), and the detach's (runtime
/// and driver API calls), registered once.
static PC_CALLBACK: OnceLock<Handler> = OnceLock::new();
static PC_LAUNCH: OnceLock<Handler> = OnceLock::new();
static DETACH_API: OnceLock<Handler> = OnceLock::new();

/// Registers `user`'s handlers (later calls change nothing; the callback reads them at each
/// call, so one registered after the subscriber was made runs from then on):
/// PC sampling's `callback` runs for every callback but a launch, and `launch` for launches;
/// the detach's `callback` for runtime and driver API calls, after PC sampling's.
pub fn register(user: User, callback: Handler, launch: Option<Handler>) {
    match user {
        User::Pc => {
            let _ = PC_CALLBACK.set(callback);
            if let Some(l) = launch {
                let _ = PC_LAUNCH.set(l);
            }
        }
        User::Detach => {
            let _ = DETACH_API.set(callback);
        }
    }
}

/// Makes the subscriber if there is none (with every callback either user needs: module loads,
/// context teardown, and the exits of the synchronizations in [`SYNC_CALLS`]),
/// and counts `user` among its holders. Fails when another CUPTI client holds the subscriber.
pub fn acquire(cupti: &Cupti, user: User) -> Result<(), CuptiError> {
    let mut h = hooks();
    if h.sub.is_none() {
        let s = cupti.subscribe_handler(on_callback)?;
        let res = [ids::CUPTI_CBID_RESOURCE_MODULE_LOADED, ids::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING]
            .map(|cbid| (ids::CUPTI_CB_DOMAIN_RESOURCE, cbid));
        for (domain, cbid) in res.into_iter().chain(SYNC_CALLS) {
            if let Err(e) = cupti.enable_callback(&s, domain, cbid, true) {
                crate::log::log!(Warn, "CUPTI callback {domain}/{cbid}: {e}");
            }
        }
        h.sub = Some(s);
    }
    h.users |= user.bit();
    Ok(())
}

/// Kernel and graph launches, the driver's and the runtime's (which go through the driver's),
/// at which PC sampling opens and closes windows and reads: its work runs at the outermost
/// entry of a launch, a finalize at the outermost exit.
const LAUNCH_CALLS: [(ids::CUpti_CallbackDomain, u32); 18] = {
    use ids::{CUPTI_CB_DOMAIN_DRIVER_API as D, CUPTI_CB_DOMAIN_RUNTIME_API as R};
    [
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch),
        (D, ids::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_v13000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID___cudaLaunchKernel_ptsz_v13000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_v9000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchCooperativeKernel_ptsz_v9000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000),
        (R, ids::CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000),
    ]
};

fn is_launch(domain: ids::CUpti_CallbackDomain, cbid: ids::CUpti_CallbackId) -> bool {
    LAUNCH_CALLS.contains(&(domain, cbid))
}

/// Times the launch callbacks were switched (and CUPTI finalized): a thread whose launch was
/// under way at a switch never saw its exit, so its nesting count starts again.
static LAUNCH_SWITCHES: AtomicU64 = AtomicU64::new(0);

pub fn launch_epoch() -> u64 {
    LAUNCH_SWITCHES.load(Ordering::Relaxed) + FINALIZED.load(Ordering::Relaxed)
}

/// Switches the launch callbacks on or off (gpuprof's thread, while PC sampling may have work
/// at launches): whether they are now as asked (false when CUPTI refused; with no subscriber,
/// whether they were to go off).
pub fn set_launches(cupti: &Cupti, on: bool) -> bool {
    switch_launches(&mut hooks(), cupti, on)
}

/// [`set_launches`] from an application thread: never waits (false when the subscriber is
/// busy or gone).
pub fn try_set_launches(cupti: &Cupti, on: bool) -> bool {
    let Ok(mut h) = HOOKS.try_lock() else { return false };
    !ENDED.load(Ordering::SeqCst) && switch_launches(&mut h, cupti, on)
}

fn switch_launches(h: &mut Hooks, cupti: &Cupti, on: bool) -> bool {
    if h.launches == on {
        return true;
    }
    let Some(s) = &h.sub else { return !on };
    LAUNCH_SWITCHES.fetch_add(1, Ordering::SeqCst);
    let ok = LAUNCH_CALLS.iter().all(|&(domain, cbid)| cupti.enable_callback(s, domain, cbid, on).is_ok());
    if ok {
        h.launches = on;
    }
    ok
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
        h.launches = false;
        let _ = cupti.unsubscribe(s);
    }
}

/// CUPTI was finalized (which ended the subscriber): nobody holds it any more. Lock-free, for
/// CUPTI's callback.
pub fn ended_by_finalize() {
    FINALIZED.fetch_add(1, Ordering::SeqCst);
    ENDED.store(true, Ordering::SeqCst);
}

/// gpuprof's own thread working in CUPTI, and a finalize on an application thread (PC sampling
/// between windows), exclude each other: finalizing while another thread is inside CUPTI is
/// undefined, and a subscriber made meanwhile would be lost. gpuprof's thread waits for a
/// finalize under way; an application thread never waits (it finalizes at a later
/// synchronization instead).
static BG_IN_CUPTI: AtomicU32 = AtomicU32::new(0);
static FINALIZING: AtomicBool = AtomicBool::new(false);

/// gpuprof's thread works in CUPTI while this lives ([`background`]).
pub struct Background(());

impl Drop for Background {
    fn drop(&mut self) {
        BG_IN_CUPTI.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Marks gpuprof's thread as working in CUPTI until the guard drops (nesting is fine); waits
/// while an application thread finalizes.
pub fn background() -> Background {
    loop {
        BG_IN_CUPTI.fetch_add(1, Ordering::SeqCst);
        if !FINALIZING.load(Ordering::SeqCst) {
            return Background(());
        }
        BG_IN_CUPTI.fetch_sub(1, Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Application threads making gpuprof's own CUPTI calls inside a callback (a module's CRC at
/// its load, on whichever thread loads it) ([`app_cupti`]).
static APP_IN_CUPTI: AtomicU32 = AtomicU32::new(0);

/// An application thread's CUPTI call inside a callback, while this lives ([`app_cupti`]).
pub struct AppInCupti(());

impl Drop for AppInCupti {
    fn drop(&mut self) {
        APP_IN_CUPTI.fetch_sub(1, Ordering::SeqCst);
    }
}

/// On an application thread, before a CUPTI call of gpuprof's own inside a callback: the right
/// to make it, or None while another thread finalizes (the call is then left out). Never
/// waits; a finalize is refused while one is held.
pub fn app_cupti() -> Option<AppInCupti> {
    APP_IN_CUPTI.fetch_add(1, Ordering::SeqCst);
    if FINALIZING.load(Ordering::SeqCst) {
        APP_IN_CUPTI.fetch_sub(1, Ordering::SeqCst);
        return None;
    }
    Some(AppInCupti(()))
}

/// An application thread's right to finalize CUPTI, while it lives ([`try_finalizing`]).
pub struct Finalizing(());

impl Drop for Finalizing {
    fn drop(&mut self) {
        FINALIZING.store(false, Ordering::SeqCst);
    }
}

/// On an application thread: the right to finalize, or None while gpuprof's thread works in
/// CUPTI or another thread finalizes. Never waits.
pub fn try_finalizing() -> Option<Finalizing> {
    if FINALIZING.swap(true, Ordering::SeqCst) {
        return None;
    }
    if BG_IN_CUPTI.load(Ordering::SeqCst) > 0 || APP_IN_CUPTI.load(Ordering::SeqCst) > 0 {
        FINALIZING.store(false, Ordering::SeqCst);
        return None;
    }
    Some(Finalizing(()))
}

/// Times CUPTI was finalized in this process (a trace's detach, PC sampling between windows):
/// whatever was registered with CUPTI before went with it.
static FINALIZED: AtomicU64 = AtomicU64::new(0);

pub fn finalizations() -> u64 {
    FINALIZED.load(Ordering::SeqCst)
}

/// Whether the running trace has activity kinds or API records on (a PC-only session's trace
/// has none): only then does CUPTI hold trace state that a finalize would cut short.
static ACTIVITY: AtomicBool = AtomicBool::new(false);

pub fn set_activity(on: bool) {
    ACTIVITY.store(on, Ordering::SeqCst);
}

pub fn activity() -> bool {
    ACTIVITY.load(Ordering::SeqCst)
}

/// The subscriber's callback: CUPTI's arguments, for the registered handlers.
fn on_callback(cb: &Callback<'_>) {
    let (domain, cbid) = (cb.domain(), cb.cbid());
    if is_launch(domain, cbid) {
        // PC sampling's only: a trace's detach never happens under a launch.
        if let Some(f) = PC_LAUNCH.get() {
            f(cb);
        }
        return;
    }
    // PC sampling's work at a synchronization's exit comes before a finalize at the same exit.
    if let Some(f) = PC_CALLBACK.get() {
        f(cb);
    }
    if (domain == ids::CUPTI_CB_DOMAIN_RUNTIME_API || domain == ids::CUPTI_CB_DOMAIN_DRIVER_API)
        && let Some(f) = DETACH_API.get()
    {
        f(cb);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// The two tests below share the process's guards: one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());

    /// gpuprof's thread in CUPTI and a finalize on an application thread exclude each other:
    /// the application thread is refused (never waits) while gpuprof's thread works; gpuprof's
    /// thread waits while a finalize is under way, and goes on once it ends.
    #[test]
    fn a_finalize_and_gpuprofs_cupti_work_exclude_each_other() {
        let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        {
            let _bg = background();
            let _nested = background();
            assert!(try_finalizing().is_none());
        }
        let fin = try_finalizing().expect("nothing in CUPTI");
        assert!(try_finalizing().is_none(), "one finalize at a time");
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _bg = background();
            tx.send(()).unwrap();
        });
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "waited for the finalize");
        drop(fin);
        rx.recv_timeout(Duration::from_secs(5)).expect("went on after it");
        t.join().unwrap();
        assert!(try_finalizing().is_some());
    }

    /// An application thread's own CUPTI call in a callback (a module's CRC) and a finalize on
    /// another exclude each other, neither waiting: the finalize is refused while the call is
    /// under way, and the call is left out while a finalize is.
    #[test]
    fn a_finalize_and_an_application_threads_cupti_call_exclude_each_other() {
        let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        {
            let _call = app_cupti().expect("no finalize under way");
            assert!(try_finalizing().is_none());
        }
        let fin = try_finalizing().expect("nothing in CUPTI");
        assert!(std::thread::spawn(|| app_cupti().is_none()).join().unwrap(), "left out during the finalize");
        drop(fin);
        assert!(app_cupti().is_some());
        assert!(try_finalizing().is_some());
    }
}
