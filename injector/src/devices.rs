//! The process's GPUs as the CUDA driver reports them, for the hello: queried from the
//! injector's own thread through the driver library the process already loaded (never a
//! second copy, never from inside `cuInit`).

use std::time::Duration;

use gpuprof_cupti::device::Driver;
use gpuprof_proto::agent as pb;

/// Lists devices, waiting up to `wait` for `cuInit` (which is running on the application's
/// thread when the driver calls `InitializeInjection`) to finish.
pub fn query(wait: Duration) -> Vec<pb::Device> {
    let Some(driver) = Driver::already_loaded() else { return Vec::new() };
    driver
        .all(wait)
        .into_iter()
        .map(|f| pb::Device {
            id: f.ordinal,
            uuid: f.uuid,
            name: f.name,
            compute_major: f.compute_major,
            compute_minor: f.compute_minor,
            sm_count: f.sm_count,
            global_memory_bytes: f.memory_bytes,
            pci_bus_id: f.pci_bus_id,
        })
        .collect()
}
