//! A scripted NVML for tests on machines without a GPU (`metrics.fake_nvml = "script.json"`):
//!
//! ```json
//! {"driver_version": "580.159.04", "cuda_version": "13.0",
//!  "devices": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H100 80GB HBM3",
//!               "pci_bus_id": "0000:1b:00.0", "memory_total_bytes": 85899345920,
//!               "mig_mode": "disabled", "power_limit_watts": 700, "gpm_supported": true,
//!               "nvml": [{"gpu_utilization_percent": 0}, {"gpu_utilization_percent": 100}],
//!               "gpm": [{"sm_active_percent": 50}]}]}
//! ```
//!
//! Each read of a device returns the next entry of its `nvml` list (cycling), and from the
//! second read on (GPM needs two samples) the next entry of `gpm`. `"missing": "why"` makes
//! opening fail the way a machine without the driver does.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{DeviceInfo, Inventory, Reading, Source};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Script {
    #[serde(default)]
    missing: Option<String>,
    #[serde(default)]
    driver_version: String,
    #[serde(default)]
    cuda_version: String,
    #[serde(default)]
    devices: Vec<ScriptDevice>,
}

#[derive(Debug, Deserialize)]
struct ScriptDevice {
    #[serde(flatten)]
    info: DeviceInfoLoose,
    #[serde(default)]
    nvml: Vec<BTreeMap<String, f64>>,
    #[serde(default)]
    gpm: Vec<BTreeMap<String, f64>>,
}

/// `DeviceInfo` without `deny_unknown_fields` (serde's flatten does not allow it).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DeviceInfoLoose {
    index: u32,
    uuid: String,
    name: String,
    pci_bus_id: String,
    memory_total_bytes: u64,
    mig_mode: String,
    power_limit_watts: f64,
    compute_major: u32,
    compute_minor: u32,
    gpm_supported: bool,
}

struct Dev {
    nvml: Vec<Vec<(&'static str, f64)>>,
    gpm: Vec<Vec<(&'static str, f64)>>,
    reads: usize,
}

/// The scripted NVML.
pub struct Fake {
    inventory: Inventory,
    devs: BTreeMap<u32, Dev>,
}

fn values(
    path: &Path,
    dev: u32,
    want: Source,
    rows: Vec<BTreeMap<String, f64>>,
) -> Result<Vec<Vec<(&'static str, f64)>>, String> {
    rows.into_iter()
        .map(|row| {
            row.into_iter()
                .map(|(k, v)| match super::metric(&k) {
                    Some(m) if m.1 == want => Ok((m.0, v)),
                    _ => Err(format!(
                        "{}: device {dev}: {k:?} is not a {} metric gpuprofd knows",
                        path.display(),
                        want.as_str()
                    )),
                })
                .collect()
        })
        .collect()
}

impl Fake {
    pub fn load(path: &Path) -> Result<Fake, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("metrics.fake_nvml: cannot read {}: {e}", path.display()))?;
        let s: Script =
            serde_json::from_str(&text).map_err(|e| format!("metrics.fake_nvml: {}: {e}", path.display()))?;
        if let Some(why) = s.missing {
            return Err(super::no_driver_text(&format!("libnvidia-ml.so.1: {why}")));
        }
        let mut devs = BTreeMap::new();
        let mut devices = Vec::new();
        for d in s.devices {
            let i = d.info;
            let index = i.index;
            devs.insert(
                index,
                Dev {
                    nvml: values(path, index, Source::Nvml, d.nvml)?,
                    gpm: values(path, index, Source::Gpm, d.gpm)?,
                    reads: 0,
                },
            );
            devices.push(DeviceInfo {
                index,
                uuid: i.uuid,
                name: i.name,
                pci_bus_id: super::normalize_bus_id(&i.pci_bus_id),
                memory_total_bytes: i.memory_total_bytes,
                mig_mode: i.mig_mode,
                power_limit_watts: i.power_limit_watts,
                compute_major: i.compute_major,
                compute_minor: i.compute_minor,
                gpm_supported: i.gpm_supported,
            });
        }
        devices.sort_by_key(|d| d.index);
        Ok(Fake {
            inventory: Inventory { driver_version: s.driver_version, cuda_version: s.cuda_version, devices },
            devs,
        })
    }
}

impl super::Nvml for Fake {
    fn inventory(&self) -> Inventory {
        self.inventory.clone()
    }

    fn read(&mut self, index: u32) -> Vec<Reading> {
        let gpm_ok = self.inventory.devices.iter().any(|d| d.index == index && d.gpm_supported);
        let Some(d) = self.devs.get_mut(&index) else {
            return Vec::new();
        };
        let k = d.reads;
        d.reads += 1;
        let mut out = Vec::new();
        if !d.nvml.is_empty() {
            out.push(Reading { source: Source::Nvml, values: d.nvml[k % d.nvml.len()].clone() });
        }
        if gpm_ok && k > 0 && !d.gpm.is_empty() {
            out.push(Reading { source: Source::Gpm, values: d.gpm[(k - 1) % d.gpm.len()].clone() });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::Nvml;
    use super::*;

    #[test]
    fn plays_the_script() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nvml.json");
        std::fs::write(
            &p,
            r#"{"driver_version":"580.1","devices":[{"index":0,"uuid":"GPU-a","pci_bus_id":"00000000:1B:00.0",
               "gpm_supported":true,"nvml":[{"gpu_utilization_percent":1},{"gpu_utilization_percent":2}],
               "gpm":[{"sm_active_percent":50}]}]}"#,
        )
        .unwrap();
        let mut f = Fake::load(&p).unwrap();
        assert_eq!(f.inventory().devices[0].pci_bus_id, "0000:1b:00.0");
        let r0 = f.read(0);
        assert_eq!(r0.len(), 1, "no GPM at the first read: {r0:?}");
        let r1 = f.read(0);
        assert_eq!(r1[0].values, vec![("gpu_utilization_percent", 2.0)]);
        assert_eq!(r1[1].source, Source::Gpm);
        assert_eq!(f.read(0)[0].values, vec![("gpu_utilization_percent", 1.0)]);
        std::fs::write(&p, r#"{"devices":[{"index":0,"nvml":[{"sm_active_percent":1}]}]}"#).unwrap();
        assert!(Fake::load(&p).err().unwrap().contains("not a nvml metric"));
        std::fs::write(&p, r#"{"missing":"test"}"#).unwrap();
        assert!(Fake::load(&p).err().unwrap().starts_with(crate::nvml::NO_DRIVER));
    }
}
