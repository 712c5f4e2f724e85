//! `libgpuprof_inject.so`: the CUDA injection library of gpuprof.
//!
//! Loaded by the CUDA driver through `CUDA_INJECTION64_PATH` (the driver calls
//! [`exports::InitializeInjection`] inside `cuInit`) or by `LD_PRELOAD` (an ELF constructor
//! points `CUDA_INJECTION64_PATH` at this library). It loads libcupti at run time, says hello to
//! `gpuprofd` over the agent socket, and stays idle until the daemon pushes a start-trace for
//! this process; then it enables CUPTI activity kinds and streams records.
//!
//! Threads: the application's and CUPTI's threads only hand completed buffers over
//! ([`tracer`]); one background thread ([`agent`]) does all decoding, interning and socket I/O.
//! Layout of the code:
//! - CUPTI itself (bindings, loading, errors, device facts) is the `gpuprof-cupti` crate.
//! - [`records`]: safe decoding of CUPTI 13.0 record bytes; [`convert`]: protocol messages.
//! - [`tracer`]: buffer callbacks and the CUPTI backend; [`pool`]: activity buffers.
//! - [`agent`]: the background thread; [`lifecycle`]: init, atexit, fork; [`exports`]: C ABI.

pub mod agent;
pub mod cbids;
pub mod config;
pub mod convert;
pub mod devices;
pub mod exports;
pub mod fatbin;
pub mod lifecycle;
pub mod log;
pub mod nccl;
pub mod pool;
pub mod records;
pub mod socket_fd;
pub mod sys;
pub mod tracer;
