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
