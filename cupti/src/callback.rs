//! Typed views of what CUPTI hands a subscriber's callback: the [`Context`] handle, a context
//! known to be alive ([`LiveContext`]) and the [`Callback`] data (API call site and context, a
//! resource's context and module cubin).
// Safety: `Callback::from_raw` states what the pointer it wraps must be; every accessor reads
// only the struct CUPTI documents for the callback's domain (checked first).
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;

use crate::sys::cupti as sys;

/// A CUDA context handle, as CUDA or CUPTI handed it out (null where CUPTI reported none).
///
/// Only made from what CUDA or CUPTI returned: a callback's data ([`Callback::api_context`],
/// [`Callback::resource_context`]), the driver's primary context
/// ([`crate::device::PrimaryContext::context`]), or an `extern "C"` callback argument
/// ([`Context::from_raw`]). It says nothing about whether the context is still alive: calls
/// that need a live context stay `unsafe` and say so.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Context(usize);

impl Context {
    /// Wraps a context handle an `extern "C"` callback received.
    ///
    /// # Safety
    /// `raw` must be a context handle CUDA or CUPTI passed to the caller (e.g. the `ctx` argument
    /// of CUPTI's buffer-completion callback), or null.
    pub unsafe fn from_raw(raw: sys::CUcontext) -> Context {
        Context(raw as usize)
    }

    pub(crate) fn from_handle(raw: sys::CUcontext) -> Context {
        Context(raw as usize)
    }

    pub(crate) fn raw(self) -> sys::CUcontext {
        self.0 as sys::CUcontext
    }

    /// The handle's address, for tables and logs (0 for none).
    pub fn id(self) -> usize {
        self.0
    }

    /// No context (what CUPTI reports where there is none).
    pub const NULL: Context = Context(0);

    /// Whether CUPTI reported no context.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Context({:#x})", self.0)
    }
}

impl fmt::LowerHex for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// A context that stays alive while this value lives (`'a`): the context of a runtime or driver
/// API call (current on the calling thread) or the one a resource callback is about, for the
/// callback's duration ([`Callback::live_context`]); or one the caller vouches for
/// ([`LiveContext::assume`]). Never null. Calls that need a live context (PC sampling's, in
/// [`crate::pcsession`]) take one instead of a bare [`Context`], and are safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveContext<'a> {
    ctx: Context,
    _live: PhantomData<&'a ()>,
}

impl<'a> LiveContext<'a> {
    /// Vouches that `ctx` is alive for `'a`; `None` for a null context.
    ///
    /// # Safety
    /// `ctx` must be a CUDA context that is not destroyed while the value (`'a`) lives.
    pub unsafe fn assume(ctx: Context) -> Option<LiveContext<'a>> {
        (!ctx.is_null()).then_some(LiveContext { ctx, _live: PhantomData })
    }

    /// The context.
    pub fn context(self) -> Context {
        self.ctx
    }
}

/// The arguments of one call of a subscriber's callback (`CUpti_CallbackFunc`), valid for the
/// callback's duration (`'a`).
#[derive(Clone, Copy)]
pub struct Callback<'a> {
    domain: sys::CUpti_CallbackDomain,
    cbid: sys::CUpti_CallbackId,
    data: *const c_void,
    _callback: PhantomData<&'a c_void>,
}

impl<'a> Callback<'a> {
    /// Wraps the arguments CUPTI passed to a subscriber's callback.
    ///
    /// # Safety
    /// `domain`, `cbid` and `data` must be those CUPTI passed to the running callback (so `data`
    /// is the struct CUPTI documents for the domain, or null), and the value must not be kept
    /// past the callback's return (`'a`).
    pub unsafe fn from_raw(
        domain: sys::CUpti_CallbackDomain,
        cbid: sys::CUpti_CallbackId,
        data: *const c_void,
    ) -> Self {
        Callback { domain, cbid, data, _callback: PhantomData }
    }

    /// The callback domain (`CUPTI_CB_DOMAIN_*`, in [`crate::ids`]).
    pub fn domain(&self) -> sys::CUpti_CallbackDomain {
        self.domain
    }

    /// The callback id within the domain.
    pub fn cbid(&self) -> sys::CUpti_CallbackId {
        self.cbid
    }

    /// A runtime or driver API call's data (`CUpti_CallbackData`), if this is one.
    fn api(&self) -> Option<&'a sys::CUpti_CallbackData> {
        let api = self.domain == sys::CUPTI_CB_DOMAIN_RUNTIME_API || self.domain == sys::CUPTI_CB_DOMAIN_DRIVER_API;
        if !api || self.data.is_null() {
            return None;
        }
        // Safety: for the runtime and driver API domains CUPTI's `cbdata` is a
        // `CUpti_CallbackData`, valid for the callback (`from_raw`'s contract).
        Some(unsafe { &*(self.data as *const sys::CUpti_CallbackData) })
    }

    /// A resource callback's data (`CUpti_ResourceData`), if this is one.
    fn resource(&self) -> Option<&'a sys::CUpti_ResourceData> {
        if self.domain != sys::CUPTI_CB_DOMAIN_RESOURCE || self.data.is_null() {
            return None;
        }
        // Safety: for the resource domain CUPTI's `cbdata` is a `CUpti_ResourceData`, valid for
        // the callback (`from_raw`'s contract).
        Some(unsafe { &*(self.data as *const sys::CUpti_ResourceData) })
    }

    /// Whether this is the exit of a runtime or driver API call (false for anything else).
    pub fn is_api_exit(&self) -> bool {
        self.api().is_some_and(|d| d.callbackSite == sys::CUPTI_API_EXIT)
    }

    /// Whether this is the entry of a runtime or driver API call (false for anything else).
    pub fn is_api_entry(&self) -> bool {
        self.api().is_some_and(|d| d.callbackSite != sys::CUPTI_API_EXIT)
    }

    /// The context of a runtime or driver API call (the one current on the calling thread);
    /// `None` for other callbacks or when CUPTI passed no data.
    pub fn api_context(&self) -> Option<Context> {
        self.api().map(|d| Context::from_handle(d.context))
    }

    /// The context a resource callback is about; `None` for other callbacks or when CUPTI
    /// passed no data.
    pub fn resource_context(&self) -> Option<Context> {
        self.resource().map(|d| Context::from_handle(d.context))
    }

    /// The context of a runtime or driver API call (current on the calling thread) or of a
    /// resource callback, alive for the callback's duration; `None` for other callbacks, when
    /// CUPTI passed no data or the context is null.
    pub fn live_context(&self) -> Option<LiveContext<'a>> {
        let ctx = self.api_context().or_else(|| self.resource_context()).filter(|c| !c.is_null())?;
        // CUPTI calls back inside the API call (or the resource event) on that context, which
        // cannot be destroyed before the callback returns.
        Some(LiveContext { ctx, _live: PhantomData })
    }

    /// The cubin of the module a `CUPTI_CBID_RESOURCE_MODULE_LOADED` or
    /// `..._MODULE_UNLOAD_STARTING` callback reports; `None` for other callbacks or when CUPTI
    /// describes no cubin. Valid only during the callback.
    pub fn module_cubin(&self) -> Option<&'a [u8]> {
        let module = self.cbid == sys::CUPTI_CBID_RESOURCE_MODULE_LOADED
            || self.cbid == sys::CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING;
        let rd = self.resource().filter(|_| module)?;
        let md = rd.resourceDescriptor as *const sys::CUpti_ModuleResourceData;
        if md.is_null() {
            return None;
        }
        // Safety: a module resource callback's descriptor is a CUpti_ModuleResourceData, valid
        // for the callback.
        let md = unsafe { &*md };
        if md.pCubin.is_null() || md.cubinSize == 0 {
            return None;
        }
        // Safety: CUPTI describes `cubinSize` bytes at `pCubin` for the callback's duration.
        Some(unsafe { std::slice::from_raw_parts(md.pCubin as *const u8, md.cubinSize) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_data(site: u32, ctx: usize) -> sys::CUpti_CallbackData {
        // Safety: a plain C struct; all-zero is valid.
        let mut d: sys::CUpti_CallbackData = unsafe { std::mem::zeroed() };
        d.callbackSite = site;
        d.context = ctx as sys::CUcontext;
        d
    }

    #[test]
    fn api_callbacks_say_their_site_and_context() {
        let d = api_data(sys::CUPTI_API_EXIT, 0x1234);
        // Safety: `d` is a CUpti_CallbackData that outlives `cb`.
        let cb = unsafe {
            Callback::from_raw(sys::CUPTI_CB_DOMAIN_DRIVER_API, 7, (&d as *const sys::CUpti_CallbackData).cast())
        };
        assert!(cb.is_api_exit() && !cb.is_api_entry());
        assert_eq!(cb.api_context().map(Context::id), Some(0x1234));
        assert_eq!(cb.resource_context(), None);
        assert_eq!(cb.live_context().map(|l| l.context().id()), Some(0x1234));
        assert!(cb.module_cubin().is_none());
        let e = api_data(sys::CUPTI_API_ENTER, 0);
        // Safety: as above.
        let cb = unsafe {
            Callback::from_raw(sys::CUPTI_CB_DOMAIN_RUNTIME_API, 7, (&e as *const sys::CUpti_CallbackData).cast())
        };
        assert!(cb.is_api_entry() && !cb.is_api_exit());
        assert!(cb.api_context().is_some_and(Context::is_null));
        assert!(cb.live_context().is_none(), "no live context where CUPTI reported none");
    }

    #[test]
    fn no_data_or_another_domain_reads_nothing() {
        // Safety: null data.
        let cb = unsafe { Callback::from_raw(sys::CUPTI_CB_DOMAIN_RUNTIME_API, 1, std::ptr::null()) };
        assert!(!cb.is_api_exit() && !cb.is_api_entry() && cb.api_context().is_none());
        let cubin = [1u8, 2, 3];
        // Safety: plain C structs; all-zero is valid.
        let mut md: sys::CUpti_ModuleResourceData = unsafe { std::mem::zeroed() };
        md.pCubin = cubin.as_ptr().cast();
        md.cubinSize = cubin.len();
        // Safety: as above.
        let mut rd: sys::CUpti_ResourceData = unsafe { std::mem::zeroed() };
        rd.context = 0x10 as sys::CUcontext;
        rd.resourceDescriptor = (&mut md as *mut sys::CUpti_ModuleResourceData).cast();
        let data = (&rd as *const sys::CUpti_ResourceData).cast();
        // Safety: `rd` and `md` outlive `cb`.
        let cb =
            unsafe { Callback::from_raw(sys::CUPTI_CB_DOMAIN_RESOURCE, sys::CUPTI_CBID_RESOURCE_MODULE_LOADED, data) };
        assert_eq!(cb.module_cubin(), Some(&cubin[..]));
        assert_eq!(cb.resource_context().map(Context::id), Some(0x10));
        assert_eq!(cb.live_context().map(|l| l.context().id()), Some(0x10));
        assert!(!cb.is_api_exit() && cb.api_context().is_none());
        // Safety: as above.
        let other = unsafe {
            Callback::from_raw(sys::CUPTI_CB_DOMAIN_RESOURCE, sys::CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING, data)
        };
        assert!(other.module_cubin().is_none(), "only module callbacks describe a module");
    }
}
