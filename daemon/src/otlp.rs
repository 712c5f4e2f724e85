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

use std::collections::{BTreeMap, HashMap};
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

use crate::config::OtlpConfig;
use crate::otlp_profiles::{ProcInfo, Taken};
use crate::pmstream::{Latest, PmHub};
use crate::registry::{Placement, Registry};
use crate::sampler::Gpus;
use crate::stats::Stats;

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

/// What a metrics snapshot reads: the latest device values, the GPUs, the connected agents and
/// the daemon's counters.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub pm: &'a PmHub,
    pub gpus: &'a Gpus,
    pub registry: &'a Registry,
    pub stats: &'a Stats,
}

impl Snapshot {
    pub fn take(d: Sources<'_>) -> Snapshot {
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

/// What the export task uses: its settings, the counters it adds to, and how it reads what it
/// sends (a metrics [`Snapshot`]; the PC samples taken since the last export, with the
/// processes they name).
pub struct Exporter {
    pub config: OtlpConfig,
    pub stats: Arc<Stats>,
    pub snapshot: Box<dyn Fn() -> Snapshot + Send + Sync>,
    pub pc: Box<dyn Fn() -> (Taken, HashMap<u64, ProcInfo>) + Send + Sync>,
}

/// The processes PC samples name, for their profiles' resources.
pub fn proc_infos(registry: &Registry) -> HashMap<u64, ProcInfo> {
    registry
        .all()
        .into_iter()
        .map(|a| {
            let info = ProcInfo {
                pid: a.pid,
                exe: a.exe.clone(),
                placement: a.placement.clone(),
                job_id: a.job.job_id.clone(),
                rank: a.job.rank,
            };
            (a.id, info)
        })
        .collect()
}

/// The export task: one request per interval until shutdown.
pub async fn run(d: Exporter, channel: Channel, shutdown: CancellationToken) {
    let cfg = d.config.clone();
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
        let (req, points) = request(&(d.snapshot)());
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
async fn export_profiles(d: &Exporter, client: &mut ProfilesServiceClient<Channel>, timeout: Duration) {
    let (taken, procs) = (d.pc)();
    d.stats.otlp_pc_samples_dropped.fetch_add(taken.dropped, Relaxed);
    let n = taken.samples();
    if n == 0 {
        return;
    }
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
mod tests;
