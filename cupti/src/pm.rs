//! A safe layer over the CUPTI PM sampling and profiler-host API (device-wide, no CUDA context
//! needed), used by the per-GPU sampler process `gpuprof-sampler`. Call
//! [`Cupti::check_pm_sampling`] once after loading: the functions here expect their symbols.
//!
//! Every CUPTI call takes a parameter struct whose first field is its own size; [`params!`]
//! builds one zeroed with that size set. Handles ([`Host`], [`PmSampling`]) end their CUPTI
//! object in `Drop`.
// Safety: this module is the FFI boundary. Each unsafe block calls a function from a table
// resolved by libloading (checked by `check_pm_sampling`) with a parameter struct that
// lives across the call and pointers into buffers that outlive it; CUPTI writes only the
// [out] fields of the struct and into buffers whose sizes we pass.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char};

use crate::error::{CuptiError, check_call};
use crate::loader::Cupti;
use crate::sys::cupti as sys;

pub type Result<T> = std::result::Result<T, CuptiError>;

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

/// Symbols PM sampling needs beyond the loader's own (`cuptiGetVersion`,
/// `cuptiGetResultString`); checked by [`Cupti::check_pm_sampling`].
impl Cupti {
    /// Fails naming the first PM-sampling or profiler-host function this libcupti lacks.
    pub fn check_pm_sampling(&self) -> std::result::Result<(), String> {
        let r = &self.raw;
        let have = [
            ("cuptiProfilerInitialize", r.cuptiProfilerInitialize.is_ok()),
            ("cuptiProfilerDeInitialize", r.cuptiProfilerDeInitialize.is_ok()),
            ("cuptiDeviceGetChipName", r.cuptiDeviceGetChipName.is_ok()),
            ("cuptiPmSamplingGetCounterAvailability", r.cuptiPmSamplingGetCounterAvailability.is_ok()),
            ("cuptiProfilerHostInitialize", r.cuptiProfilerHostInitialize.is_ok()),
            ("cuptiProfilerHostDeinitialize", r.cuptiProfilerHostDeinitialize.is_ok()),
            ("cuptiProfilerHostConfigAddMetrics", r.cuptiProfilerHostConfigAddMetrics.is_ok()),
            ("cuptiProfilerHostGetConfigImageSize", r.cuptiProfilerHostGetConfigImageSize.is_ok()),
            ("cuptiProfilerHostGetConfigImage", r.cuptiProfilerHostGetConfigImage.is_ok()),
            ("cuptiProfilerHostGetNumOfPasses", r.cuptiProfilerHostGetNumOfPasses.is_ok()),
            ("cuptiProfilerHostEvaluateToGpuValues", r.cuptiProfilerHostEvaluateToGpuValues.is_ok()),
            ("cuptiPmSamplingEnable", r.cuptiPmSamplingEnable.is_ok()),
            ("cuptiPmSamplingDisable", r.cuptiPmSamplingDisable.is_ok()),
            ("cuptiPmSamplingSetConfig", r.cuptiPmSamplingSetConfig.is_ok()),
            ("cuptiPmSamplingGetCounterDataSize", r.cuptiPmSamplingGetCounterDataSize.is_ok()),
            ("cuptiPmSamplingCounterDataImageInitialize", r.cuptiPmSamplingCounterDataImageInitialize.is_ok()),
            ("cuptiPmSamplingStart", r.cuptiPmSamplingStart.is_ok()),
            ("cuptiPmSamplingStop", r.cuptiPmSamplingStop.is_ok()),
            ("cuptiPmSamplingDecodeData", r.cuptiPmSamplingDecodeData.is_ok()),
            ("cuptiPmSamplingGetCounterDataInfo", r.cuptiPmSamplingGetCounterDataInfo.is_ok()),
            ("cuptiPmSamplingCounterDataGetSampleInfo", r.cuptiPmSamplingCounterDataGetSampleInfo.is_ok()),
        ];
        match have.iter().find(|(_, ok)| !ok) {
            Some((name, _)) => Err(format!("{} lacks {name}: PM sampling needs CUPTI 13.0 or later", self.path())),
            None => Ok(()),
        }
    }

    fn check(&self, call: &'static str, r: sys::CUptiResult) -> Result<()> {
        check_call(call, r)
    }

    /// cuptiProfilerInitialize: needed before chip names and the host API.
    pub fn profiler_initialize(&self) -> Result<()> {
        let mut p = params!(CUpti_Profiler_Initialize_Params, pPriv);
        // Safety: see the module comment.
        self.check("cuptiProfilerInitialize", unsafe { self.raw.cuptiProfilerInitialize(&mut p) })
    }

    /// cuptiProfilerDeInitialize.
    pub fn profiler_deinitialize(&self) -> Result<()> {
        let mut p = params!(CUpti_Profiler_DeInitialize_Params, pPriv);
        // Safety: see the module comment.
        self.check("cuptiProfilerDeInitialize", unsafe { self.raw.cuptiProfilerDeInitialize(&mut p) })
    }

    /// The chip name of a device, e.g. "GH100".
    pub fn chip_name(&self, device: u32) -> Result<String> {
        let mut p = params!(CUpti_Device_GetChipName_Params, pChipName);
        p.deviceIndex = device as usize;
        // Safety: see the module comment; pChipName points to a string owned by CUPTI.
        self.check("cuptiDeviceGetChipName", unsafe { self.raw.cuptiDeviceGetChipName(&mut p) })?;
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
            self.raw.cuptiPmSamplingGetCounterAvailability(&mut p)
        })?;
        let mut img = vec![0u8; p.counterAvailabilityImageSize];
        p.pCounterAvailabilityImage = img.as_mut_ptr();
        // Safety: the buffer has the size CUPTI asked for.
        self.check("cuptiPmSamplingGetCounterAvailability", unsafe {
            self.raw.cuptiPmSamplingGetCounterAvailability(&mut p)
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
        cupti.check("cuptiProfilerHostInitialize", unsafe { cupti.raw.cuptiProfilerHostInitialize(&mut p) })?;
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
            self.cupti.raw.cuptiProfilerHostConfigAddMetrics(&mut p)
        })
    }

    /// The config image for the metrics added so far.
    pub fn config_image(&self) -> Result<Vec<u8>> {
        let mut s = params!(CUpti_Profiler_Host_GetConfigImageSize_Params, configImageSize);
        s.pHostObject = self.obj;
        // Safety: see the module comment.
        self.cupti.check("cuptiProfilerHostGetConfigImageSize", unsafe {
            self.cupti.raw.cuptiProfilerHostGetConfigImageSize(&mut s)
        })?;
        let mut img = vec![0u8; s.configImageSize];
        let mut p = params!(CUpti_Profiler_Host_GetConfigImage_Params, pConfigImage);
        p.pHostObject = self.obj;
        p.configImageSize = img.len();
        p.pConfigImage = img.as_mut_ptr();
        // Safety: the buffer has the size CUPTI reported.
        self.cupti.check("cuptiProfilerHostGetConfigImage", unsafe {
            self.cupti.raw.cuptiProfilerHostGetConfigImage(&mut p)
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
            self.cupti.raw.cuptiProfilerHostGetNumOfPasses(&mut p)
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
            self.cupti.raw.cuptiProfilerHostEvaluateToGpuValues(&mut p)
        })
    }
}

impl Drop for Host<'_> {
    fn drop(&mut self) {
        let mut p = params!(CUpti_Profiler_Host_Deinitialize_Params, pHostObject);
        p.pHostObject = self.obj;
        // Safety: the object came from cuptiProfilerHostInitialize and is not used after this.
        let _ = unsafe { self.cupti.raw.cuptiProfilerHostDeinitialize(&mut p) };
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
        cupti.check("cuptiPmSamplingEnable", unsafe { cupti.raw.cuptiPmSamplingEnable(&mut p) })?;
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
        self.cupti.check("cuptiPmSamplingSetConfig", unsafe { self.cupti.raw.cuptiPmSamplingSetConfig(&mut p) })
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
            self.cupti.raw.cuptiPmSamplingGetCounterDataSize(&mut p)
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
            self.cupti.raw.cuptiPmSamplingCounterDataImageInitialize(&mut p)
        })
    }

    pub fn start(&mut self) -> Result<()> {
        let mut p = params!(CUpti_PmSampling_Start_Params, pPmSamplingObject);
        p.pPmSamplingObject = self.obj;
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingStart", unsafe { self.cupti.raw.cuptiPmSamplingStart(&mut p) })?;
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
        self.cupti.check("cuptiPmSamplingStop", unsafe { self.cupti.raw.cuptiPmSamplingStop(&mut p) })
    }

    /// Decodes the hardware buffer into `image`; returns why it stopped and whether the
    /// hardware buffer overflowed.
    pub fn decode(&self, image: &mut [u8]) -> Result<(DecodeStop, bool)> {
        let mut p = params!(CUpti_PmSampling_DecodeData_Params, overflow);
        p.pPmSamplingObject = self.obj;
        p.pCounterDataImage = image.as_mut_ptr();
        p.counterDataImageSize = image.len();
        // Safety: see the module comment.
        self.cupti.check("cuptiPmSamplingDecodeData", unsafe { self.cupti.raw.cuptiPmSamplingDecodeData(&mut p) })?;
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
            self.cupti.raw.cuptiPmSamplingGetCounterDataInfo(&mut p)
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
            self.cupti.raw.cuptiPmSamplingCounterDataGetSampleInfo(&mut p)
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
        let _ = unsafe { self.cupti.raw.cuptiPmSamplingDisable(&mut p) };
    }
}
