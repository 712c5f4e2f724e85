//! NVML: the GPUs' inventory and the always-on device metrics (NVML counters, and GPM on Hopper
//! and later), none of which takes a GPU's performance monitor.
//!
//! [`Nvml`] is the one interface the daemon reads them through: [`real`] loads
//! `libnvidia-ml.so.1` at run time through `nvml-wrapper` (the daemon keeps running without it,
//! and says so), [`fake`] plays a script of devices and values (`metrics.fake_nvml`, for tests
//! on machines without a GPU).

pub mod fake;
mod real;

use serde::{Deserialize, Serialize};

use crate::config::MetricsConfig;

/// The start of every "no driver" message: GPU-only commands fail with it.
pub const NO_DRIVER: &str = "no NVIDIA driver found";

/// The one sentence the log and `gpuprofctl status` give when NVML cannot be loaded: `why` is
/// the loader's message (it names the library).
pub fn no_driver_text(why: &str) -> String {
    format!(
        "{NO_DRIVER} ({why}), so device metrics and GPU commands are off: install the NVIDIA driver, \
         or set metrics.nvml_library to its libnvidia-ml.so.1"
    )
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceInfo {
    /// NVML's index, the one `nvidia-smi` shows (PCI bus order).
    pub index: u32,
    /// "GPU-xxxxxxxx-...".
    pub uuid: String,
    pub name: String,
    /// "0000:1b:00.0" (the form used everywhere in gpuprof).
    pub pci_bus_id: String,
    pub memory_total_bytes: u64,
    /// "enabled", "disabled", or "" where MIG is not supported.
    pub mig_mode: String,
    /// Enforced power limit in watts (0: unknown).
    pub power_limit_watts: f64,
    pub compute_major: u32,
    pub compute_minor: u32,
    /// GPM (GPU Performance Monitoring, Hopper and later) works on this device.
    pub gpm_supported: bool,
}

/// Every GPU and the driver's versions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Inventory {
    pub driver_version: String,
    /// The CUDA version the driver supports, e.g. "13.0".
    pub cuda_version: String,
    pub devices: Vec<DeviceInfo>,
}

/// Where a sample point comes from (`PmSamplePoint.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Nvml,
    Gpm,
    CuptiPm,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Nvml => "nvml",
            Source::Gpm => "gpm",
            Source::CuptiPm => "cupti_pm",
        }
    }

    /// Parses a `--source` / `StreamPmSamplesRequest.sources` value.
    pub fn parse(s: &str) -> Option<Source> {
        match s.trim().to_ascii_lowercase().as_str() {
            "nvml" => Some(Source::Nvml),
            "gpm" => Some(Source::Gpm),
            "cupti_pm" | "cupti" => Some(Source::CuptiPm),
            _ => None,
        }
    }
}

/// Values of one source read from one device at one time.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub source: Source,
    /// (metric, value); names carry their unit (see [`METRICS`]).
    pub values: Vec<(&'static str, f64)>,
}

/// Every metric NVML and GPM readings may carry, with its source, whether it is a counter
/// (monotonic since the driver loaded) and its help text. A name ends in its unit.
pub const METRICS: &[(&str, Source, bool, &str)] = &[
    ("gpu_utilization_percent", Source::Nvml, false, "Time a kernel was running over the driver's last period (NVML)."),
    ("memory_copy_utilization_percent", Source::Nvml, false, "Time device memory was read or written (NVML)."),
    ("memory_used_bytes", Source::Nvml, false, "Device memory in use."),
    ("memory_total_bytes", Source::Nvml, false, "Device memory installed."),
    ("power_usage_watts", Source::Nvml, false, "Power draw."),
    ("power_limit_watts", Source::Nvml, false, "Enforced power limit."),
    ("sm_clock_hertz", Source::Nvml, false, "SM clock."),
    ("memory_clock_hertz", Source::Nvml, false, "Memory clock."),
    ("temperature_celsius", Source::Nvml, false, "GPU die temperature."),
    ("clocks_event_reasons", Source::Nvml, false, "Bit mask of why clocks are held down (NVML throttle reasons)."),
    ("ecc_errors_corrected_total", Source::Nvml, true, "Corrected ECC errors since the driver loaded."),
    ("ecc_errors_uncorrected_total", Source::Nvml, true, "Uncorrected ECC errors since the driver loaded."),
    ("xid_errors_total", Source::Nvml, true, "Critical XID events seen since gpuprofd started."),
    ("xid_last", Source::Nvml, false, "The last critical XID error code seen (0: none)."),
    ("graphics_active_percent", Source::Gpm, false, "Time any warp was active on an SM, averaged over SMs (GPM)."),
    ("sm_active_percent", Source::Gpm, false, "Time each SM had at least one warp assigned, averaged over SMs (GPM)."),
    ("sm_occupancy_percent", Source::Gpm, false, "Warps resident relative to the maximum, averaged over SMs (GPM)."),
    ("tensor_active_percent", Source::Gpm, false, "Time any tensor pipe was active (GPM)."),
    ("fp64_active_percent", Source::Gpm, false, "FP64 pipe utilization (GPM)."),
    ("fp32_active_percent", Source::Gpm, false, "FP32 pipe utilization (GPM)."),
    ("fp16_active_percent", Source::Gpm, false, "FP16 pipe utilization (GPM)."),
    ("dram_active_percent", Source::Gpm, false, "DRAM bandwidth used relative to the peak (GPM)."),
    ("pcie_tx_bytes_per_second", Source::Gpm, false, "PCIe bytes sent by the GPU (GPM)."),
    ("pcie_rx_bytes_per_second", Source::Gpm, false, "PCIe bytes received by the GPU (GPM)."),
    ("nvlink_tx_bytes_per_second", Source::Gpm, false, "NVLink bytes sent, all links (GPM)."),
    ("nvlink_rx_bytes_per_second", Source::Gpm, false, "NVLink bytes received, all links (GPM)."),
];

/// The `METRICS` entry of a name.
pub fn metric(name: &str) -> Option<&'static (&'static str, Source, bool, &'static str)> {
    METRICS.iter().find(|m| m.0 == name)
}

/// The daemon's view of NVML: the real library or a script.
pub trait Nvml: Send {
    /// The GPUs, in NVML index order, and the driver's versions.
    fn inventory(&self) -> Inventory;
    /// Reads device `index` now: its NVML values, and (where GPM works) GPM values over the
    /// time since the previous call for it (none at the first call). Values a device does not
    /// support are left out.
    fn read(&mut self, index: u32) -> Vec<Reading>;
}

/// Opens NVML as configured: the script of `metrics.fake_nvml`, else the real library.
/// The error says that no driver was found and why, in words for the log and for clients.
pub fn open(cfg: &MetricsConfig) -> Result<Box<dyn Nvml>, String> {
    if !cfg.fake_nvml.is_empty() {
        return fake::Fake::load(std::path::Path::new(&cfg.fake_nvml)).map(|f| Box::new(f) as Box<dyn Nvml>);
    }
    real::Real::open(&cfg.nvml_library, cfg.gpm).map(|r| Box::new(r) as Box<dyn Nvml>)
}

/// "00000000:1B:00.0" (NVML) → "0000:1b:00.0".
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
        _ => id,
    }
}

/// 13000 → "13.0".
pub fn cuda_version(v: i32) -> String {
    if v <= 0 { String::new() } else { format!("{}.{}", v / 1000, (v % 1000) / 10) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_versions() {
        assert_eq!(normalize_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("0000:c1:00.0"), "0000:c1:00.0");
        assert_eq!(cuda_version(13000), "13.0");
        assert_eq!(cuda_version(12040), "12.4");
        assert_eq!(Source::parse("cupti"), Some(Source::CuptiPm));
        for (name, _, counter, _) in METRICS {
            assert_eq!(name.ends_with("_total"), *counter, "{name}: counters and only counters end in _total");
        }
    }
}
