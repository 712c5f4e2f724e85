//! NCCL's profiler plugin interface, as far as gpuprof uses it: the `ncclProfiler_v4` (NCCL
//! 2.27) and `ncclProfiler_v5` (NCCL 2.28) tables and the parts of their event descriptors read
//! for collectives (NCCL's `plugins/profiler` headers; NCCL looks for these symbols in the
//! library `NCCL_PROFILER_PLUGIN` names). Declarations only: the calls are in `exports.rs`.

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t` values the plugin returns.
pub const NCCL_SUCCESS: c_int = 0;
pub const NCCL_INTERNAL_ERROR: c_int = 3;

/// Event types (`eDescr->type`, `eActivationMask` bits).
pub const PROFILE_COLL: u64 = 1 << 1;
pub const PROFILE_KERNEL_CH: u64 = 1 << 6;

/// `ncclProfilerKernelChStop`: the state a kernel channel event's end arrives with.
pub const KERNEL_CH_STOP: c_int = 22;

/// The head of an event descriptor: in v4 `type` is a `uint8_t` (then padding), in v5 a
/// `uint64_t`; either way `parentObj` is at byte 8, `rank` at 16 and the union that follows at
/// 24, so one layout per variant serves both versions. `ty` is read as the version's width,
/// field by field through the pointer (see `exports.rs`).
#[repr(C)]
pub struct Head {
    pub ty: u64,
    pub parent: *mut c_void,
    pub rank: c_int,
}

/// `eDescr->coll` (the same fields in v4 and v5; v5 adds `parentGroup` after them).
#[repr(C)]
pub struct Coll {
    pub seq: u64,
    pub func: *const c_char,
    pub send_buff: *const c_void,
    pub recv_buff: *mut c_void,
    pub count: usize,
    pub root: c_int,
    pub datatype: *const c_char,
    pub n_channels: u8,
    pub n_warps: u8,
    pub algo: *const c_char,
    pub proto: *const c_char,
}

/// `eDescr->kernelCh`.
#[repr(C)]
pub struct KernelCh {
    pub channel_id: u8,
    pub p_timer: u64,
}

/// A descriptor read as one variant of its union.
#[repr(C)]
pub struct Descr<T> {
    pub head: Head,
    pub u: T,
}

/// `ncclProfilerEventStateArgs_v4/v5_t`, its `kernelCh` member (at the union's start).
#[repr(C)]
pub struct StateArgsKernelCh {
    pub p_timer: u64,
}

/// NCCL's logger (unused: gpuprof logs through its own log).
pub type Logger = *const c_void;

pub type InitV4 = extern "C" fn(
    context: *mut *mut c_void,
    mask: *mut c_int,
    comm_name: *const c_char,
    comm_hash: u64,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: Logger,
) -> c_int;
pub type InitV5 = extern "C" fn(
    context: *mut *mut c_void,
    comm_id: u64,
    mask: *mut c_int,
    comm_name: *const c_char,
    n_nodes: c_int,
    nranks: c_int,
    rank: c_int,
    log: Logger,
) -> c_int;
pub type StartEvent = extern "C" fn(context: *mut c_void, handle: *mut *mut c_void, descr: *mut c_void) -> c_int;
pub type StopEvent = extern "C" fn(handle: *mut c_void) -> c_int;
pub type RecordEventState = extern "C" fn(handle: *mut c_void, state: c_int, args: *mut c_void) -> c_int;
pub type Finalize = extern "C" fn(context: *mut c_void) -> c_int;

/// `ncclProfiler_v4_t` / `ncclProfiler_v5_t`: a name and five entry points.
#[repr(C)]
pub struct Profiler<I> {
    pub name: *const c_char,
    pub init: I,
    pub start_event: StartEvent,
    pub stop_event: StopEvent,
    pub record_event_state: RecordEventState,
    pub finalize: Finalize,
}
