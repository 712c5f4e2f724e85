//! The process's GPUs as the CUDA driver reports them, for the hello: queried from the
//! injector's own thread through the driver library the process already loaded (never a
//! second copy, never from inside `cuInit`).
// Safety: FFI calls into libcuda with out-pointers to locals sized as the API requires.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;

use crate::convert::uuid_string;
use crate::sys::cuda::CudaDriver;
use crate::sys::cupti as sys;

fn driver() -> Option<CudaDriver> {
    use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
    for name in ["libcuda.so.1", "libcuda.so"] {
        // Safety: RTLD_NOLOAD only returns a handle to a library already in the process.
        if let Ok(lib) = unsafe { Library::open(Some(name), RTLD_LAZY | RTLD_LOCAL | libc::RTLD_NOLOAD) } {
            // Safety: resolves symbols by name; missing ones are stored as errors.
            return unsafe { CudaDriver::from_library(lib) }.ok();
        }
    }
    None
}

/// Lists devices, waiting up to `wait` for `cuInit` (which is running on the application's
/// thread when the driver calls `InitializeInjection`) to finish.
pub fn query(wait: Duration) -> Vec<pb::Device> {
    let Some(d) = driver() else { return Vec::new() };
    let (Ok(count_fn), Ok(get), Ok(uuid_fn)) = (&d.cuDeviceGetCount, &d.cuDeviceGet, &d.cuDeviceGetUuid_v2) else {
        return Vec::new();
    };
    let deadline = Instant::now() + wait;
    let mut count = 0i32;
    loop {
        // Safety: `count` is a valid out pointer.
        let r = unsafe { count_fn(&mut count) };
        if r == sys::CUDA_SUCCESS {
            break;
        }
        if r != sys::CUDA_ERROR_NOT_INITIALIZED || Instant::now() >= deadline {
            return Vec::new();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut out = Vec::new();
    for ordinal in 0..count {
        let mut dev: sys::CUdevice = 0;
        // Safety: `dev` is a valid out pointer; `ordinal` < count.
        if unsafe { get(&mut dev, ordinal) } != sys::CUDA_SUCCESS {
            continue;
        }
        let mut uuid = sys::CUuuid { bytes: [0; 16] };
        // Safety: `uuid` is a valid CUuuid out pointer.
        let uuid = if unsafe { uuid_fn(&mut uuid, dev) } == sys::CUDA_SUCCESS {
            uuid_string(&uuid.bytes.map(|b| b as u8))
        } else {
            String::new()
        };
        let attr = |a: sys::CUdevice_attribute| -> u32 {
            let Ok(f) = &d.cuDeviceGetAttribute else { return 0 };
            let mut v = 0i32;
            // Safety: `v` is a valid out pointer.
            if unsafe { f(&mut v, a, dev) } == sys::CUDA_SUCCESS { v.max(0) as u32 } else { 0 }
        };
        let text = |f: &Result<
            unsafe extern "C" fn(*mut std::ffi::c_char, i32, sys::CUdevice) -> sys::CUresult,
            libloading::Error,
        >| {
            let Ok(f) = f else { return String::new() };
            let mut buf = [0 as std::ffi::c_char; 256];
            // Safety: the buffer is 256 bytes and its length is passed.
            if unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) } != sys::CUDA_SUCCESS {
                return String::new();
            }
            buf[255] = 0;
            // Safety: NUL-terminated above.
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
        };
        let mut mem = 0usize;
        if let Ok(f) = &d.cuDeviceTotalMem_v2 {
            // Safety: `mem` is a valid out pointer.
            let _ = unsafe { f(&mut mem, dev) };
        }
        out.push(pb::Device {
            id: ordinal as u32,
            uuid,
            name: text(&d.cuDeviceGetName),
            compute_major: attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            compute_minor: attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            sm_count: attr(sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            global_memory_bytes: mem as u64,
            pci_bus_id: text(&d.cuDeviceGetPCIBusId),
        });
    }
    out
}
