//! Activity tracing and callbacks: the safe calls the injector makes on a loaded [`Cupti`].
// Safety: each unsafe block calls a function resolved by `Cupti::load` (the tracing symbols are
// required there) with arguments whose validity is stated next to it.
#![allow(unsafe_code)]

use crate::callback::{Callback, Context};
use crate::error::{CuptiError, check};
use crate::loader::Cupti;
use crate::sys::cupti as sys;

impl Cupti {
    /// `cuptiActivityEnable(kind)`.
    pub fn activity_enable(&self, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnable(kind) })
    }

    /// `cuptiActivityDisable(kind)`.
    pub fn activity_disable(&self, kind: sys::CUpti_ActivityKind) -> Result<(), CuptiError> {
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityDisable(kind) })
    }

    /// `cuptiActivityEnableRuntimeApi(cbid, enable)`.
    pub fn enable_runtime_api(&self, cbid: u32, enable: bool) -> Result<(), CuptiError> {
        // Safety: plain value arguments; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnableRuntimeApi(cbid, enable as u8) })
    }

    /// `cuptiActivityEnableDriverApi(cbid, enable)`.
    pub fn enable_driver_api(&self, cbid: u32, enable: bool) -> Result<(), CuptiError> {
        // Safety: plain value arguments; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityEnableDriverApi(cbid, enable as u8) })
    }

    /// `cuptiActivityEnableAllSyncRecords(enable)`: with `false`, CUPTI skips event/stream query
    /// records for work not completed yet (a busy-polling application makes millions).
    pub fn enable_all_sync_records(&self, enable: bool) -> Result<(), CuptiError> {
        if self.raw.cuptiActivityEnableAllSyncRecords.is_err() {
            return Err(CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED));
        }
        // Safety: plain value argument; the symbol resolved (checked above).
        check(unsafe { self.raw.cuptiActivityEnableAllSyncRecords(enable as u8) })
    }

    /// `cuptiActivitySetAttribute(attr, sizeof(T), &value)` for a `u8` or `usize` attribute.
    pub fn set_attribute<T: Copy>(&self, attr: sys::CUpti_ActivityAttribute, value: T) -> Result<(), CuptiError> {
        let Ok(f) = &self.raw.cuptiActivitySetAttribute else {
            return Err(CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED));
        };
        let mut v = value;
        let mut size = std::mem::size_of::<T>();
        // Safety: `size` and `v` are valid for the call; CUPTI reads `size` bytes of `v` (the
        // attribute's documented type, u8 or size_t, chosen by the caller).
        check(unsafe { f(attr, &mut size, (&mut v as *mut T).cast()) })
    }

    /// `cuptiActivityRegisterCallbacks(request, complete)`.
    pub fn register_callbacks(
        &self,
        request: sys::CUpti_BuffersCallbackRequestFunc,
        complete: sys::CUpti_BuffersCallbackCompleteFunc,
    ) -> Result<(), CuptiError> {
        // Safety: the callbacks are `extern "C"` functions with CUPTI's signatures that live
        // for the whole process (they are statics of this library, which is never unloaded).
        check(unsafe { self.raw.cuptiActivityRegisterCallbacks(request, complete) })
    }

    /// `cuptiActivityFlushAll(flags)`; `forced` returns buffers with incomplete records too.
    pub fn flush_all(&self, forced: bool) -> Result<(), CuptiError> {
        let flag = if forced { sys::CUPTI_ACTIVITY_FLAG_FLUSH_FORCED } else { 0 };
        // Safety: plain value argument; the symbol was checked at load.
        check(unsafe { self.raw.cuptiActivityFlushAll(flag) })
    }

    /// `cuptiActivityGetNumDroppedRecords(ctx, stream, &n)`: records CUPTI dropped since the
    /// last call for the buffer being completed (`ctx` and `stream_id` as CUPTI passed them to
    /// the completion callback).
    pub fn dropped_records(&self, ctx: Context, stream_id: u32) -> usize {
        let mut n = 0usize;
        // Safety: `ctx` is a handle CUDA/CUPTI gave out (or null), which CUPTI only looks up;
        // `n` is a valid out pointer.
        let r = unsafe { self.raw.cuptiActivityGetNumDroppedRecords(ctx.raw(), stream_id, &mut n) };
        if r == sys::CUPTI_SUCCESS { n } else { 0 }
    }

    /// Walks the records of a completed buffer, calling `f` with each record's address.
    ///
    /// # Safety
    /// `buf` must point to `valid` initialised bytes of a buffer CUPTI has completed.
    pub unsafe fn for_each_record(&self, buf: *mut u8, valid: usize, mut f: impl FnMut(*const u8)) {
        let mut rec: *mut sys::CUpti_Activity = std::ptr::null_mut();
        loop {
            // Safety: per this function's contract; CUPTI reads the buffer and advances `rec`
            // within `valid` bytes.
            let r = unsafe { self.raw.cuptiActivityGetNextRecord(buf, valid, &mut rec) };
            if r != sys::CUPTI_SUCCESS || rec.is_null() {
                break;
            }
            f(rec as *const u8);
        }
    }

    /// `cuptiFinalize()`: detaches CUPTI from the process. Every kind, callback and subscriber
    /// goes; the next CUPTI call initialises CUPTI again. CUPTI asks that it be called from an
    /// API-exit callback, or else after the caller flushed the activity buffers (and no other
    /// thread calls CUPTI meanwhile).
    pub fn finalize(&self) -> Result<(), CuptiError> {
        let Ok(f) = &self.raw.cuptiFinalize else {
            return Err(CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED));
        };
        // Safety: no arguments; the symbol resolved (checked above).
        check(unsafe { f() })
    }

    /// `cuptiSubscribe(&handle, callback, null)`: a subscriber whose `callback` runs for the
    /// domains later switched on with [`Cupti::enable_domain`]. Fails with
    /// CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED when another client holds one.
    pub fn subscribe(&self, callback: sys::CUpti_CallbackFunc) -> Result<Subscriber, CuptiError> {
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // Safety: `callback` is an `extern "C"` function with CUPTI's callback signature that
        // lives as long as the process (a static of the calling library); `handle` is a valid
        // out pointer.
        check(unsafe { self.raw.cuptiSubscribe(&mut handle, callback, std::ptr::null_mut()) })?;
        Ok(Subscriber(handle))
    }

    /// `cuptiSubscribe` with a callback written in safe Rust: CUPTI's arguments reach `handler`
    /// wrapped in a [`Callback`] (valid for the call only), and a panic in it stops there.
    pub fn subscribe_handler(&self, handler: Handler) -> Result<Subscriber, CuptiError> {
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // Safety: `trampoline` has CUPTI's callback signature and is a static of this crate;
        // the user data is `handler`, a function pointer that lives as long as the process, cast
        // back in `trampoline`; `handle` is a valid out pointer.
        check(unsafe { self.raw.cuptiSubscribe(&mut handle, Some(trampoline), handler as *mut std::ffi::c_void) })?;
        Ok(Subscriber(handle))
    }

    /// `cuptiUnsubscribe(handle)`. Not needed after [`Cupti::finalize`], which ends every
    /// subscriber.
    pub fn unsubscribe(&self, s: Subscriber) -> Result<(), CuptiError> {
        // Safety: `s` came from a successful `cuptiSubscribe` and is consumed here.
        check(unsafe { self.raw.cuptiUnsubscribe(s.0) })
    }

    /// `cuptiEnableDomain(on, subscriber, domain)`: the subscriber's callback runs at the entry
    /// and exit of every call in `domain` (e.g. `CUPTI_CB_DOMAIN_RUNTIME_API`).
    pub fn enable_domain(&self, s: &Subscriber, domain: sys::CUpti_CallbackDomain, on: bool) -> Result<(), CuptiError> {
        let Ok(f) = &self.raw.cuptiEnableDomain else {
            return Err(CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED));
        };
        // Safety: `s` is a live subscriber handle; plain value arguments.
        check(unsafe { f(on as u32, s.0, domain) })
    }

    /// `cuptiEnableCallback(on, subscriber, domain, cbid)`: the subscriber's callback runs at
    /// the entry and exit of one call of `domain`.
    pub fn enable_callback(
        &self,
        s: &Subscriber,
        domain: sys::CUpti_CallbackDomain,
        cbid: u32,
        on: bool,
    ) -> Result<(), CuptiError> {
        let Ok(f) = &self.raw.cuptiEnableCallback else {
            return Err(CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED));
        };
        // Safety: `s` is a live subscriber handle; plain value arguments.
        check(unsafe { f(on as u32, s.0, domain, cbid) })
    }

    /// Probes whether another CUPTI subscriber (e.g. Kineto's) exists: subscribes and
    /// immediately unsubscribes. `Err(39)` means someone else holds CUPTI.
    pub fn probe_subscriber(&self) -> Result<(), CuptiError> {
        let mut handle: sys::CUpti_SubscriberHandle = std::ptr::null_mut();
        // Safety: `probe_callback` has CUPTI's callback signature and does nothing; no domain
        // is enabled, so it is never called; `handle` is a valid out pointer.
        check(unsafe { self.raw.cuptiSubscribe(&mut handle, Some(probe_callback), std::ptr::null_mut()) })?;
        // Safety: `handle` was just returned by a successful cuptiSubscribe.
        let _ = unsafe { self.raw.cuptiUnsubscribe(handle) };
        Ok(())
    }
}

extern "C" fn probe_callback(
    _userdata: *mut std::ffi::c_void,
    _domain: sys::CUpti_CallbackDomain,
    _cbid: sys::CUpti_CallbackId,
    _data: *const std::ffi::c_void,
) {
}

/// A CUPTI subscriber handle (from [`Cupti::subscribe`]).
#[derive(Debug)]
pub struct Subscriber(sys::CUpti_SubscriberHandle);

// Safety: a subscriber handle is an opaque token CUPTI accepts from any thread.
unsafe impl Send for Subscriber {}

/// A subscriber's callback in safe Rust ([`Cupti::subscribe_handler`]).
pub type Handler = fn(&Callback<'_>);

/// CUPTI's callback for [`Cupti::subscribe_handler`]: the user data is the handler.
extern "C" fn trampoline(
    userdata: *mut std::ffi::c_void,
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    cbdata: *const std::ffi::c_void,
) {
    if userdata.is_null() {
        return;
    }
    // Safety: `userdata` is the `Handler` that `subscribe_handler` cast to a pointer, of the
    // same size, cast back unchanged.
    let handler = unsafe { std::mem::transmute::<*mut std::ffi::c_void, Handler>(userdata) };
    // Safety: CUPTI's arguments to the running subscriber callback, used only until it returns.
    let cb = unsafe { Callback::from_raw(domain, cbid, cbdata) };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&cb)));
}

#[cfg(test)]
mod trampoline_tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    static SEEN: AtomicU32 = AtomicU32::new(0);

    fn handler(cb: &Callback<'_>) {
        SEEN.store(cb.domain() * 1000 + cb.cbid(), Ordering::SeqCst);
    }

    fn panics(_: &Callback<'_>) {
        panic!("a handler's panic stays in the trampoline");
    }

    #[test]
    fn the_trampoline_hands_cuptis_arguments_to_the_handler_it_was_given() {
        // Safety: CUpti_CallbackData is plain C data (integers and pointers); all zeros is a
        // valid value, standing for CUPTI's.
        let data: sys::CUpti_CallbackData = unsafe { std::mem::zeroed() };
        let p = (&data as *const sys::CUpti_CallbackData).cast();
        trampoline(handler as Handler as *mut std::ffi::c_void, sys::CUPTI_CB_DOMAIN_DRIVER_API, 17, p);
        assert_eq!(SEEN.load(Ordering::SeqCst), sys::CUPTI_CB_DOMAIN_DRIVER_API * 1000 + 17);
        trampoline(std::ptr::null_mut(), sys::CUPTI_CB_DOMAIN_RUNTIME_API, 3, p);
        assert_eq!(SEEN.load(Ordering::SeqCst), sys::CUPTI_CB_DOMAIN_DRIVER_API * 1000 + 17, "no handler: nothing");
        trampoline(panics as Handler as *mut std::ffi::c_void, sys::CUPTI_CB_DOMAIN_RUNTIME_API, 3, p);
    }
}
