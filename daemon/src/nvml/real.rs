//! The real NVML, through `nvml-wrapper` (which loads `libnvidia-ml.so.1` at run time).

use std::collections::HashMap;

use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, GpmSample, Nvml as Lib};

use super::{DeviceInfo, Inventory, Reading, Source};

const MIB: f64 = 1_048_576.0;

/// GPM metrics read every time, with their names and scale (GPM's PCIe and NVLink rates are
/// MiB/s).
const GPM: &[(GpmMetricId, &str, f64)] = &[
    (GpmMetricId::GraphicsUtil, "graphics_active_percent", 1.0),
    (GpmMetricId::SmUtil, "sm_active_percent", 1.0),
    (GpmMetricId::SmOccupancy, "sm_occupancy_percent", 1.0),
    (GpmMetricId::AnyTensorUtil, "tensor_active_percent", 1.0),
    (GpmMetricId::Fp64Util, "fp64_active_percent", 1.0),
    (GpmMetricId::Fp32Util, "fp32_active_percent", 1.0),
    (GpmMetricId::Fp16Util, "fp16_active_percent", 1.0),
    (GpmMetricId::DramBwUtil, "dram_active_percent", 1.0),
    (GpmMetricId::PcieTxPerSec, "pcie_tx_bytes_per_second", MIB),
    (GpmMetricId::PcieRxPerSec, "pcie_rx_bytes_per_second", MIB),
    (GpmMetricId::NvlinkTotalTxPerSec, "nvlink_tx_bytes_per_second", MIB),
    (GpmMetricId::NvlinkTotalRxPerSec, "nvlink_rx_bytes_per_second", MIB),
];

pub struct Real {
    /// Loaded once for the life of the daemon (GPM samples and events borrow it).
    lib: &'static Lib,
    inventory: Inventory,
    gpm: bool,
    prev: HashMap<u32, GpmSample<'static>>,
    events: Option<EventSet<'static>>,
    /// Per device (by UUID): critical XID events seen and the last code.
    xid: HashMap<String, (u64, u64)>,
}

/// One sentence: what is missing, why (the loader's own words, which name the library), what
/// is off, and what to do.
fn no_driver(library: &str, e: &NvmlError) -> String {
    let lib = if library.is_empty() { "libnvidia-ml.so.1" } else { library };
    let why = match e {
        // dlopen's message starts with the library's name.
        NvmlError::LibloadingError(l) => l.to_string(),
        e => format!("{lib}: {e}"),
    };
    super::no_driver_text(&why)
}

impl Real {
    pub fn open(library: &str, gpm: bool) -> Result<Real, String> {
        let lib = if library.is_empty() {
            Lib::init()
        } else {
            Lib::builder().lib_path(std::ffi::OsStr::new(library)).init()
        }
        .map_err(|e| no_driver(library, &e))?;
        let lib: &'static Lib = Box::leak(Box::new(lib));
        let inventory = inventory(lib).map_err(|e| no_driver(library, &e))?;
        let events = lib.create_event_set().ok().map(|mut set| {
            for d in &inventory.devices {
                let Ok(dev) = lib.device_by_index(d.index) else { continue };
                let wanted = nvml_wrapper::bitmasks::event::EventTypes::CRITICAL_XID_ERROR;
                if !dev.supported_event_types().is_ok_and(|t| t.contains(wanted)) {
                    continue;
                }
                match dev.register_events(wanted, set) {
                    Ok(s) => set = s,
                    Err(e) => {
                        tracing::debug!(device = d.index, error = %e.error, "XID events not available");
                        return None;
                    }
                }
            }
            Some(set)
        });
        Ok(Real { lib, inventory, gpm, prev: HashMap::new(), events: events.flatten(), xid: HashMap::new() })
    }

    fn drain_events(&mut self) {
        let Some(set) = &self.events else { return };
        // Timeout 0: only what is queued now.
        while let Ok(ev) = set.wait(0) {
            let Ok(uuid) = ev.device.uuid() else { continue };
            let code = match ev.event_data {
                Some(nvml_wrapper::enums::event::XidError::Value(v)) => v,
                _ => 0,
            };
            let e = self.xid.entry(uuid).or_default();
            e.0 += 1;
            e.1 = code;
        }
    }
}

fn inventory(lib: &'static Lib) -> Result<Inventory, NvmlError> {
    let n = lib.device_count()?;
    let mut devices = Vec::new();
    for index in 0..n {
        let d = lib.device_by_index(index)?;
        let cc = d.cuda_compute_capability().ok();
        let (major, minor) = cc.map_or((0, 0), |c| (c.major.max(0) as u32, c.minor.max(0) as u32));
        devices.push(DeviceInfo {
            index,
            uuid: d.uuid().unwrap_or_default(),
            name: d.name().unwrap_or_default(),
            pci_bus_id: d.pci_info().map(|p| super::normalize_bus_id(&p.bus_id)).unwrap_or_default(),
            memory_total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            mig_mode: match d.mig_mode() {
                Ok(m) if m.current == 1 => "enabled".into(),
                Ok(_) => "disabled".into(),
                Err(_) => String::new(),
            },
            power_limit_watts: d.enforced_power_limit().map(|mw| f64::from(mw) / 1000.0).unwrap_or(0.0),
            compute_major: major,
            compute_minor: minor,
            gpm_supported: d.gpm_support().unwrap_or(false),
        });
    }
    Ok(Inventory {
        driver_version: lib.sys_driver_version().unwrap_or_default(),
        cuda_version: lib.sys_cuda_driver_version().map(super::cuda_version).unwrap_or_default(),
        devices,
    })
}

fn nvml_values(d: &Device<'_>, out: &mut Vec<(&'static str, f64)>) {
    let mut put = |name: &'static str, v: Option<f64>| {
        if let Some(v) = v {
            out.push((name, v));
        }
    };
    let util = d.utilization_rates().ok();
    put("gpu_utilization_percent", util.as_ref().map(|u| f64::from(u.gpu)));
    put("memory_copy_utilization_percent", util.as_ref().map(|u| f64::from(u.memory)));
    let mem = d.memory_info().ok();
    put("memory_used_bytes", mem.as_ref().map(|m| m.used as f64));
    put("memory_total_bytes", mem.as_ref().map(|m| m.total as f64));
    put("power_usage_watts", d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0));
    put("power_limit_watts", d.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0));
    put("sm_clock_hertz", d.clock_info(Clock::SM).ok().map(|mhz| f64::from(mhz) * 1e6));
    put("memory_clock_hertz", d.clock_info(Clock::Memory).ok().map(|mhz| f64::from(mhz) * 1e6));
    put("temperature_celsius", d.temperature(TemperatureSensor::Gpu).ok().map(f64::from));
    put("clocks_event_reasons", d.current_throttle_reasons().ok().map(|r| r.bits() as f64));
    let ecc = |t| d.total_ecc_errors(t, EccCounter::Volatile).ok().map(|n| n as f64);
    put("ecc_errors_corrected_total", ecc(MemoryError::Corrected));
    put("ecc_errors_uncorrected_total", ecc(MemoryError::Uncorrected));
}

impl super::Nvml for Real {
    fn inventory(&self) -> Inventory {
        self.inventory.clone()
    }

    fn read(&mut self, index: u32) -> Vec<Reading> {
        self.drain_events();
        let Ok(d) = self.lib.device_by_index(index) else {
            return Vec::new();
        };
        let mut values = Vec::with_capacity(16);
        nvml_values(&d, &mut values);
        if self.events.is_some() {
            let (n, last) = d.uuid().ok().and_then(|u| self.xid.get(&u).copied()).unwrap_or((0, 0));
            values.push(("xid_errors_total", n as f64));
            values.push(("xid_last", last as f64));
        }
        let mut out = vec![Reading { source: Source::Nvml, values }];
        let gpm_ok = self.gpm && self.inventory.devices.iter().any(|x| x.index == index && x.gpm_supported);
        if gpm_ok {
            match d.gpm_sample() {
                Ok(cur) => {
                    if let Some(prev) = self.prev.remove(&index) {
                        let ids: Vec<GpmMetricId> = GPM.iter().map(|g| g.0).collect();
                        if let Ok(res) = nvml_wrapper::gpm::gpm_metrics_get(self.lib, &prev, &cur, &ids) {
                            let values = GPM
                                .iter()
                                .zip(res)
                                .filter_map(|((_, name, scale), r)| r.ok().map(|r| (*name, r.value * scale)))
                                .collect::<Vec<_>>();
                            if !values.is_empty() {
                                out.push(Reading { source: Source::Gpm, values });
                            }
                        }
                    }
                    self.prev.insert(index, cur);
                }
                Err(e) => tracing::debug!(device = index, error = %e, "GPM sample failed"),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_one_sentence_in_the_loaders_words() {
        let Err(e) = Real::open("/nonexistent/libnvidia-ml.so.1", false) else { panic!("opened a missing library") };
        assert!(e.starts_with("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1: "), "{e}");
        assert!(e.contains("cannot open shared object file") && e.contains("metrics.nvml_library"), "{e}");
        assert!(!e.contains("libloading"), "{e}");
    }
}
