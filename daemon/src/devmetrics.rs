//! Always-on device metrics: every `metrics.interval` each GPU NVML lists is read (NVML
//! counters, and GPM where the GPU has it) on a blocking thread; the readings are published
//! to `StreamPmSamples` subscribers (source "nvml" or "gpm") and the latest-value tracker,
//! and averaged over `metrics.store_interval` into `pm_sample` rows (counters keep their last
//! value), which PM retention folds and expires like the CUPTI sampler's. Nothing here takes
//! a GPU's performance monitor.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use gpuprof_proto::agent::{PmSample, PmSampleBatch};
use tokio_util::sync::CancellationToken;

use crate::Daemon;
use crate::ingest::WriterMsg;
use crate::nvml::{Nvml, Reading, Source};

/// Readings of one device and source being averaged for storage.
struct Window {
    start_ns: u64,
    end_ns: u64,
    names: Vec<&'static str>,
    sums: Vec<f64>,
    last: Vec<f64>,
    n: u32,
}

impl Window {
    fn new(start_ns: u64, r: &Reading) -> Window {
        Window {
            start_ns,
            end_ns: start_ns,
            names: r.values.iter().map(|v| v.0).collect(),
            sums: vec![0.0; r.values.len()],
            last: vec![0.0; r.values.len()],
            n: 0,
        }
    }

    /// The stored values: means, except for counters and codes (the last value).
    fn values(&self) -> Vec<f64> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                if name.ends_with("_total") || *name == "xid_last" || *name == "clocks_event_reasons" {
                    self.last[i]
                } else {
                    self.sums[i] / f64::from(self.n.max(1))
                }
            })
            .collect()
    }
}

fn batch(device: u32, names: &[&'static str], start_ns: u64, end_ns: u64, values: Vec<f64>) -> PmSampleBatch {
    PmSampleBatch {
        device_id: device,
        metrics: names.iter().map(|n| n.to_string()).collect(),
        samples: vec![PmSample { start_ns, end_ns, values }],
    }
}

/// Reads every GPU NVML lists until `shutdown`.
pub async fn run(d: Arc<Daemon>, nvml: Box<dyn Nvml>, shutdown: CancellationToken) {
    let cfg = d.config.metrics.clone();
    let devices: Vec<u32> = d.nvml.inventory.devices.iter().map(|x| x.index).collect();
    let interval = cfg.interval.0;
    let store_ns = cfg.store_interval.0.as_nanos() as u64;
    tracing::info!(gpus = devices.len(), interval = ?interval, gpm = cfg.gpm, "always-on device metrics (NVML) started");
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut nvml = Some(nvml);
    let mut last_end: HashMap<(u32, Source), u64> = HashMap::new();
    let mut windows: HashMap<(u32, Source), Window> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let Some(mut n) = nvml.take() else { break };
        let devs = devices.clone();
        let read = tokio::task::spawn_blocking(move || {
            let r: Vec<(u32, Vec<Reading>)> = devs.iter().map(|&i| (i, n.read(i))).collect();
            (n, r)
        });
        let (n, readings) = match read.await {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "reading NVML failed; device metrics stopped");
                return;
            }
        };
        nvml = Some(n);
        let now = crate::clock::now_ns();
        for (index, rs) in readings {
            for r in rs {
                let key = (index, r.source);
                let start = last_end.insert(key, now).unwrap_or(now.saturating_sub(interval.as_nanos() as u64));
                let names: Vec<&'static str> = r.values.iter().map(|v| v.0).collect();
                let values: Vec<f64> = r.values.iter().map(|v| v.1).collect();
                d.publish(0, r.source, &batch(index, &names, start, now, values.clone()));
                let w = windows.entry(key).or_insert_with(|| Window::new(start, &r));
                if w.names != names {
                    *w = Window::new(start, &r);
                }
                for (i, v) in values.iter().enumerate() {
                    w.sums[i] += v;
                    w.last[i] = *v;
                }
                w.n += 1;
                w.end_ns = now;
                if w.end_ns.saturating_sub(w.start_ns) + store_ns / 20 >= store_ns {
                    let w = windows.remove(&key).expect("window present");
                    store(&d, index, batch(index, &w.names, w.start_ns, w.end_ns, w.values())).await;
                }
            }
        }
    }
    tracing::debug!("device metrics stopped");
}

async fn store(d: &Daemon, index: u32, b: PmSampleBatch) {
    let Some(dev) = d.nvml.device(index) else { return };
    let n = (b.samples.len() * b.metrics.len()) as u64;
    d.stats.queued_records.fetch_add(n, Relaxed);
    let msg = WriterMsg::DevicePm {
        uuid: dev.uuid.clone(),
        name: dev.name.clone(),
        pci_bus_id: dev.pci_bus_id.clone(),
        batch: b,
    };
    if d.writer.send(msg).await.is_err() {
        tracing::debug!("writer gone; device metrics not stored");
    }
}
