//! Every symbol the library exports to C, in one place. Each entry catches panics: nothing
//! unwinds into the driver or the application.
// Safety: `#[no_mangle]` exports, the ELF constructor, and dladdr/dlsym on this library and
// libcupti; each use is commented.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_void};
use std::panic::catch_unwind;

use crate::lifecycle;

/// Called by the CUDA driver inside `cuInit` when `CUDA_INJECTION64_PATH` names this library.
/// CUPTI may be used from here, the driver API not yet; it only starts the background thread.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = catch_unwind(lifecycle::initialize);
    1
}

/// Called by NVTX at the first NVTX call when `NVTX_INJECTION64_PATH` names this library:
/// forwards to libcupti's own NVTX injection so that NVTX ranges and marks become CUPTI
/// MARKER records. Returns 0 (NVTX stays a no-op) when CUPTI is unusable.
#[unsafe(no_mangle)]
pub extern "C" fn InitializeInjectionNvtx2(get_export_table: *const c_void) -> c_int {
    catch_unwind(|| {
        let Ok(cupti) = gpuprof_cupti::loader::shared() else { return 0 };
        type InitNvtx = unsafe extern "C" fn(*const c_void) -> c_int;
        // Safety: reopening the libcupti already loaded (same path; dlopen returns the same
        // handle) to resolve its NVTX entry point, whose C signature is the one above.
        unsafe {
            let Ok(lib) = libloading::Library::new(cupti.path()) else { return 0 };
            let Ok(f) = lib.get::<InitNvtx>(b"InitializeInjectionNvtx2\0") else { return 0 };
            let r = f(get_export_table);
            std::mem::forget(lib); // keep the reference: CUPTI's NVTX hooks live on
            if r != 0 {
                crate::tracer::detach::NVTX_FORWARDED.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            r
        }
    })
    .unwrap_or(0)
}

/// ELF constructor. `LD_PRELOAD` alone never makes the driver call `InitializeInjection`, so
/// when this library is preloaded and `CUDA_INJECTION64_PATH` is unset, point it at this very
/// file: the driver then calls `InitializeInjection` inside `cuInit`, exactly as in the
/// `CUDA_INJECTION64_PATH` case. Nothing else happens in a process that never uses CUDA.
extern "C" fn preload_constructor() {
    let _ = catch_unwind(|| {
        if std::env::var_os("CUDA_INJECTION64_PATH").is_some() {
            return;
        }
        let Some(path) = own_path() else { return };
        let file = path.rsplit('/').next().unwrap_or(&path).to_string();
        let preloaded = std::env::var("LD_PRELOAD").is_ok_and(|p| p.split([' ', ':']).any(|e| e.ends_with(&file)));
        if !preloaded {
            return;
        }
        // Safety: this runs from the dynamic loader's constructor pass for an LD_PRELOAD
        // library, before `main` and before the program starts threads.
        unsafe { std::env::set_var("CUDA_INJECTION64_PATH", &path) };
    });
}

#[used]
#[unsafe(link_section = ".init_array")]
static PRELOAD_CONSTRUCTOR: extern "C" fn() = preload_constructor;

/// The path this library was loaded from.
fn own_path() -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // Safety: dladdr on the address of a function of this library, with a valid out struct.
    let ok = unsafe { libc::dladdr(preload_constructor as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // Safety: dladdr returned a NUL-terminated path owned by the loader.
    let p = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    std::fs::canonicalize(&p).ok().map(|p| p.display().to_string()).or(Some(p))
}

// ------------------------------------------------------------------ NCCL profiler plugin
//
// NCCL (2.27 and later) loads the library `NCCL_PROFILER_PLUGIN` names and looks up
// `ncclProfiler_v5`, then `ncclProfiler_v4`. Pointing it at this library (already loaded by the
// driver, so the same instance) makes NCCL report each collective to `crate::nccl`. Every entry
// point returns ncclSuccess except `init` without a running agent (NCCL then disables the
// plugin); nothing panics into NCCL, and handles are opaque numbers, never dereferenced.

use crate::nccl::{self, abi};

/// Safety: the table is immutable and its name points at a 'static C string.
unsafe impl<I> Sync for abi::Profiler<I> {}

const PLUGIN_NAME: &CStr = c"gpuprof";

#[unsafe(no_mangle)]
pub static ncclProfiler_v5: abi::Profiler<abi::InitV5> = abi::Profiler {
    name: PLUGIN_NAME.as_ptr(),
    init: nccl_init_v5,
    start_event: nccl_start_event_v5,
    stop_event: nccl_stop_event,
    record_event_state: nccl_record_event_state,
    finalize: nccl_finalize,
};

#[unsafe(no_mangle)]
pub static ncclProfiler_v4: abi::Profiler<abi::InitV4> = abi::Profiler {
    name: PLUGIN_NAME.as_ptr(),
    init: nccl_init_v4,
    start_event: nccl_start_event_v4,
    stop_event: nccl_stop_event,
    record_event_state: nccl_record_event_state,
    finalize: nccl_finalize,
};

/// A C string NCCL passed, copied (empty for NULL).
fn c_text(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // Safety: NCCL passes NUL-terminated strings (names from its static tables) that live for
    // the call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn nccl_init(context: *mut *mut c_void, mask: *mut c_int, comm: nccl::Comm) -> c_int {
    catch_unwind(|| {
        if context.is_null() || mask.is_null() || !mask.is_aligned() {
            return abi::NCCL_INTERNAL_ERROR;
        }
        // Safety: NCCL's activation mask is a process-wide `int` it reads atomically on every
        // API call and keeps for the life of the process; the plugin may change it at any time
        // (NCCL's example plugin does the same).
        let mask: &'static std::sync::atomic::AtomicI32 = unsafe { std::sync::atomic::AtomicI32::from_ptr(mask) };
        let Some(id) = nccl::global().init(comm, mask) else { return abi::NCCL_INTERNAL_ERROR };
        // Safety: `context` is NCCL's out pointer for this communicator's context.
        unsafe { *context = id as *mut c_void };
        abi::NCCL_SUCCESS
    })
    .unwrap_or(abi::NCCL_INTERNAL_ERROR)
}

extern "C" fn nccl_init_v5(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    _name: *const std::ffi::c_char,
    _nodes: c_int,
    nranks: c_int,
    _rank: c_int,
    _log: abi::Logger,
) -> c_int {
    nccl_init(context, mask, nccl::Comm { hash: comm_id, nranks: nranks.max(0) as u32 })
}

extern "C" fn nccl_init_v4(
    context: *mut *mut c_void,
    mask: *mut c_int,
    _name: *const std::ffi::c_char,
    comm_hash: u64,
    _nodes: c_int,
    nranks: c_int,
    _rank: c_int,
    _log: abi::Logger,
) -> c_int {
    nccl_init(context, mask, nccl::Comm { hash: comm_hash, nranks: nranks.max(0) as u32 })
}

/// startEvent: `wide_type` for v5 (a 64-bit `type`), else v4's 8-bit one.
fn nccl_start_event(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void, wide_type: bool) -> c_int {
    let _ = catch_unwind(|| {
        if handle.is_null() {
            return;
        }
        // Safety: `handle` is NCCL's out pointer for the event's handle.
        unsafe { *handle = std::ptr::null_mut() };
        if descr.is_null() {
            return;
        }
        // Safety: NCCL's descriptor starts with the head `abi::Head` describes: the type is a
        // `uint64_t` in v5 and a `uint8_t` (followed by padding) in v4, so v4's is read as a
        // byte. Fields are read through the raw pointer, one by one: no reference to the whole
        // descriptor (whose padding may be uninitialized) is made.
        let ty = unsafe { if wide_type { *(descr as *const u64) } else { u64::from(*(descr as *const u8)) } };
        let h = if ty == abi::PROFILE_COLL {
            let d = descr as *const abi::Descr<abi::Coll>;
            // Safety: a Coll event's descriptor holds the `coll` member of the union.
            let start = unsafe {
                nccl::CollStart {
                    seq: (*d).u.seq,
                    func: c_text((*d).u.func),
                    datatype: c_text((*d).u.datatype),
                    algo: c_text((*d).u.algo),
                    proto: c_text((*d).u.proto),
                    count: (*d).u.count as u64,
                    root: (*d).u.root,
                    rank: (*d).head.rank,
                    channels: u32::from((*d).u.n_channels),
                }
            };
            // Safety: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            nccl::global().coll_start(context as usize, start, tid)
        } else if ty == abi::PROFILE_KERNEL_CH {
            let d = descr as *const abi::Descr<abi::KernelCh>;
            // Safety: a KernelCh event's descriptor holds the `kernelCh` member.
            let (parent, ptimer) = unsafe { ((*d).head.parent as usize, (*d).u.p_timer) };
            nccl::global().channel_start(parent, ptimer)
        } else {
            0
        };
        // Safety: as above.
        unsafe { *handle = h as *mut c_void };
    });
    abi::NCCL_SUCCESS
}

extern "C" fn nccl_start_event_v5(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    nccl_start_event(context, handle, descr, true)
}

extern "C" fn nccl_start_event_v4(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int {
    nccl_start_event(context, handle, descr, false)
}

extern "C" fn nccl_stop_event(handle: *mut c_void) -> c_int {
    let _ = catch_unwind(|| nccl::global().stop(handle as usize));
    abi::NCCL_SUCCESS
}

extern "C" fn nccl_record_event_state(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int {
    let _ = catch_unwind(|| {
        if state == abi::KERNEL_CH_STOP && !args.is_null() {
            // Safety: the KernelChStop state comes with the `kernelCh` member of the state
            // arguments' union.
            let ptimer = unsafe { (*(args as *const abi::StateArgsKernelCh)).p_timer };
            nccl::global().channel_end_time(handle as usize, ptimer);
        }
    });
    abi::NCCL_SUCCESS
}

extern "C" fn nccl_finalize(context: *mut c_void) -> c_int {
    let _ = catch_unwind(|| nccl::global().finalize(context as usize));
    abi::NCCL_SUCCESS
}
