//! PC sampling (`cupti_pcsampling.h`): continuous warp-state sampling per context, the buffers
//! CUPTI fills, cubin CRCs and SASS-to-source correlation.
//!
//! Every call takes the context explicitly; CUPTI's documented order is enable, then configure
//! (period, stall reasons, buffers, continuous mode, no start/stop control, the buffer CUPTI
//! fills at disable), then `GetData` periodically, then disable. `GetData` never synchronizes
//! the device.
// Safety: this module is the FFI boundary for PC sampling; each unsafe block calls a function
// of the loaded table (checked present first) with arguments whose validity is stated next to it.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_void};
use std::mem::{offset_of, size_of};

use crate::callback::Context;
use crate::error::{CuptiError, check_call};
use crate::loader::Cupti;
use crate::sys::cupti as sys;

/// `CUPTI_PCSAMPLING_STRUCT_SIZE(type, last)`: what CUPTI expects in a params struct's `size`.
macro_rules! params_size {
    ($t:ty, $last:ident) => {{
        // Safety: the params structs are plain C data; all-zero is a valid value.
        let probe: $t = unsafe { std::mem::zeroed() };
        offset_of!($t, $last) + std::mem::size_of_val(&{ probe.$last })
    }};
}

/// The stall reasons a context's device reports: CUPTI's index and name of each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StallReasons {
    pub index: Vec<u32>,
    pub names: Vec<String>,
}

impl StallReasons {
    /// The name of stall reason `index` ("" if unknown).
    pub fn name(&self, index: u32) -> &str {
        self.index.iter().position(|&i| i == index).map_or("", |p| self.names[p].as_str())
    }
}

/// How to configure PC sampling on a context.
#[derive(Debug, Clone, Default)]
pub struct PcConfig {
    /// Period as a power of two of SM cycles (5..31).
    pub period_log2: u32,
    /// Stall reason indexes to collect (empty: all).
    pub stall_index: Vec<u32>,
    /// Scratch and hardware buffer sizes in bytes (0: CUPTI's default).
    pub scratch_bytes: usize,
    pub hw_bytes: usize,
    /// How long CUPTI's decoding threads sleep between passes, in ms (0: CUPTI's default, 100).
    pub worker_sleep_ms: u32,
    /// Sampling runs only between [`Cupti::pc_start`] and [`Cupti::pc_stop`] (false: from the
    /// configuration until disable).
    pub start_stop: bool,
}

/// One sampled PC of a [`PcBuffer`].
#[derive(Debug, Clone, Copy)]
pub struct PcRecord<'a> {
    pub cubin_crc: u64,
    pub pc_offset: u64,
    pub function_index: u32,
    /// CUPTI's string for the function name (the same for every record of the function).
    pub function_name: FunctionName,
    /// (stall reason index, samples).
    pub stalls: &'a [sys::CUpti_PCSamplingStallReason],
}

/// A function name CUPTI gave a PC record: a NUL-terminated string that lives for the rest of
/// the process (CUPTI leaves it to the client to free, which gpuprof never does), or none.
/// Only made from a [`PcRecord`]; cheap to copy, compare and hash (by address).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionName(usize);

impl FunctionName {
    /// Whether CUPTI gave no name.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The name (empty when CUPTI gave none).
    pub fn c_str(self) -> &'static CStr {
        if self.0 == 0 {
            return c"";
        }
        // Safety: a FunctionName is only made from CUPTI's `functionName` of a PC record, a
        // NUL-terminated string never freed (see the type's doc).
        unsafe { CStr::from_ptr(self.0 as *const c_char) }
    }
}

/// A buffer CUPTI fills with parsed PC data: `num_pcs` PCs with room for every stall reason.
pub struct PcBuffer {
    data: Box<sys::CUpti_PCSamplingData>,
    pcs: Vec<sys::CUpti_PCSamplingPCData>,
    stalls: Vec<Vec<sys::CUpti_PCSamplingStallReason>>,
}

// Safety: the buffer owns its memory; CUPTI writes it only during calls made with it.
unsafe impl Send for PcBuffer {}

impl PcBuffer {
    pub fn new(num_pcs: usize, num_stall_reasons: usize) -> PcBuffer {
        let mut stalls: Vec<Vec<sys::CUpti_PCSamplingStallReason>> = (0..num_pcs)
            .map(|_| {
                vec![sys::CUpti_PCSamplingStallReason { pcSamplingStallReasonIndex: 0, samples: 0 }; num_stall_reasons]
            })
            .collect();
        let mut pcs: Vec<sys::CUpti_PCSamplingPCData> = stalls
            .iter_mut()
            .map(|s| {
                // Safety: a plain C struct of integers and pointers; all-zero is valid.
                let mut pc: sys::CUpti_PCSamplingPCData = unsafe { std::mem::zeroed() };
                pc.size = size_of::<sys::CUpti_PCSamplingPCData>();
                pc.stallReason = s.as_mut_ptr();
                pc
            })
            .collect();
        // Safety: as above.
        let mut data: Box<sys::CUpti_PCSamplingData> = Box::new(unsafe { std::mem::zeroed() });
        data.size = size_of::<sys::CUpti_PCSamplingData>();
        data.collectNumPcs = num_pcs;
        data.pPcData = pcs.as_mut_ptr();
        PcBuffer { data, pcs, stalls }
    }

    pub(crate) fn as_ptr(&mut self) -> *mut c_void {
        &mut *self.data as *mut sys::CUpti_PCSamplingData as *mut c_void
    }

    /// Samples taken since the last read (user, non-user and dropped).
    pub fn total_samples(&self) -> u64 {
        self.data.totalSamples
    }
    /// Samples the hardware dropped since the last read.
    pub fn dropped_samples(&self) -> u64 {
        self.data.droppedSamples
    }
    /// Samples in kernels CUPTI gives no records for (e.g. the driver's own).
    pub fn non_user_samples(&self) -> u64 {
        self.data.nonUsrKernelsTotalSamples
    }
    /// PCs CUPTI still holds after this read (read again at once while > 0).
    pub fn remaining_pcs(&self) -> usize {
        self.data.remainingNumPcs
    }
    /// Whether CUPTI reported the hardware buffer full.
    pub fn hardware_buffer_full(&self) -> bool {
        self.data.hardwareBufferFull != 0
    }

    /// The PCs of the last read.
    pub fn records(&self) -> impl Iterator<Item = PcRecord<'_>> {
        let n = self.data.totalNumPcs.min(self.pcs.len());
        self.pcs[..n].iter().zip(&self.stalls).map(|(pc, st)| PcRecord {
            cubin_crc: pc.cubinCrc,
            pc_offset: pc.pcOffset,
            function_index: pc.functionIndex,
            function_name: FunctionName(pc.functionName as usize),
            stalls: &st[..pc.stallReasonCount.min(st.len())],
        })
    }

    /// Marks the buffer empty before it is handed to CUPTI again.
    fn reset(&mut self) {
        self.data.totalNumPcs = 0;
        self.data.remainingNumPcs = 0;
        self.data.totalSamples = 0;
        self.data.droppedSamples = 0;
        self.data.nonUsrKernelsTotalSamples = 0;
        self.data.hardwareBufferFull = 0;
    }
}

impl Cupti {
    fn pc_fn<T>(&self, f: &Result<T, libloading::Error>) -> Result<(), CuptiError> {
        f.as_ref().map(|_| ()).map_err(|_| CuptiError::new(sys::CUPTI_ERROR_NOT_SUPPORTED))
    }

    /// `cuptiPCSamplingEnable(ctx)`.
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context.
    pub(crate) unsafe fn pc_enable(&self, ctx: Context) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingEnable)?;
        let mut p = sys::CUpti_PCSamplingEnableParams {
            size: params_size!(sys::CUpti_PCSamplingEnableParams, ctx),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
        };
        // Safety: `p` is a valid params struct for the duration of the call.
        check_call("cuptiPCSamplingEnable", unsafe { self.raw.cuptiPCSamplingEnable(&mut p) })
    }

    /// `cuptiPCSamplingDisable(ctx)`: ends sampling on the context and writes the PCs it still
    /// had into the buffer given at configuration.
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context on which sampling was enabled.
    pub(crate) unsafe fn pc_disable(&self, ctx: Context) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingDisable)?;
        let mut p = sys::CUpti_PCSamplingDisableParams {
            size: params_size!(sys::CUpti_PCSamplingDisableParams, ctx),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
        };
        // Safety: as for `pc_enable`.
        check_call("cuptiPCSamplingDisable", unsafe { self.raw.cuptiPCSamplingDisable(&mut p) })
    }

    /// `cuptiPCSamplingStart(ctx)`: opens a sampling range (start/stop control configured).
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context on which sampling was enabled and configured with
    /// [`PcConfig::start_stop`].
    pub(crate) unsafe fn pc_start(&self, ctx: Context) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingStart)?;
        let mut p = sys::CUpti_PCSamplingStartParams {
            size: params_size!(sys::CUpti_PCSamplingStartParams, ctx),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
        };
        // Safety: as for `pc_enable`.
        check_call("cuptiPCSamplingStart", unsafe { self.raw.cuptiPCSamplingStart(&mut p) })
    }

    /// `cuptiPCSamplingStop(ctx)`: closes the range; what it sampled is read with
    /// [`Cupti::pc_get_data`].
    ///
    /// # Safety
    /// As for [`Cupti::pc_start`].
    pub(crate) unsafe fn pc_stop(&self, ctx: Context) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingStop)?;
        let mut p = sys::CUpti_PCSamplingStopParams {
            size: params_size!(sys::CUpti_PCSamplingStopParams, ctx),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
        };
        // Safety: as for `pc_enable`.
        check_call("cuptiPCSamplingStop", unsafe { self.raw.cuptiPCSamplingStop(&mut p) })
    }

    /// The stall reasons of `ctx`'s device.
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context on which sampling was enabled.
    pub(crate) unsafe fn pc_stall_reasons(&self, ctx: Context) -> Result<StallReasons, CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingGetNumStallReasons)?;
        let mut n: usize = 0;
        let mut p = sys::CUpti_PCSamplingGetNumStallReasonsParams {
            size: params_size!(sys::CUpti_PCSamplingGetNumStallReasonsParams, numStallReasons),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
            numStallReasons: &mut n,
        };
        // Safety: valid params with a valid out pointer.
        check_call("cuptiPCSamplingGetNumStallReasons", unsafe { self.raw.cuptiPCSamplingGetNumStallReasons(&mut p) })?;
        let width = sys::CUPTI_STALL_REASON_STRING_SIZE as usize;
        let mut index = vec![0u32; n];
        let mut storage = vec![0 as c_char; n * width];
        let mut names: Vec<*mut c_char> = (0..n).map(|i| storage[i * width..].as_mut_ptr()).collect();
        let mut q = sys::CUpti_PCSamplingGetStallReasonsParams {
            size: params_size!(sys::CUpti_PCSamplingGetStallReasonsParams, stallReasons),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
            numStallReasons: n,
            stallReasonIndex: index.as_mut_ptr(),
            stallReasons: names.as_mut_ptr(),
        };
        // Safety: `n` index slots and `n` name buffers of CUPTI_STALL_REASON_STRING_SIZE bytes.
        check_call("cuptiPCSamplingGetStallReasons", unsafe { self.raw.cuptiPCSamplingGetStallReasons(&mut q) })?;
        let names = (0..n)
            .map(|i| {
                let s = &storage[i * width..(i + 1) * width];
                let end = s.iter().position(|&c| c == 0).unwrap_or(width);
                let bytes: Vec<u8> = s[..end].iter().map(|&c| c as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            })
            .collect();
        Ok(StallReasons { index, names })
    }

    /// Configures continuous-mode sampling on `ctx` (with start/stop control when
    /// `cfg.start_stop`), parsed output, `at_disable` as the buffer CUPTI fills when sampling is
    /// disabled.
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context on which sampling was enabled; `at_disable` must stay
    /// alive and unmoved until sampling on `ctx` is disabled.
    pub(crate) unsafe fn pc_configure(
        &self,
        ctx: Context,
        cfg: &PcConfig,
        at_disable: &mut PcBuffer,
    ) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingSetConfigurationAttribute)?;
        let mut stall_index = cfg.stall_index.clone();
        let mut attrs: Vec<sys::CUpti_PCSamplingConfigurationInfo> = Vec::new();
        let mut push =
            |t: sys::CUpti_PCSamplingConfigurationAttributeType,
             fill: &dyn Fn(&mut sys::CUpti_PCSamplingConfigurationInfo__bindgen_ty_1)| {
                // Safety: plain C data; all-zero is valid.
                let mut a: sys::CUpti_PCSamplingConfigurationInfo = unsafe { std::mem::zeroed() };
                a.attributeType = t;
                fill(&mut a.attributeData);
                attrs.push(a);
            };
        push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE, &|d| {
            d.collectionModeData.collectionMode = sys::CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS
        });
        push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL, &|d| {
            d.enableStartStopControlData.enableStartStopControl = u32::from(cfg.start_stop)
        });
        push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_OUTPUT_DATA_FORMAT, &|d| {
            d.outputDataFormatData.outputDataFormat = sys::CUPTI_PC_SAMPLING_OUTPUT_DATA_FORMAT_PARSED
        });
        if cfg.period_log2 != 0 {
            push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD, &|d| {
                d.samplingPeriodData.samplingPeriod = cfg.period_log2
            });
        }
        if cfg.scratch_bytes != 0 {
            push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE, &|d| {
                d.scratchBufferSizeData.scratchBufferSize = cfg.scratch_bytes
            });
        }
        if cfg.hw_bytes != 0 {
            push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_HARDWARE_BUFFER_SIZE, &|d| {
                d.hardwareBufferSizeData.hardwareBufferSize = cfg.hw_bytes
            });
        }
        if cfg.worker_sleep_ms != 0 {
            push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_WORKER_THREAD_PERIODIC_SLEEP_SPAN, &|d| {
                d.workerThreadPeriodicSleepSpanData.workerThreadPeriodicSleepSpan = cfg.worker_sleep_ms
            });
        }
        if !stall_index.is_empty() {
            let (n, p) = (stall_index.len(), stall_index.as_mut_ptr());
            push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON, &|d| {
                d.stallReasonData.stallReasonCount = n;
                d.stallReasonData.pStallReasonIndex = p;
            });
        }
        let buf = at_disable.as_ptr();
        push(sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER, &|d| {
            d.samplingDataBufferData.samplingDataBuffer = buf
        });
        let mut p = sys::CUpti_PCSamplingConfigurationInfoParams {
            size: params_size!(sys::CUpti_PCSamplingConfigurationInfoParams, pPCSamplingConfigurationInfo),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
            numAttributes: attrs.len(),
            pPCSamplingConfigurationInfo: attrs.as_mut_ptr(),
        };
        // Safety: `attrs` and `stall_index` outlive the call (CUPTI copies the index list);
        // `at_disable` outlives sampling per this function's contract.
        let r = unsafe { self.raw.cuptiPCSamplingSetConfigurationAttribute(&mut p) };
        if let Err(e) = check_call("cuptiPCSamplingSetConfigurationAttribute", r) {
            // Name the attribute CUPTI refused, when it says.
            if let Some(a) = attrs.iter().find(|a| a.attributeStatus != sys::CUPTI_SUCCESS) {
                return Err(CuptiError { call: attr_name(a.attributeType), code: a.attributeStatus });
            }
            return Err(e);
        }
        Ok(())
    }

    /// `cuptiPCSamplingGetData(ctx)` into `buf` (emptied first). `CUPTI_ERROR_OUT_OF_MEMORY`
    /// with [`PcBuffer::hardware_buffer_full`] means the hardware buffer is stuck full.
    ///
    /// # Safety
    /// `ctx` must be a live CUDA context on which sampling is enabled.
    pub(crate) unsafe fn pc_get_data(&self, ctx: Context, buf: &mut PcBuffer) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiPCSamplingGetData)?;
        buf.reset();
        let mut p = sys::CUpti_PCSamplingGetDataParams {
            size: params_size!(sys::CUpti_PCSamplingGetDataParams, pcSamplingData),
            pPriv: std::ptr::null_mut(),
            ctx: ctx.raw(),
            pcSamplingData: buf.as_ptr(),
        };
        // Safety: `buf` is a PcBuffer laid out as CUPTI's parsed format.
        check_call("cuptiPCSamplingGetData", unsafe { self.raw.cuptiPCSamplingGetData(&mut p) })
    }

    /// CUPTI's CRC of a cubin (what PC records carry in `cubinCrc`).
    pub fn cubin_crc(&self, cubin: &[u8]) -> Result<u64, CuptiError> {
        self.pc_fn(&self.raw.cuptiGetCubinCrc)?;
        let mut p = sys::CUpti_GetCubinCrcParams {
            size: params_size!(sys::CUpti_GetCubinCrcParams, cubinCrc),
            cubinSize: cubin.len(),
            cubin: cubin.as_ptr() as *const c_void,
            cubinCrc: 0,
        };
        // Safety: the params point at `cubin`, alive for the call.
        check_call("cuptiGetCubinCrc", unsafe { self.raw.cuptiGetCubinCrc(&mut p) })?;
        Ok(p.cubinCrc)
    }

    /// The source file (directory joined) and line of `pc_offset` in `function` of `cubin`;
    /// `Ok(None)` when the cubin has no line information for it.
    pub fn sass_to_source(
        &self,
        cubin: &[u8],
        function: &CStr,
        pc_offset: u64,
    ) -> Result<Option<(String, u32)>, CuptiError> {
        self.pc_fn(&self.raw.cuptiGetSassToSourceCorrelation)?;
        let mut p = sys::CUpti_GetSassToSourceCorrelationParams {
            size: params_size!(sys::CUpti_GetSassToSourceCorrelationParams, dirName),
            cubin: cubin.as_ptr() as *const c_void,
            functionName: function.as_ptr(),
            cubinSize: cubin.len(),
            lineNumber: 0,
            pcOffset: pc_offset,
            fileName: std::ptr::null_mut(),
            dirName: std::ptr::null_mut(),
        };
        // Safety: the params point at `cubin` and `function`, alive for the call.
        let r = unsafe { self.raw.cuptiGetSassToSourceCorrelation(&mut p) };
        let take = |s: *mut c_char| -> String {
            if s.is_null() {
                return String::new();
            }
            // Safety: a NUL-terminated string CUPTI allocated with malloc for the caller, who
            // frees it (once, here).
            let v = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
            // Safety: freed once, by the caller, as CUPTI asks.
            unsafe { libc::free(s as *mut c_void) };
            v
        };
        let (file, dir) = (take(p.fileName), take(p.dirName));
        check_call("cuptiGetSassToSourceCorrelation", r)?;
        if file.is_empty() || p.lineNumber == 0 {
            return Ok(None);
        }
        let path = if dir.is_empty() || file.starts_with('/') {
            file
        } else {
            format!("{}/{file}", dir.trim_end_matches('/'))
        };
        Ok(Some((path, p.lineNumber)))
    }
}

/// A cubin's CRC, from its bytes (`None`: no answer).
pub type ComputeCrc = fn(&[u8]) -> Option<u64>;

/// The function CUPTI's compute-CRC callback hands each cubin to ([`Cupti::register_compute_crc`]).
static COMPUTE_CRC: std::sync::OnceLock<ComputeCrc> = std::sync::OnceLock::new();

/// CUPTI's compute-CRC callback: the cubin as a slice to the registered function, its answer
/// written back; nothing written when it has none, the arguments are null or it panics.
unsafe extern "C" fn compute_crc(cubin: *const c_void, size: usize, crc: *mut u64) {
    let _ = std::panic::catch_unwind(|| {
        let Some(f) = COMPUTE_CRC.get() else { return };
        if cubin.is_null() || size == 0 || crc.is_null() {
            return;
        }
        // Safety: CUPTI passes `size` bytes of cubin, valid during this call.
        let bytes = unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), size) };
        if let Some(v) = f(bytes) {
            // Safety: CUPTI's out pointer for the CRC, checked non-null above.
            unsafe { *crc = v };
        }
    });
}

impl Cupti {
    /// `cuptiRegisterComputeCrcCallback`: CUPTI asks for each loaded module's CRC, the one its
    /// PC records carry; `f` gets the cubin (valid during the call) and answers it. The first
    /// `f` given is kept for the process (registering again re-registers it, e.g. after a
    /// `cuptiFinalize`).
    pub fn register_compute_crc(&self, f: ComputeCrc) -> Result<(), CuptiError> {
        self.pc_fn(&self.raw.cuptiRegisterComputeCrcCallback)?;
        let _ = COMPUTE_CRC.set(f);
        // Safety: `compute_crc` is an `extern "C"` function with CUPTI's signature, living for
        // the process.
        check_call("cuptiRegisterComputeCrcCallback", unsafe {
            self.raw.cuptiRegisterComputeCrcCallback(Some(compute_crc))
        })
    }
}

fn attr_name(t: sys::CUpti_PCSamplingConfigurationAttributeType) -> &'static str {
    match t {
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD => "PC sampling attribute SAMPLING_PERIOD",
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON => "PC sampling attribute STALL_REASON",
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE => {
            "PC sampling attribute SCRATCH_BUFFER_SIZE"
        }
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_HARDWARE_BUFFER_SIZE => {
            "PC sampling attribute HARDWARE_BUFFER_SIZE"
        }
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE => "PC sampling attribute COLLECTION_MODE",
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL => {
            "PC sampling attribute ENABLE_START_STOP_CONTROL"
        }
        sys::CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER => {
            "PC sampling attribute SAMPLING_DATA_BUFFER"
        }
        _ => "cuptiPCSamplingSetConfigurationAttribute",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compute-CRC trampoline hands CUPTI's cubin to the registered function and writes its
    /// answer; null arguments, an empty cubin or no answer leave the CRC as it was.
    #[test]
    fn the_compute_crc_callback_answers_through_the_registered_function() {
        fn crc_of(cubin: &[u8]) -> Option<u64> {
            (cubin[0] != 0).then(|| cubin.iter().map(|&b| u64::from(b)).sum())
        }
        let _ = COMPUTE_CRC.set(crc_of);
        let cubin = [1u8, 2, 3];
        let mut crc = 7u64;
        // Safety: a valid cubin of 3 bytes and a valid out pointer, as CUPTI passes them.
        unsafe { compute_crc(cubin.as_ptr().cast(), cubin.len(), &mut crc) };
        assert_eq!(crc, 6);
        let mut crc = 7u64;
        // Safety: as above; the function has no answer for this cubin.
        unsafe { compute_crc([0u8, 5].as_ptr().cast(), 2, &mut crc) };
        assert_eq!(crc, 7, "no answer: the CRC is left alone");
        // Safety: null and empty arguments are refused before use.
        unsafe {
            compute_crc(std::ptr::null(), 3, &mut crc);
            compute_crc(cubin.as_ptr().cast(), 0, &mut crc);
            compute_crc(cubin.as_ptr().cast(), 3, std::ptr::null_mut());
        }
        assert_eq!(crc, 7);
    }

    #[test]
    fn a_buffer_points_each_pc_at_its_own_stall_array() {
        let b = PcBuffer::new(4, 3);
        assert_eq!(b.data.collectNumPcs, 4);
        assert_eq!(b.data.size, size_of::<sys::CUpti_PCSamplingData>());
        for (pc, st) in b.pcs.iter().zip(&b.stalls) {
            assert_eq!(pc.stallReason as *const _, st.as_ptr());
            assert_eq!(st.len(), 3);
        }
        assert_eq!(b.records().count(), 0, "nothing read yet");
    }

    #[test]
    fn params_sizes_match_the_header_macros() {
        // CUPTI_PCSAMPLING_STRUCT_SIZE(type, last field) for the structs with no tail padding.
        assert_eq!(params_size!(sys::CUpti_PCSamplingEnableParams, ctx), 24);
        assert_eq!(params_size!(sys::CUpti_GetCubinCrcParams, cubinCrc), 32);
        assert_eq!(params_size!(sys::CUpti_GetSassToSourceCorrelationParams, dirName), 64);
    }

    #[test]
    fn stall_names_by_index() {
        let s = StallReasons { index: vec![3, 7], names: vec!["a".into(), "b".into()] };
        assert_eq!(s.name(7), "b");
        assert_eq!(s.name(1), "");
    }
}
