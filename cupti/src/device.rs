//! Device facts from the CUDA driver (name, UUID, PCI bus id, compute capability, SMs, memory),
//! in one format for every agent's hello: UUIDs as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`
//! (as `nvidia-smi -L` prints them) and PCI bus ids in lower case, `0000:1b:00.0` (as
//! `/proc/driver/nvidia/gpus` and sysfs name them, which the daemon's GPU discovery reads).
// Safety: FFI calls into libcuda with out-pointers to locals sized as the API requires; each
// unsafe block says which.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char};
use std::time::{Duration, Instant};

use crate::callback::Context;
use crate::sys::cuda::CudaDriver;
use crate::sys::cupti as sys;

/// Facts about one device.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceFacts {
    /// CUDA ordinal.
    pub ordinal: u32,
    pub name: String,
    /// [`uuid_string`] form.
    pub uuid: String,
    /// [`pci_bus_id`] form.
    pub pci_bus_id: String,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub sm_count: u32,
    pub memory_bytes: u64,
}

/// The CUDA driver library.
pub struct Driver {
    raw: CudaDriver,
}

impl Driver {
    /// The copy of libcuda already in this process (never a second one), for the injector,
    /// whose host loaded the driver. `None` when none is loaded.
    pub fn already_loaded() -> Option<Driver> {
        use libloading::os::unix::{Library, RTLD_LAZY, RTLD_LOCAL};
        for name in ["libcuda.so.1", "libcuda.so"] {
            // Safety: RTLD_NOLOAD only returns a handle to a library already in the process.
            if let Ok(lib) = unsafe { Library::open(Some(name), RTLD_LAZY | RTLD_LOCAL | libc::RTLD_NOLOAD) } {
                // Safety: resolves symbols by name; missing ones are stored as errors.
                return unsafe { CudaDriver::from_library(lib) }.ok().map(|raw| Driver { raw });
            }
        }
        None
    }

    /// Loads libcuda.so.1 and calls `cuInit(0)`, for a process of its own (the sampler).
    pub fn load_and_init() -> Result<Driver, String> {
        // Safety: loading the driver library runs its initialisers only.
        let raw = unsafe { CudaDriver::new("libcuda.so.1") }.map_err(|e| format!("cannot load libcuda.so.1: {e}"))?;
        let Ok(init) = &raw.cuInit else { return Err("libcuda.so.1 lacks cuInit".into()) };
        // Safety: cuInit takes a flags word.
        let r = unsafe { init(0) };
        if r != sys::CUDA_SUCCESS {
            return Err(format!("cuInit failed with CUresult {r}"));
        }
        Ok(Driver { raw })
    }

    /// Number of devices, waiting up to `wait` while the driver is still initialising (the
    /// injector's thread starts while `cuInit` runs on the application's). 0 on any error.
    pub fn device_count(&self, wait: Duration) -> u32 {
        let Ok(count_fn) = &self.raw.cuDeviceGetCount else { return 0 };
        let deadline = Instant::now() + wait;
        loop {
            let mut n = 0i32;
            // Safety: `n` is a valid out pointer.
            let r = unsafe { count_fn(&mut n) };
            if r == sys::CUDA_SUCCESS {
                return n.max(0) as u32;
            }
            if r != sys::CUDA_ERROR_NOT_INITIALIZED || Instant::now() >= deadline {
                return 0;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits, on the calling thread, for the work already submitted to every device's primary
    /// context that is active (the contexts the CUDA runtime, and so PyTorch, uses); devices
    /// without one are skipped, so no context is ever created. Returns how many were waited
    /// for. A trace waits so before `cuptiFinalize`: kernels launched while tracing and still
    /// queued would otherwise complete into CUPTI state that finalize freed.
    pub fn synchronize_active_primary_contexts(&self) -> Result<u32, String> {
        let Ok(sync) = &self.raw.cuCtxSynchronize else {
            return Err("libcuda lacks a primary-context or synchronization function".into());
        };
        let mut synced = 0;
        for ordinal in 0..self.device_count(Duration::ZERO) {
            let Some(ctx) = self.active_primary_context(ordinal) else { continue };
            // Safety: `ctx` is retained and current on this thread for the call.
            let r = ctx.with_current(|| unsafe { sync() });
            if r != sys::CUDA_SUCCESS {
                return Err(format!("cuCtxSynchronize on device {ordinal} failed with CUresult {r}"));
            }
            synced += 1;
        }
        Ok(synced)
    }

    /// Device `ordinal`'s primary context, retained, when it is active (never creates one).
    pub fn active_primary_context(&self, ordinal: u32) -> Option<PrimaryContext<'_>> {
        let d = &self.raw;
        let (Ok(get), Ok(state), Ok(retain)) =
            (&d.cuDeviceGet, &d.cuDevicePrimaryCtxGetState, &d.cuDevicePrimaryCtxRetain)
        else {
            return None;
        };
        let mut dev: sys::CUdevice = 0;
        // Safety: `dev` is a valid out pointer.
        if unsafe { get(&mut dev, ordinal as i32) } != sys::CUDA_SUCCESS {
            return None;
        }
        let (mut flags, mut active) = (0u32, 0i32);
        // Safety: valid out pointers.
        if unsafe { state(dev, &mut flags, &mut active) } != sys::CUDA_SUCCESS || active == 0 {
            return None;
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // Safety: `ctx` is a valid out pointer; released in PrimaryContext's Drop.
        if unsafe { retain(&mut ctx, dev) } != sys::CUDA_SUCCESS {
            return None;
        }
        Some(PrimaryContext { driver: self, dev, ctx })
    }

    /// Runs `f` with `ctx` pushed current on the calling thread, leaving the thread's context
    /// stack as it was.
    ///
    /// # Safety
    /// `ctx` must be a live context.
    unsafe fn with_context<T>(&self, ctx: sys::CUcontext, f: impl FnOnce() -> T) -> T {
        let d = &self.raw;
        let pushed = match &d.cuCtxPushCurrent_v2 {
            // Safety: `ctx` is live per this function's contract.
            Ok(push) => (unsafe { push(ctx) }) == sys::CUDA_SUCCESS,
            Err(_) => false,
        };
        let r = f();
        if pushed && let Ok(pop) = &d.cuCtxPopCurrent_v2 {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // Safety: pops what was pushed above on this thread.
            unsafe { pop(&mut popped) };
        }
        r
    }

    /// Every device's facts (those the driver fails to describe are left out).
    pub fn all(&self, wait: Duration) -> Vec<DeviceFacts> {
        (0..self.device_count(wait)).filter_map(|o| self.facts(o).ok()).collect()
    }

    /// Name, UUID, PCI bus id, compute capability, SMs and memory of a device ordinal.
    pub fn facts(&self, ordinal: u32) -> Result<DeviceFacts, String> {
        let d = &self.raw;
        let Ok(get) = &d.cuDeviceGet else { return Err("libcuda lacks cuDeviceGet".into()) };
        let mut dev: sys::CUdevice = 0;
        // Safety: `dev` is a valid out pointer.
        let r = unsafe { get(&mut dev, ordinal as i32) };
        if r != sys::CUDA_SUCCESS {
            return Err(format!("cuDeviceGet({ordinal}) failed with CUresult {r}"));
        }
        let mut f = DeviceFacts { ordinal, ..Default::default() };
        if let Ok(uuid_fn) = &d.cuDeviceGetUuid_v2 {
            let mut uuid = sys::CUuuid { bytes: [0; 16] };
            // Safety: `uuid` is a valid CUuuid out pointer.
            if unsafe { uuid_fn(&mut uuid, dev) } == sys::CUDA_SUCCESS {
                f.uuid = uuid_string(&uuid.bytes.map(|b| b as u8));
            }
        }
        let text = |func: &Result<
            unsafe extern "C" fn(*mut c_char, i32, sys::CUdevice) -> sys::CUresult,
            libloading::Error,
        >| {
            let Ok(func) = func else { return String::new() };
            let mut buf = [0 as c_char; 256];
            // Safety: the buffer is 256 bytes and its length is passed.
            if unsafe { func(buf.as_mut_ptr(), buf.len() as i32, dev) } != sys::CUDA_SUCCESS {
                return String::new();
            }
            buf[255] = 0;
            // Safety: NUL-terminated above.
            unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
        };
        f.name = text(&d.cuDeviceGetName);
        f.pci_bus_id = pci_bus_id(&text(&d.cuDeviceGetPCIBusId));
        let attr = |a: sys::CUdevice_attribute| -> u32 {
            let Ok(func) = &d.cuDeviceGetAttribute else { return 0 };
            let mut v = 0i32;
            // Safety: `v` is a valid out pointer.
            if unsafe { func(&mut v, a, dev) } == sys::CUDA_SUCCESS { v.max(0) as u32 } else { 0 }
        };
        f.compute_major = attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        f.compute_minor = attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        f.sm_count = attr(sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        if let Ok(mem_fn) = &d.cuDeviceTotalMem_v2 {
            let mut mem = 0usize;
            // Safety: `mem` is a valid out pointer.
            if unsafe { mem_fn(&mut mem, dev) } == sys::CUDA_SUCCESS {
                f.memory_bytes = mem as u64;
            }
        }
        Ok(f)
    }
}

/// A device UUID as `nvidia-smi -L` prints it: `GPU-` and 8-4-4-4-12 lower-case hex digits.
pub fn uuid_string(b: &[u8; 16]) -> String {
    let h = |r: std::ops::Range<usize>| b[r].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!("GPU-{}-{}-{}-{}-{}", h(0..4), h(4..6), h(6..8), h(8..10), h(10..16))
}

/// A PCI bus id in the one form gpuprof uses: lower case, 4-digit domain (`0000:1b:00.0`).
/// CUDA reports `0000:1B:00.0`, NVML `00000000:1B:00.0`.
pub fn pci_bus_id(raw: &str) -> String {
    let s = raw.trim().to_ascii_lowercase();
    match s.split_once(':') {
        Some((domain, rest)) if domain.len() > 4 && domain.chars().all(|c| c.is_ascii_hexdigit()) => {
            let trimmed = domain.trim_start_matches('0');
            format!("{trimmed:0>4}:{rest}")
        }
        _ => s,
    }
}

/// A retained primary context (released on drop).
pub struct PrimaryContext<'a> {
    driver: &'a Driver,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
}

impl PrimaryContext<'_> {
    /// The context.
    pub fn context(&self) -> Context {
        Context::from_handle(self.ctx)
    }

    /// Runs `f` with the context current on the calling thread, leaving the thread's context
    /// stack as it was.
    pub fn with_current<T>(&self, f: impl FnOnce() -> T) -> T {
        // Safety: `ctx` is retained for as long as `self` lives.
        unsafe { self.driver.with_context(self.ctx, f) }
    }
}

impl Drop for PrimaryContext<'_> {
    fn drop(&mut self) {
        if let Ok(release) = &self.driver.raw.cuDevicePrimaryCtxRelease_v2 {
            // Safety: balances the retain in `active_primary_context`.
            unsafe { release(self.dev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_grouped_8_4_4_4_12_in_lower_case() {
        let b = [0xAB, 0xCD, 0xEF, 0x01, 0x23, 0x45, 0x67, 0x89, 0x0A, 0xBC, 0xDE, 0xF0, 0x11, 0x22, 0x33, 0x44];
        assert_eq!(uuid_string(&b), "GPU-abcdef01-2345-6789-0abc-def011223344");
    }

    #[test]
    fn pci_bus_ids_have_one_form() {
        assert_eq!(pci_bus_id("0000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(pci_bus_id("00000000:C1:00.0"), "0000:c1:00.0");
        assert_eq!(pci_bus_id("0000:1b:00.0"), "0000:1b:00.0");
        assert_eq!(pci_bus_id(" 0001:01:00.0\n"), "0001:01:00.0");
        assert_eq!(pci_bus_id(""), "");
    }

    #[test]
    fn no_driver_in_this_process_is_none() {
        // Test binaries never load libcuda.
        assert!(Driver::already_loaded().is_none());
    }
}
