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

use crate::config::MetricsConfig;
use crate::ingest::{WriterHandle, WriterMsg};
use crate::nvml::{DeviceInfo, Nvml, Reading, Source};
use crate::stats::Stats;

/// Where readings go live: `StreamPmSamples` subscribers (`Daemon::publish` in gpuprofd).
pub type Publish = Box<dyn Fn(Source, &PmSampleBatch) + Send + Sync>;

/// What the device metrics use: their configuration, the devices NVML listed at start, the
/// writer and its counters, and where live readings are published.
pub struct DevMetrics {
    pub cfg: MetricsConfig,
    pub devices: Vec<DeviceInfo>,
    pub writer: WriterHandle,
    pub stats: Arc<Stats>,
    pub publish: Publish,
}

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
pub async fn run(d: DevMetrics, nvml: Box<dyn Nvml>, shutdown: CancellationToken) {
    let cfg = d.cfg.clone();
    let devices: Vec<u32> = d.devices.iter().map(|x| x.index).collect();
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
                (d.publish)(r.source, &batch(index, &names, start, now, values.clone()));
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

async fn store(d: &DevMetrics, index: u32, b: PmSampleBatch) {
    let Some(dev) = d.devices.iter().find(|x| x.index == index) else { return };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readings_are_published_and_stored_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("nvml.json");
        std::fs::write(
            &script,
            r#"{"devices": [{"index": 0, "uuid": "GPU-test", "name": "Test GPU", "pci_bus_id": "0000:1b:00.0",
                "nvml": [{"gpu_utilization_percent": 10}, {"gpu_utilization_percent": 30}]}]}"#,
        )
        .unwrap();
        let nvml = crate::nvml::fake::Fake::load(&script).unwrap();
        let toml = "[metrics]\ninterval = \"100ms\"\nstore_interval = \"200ms\"\ngpm = false\n";
        let cfg = crate::config::Config::from_toml(toml).unwrap();
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let published: Arc<Mutex<Vec<(Source, f64)>>> = Arc::default();
        let seen = published.clone();
        let parts = DevMetrics {
            cfg: cfg.metrics.clone(),
            devices: nvml.inventory().devices,
            writer: writer.handle.clone(),
            stats: Arc::new(Stats::default()),
            publish: Box::new(move |source, b| seen.lock().unwrap().push((source, b.samples[0].values[0]))),
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(run(parts, Box::new(nvml), shutdown.clone()));
        tokio::time::sleep(std::time::Duration::from_millis(750)).await;
        shutdown.cancel();
        task.await.unwrap();
        writer.stop().await;

        let published = published.lock().unwrap().clone();
        assert!(published.len() >= 4, "a reading every 100 ms: {published:?}");
        assert!(published.iter().all(|(s, _)| *s == Source::Nvml));
        assert_eq!((published[0].1, published[1].1), (10.0, 30.0), "the script's values, in turn");
        let c = crate::store::open_reader(&dir.path().join("t.db")).unwrap();
        let rows: i64 = c.query_row("SELECT count(*) FROM pm_sample", [], |r| r.get(0)).unwrap();
        assert!(rows >= 1, "averaged windows stored");
    }
}
