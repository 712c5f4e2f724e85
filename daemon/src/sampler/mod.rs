//! Device-wide PM sampling: one `gpuprof-sampler --device N` child process per GPU.
//!
//! The daemon never loads CUDA. It finds GPUs in `/proc/driver/nvidia/gpus` (or takes the
//! list from `[sampler] devices`), starts one child per GPU ([`supervise`]) and restarts it
//! with backoff when it dies. Children connect to the agent socket like any agent; the
//! arbiter tells them when to sample (`StartPmSampling`) and when to let go of the hardware
//! (`StopPmSampling`). [`Gpus`] keeps what status reports about them.
//!
//! The child is its own binary (the `sampler/` crate), so this crate has no unsafe code and
//! no CUDA: [`program`] says where it is.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::arbiter::SamplerStates;
use crate::config::{Config, SamplerConfig};

/// A GPU as the NVIDIA kernel driver lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index in PCI bus order (nvidia-smi's numbering, CUDA's with CUDA_DEVICE_ORDER=PCI_BUS_ID).
    pub index: u32,
    pub pci_bus_id: String,
    pub model: String,
    pub uuid: String,
}

/// GPUs from `DIR/*/information` (DIR is normally /proc/driver/nvidia/gpus), in PCI order.
pub fn discover(dir: &Path) -> Vec<GpuInfo> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut buses: Vec<(String, String)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let info = std::fs::read_to_string(e.path().join("information")).ok()?;
            Some((e.file_name().to_string_lossy().to_lowercase(), info))
        })
        .collect();
    buses.sort();
    buses
        .into_iter()
        .enumerate()
        .map(|(i, (bus, info))| {
            let field = |k: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(k).map(|v| v.trim_start_matches(':').trim().to_string()))
                    .unwrap_or_default()
            };
            GpuInfo { index: i as u32, pci_bus_id: bus, model: field("Model"), uuid: field("GPU UUID") }
        })
        .collect()
}

/// What status says about one GPU's sampler.
#[derive(Debug, Clone, Default)]
pub struct SamplerStatus {
    /// starting, sampling, stopped, hardware busy, failed, disconnected, exited.
    pub state: String,
    pub detail: String,
    pub connected: bool,
    pub restarts: u64,
}

/// The GPUs this daemon manages and their samplers' states.
pub struct Gpus {
    /// Found at start (empty when the sampler is disabled or there is no NVIDIA driver).
    pub found: Vec<GpuInfo>,
    /// Why there are no GPUs, if there are none.
    pub note: String,
    status: Mutex<BTreeMap<u32, SamplerStatus>>,
}

impl Gpus {
    /// Decides which GPUs to manage from the config and the driver's list.
    pub fn from_config(cfg: &Config) -> Gpus {
        Self::from_config_in(cfg, Path::new("/proc/driver/nvidia/gpus"))
    }

    /// GPUs from NVML's inventory when NVML works, else from the driver's /proc list.
    pub fn from_nvml(cfg: &Config, nvml: &crate::NvmlState) -> Gpus {
        if nvml.error.is_some() || nvml.inventory.devices.is_empty() {
            let mut g = Self::from_config(cfg);
            if let Some(e) = &nvml.error
                && g.found.is_empty()
            {
                g.note = e.clone();
            }
            return g;
        }
        let found = nvml
            .inventory
            .devices
            .iter()
            .map(|x| GpuInfo {
                index: x.index,
                pci_bus_id: x.pci_bus_id.clone(),
                model: x.name.clone(),
                uuid: x.uuid.clone(),
            })
            .collect();
        Self::from_found(cfg, found, "NVML")
    }

    pub fn from_config_in(cfg: &Config, dir: &Path) -> Gpus {
        Self::from_found(cfg, discover(dir), &dir.display().to_string())
    }

    fn from_found(cfg: &Config, found: Vec<GpuInfo>, listed_by: &str) -> Gpus {
        let s = &cfg.sampler;
        let (managed, note) = if !s.enabled {
            (
                Vec::new(),
                format!("PM sampling disabled in config ([sampler] enabled = false); {} GPU(s) present", found.len()),
            )
        } else if !s.devices.is_empty() {
            (s.devices.clone(), String::new())
        } else if found.is_empty() {
            (Vec::new(), format!("no NVIDIA GPU found ({listed_by} lists none)"))
        } else {
            (found.iter().map(|g| g.index).collect(), String::new())
        };
        let status = managed
            .iter()
            .map(|d| {
                let state = if s.spawn { "starting" } else { "waiting for a sampler to connect" };
                (*d, SamplerStatus { state: state.into(), ..Default::default() })
            })
            .collect();
        Gpus { found, note, status: Mutex::new(status) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, SamplerStatus>> {
        self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Devices to manage at start.
    pub fn managed(&self) -> Vec<u32> {
        self.lock().keys().copied().collect()
    }

    /// The child exited: keep its last failure as the reason.
    fn exited(&self, device: u32, status: &str) {
        let mut m = self.lock();
        let s = m.entry(device).or_default();
        s.restarts += 1;
        s.detail = if s.state == "failed" && !s.detail.is_empty() {
            format!("{status}: {}", s.detail)
        } else {
            status.to_string()
        };
        s.state = "exited".into();
    }

    /// A copy of every GPU's sampler status.
    pub fn snapshot(&self) -> BTreeMap<u32, SamplerStatus> {
        self.lock().clone()
    }

    /// `GetStatus.gpu_count` and `gpu_note`.
    pub fn summary(&self, arbiter: &crate::arbiter::Arbiter) -> (u32, String) {
        let devices = arbiter.devices();
        if devices.is_empty() {
            return (0, if self.note.is_empty() { "no GPU managed".into() } else { self.note.clone() });
        }
        let snap = self.snapshot();
        let parts: Vec<String> = devices
            .iter()
            .map(|d| {
                let s = snap.get(d).cloned().unwrap_or_default();
                let monitor = arbiter.monitor_state(*d);
                let mut t = format!("GPU {d}: sampler {}", if s.state.is_empty() { "unknown" } else { &s.state });
                if !s.detail.is_empty() && s.state != "sampling" {
                    t.push_str(&format!(" ({})", s.detail));
                }
                if monitor != "sampler" {
                    t.push_str(&format!("; monitor {monitor}"));
                }
                if s.restarts > 0 {
                    t.push_str(&format!("; {} restarts", s.restarts));
                }
                t
            })
            .collect();
        (devices.len() as u32, parts.join("; "))
    }
}

/// The states the arbiter's driver records as samplers report them.
impl SamplerStates for Gpus {
    fn set_state(&self, device: u32, state: &str, detail: &str) {
        let mut m = self.lock();
        let s = m.entry(device).or_default();
        s.state = state.to_string();
        s.detail = detail.to_string();
    }

    fn set_connected(&self, device: u32, connected: bool) {
        self.lock().entry(device).or_default().connected = connected;
    }

    /// The sampler's connection closed; a failure it reported stays the reason.
    fn set_disconnected(&self, device: u32, reason: &str) {
        let mut m = self.lock();
        let s = m.entry(device).or_default();
        s.connected = false;
        if s.state != "failed" {
            s.state = "disconnected".into();
            s.detail = reason.to_string();
        }
    }
}

/// The GPUs whose sampler gpuprofd spawns and supervises (none unless `[sampler] enabled`
/// and `spawn` are set); [`supervise`] runs once per device.
pub fn spawned_devices(cfg: &SamplerConfig, gpus: &Gpus) -> Vec<u32> {
    if !cfg.enabled || !cfg.spawn {
        return Vec::new();
    }
    gpus.managed()
}

/// The sampler binary: `sampler.program`, or `gpuprof-sampler` next to the running gpuprofd.
pub fn program(cfg: &SamplerConfig) -> std::io::Result<std::path::PathBuf> {
    if !cfg.program.is_empty() {
        return Ok(cfg.program.clone().into());
    }
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name("gpuprof-sampler"))
}

/// What a sampler's supervisor uses: `[sampler]`, the agent socket the child connects to,
/// and the GPUs' sampler states.
pub struct Supervised {
    pub sampler: SamplerConfig,
    pub agent_socket: std::path::PathBuf,
    pub gpus: Arc<Gpus>,
}

/// Keeps `gpuprof-sampler --device N` running: restarts it with exponential backoff (1 s
/// doubling up to `sampler.restart_backoff_max`; reset after a minute of good running).
pub async fn supervise(d: Supervised, device: u32, shutdown: CancellationToken) {
    let exe = match program(&d.sampler) {
        Ok(p) => p,
        Err(e) => {
            d.gpus.set_state(device, "failed", &format!("cannot find the gpuprof-sampler program: {e}"));
            return;
        }
    };
    let max = d.sampler.restart_backoff_max.0;
    let mut backoff = Duration::from_secs(1);
    loop {
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.arg("--device")
            .arg(device.to_string())
            .arg("--socket")
            .arg(&d.agent_socket)
            .arg("--hardware-buffer-mib")
            .arg(d.sampler.hardware_buffer_mib.to_string())
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env_remove("CUDA_VISIBLE_DEVICES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if !d.sampler.cupti_library.is_empty() {
            cmd.arg("--cupti").arg(&d.sampler.cupti_library);
        }
        let started = Instant::now();
        match cmd.spawn() {
            Ok(mut child) => {
                tracing::info!(device, pid = child.id(), "started PM sampler");
                tokio::select! {
                    _ = shutdown.cancelled() => {
                        // The agent socket closes at shutdown; the child stops CUPTI and exits.
                        if tokio::time::timeout(Duration::from_secs(3), child.wait()).await.is_err() {
                            tracing::warn!(device, "PM sampler did not exit in 3 s; killing it");
                            let _ = child.kill().await;
                        }
                        return;
                    }
                    st = child.wait() => {
                        let st = st.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                        tracing::warn!(device, status = %st, ran_ms = started.elapsed().as_millis() as u64, "PM sampler exited");
                        d.gpus.exited(device, &st);
                    }
                }
            }
            Err(e) => {
                tracing::error!(device, program = %exe.display(), error = %e, "cannot start PM sampler");
                d.gpus.set_state(device, "failed", &format!("cannot start {}: {e}", exe.display()));
            }
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff = Duration::from_secs(1);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(max);
    }
}

/// For `gpuprofd check-config`: checks the metric set on every managed GPU by running the
/// sampler child in check mode. Returns a note for people; fails naming the metric.
pub fn check_metrics(cfg: &Config) -> anyhow::Result<String> {
    let gpus = Gpus::from_config(cfg);
    let devices = gpus.managed();
    if devices.is_empty() {
        return Ok(format!("PM metrics not checked on hardware: {}", gpus.note));
    }
    let exe = program(&cfg.sampler)?;
    let mut notes = Vec::new();
    for dev in devices {
        let mut cmd = std::process::Command::new(&exe);
        cmd.arg("--device")
            .arg(dev.to_string())
            .arg("--check")
            .arg("--metrics")
            .arg(cfg.sampler.metrics.join(","))
            .env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            .env_remove("CUDA_VISIBLE_DEVICES");
        if !cfg.sampler.cupti_library.is_empty() {
            cmd.arg("--cupti").arg(&cfg.sampler.cupti_library);
        }
        let out = cmd.output().map_err(|e| anyhow::anyhow!("cannot run {}: {e}", exe.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        match out.status.code() {
            Some(0) => notes.push(text),
            Some(2) => anyhow::bail!("sampler.metrics: {text}"),
            _ => notes.push(format!("GPU {dev}: PM metrics not checked: {text}")),
        }
    }
    Ok(notes.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A supervisor built from its parts, no daemon: a sampler program that cannot start
    /// leaves the GPU's state failed, naming the program; shutdown ends the supervisor.
    #[tokio::test]
    async fn a_sampler_that_cannot_start_is_failed() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config::from_toml("[sampler]\nprogram = \"/nonexistent/gpuprof-sampler\"\n").unwrap();
        let gpus = Arc::new(Gpus::from_config_in(&cfg, dir.path()));
        let parts = Supervised {
            sampler: cfg.sampler.clone(),
            agent_socket: dir.path().join("agent.sock"),
            gpus: gpus.clone(),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(supervise(parts, 3, shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(200)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
        let s = gpus.snapshot().remove(&3).unwrap();
        assert_eq!(s.state, "failed");
        assert!(s.detail.contains("cannot start /nonexistent/gpuprof-sampler"), "{}", s.detail);
    }

    #[test]
    fn discovers_gpus_in_pci_order() {
        let d = tempfile::tempdir().unwrap();
        for (bus, uuid) in [("0000:c1:00.0", "GPU-bbb"), ("0000:1b:00.0", "GPU-aaa")] {
            let p = d.path().join(bus);
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(
                p.join("information"),
                format!(
                    "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 17\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
                ),
            )
            .unwrap();
        }
        let g = discover(d.path());
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].index, 0);
        assert_eq!(g[0].uuid, "GPU-aaa");
        assert_eq!(g[0].model, "NVIDIA H100 80GB HBM3");
        assert_eq!(g[1].pci_bus_id, "0000:c1:00.0");
        let cfg = Config::from_toml("").unwrap();
        assert_eq!(Gpus::from_config_in(&cfg, d.path()).managed(), vec![0, 1]);
        let none = Gpus::from_config_in(&cfg, &d.path().join("absent"));
        assert!(none.managed().is_empty());
        assert!(none.note.contains("no NVIDIA GPU"), "{}", none.note);
        let listed = Config::from_toml("[sampler]\ndevices = [1]\n").unwrap();
        assert_eq!(Gpus::from_config_in(&listed, &d.path().join("absent")).managed(), vec![1]);
    }
}
