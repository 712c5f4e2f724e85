//! OTLP metrics export (`[otlp] endpoint`): every `interval`, one `ExportMetricsServiceRequest`
//! over gRPC (TLS for https:// endpoints) to an OpenTelemetry collector, followed by the PC
//! samples as profiles when `[otlp] profiles` is on ([`crate::otlp_profiles`]).
//!
//! Resources: one per GPU (`host.name`, `hw.type` = "gpu", `hw.id` = the GPU UUID, `hw.model`,
//! `gpu.index`) with the latest PM values and sample counts; one per container or pod of the
//! connected CUDA processes (`k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name`,
//! `container.id`) with `gpuprof.process.tracing`; one for the daemon (`host.name`) with its
//! record counters. All carry `service.name` = "gpuprofd" and `service.version`.
//!
//! A collector that is down or slow costs the export: its points are counted as dropped
//! (`gpuprof_otlp_points_dropped_total` on /metrics) and the next interval sends current values;
//! nothing queues up and ingest never waits.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::{Context, Result};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{
    AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum, metric,
    number_data_point,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::Daemon;
use crate::config::OtlpConfig;
use crate::pmstream::Latest;
use crate::registry::Placement;

/// What one export reports, taken from the daemon at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub host: String,
    pub start_ns: u64,
    pub now_ns: u64,
    pub gpus: Vec<GpuSnap>,
    pub procs: Vec<ProcSnap>,
    /// (kind, ingested, dropped) per record kind.
    pub records: Vec<(&'static str, u64, u64)>,
    pub connected_agents: u64,
}

#[derive(Debug, Clone, Default)]
pub struct GpuSnap {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    pub latest: Option<Latest>,
}

#[derive(Debug, Clone, Default)]
pub struct ProcSnap {
    pub pid: u32,
    pub exe: String,
    pub placement: Placement,
    pub tracing: bool,
    /// The distributed job it reported (empty id and no rank when none).
    pub job_id: String,
    pub rank: Option<u32>,
}

impl Snapshot {
    pub fn take(d: &Daemon) -> Snapshot {
        let now_ns = crate::clock::now_ns();
        let mut latest = d.pm.latest();
        let mut gpus: Vec<GpuSnap> = d
            .gpus
            .found
            .iter()
            .map(|g| GpuSnap {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                latest: latest.remove(&g.index),
            })
            .collect();
        // Samplers for GPUs not found at start (configured by index).
        gpus.extend(latest.into_iter().map(|(index, l)| GpuSnap { index, latest: Some(l), ..Default::default() }));
        let mut agents: Vec<_> = d.registry.all().into_iter().filter(|a| a.kind == "injector").collect();
        agents.sort_by_key(|a| a.id);
        let procs = agents
            .iter()
            .map(|a| ProcSnap {
                pid: a.pid,
                exe: a.exe.rsplit('/').next().unwrap_or_default().to_string(),
                placement: a.placement.clone(),
                tracing: a.trace_state() == "tracing",
                job_id: a.job.job_id.clone(),
                rank: a.job.rank,
            })
            .collect();
        let records = crate::catalog::Kind::ALL
            .iter()
            .map(|k| {
                let c = d.stats.kind(*k);
                (
                    k.name(),
                    c.ingested.load(Relaxed),
                    c.dropped_by_agents.load(Relaxed) + c.dropped_by_daemon.load(Relaxed),
                )
            })
            .collect();
        Snapshot {
            host: host_name(),
            start_ns: now_ns.saturating_sub(d.stats.started.elapsed().as_nanos() as u64),
            now_ns,
            gpus,
            procs,
            records,
            connected_agents: d.stats.connected_agents.load(Relaxed),
        }
    }
}

/// The node's name: the kernel's host name (with hostNetwork on Kubernetes, the node's).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default()
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

fn int(key: &str, v: i64) -> KeyValue {
    kv(key, any_value::Value::IntValue(v))
}

fn point(attributes: Vec<KeyValue>, start: u64, time: u64, v: number_data_point::Value) -> NumberDataPoint {
    NumberDataPoint {
        attributes,
        start_time_unix_nano: start,
        time_unix_nano: time,
        value: Some(v),
        ..Default::default()
    }
}

fn gauge(name: &str, unit: &str, description: &str, data_points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        description: description.into(),
        data: Some(metric::Data::Gauge(Gauge { data_points })),
        ..Default::default()
    }
}

fn counter(name: &str, unit: &str, description: &str, data_points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: name.into(),
        unit: unit.into(),
        description: description.into(),
        data: Some(metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: true,
        })),
        ..Default::default()
    }
}

/// The export request for a snapshot, and how many data points it holds.
pub fn request(snap: &Snapshot) -> (ExportMetricsServiceRequest, u64) {
    use number_data_point::Value::{AsDouble, AsInt};
    let base = |mut attrs: Vec<KeyValue>| {
        let mut all = vec![
            s("service.name", "gpuprofd"),
            s("service.version", env!("CARGO_PKG_VERSION")),
            s("host.name", &snap.host),
        ];
        all.append(&mut attrs);
        Resource { attributes: all, ..Default::default() }
    };
    let scope = || {
        Some(InstrumentationScope {
            name: "gpuprofd".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        })
    };
    let rm = |resource: Resource, metrics: Vec<Metric>| ResourceMetrics {
        resource: Some(resource),
        scope_metrics: vec![ScopeMetrics { scope: scope(), metrics, ..Default::default() }],
        ..Default::default()
    };
    let (start, now) = (snap.start_ns, snap.now_ns);
    let mut out = Vec::new();

    for g in &snap.gpus {
        let mut attrs = vec![s("hw.type", "gpu"), s("hw.vendor", "NVIDIA"), int("gpu.index", i64::from(g.index))];
        if !g.uuid.is_empty() {
            attrs.push(s("hw.id", &g.uuid));
        }
        if !g.model.is_empty() {
            attrs.push(s("hw.model", &g.model));
        }
        let mut metrics = Vec::new();
        if let Some(l) = &g.latest {
            let points = l
                .metrics
                .iter()
                .zip(&l.values)
                .map(|(m, v)| point(vec![s("metric", m)], 0, l.end_ns, AsDouble(*v)))
                .collect();
            metrics.push(gauge(
                "gpuprof.pm.value",
                "1",
                "Latest PM sample value per metric (CUPTI metric units).",
                points,
            ));
            metrics.push(counter(
                "gpuprof.pm.samples",
                "{sample}",
                "PM samples received since gpuprofd started.",
                vec![point(vec![], start, now, AsInt(l.samples as i64))],
            ));
        }
        if !metrics.is_empty() {
            out.push(rm(base(attrs), metrics));
        }
    }

    let mut by_workload: BTreeMap<(String, String), Vec<&ProcSnap>> = BTreeMap::new();
    for p in &snap.procs {
        by_workload.entry((p.placement.pod_uid.clone(), p.placement.container_id.clone())).or_default().push(p);
    }
    for ((pod_uid, container_id), procs) in by_workload {
        let pl = &procs[0].placement;
        let mut attrs = Vec::new();
        for (k, v) in [
            ("k8s.pod.uid", pod_uid.as_str()),
            ("k8s.pod.name", pl.pod_name.as_str()),
            ("k8s.namespace.name", pl.pod_namespace.as_str()),
            ("container.id", container_id.as_str()),
        ] {
            if !v.is_empty() {
                attrs.push(s(k, v));
            }
        }
        let points = procs
            .iter()
            .map(|p| {
                let mut attrs = vec![int("process.pid", i64::from(p.pid)), s("process.executable.name", &p.exe)];
                attrs.extend(crate::otlp_profiles::job_attributes(&p.job_id, p.rank));
                point(attrs, 0, now, AsInt(i64::from(p.tracing)))
            })
            .collect();
        out.push(rm(
            base(attrs),
            vec![gauge("gpuprof.process.tracing", "1", "1 while a session traces the CUDA process, else 0.", points)],
        ));
    }

    let cum = |pick: fn(&(&'static str, u64, u64)) -> u64| {
        snap.records.iter().map(|r| point(vec![s("kind", r.0)], start, now, AsInt(pick(r) as i64))).collect()
    };
    out.push(rm(
        base(vec![]),
        vec![
            counter(
                "gpuprof.records.ingested",
                "{record}",
                "Records committed to the database, per kind.",
                cum(|r| r.1),
            ),
            counter(
                "gpuprof.records.dropped",
                "{record}",
                "Records lost by agents and the daemon, per kind.",
                cum(|r| r.2),
            ),
            gauge(
                "gpuprof.agents.connected",
                "{connection}",
                "Agent connections (injectors and samplers).",
                vec![point(vec![], 0, now, AsInt(snap.connected_agents as i64))],
            ),
        ],
    ));
    let points = out
        .iter()
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .map(|m| match &m.data {
            Some(metric::Data::Gauge(g)) => g.data_points.len(),
            Some(metric::Data::Sum(s)) => s.data_points.len(),
            _ => 0,
        } as u64)
        .sum();
    (ExportMetricsServiceRequest { resource_metrics: out }, points)
}

/// The channel to the collector (connected lazily: a collector that is not up yet is not an
/// error at start). Reads the TLS files now, naming the key of one that cannot be read.
pub fn channel(cfg: &OtlpConfig) -> Result<Channel> {
    let mut ep = Endpoint::from_shared(cfg.endpoint.clone())
        .with_context(|| format!("otlp.endpoint {:?}", cfg.endpoint))?
        .connect_timeout(cfg.timeout.0)
        .timeout(cfg.timeout.0);
    if cfg.endpoint.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if cfg.ca_file.is_empty() {
            tls = tls.with_native_roots();
        } else {
            let pem = std::fs::read(&cfg.ca_file).with_context(|| format!("reading otlp.ca_file {}", cfg.ca_file))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if !cfg.client_cert_file.is_empty() {
            let cert = std::fs::read(&cfg.client_cert_file)
                .with_context(|| format!("reading otlp.client_cert_file {}", cfg.client_cert_file))?;
            let key = std::fs::read(&cfg.client_key_file)
                .with_context(|| format!("reading otlp.client_key_file {}", cfg.client_key_file))?;
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        ep = ep.tls_config(tls).context("otlp TLS settings")?;
    }
    Ok(ep.connect_lazy())
}

/// The export task: one request per interval until shutdown.
pub async fn run(d: Arc<Daemon>, channel: Channel, shutdown: CancellationToken) {
    let cfg = d.config.otlp.clone();
    let mut profiles = ProfilesServiceClient::new(channel.clone());
    let mut client = MetricsServiceClient::new(channel);
    let mut tick = tokio::time::interval(cfg.interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (req, points) = request(&Snapshot::take(&d));
        let r = tokio::time::timeout(cfg.timeout.0 + Duration::from_millis(100), client.export(req)).await;
        let err = match r {
            Ok(Ok(resp)) => {
                let rejected = resp.into_inner().partial_success.map_or(0, |p| p.rejected_data_points.max(0) as u64);
                d.stats.otlp_points_dropped.fetch_add(rejected, Relaxed);
                d.stats.otlp_points_sent.fetch_add(points - rejected.min(points), Relaxed);
                None
            }
            Ok(Err(status)) => Some(format!("{}: {}", status.code(), status.message())),
            Err(_) => Some(format!("no answer within {:?}", cfg.timeout.0)),
        };
        match err {
            Some(e) => {
                d.stats.otlp_failed_exports.fetch_add(1, Relaxed);
                d.stats.otlp_points_dropped.fetch_add(points, Relaxed);
                if !failing {
                    tracing::warn!(endpoint = %cfg.endpoint, error = %e, "OTLP export failed; dropping metrics until the collector answers");
                }
                failing = true;
            }
            None if failing => {
                tracing::info!(endpoint = %cfg.endpoint, "OTLP export works again");
                failing = false;
            }
            None => {}
        }
        if cfg.profiles {
            export_profiles(&d, &mut profiles, cfg.timeout.0).await;
        }
    }
}

/// Sends the PC samples taken since the last export as OTLP profiles; a failure costs them.
async fn export_profiles(d: &Daemon, client: &mut ProfilesServiceClient<Channel>, timeout: Duration) {
    let taken = d.otlp_pc.take();
    d.stats.otlp_pc_samples_dropped.fetch_add(taken.dropped, Relaxed);
    let n = taken.samples();
    if n == 0 {
        return;
    }
    let procs = d
        .registry
        .all()
        .into_iter()
        .map(|a| {
            let info = crate::otlp_profiles::ProcInfo {
                pid: a.pid,
                exe: a.exe.clone(),
                placement: a.placement.clone(),
                job_id: a.job.job_id.clone(),
                rank: a.job.rank,
            };
            (a.id, info)
        })
        .collect();
    let req = crate::otlp_profiles::request(&host_name(), &taken, &procs, crate::clock::now_ns());
    match tokio::time::timeout(timeout + Duration::from_millis(100), client.export(req)).await {
        Ok(Ok(_)) => {
            d.stats.otlp_pc_samples_sent.fetch_add(n, Relaxed);
        }
        Ok(Err(status)) => {
            d.stats.otlp_pc_samples_dropped.fetch_add(n, Relaxed);
            tracing::debug!(error = %status.message(), code = ?status.code(), "OTLP profiles export failed");
        }
        Err(_) => {
            d.stats.otlp_pc_samples_dropped.fetch_add(n, Relaxed);
            tracing::debug!(?timeout, "OTLP profiles export not answered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        let pod = Placement {
            container_id: "7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a".into(),
            container_runtime: "containerd",
            pod_uid: "1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c".into(),
            pod_name: "trainer-0".into(),
            pod_namespace: "ml".into(),
            container_name: "pytorch".into(),
        };
        Snapshot {
            host: "gpu-node-17".into(),
            start_ns: 1_000,
            now_ns: 2_000,
            gpus: vec![
                GpuSnap {
                    index: 0,
                    uuid: "GPU-0f9e8d7c-6b5a-4321-9876-543210fedcba".into(),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    latest: Some(Latest {
                        metrics: vec!["sm__cycles_active.avg.pct_of_peak_sustained_elapsed".into()],
                        values: vec![42.5],
                        end_ns: 1_900,
                        samples: 77,
                        ..Default::default()
                    }),
                },
                // No sampler data yet: no resource.
                GpuSnap { index: 1, uuid: "GPU-1".into(), ..Default::default() },
            ],
            procs: vec![
                ProcSnap {
                    pid: 10,
                    exe: "python3".into(),
                    placement: pod.clone(),
                    tracing: true,
                    job_id: "run-7".into(),
                    rank: Some(3),
                },
                ProcSnap {
                    pid: 11,
                    exe: "python3".into(),
                    placement: pod,
                    tracing: false,
                    job_id: String::new(),
                    rank: None,
                },
                ProcSnap {
                    pid: 12,
                    exe: "bench".into(),
                    placement: Placement::default(),
                    tracing: false,
                    job_id: String::new(),
                    rank: None,
                },
            ],
            records: vec![("kernel", 5, 1)],
            connected_agents: 4,
        }
    }

    fn attr(r: &ResourceMetrics, key: &str) -> Option<String> {
        r.resource.as_ref()?.attributes.iter().find(|a| a.key == key).and_then(|a| match &a.value.as_ref()?.value {
            Some(any_value::Value::StringValue(s)) => Some(s.clone()),
            Some(any_value::Value::IntValue(i)) => Some(i.to_string()),
            _ => None,
        })
    }

    #[test]
    fn resources_per_gpu_workload_and_daemon() {
        let (req, points) = request(&snap());
        let rms = &req.resource_metrics;
        // GPU 0, the pod, the process outside containers, the daemon.
        assert_eq!(rms.len(), 4, "{rms:#?}");
        for r in rms {
            assert_eq!(attr(r, "host.name").as_deref(), Some("gpu-node-17"));
            assert_eq!(attr(r, "service.name").as_deref(), Some("gpuprofd"));
        }
        let gpu = &rms[0];
        assert_eq!(attr(gpu, "hw.id").as_deref(), Some("GPU-0f9e8d7c-6b5a-4321-9876-543210fedcba"));
        assert_eq!(attr(gpu, "hw.model").as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(attr(gpu, "gpu.index").as_deref(), Some("0"));
        let m = &gpu.scope_metrics[0].metrics;
        assert_eq!(m[0].name, "gpuprof.pm.value");
        let Some(metric::Data::Gauge(g)) = &m[0].data else { panic!("{m:?}") };
        assert_eq!(g.data_points[0].value, Some(number_data_point::Value::AsDouble(42.5)));
        assert_eq!(g.data_points[0].time_unix_nano, 1_900);
        let Some(metric::Data::Sum(sum)) = &m[1].data else { panic!("{m:?}") };
        assert!(sum.is_monotonic && sum.aggregation_temporality == AggregationTemporality::Cumulative as i32);
        assert_eq!(sum.data_points[0].start_time_unix_nano, 1_000);

        // Processes outside containers sort first (empty pod and container).
        assert_eq!(attr(&rms[1], "k8s.pod.uid"), None);
        let pod = &rms[2];
        assert_eq!(attr(pod, "k8s.pod.uid").as_deref(), Some("1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c"));
        assert_eq!(attr(pod, "k8s.pod.name").as_deref(), Some("trainer-0"));
        assert_eq!(attr(pod, "k8s.namespace.name").as_deref(), Some("ml"));
        assert!(attr(pod, "container.id").unwrap().starts_with("7e2b6c0a4f1d"));
        let Some(metric::Data::Gauge(g)) = &pod.scope_metrics[0].metrics[0].data else { panic!() };
        let tracing: Vec<_> = g.data_points.iter().map(|p| p.value).collect();
        assert_eq!(tracing, [Some(number_data_point::Value::AsInt(1)), Some(number_data_point::Value::AsInt(0))]);
        // The rank's point carries its job; the other has none.
        let keys = |i: usize| g.data_points[i].attributes.iter().map(|a| a.key.as_str()).collect::<Vec<_>>();
        assert_eq!(keys(0), ["process.pid", "process.executable.name", "gpuprof.job.id", "gpuprof.job.rank"]);
        assert_eq!(keys(1), ["process.pid", "process.executable.name"]);
        // 1 PM value + 1 sample count + 1 + 2 process points + 2 record counters + 1 gauge.
        assert_eq!(points, 8);
    }

    #[tokio::test]
    async fn tls_files_are_checked_at_start() {
        let mut cfg = crate::config::Config::from_toml("").unwrap().otlp;
        cfg.endpoint = "https://collector:4317".into();
        cfg.ca_file = "/nonexistent/ca.pem".into();
        let e = format!("{:#}", channel(&cfg).unwrap_err());
        assert!(e.contains("otlp.ca_file"), "{e}");
        cfg.ca_file.clear();
        cfg.endpoint = "http://127.0.0.1:4317".into();
        assert!(channel(&cfg).is_ok(), "plain gRPC, connected lazily");
    }
}
