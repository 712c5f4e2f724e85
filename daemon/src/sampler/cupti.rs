//! A safe layer over the CUPTI PM sampling and profiler-host API, and the few CUDA driver
//! calls the sampler child needs. Only `gpuprofd sampler` uses it: libcupti and libcuda are
//! loaded at run time with libloading, so the daemon never loads CUDA.
//!
//! Every CUPTI call takes a parameter struct whose first field is its own size; [`params!`]
//! builds one zeroed with that size set. Handles ([`Host`], [`PmSampling`]) end their CUPTI
//! object in `Drop`.
// Safety: this module is the FFI boundary. Each unsafe block calls a function from a table
// resolved by libloading (all symbols were required at load) with a parameter struct that
// lives across the call and pointers into buffers that outlive it; CUPTI writes only the
// [out] fields of the struct and into buffers whose sizes we pass.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char};
use std::fmt;
use std::path::{Path, PathBuf};

use super::sys::{cuda, cupti as sys};

/// A failed CUPTI or CUDA call.
#[derive(Debug, Clone)]
pub struct CallError {
    /// What was called.
    pub call: &'static str,
    /// CUptiResult (or CUresult for driver calls).
    pub code: u32,
    /// CUPTI's text for the code.
    pub text: String,
}

impl CallError {
    /// CUPTI_ERROR_HARDWARE_BUSY: another client (ncu, DCGM, another sampler) holds the
    /// device's performance monitor.
    pub fn is_hardware_busy(&self) -> bool {
        self.code == sys::CUPTI_ERROR_HARDWARE_BUSY
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.text, self.code)
    }
}

impl std::error::Error for CallError {}

pub type Result<T> = std::result::Result<T, CallError>;

/// A zeroed CUPTI parameter struct with `structSize` set as the C macro
/// `CUPTI_PROFILER_STRUCT_SIZE(type, lastfield)` does.
macro_rules! params {
    ($t:ident, $last:ident) => {{
        // Safety: CUPTI parameter structs hold only integers and raw pointers, for which
        // all-zero bytes are valid values (0 and null).
        let mut p: sys::$t = unsafe { std::mem::zeroed() };
        p.structSize = std::mem::offset_of!(sys::$t, $last) + std::mem::size_of_val(&p.$last);
        p
    }};
}

/// Where to look for libcupti, in order.
pub fn cupti_candidates(explicit: Option<&Path>) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = Vec::new();
    if let Some(p) = explicit {
        v.push(p.to_path_buf());
        return v;
    }
    if let Some(p) = std::env::var_os("GPUPROF_CUPTI_LIBRARY").filter(|p| !p.is_empty()) {
        v.push(PathBuf::from(p));
        return v;
    }
    // By soname: LD_LIBRARY_PATH, then the ldconfig cache.
    v.push("libcupti.so.13".into());
    v.push("libcupti.so".into());
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(h) = std::env::var_os(var).filter(|h| !h.is_empty()) {
            roots.push(h.into());
        }
    }
    roots.push("/usr/local/cuda".into());
    roots.push("/usr/local/cuda-13.0".into());
    for r in roots {
        for sub in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"] {
            v.push(r.join(sub).join("libcupti.so.13"));
            v.push(r.join(sub).join("libcupti.so"));
        }
    }
    v
}

/// libcupti, loaded.
pub struct Cupti {
    lib: sys::Cupti,
    /// The file it was loaded from (or the soname that resolved).
    pub path: PathBuf,
}

impl Cupti {
    /// Loads libcupti from the first candidate that works.
    pub fn load(explicit: Option<&Path>) -> std::result::Result<Cupti, String> {
        let mut errors = Vec::new();
        for p in cupti_candidates(explicit) {
            if p.is_absolute() && !p.exists() {
                continue;
            }
            // Safety: loading libcupti runs its initializers, which only set up CUPTI's own
            // state; every symbol this module calls is required to be present.
            match unsafe { sys::Cupti::new(&p) } {
                Ok(lib) => return Ok(Cupti { lib, path: p }),
                Err(e) => errors.push(format!("{}: {e}", p.display())),
            }
        }
        Err(format!(
            "cannot load libcupti (set sampler.cupti_library or GPUPROF_CUPTI_LIBRARY): {}",
            if errors.is_empty() { "no candidate found".to_string() } else { errors.join("; ") }
        ))
    }

    fn check(&self, call: &'static str, r: sys::CUptiResult) -> Result<()> {
        if r == sys::CUPTI_SUCCESS {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        // Safety: cuptiGetResultString stores a pointer to a static string (or leaves null).
        let text = unsafe {
            if self.lib.cuptiGetResultString(r, &mut s) == sys::CUPTI_SUCCESS && !s.is_null() {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            } else {
                "unknown error".to_string()
            }
        };
        Err(CallError { call, code: r, text })
    }

    /// cuptiGetVersion (e.g. 130001).
    pub fn version(&self) -> u32 {
        let mut v = 0u32;
        // Safety: writes one u32.
        let _ = unsafe { self.lib.cuptiGetVersion(&mut v) };
        v
    }

    /// cuptiProfilerInitialize: needed before chip names and the host API.
    pub fn profiler_initialize(&self) -> Result<()> {
        let mut p = params!(CUpti_Profiler_Initialize_Params, pPriv);
        // Safety: see the module comment.
        self.check("cuptiProfilerInitialize", unsafe { self.lib.cuptiProfilerInitialize(&mut p) })
    }

    /// cuptiProfilerDeInitialize.
    pub fn profiler_deinitialize(&self) -> Result<()> {
        let mut p = params!(CUpti_Profiler_DeInitialize_Params, pPriv);
        // Safety: see the module comment.
        self.check("cuptiProfilerDeInitialize", unsafe { self.lib.cuptiProfilerDeInitialize(&mut p) })
    }

    /// The chip name of a device, e.g. "GH100".
    pub fn chip_name(&self, device: u32) -> Result<String> {
        let mut p = params!(CUpti_Device_GetChipName_Params, pChipName);
        p.deviceIndex = device as usize;
        // Safety: see the module comment; pChipName points to a string owned by CUPTI.
        self.check("cuptiDeviceGetChipName", unsafe { self.lib.cuptiDeviceGetChipName(&mut p) })?;
        if p.pChipName.is_null() {
            return Ok(String::new());
        }
        // Safety: a NUL-terminated string owned by CUPTI, copied at once.
        Ok(unsafe { CStr::from_ptr(p.pChipName) }.to_string_lossy().into_owned())
    }

    /// The counter availability image of a device for PM sampling.
    pub fn counter_availability(&self, device: u32) -> Result<Vec<u8>> {
        let mut p = params!(CUpti_PmSampling_GetCounterAvailability_Params, pCounterAvailabilityImage);
        p.deviceIndex = device as usize;
        // Safety: first call with a null buffer returns the size.
        self.check("cuptiPmSamplingGetCounterAvailability", unsafe {
            self.lib.cuptiPmSamplingGetCounterAvailability(&mut p)
        })?;
        let mut img = vec![0u8; p.counterAvailabilityImageSize];
        p.pCounterAvailabilityImage = img.as_mut_ptr();
        // Safety: the buffer has the size CUPTI asked for.
        self.check("cuptiPmSamplingGetCounterAvailability", unsafe {
            self.lib.cuptiPmSamplingGetCounterAvailability(&mut p)
        })?;
        Ok(img)
    }
}

/// Metric names as C strings plus the pointer array CUPTI takes.
pub struct MetricNames {
    _owned: Vec<CString>,
    ptrs: Vec<*const c_char>,
}

impl MetricNames {
    pub fn new(names: &[String]) -> std::result::Result<MetricNames, String> {
        let owned = names
            .iter()
            .map(|n| CString::new(n.as_str()).map_err(|_| format!("metric name {n:?} contains a NUL byte")))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let ptrs = owned.iter().map(|c| c.as_ptr()).collect();
        Ok(MetricNames { _owned: owned, ptrs })
    }

    pub fn len(&self) -> usize {
        self.ptrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ptrs.is_empty()
    }

    fn ptr(&mut self) -> *mut *const c_char {
        self.ptrs.as_mut_ptr()
    }
}

/// A profiler host object: metric configuration and evaluation for one chip.
pub struct Host<'a> {
    cupti: &'a Cupti,
    obj: *mut sys::CUpti_Profiler_Host_Object,
    // CUPTI keeps pointers to the chip name and the availability image in the host object:
    // they live exactly as long as it (freeing them early made DecodeData fault on the H100).
    _chip: CString,
    _availability: Vec<u8>,
}

impl<'a> Host<'a> {
    pub fn new(cupti: &'a Cupti, chip: &str, availability: Vec<u8>) -> Result<Host<'a>> {
        let chip_c = CString::new(chip).unwrap_or_default();
        let mut p = params!(CUpti_Profiler_Host_Initialize_Params, pHostObject);
        p.profilerType = sys::CUPTI_PROFILER_TYPE_PM_SAMPLING;
        p.pChipName = chip_c.as_ptr();
        p.pCounterAvailabilityImage = availability.as_ptr();
        // Safety: chip_c and availability are moved into the Host, so they outlive the host
        // object (their heap buffers do not move); pHostObject is an [out] handle.
        cupti.check("cuptiProfilerHostInitialize", unsafe { cupti.lib.cuptiProfilerHostInitialize(&mut p) })?;
        Ok(Host { cupti, obj: p.pHostObject, _chip: chip_c, _availability: availability })
    }

    /// Adds metrics to the configuration.
    pub fn add_metrics(&self, names: &mut MetricNames) -> Result<()> {
        let mut p = params!(CUpti_Profiler_Host_ConfigAddMetrics_Params, numMetrics);
        p.pHostObject = self.obj;
        p.ppMetricNames = names.ptr();
        p.numMetrics = names.len();
        // Safety: see the module comment.
        self.cupti.check("cuptiProfilerHostConfigAddMetrics", unsafe {
            self.cupti.lib.cuptiProfilerHostConfigAddMetrics(&mut p)
        })
    }

    /// The config image for the metrics added so far.
    pub fn config_image(&self) -> Result<Vec<u8>> {
        let mut s = params!(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize);
        s.pHostObject = self.obj;
        // Safety: see the module comment.
        self.cupti.check("cuptiProfilerHostGetConfigImageSize", unsafe {
            self.cupti.lib.cuptiProfilerHostGetConfigImageSize(&mut s)
        })?;
        let mut img = vec![0u8; s.configImageSize];
        let mut p = params!(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage);
        p.pHostObject = self.obj;
        p.configImageSize = img.len();
        p.pConfigImage = img.as_mut_ptr();
        // Safety: the buffer has the size CUPTI reported.
        self.cupti.check("cuptiProfilerHostGetConfigImage", unsafe {
            self.cupti.lib.cuptiProfilerHostGetConfigImage(&mut p)
        })?;
        Ok(img)
    }

    /// Passes needed to collect a config image.
    pub fn num_passes(&self, config: &mut [u8]) -> Result<usize> {
        let mut p = params!(CUpti_Profiler_Host_GetNumOfPasses_Params, numOfPasses);
        p.configImageSize = config.len();
        p.pConfigImage = config.as_mut_ptr();
        // Safety: see the module comment.
        self.cupti.check("cuptiProfilerHostGetNumOfPasses", unsafe {
            self.cupti.lib.cuptiProfilerHostGetNumOfPasses(&mut p)
        })?;
        Ok(p.numOfPasses)
    }

    /// Evaluates sample `index` of a decoded counter data image into `out` (one per metric).
    pub fn evaluate(&self, image: &[u8], index: usize, names: &mut MetricNames, out: &mut [f64]) -> Result<()> {
        debug_assert_eq!(out.len(), names.len());
        let mut p = params!(CUpti_Profiler_Host_EvaluateToGpuValues_Params, pMetricValues);
        p.pHostObject = self.obj;
        p.pCounterDataImage = image.as_ptr();
        p.counterDataImageSize = image.len();
        p.rangeIndex = index;
        p.ppMetricNames = names.ptr();
        p.numMetrics = names.len().min(out.len());
        p.pMetricValues = out.as_mut_ptr();
        // Safety: out has room for numMetrics doubles.
        self.cupti.check("cuptiProfilerHostEvaluateToGpuValues", unsafe {
            self.cupti.lib.cuptiProfilerHostEvaluateToGpuValues(&mut p)
        })
    }
}

impl Drop for Host<'_> {
    fn drop(&mut self) {
        let mut p = params!(CUpti_Profiler_Host_Deinitialize_Params, pHostObject);
        p.pHostObject = self.obj;
        // Safety: the object came from cuptiProfilerHostInitialize and is not used after this.
        let _ = unsafe { self.cupti.lib.cuptiProfilerHostDeinitialize(&mut p) };
    }
}

/// Why a decode stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeStop {
    /// The counter data image is full: evaluate, reinitialize and decode again.
    ImageFull,
    /// Everything in the hardware buffer was decoded.
    EndOfRecords,
    Other,
}

/// PM sampling enabled on one device.
pub struct PmSampling<'a> {
    cupti: &'a Cupti,
    obj: *mut sys::CUpti_PmSampling_Object,
    started: bool,
}

impl<'a> PmSampling<'a> {
    /// cuptiPmSamplingEnable: takes the device's performance monitor.
    pub fn enable(cupti: &'a Cupti, device: u32) -> Result<PmSampling<'a>> {
        let mut p = params!(CUpti_PmSampling_Enable_Params, pPmSamplingObject);
        p.deviceIndex = device as usize;
        // Safety: see the module comment.
        cupti.check("cuptiPmSamplingEnable", unsafe { cupti.lib.cuptiPmSamplingEnable(&mut p) })?;
        Ok(PmSampling { cupti, obj: p.pPmSamplingObject, started: false })
    }

    /// Sets the config image, the hardware buffer size and the interval (ns, time trigger).
    pub fn set_config(&self, config: &[u8], hw_buffer_bytes: usize, interval_ns: u64) -> Result<()> {
        let mut p = params!(CUpti_PmSampling_SetConfig_Params, hwBufferAppendMode);
        p.pPmSamplingObject = self.obj;
        p.configSize = config.len();
        p.pConfig = config.as_ptr();
        p.hardwareBufferSize = hw_buffer_bytes;
        p.samplingInterval = interval_ns;
        p.triggerMode = sys::CUPTI_PM_SAMPLING_TRIGGER_MODE_GPU_TIME_INTERVAL;
        p.hwBufferAppendMode = sys::CUPTI_PM_SAMPLING_HARDWARE_BUFFER_APPEND_MODE_KEEP_LATEST;
        // Safety: see the module comment; CUPTI copies the config image.
        self.cupti.check("cuptiPmSamplingSetConfig", unsafe { self.cupti.lib.cuptiPmSamplingSetConfig(&mut p) })
    }

    /// Size of a counter data image holding `max_samples` samples of `names`.
    pub fn counter_data_size(&self, names: &mut MetricNames, max_samples: u32) -> Result<usize> {
        let mut p = params!(CUpti_PmSampling_GetCounterDataSize_Params, counterDataSize);
        p.pPmSamplingObject = self.obj;
        p.pMetricNames = names.ptr();
        p.numMetrics = names.len();
        p.maxSamples = max_samples;
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingGetCounterDataSize", unsafe {
            self.cupti.lib.cuptiPmSamplingGetCounterDataSize(&mut p)
        })?;
        Ok(p.counterDataSize)
    }

    /// (Re)initializes a counter data image: empties it for the next decode.
    pub fn init_image(&self, image: &mut [u8]) -> Result<()> {
        let mut p = params!(CUpti_PmSampling_CounterDataImage_Initialize_Params, pCounterData);
        p.pPmSamplingObject = self.obj;
        p.counterDataSize = image.len();
        p.pCounterData = image.as_mut_ptr();
        // Safety: the image has the size CUPTI computed.
        self.cupti.check("cuptiPmSamplingCounterDataImageInitialize", unsafe {
            self.cupti.lib.cuptiPmSamplingCounterDataImageInitialize(&mut p)
        })
    }

    pub fn start(&mut self) -> Result<()> {
        let mut p = params!(CUpti_PmSampling_Start_Params, pPmSamplingObject);
        p.pPmSamplingObject = self.obj;
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingStart", unsafe { self.cupti.lib.cuptiPmSamplingStart(&mut p) })?;
        self.started = true;
        Ok(())
    }

    pub fn stop(&mut self) -> Result<()> {
        if !self.started {
            return Ok(());
        }
        self.started = false;
        let mut p = params!(CUpti_PmSampling_Stop_Params, pPmSamplingObject);
        p.pPmSamplingObject = self.obj;
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingStop", unsafe { self.cupti.lib.cuptiPmSamplingStop(&mut p) })
    }

    /// Decodes the hardware buffer into `image`; returns why it stopped and whether the
    /// hardware buffer overflowed.
    pub fn decode(&self, image: &mut [u8]) -> Result<(DecodeStop, bool)> {
        let mut p = params!(CUpti_PmSampling_DecodeData_Params, overflow);
        p.pPmSamplingObject = self.obj;
        p.pCounterDataImage = image.as_mut_ptr();
        p.counterDataImageSize = image.len();
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingDecodeData", unsafe { self.cupti.lib.cuptiPmSamplingDecodeData(&mut p) })?;
        let stop = match p.decodeStopReason {
            sys::CUPTI_PM_SAMPLING_DECODE_STOP_REASON_COUNTER_DATA_FULL => DecodeStop::ImageFull,
            sys::CUPTI_PM_SAMPLING_DECODE_STOP_REASON_END_OF_RECORDS => DecodeStop::EndOfRecords,
            _ => DecodeStop::Other,
        };
        Ok((stop, p.overflow != 0))
    }

    /// Completed samples in a decoded image.
    pub fn completed_samples(&self, image: &[u8]) -> Result<usize> {
        let mut p = params!(CUpti_PmSampling_GetCounterDataInfo_Params, numCompletedSamples);
        p.pCounterDataImage = image.as_ptr();
        p.counterDataImageSize = image.len();
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingGetCounterDataInfo", unsafe {
            self.cupti.lib.cuptiPmSamplingGetCounterDataInfo(&mut p)
        })?;
        Ok(p.numCompletedSamples)
    }

    /// Start and end timestamps (ns) of sample `index`.
    pub fn sample_times(&self, image: &[u8], index: usize) -> Result<(u64, u64)> {
        let mut p = params!(CUpti_PmSampling_CounterData_GetSampleInfo_Params, endTimestamp);
        p.pPmSamplingObject = self.obj;
        p.pCounterDataImage = image.as_ptr();
        p.counterDataImageSize = image.len();
        p.sampleIndex = index;
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingCounterDataGetSampleInfo", unsafe {
            self.cupti.lib.cuptiPmSamplingCounterDataGetSampleInfo(&mut p)
        })?;
        Ok((p.startTimestamp, p.endTimestamp))
    }
}

impl Drop for PmSampling<'_> {
    fn drop(&mut self) {
        let _ = self.stop();
        let mut p = params!(CUpti_PmSampling_Disable_Params, pPmSamplingObject);
        p.pPmSamplingObject = self.obj;
        // Safety: the object came from cuptiPmSamplingEnable and is not used after this.
        let _ = unsafe { self.cupti.lib.cuptiPmSamplingDisable(&mut p) };
    }
}

/// libcuda, loaded, with cuInit done.
pub struct Driver {
    lib: cuda::CudaDriver,
}

/// Facts about one device for the sampler's Hello.
#[derive(Debug, Clone, Default)]
pub struct DeviceFacts {
    pub name: String,
    pub uuid: String,
    pub pci_bus_id: String,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub sm_count: u32,
    pub memory_bytes: u64,
}

impl Driver {
    /// Loads libcuda.so.1 and calls cuInit(0).
    pub fn load() -> std::result::Result<Driver, String> {
        // Safety: loading the driver library runs its initializers only.
        let lib =
            unsafe { cuda::CudaDriver::new("libcuda.so.1") }.map_err(|e| format!("cannot load libcuda.so.1: {e}"))?;
        // Safety: cuInit takes a flags word.
        let r = unsafe { lib.cuInit(0) };
        if r != cuda::CUDA_SUCCESS {
            return Err(format!("cuInit failed with CUresult {r}"));
        }
        Ok(Driver { lib })
    }

    /// Number of CUDA devices.
    pub fn device_count(&self) -> u32 {
        let mut n = 0;
        // Safety: writes one int.
        let r = unsafe { self.lib.cuDeviceGetCount(&mut n) };
        if r == cuda::CUDA_SUCCESS { n.max(0) as u32 } else { 0 }
    }

    /// Name, UUID, PCI id, compute capability, SMs and memory of a device ordinal.
    pub fn facts(&self, ordinal: u32) -> std::result::Result<DeviceFacts, String> {
        let mut dev: cuda::CUdevice = 0;
        // Safety: writes one CUdevice.
        let r = unsafe { self.lib.cuDeviceGet(&mut dev, ordinal as i32) };
        if r != cuda::CUDA_SUCCESS {
            return Err(format!("cuDeviceGet({ordinal}) failed with CUresult {r}"));
        }
        let mut f = DeviceFacts::default();
        let mut name = [0 as c_char; 256];
        // Safety: the buffer length is passed.
        if unsafe { self.lib.cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev) } == cuda::CUDA_SUCCESS {
            // Safety: cuDeviceGetName writes a NUL-terminated string within the buffer.
            f.name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        }
        // Safety: CUuuid is 16 bytes, zeroed is valid.
        let mut uuid: cuda::CUuuid = unsafe { std::mem::zeroed() };
        // Safety: writes one CUuuid.
        if unsafe { self.lib.cuDeviceGetUuid_v2(&mut uuid, dev) } == cuda::CUDA_SUCCESS {
            let b: Vec<u8> = uuid.bytes.iter().map(|c| *c as u8).collect();
            f.uuid = format!(
                "GPU-{}-{}-{}-{}-{}",
                hex(&b[0..4]),
                hex(&b[4..6]),
                hex(&b[6..8]),
                hex(&b[8..10]),
                hex(&b[10..16])
            );
        }
        let mut bus = [0 as c_char; 64];
        // Safety: the buffer length is passed.
        if unsafe { self.lib.cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev) } == cuda::CUDA_SUCCESS {
            // Safety: NUL-terminated within the buffer.
            f.pci_bus_id = unsafe { CStr::from_ptr(bus.as_ptr()) }.to_string_lossy().to_lowercase();
        }
        let attr = |a: cuda::CUdevice_attribute| -> u32 {
            let mut v = 0;
            // Safety: writes one int.
            let r = unsafe { self.lib.cuDeviceGetAttribute(&mut v, a, dev) };
            if r == cuda::CUDA_SUCCESS { v.max(0) as u32 } else { 0 }
        };
        f.compute_major = attr(cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
        f.compute_minor = attr(cuda::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
        f.sm_count = attr(cuda::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        let mut mem = 0usize;
        // Safety: writes one size_t.
        if unsafe { self.lib.cuDeviceTotalMem_v2(&mut mem, dev) } == cuda::CUDA_SUCCESS {
            f.memory_bytes = mem as u64;
        }
        Ok(f)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
