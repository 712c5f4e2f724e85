//! The Prometheus endpoint (`[prometheus] listen`, off by default), in the shape operators
//! already scrape from DCGM exporter: per-GPU series labelled `gpu`, `UUID`, `pci_bus_id`,
//! `modelName` and `Hostname`; one family per metric and unit (`gpuprof_gpu_sm_active_percent`,
//! `gpuprof_gpu_power_usage_watts`, ...) for the always-on NVML and GPM metrics; CUPTI PM values
//! split by unit (`gpuprof_pm_percent`, `gpuprof_pm_bytes`, `gpuprof_pm_value` for the rest);
//! the arbiter's state per GPU; the daemon's counters and `gpuprof_build_info`. Per-process
//! series carry the process's distributed-job `job_id` and `rank`, and GPU series too where
//! one rank owns the GPU. Served with
//! axum (hyper), `GET /metrics` only; every response closes its connection.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::{Context, Result};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::NvmlState;
use crate::arbiter::Arbiter;
use crate::catalog::Kind;
use crate::config::PrometheusConfig;
use crate::nvml::Source;
use crate::pcsamp::PcHub;
use crate::pmstream::PmHub;
use crate::registry::Registry;
use crate::sampler::Gpus;
use crate::stats::Stats;

/// What a scrape reads: the daemon's counters, the connected agents, the latest device values,
/// the performance monitors' holders, the samplers, NVML's inventory, the database's size and
/// PC sampling's states.
#[derive(Clone, Copy)]
pub struct Scrape<'a> {
    pub stats: &'a Stats,
    pub registry: &'a Registry,
    pub pm: &'a PmHub,
    pub arbiter: &'a Arbiter,
    pub gpus: &'a Gpus,
    pub nvml: &'a NvmlState,
    pub db_path: &'a std::path::Path,
    pub pc: &'a PcHub,
}

/// Renders the exposition text of a scrape (the endpoint calls it per request).
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds the endpoint if configured.
pub async fn bind(cfg: &PrometheusConfig) -> Result<Option<TcpListener>> {
    if cfg.listen.is_empty() {
        return Ok(None);
    }
    let addr = &cfg.listen;
    let l = TcpListener::bind(addr).await.with_context(|| format!("binding prometheus.listen {addr}"))?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(Some(l))
}

fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

async fn metrics(axum::extract::State(render): axum::extract::State<Render>) -> Response {
    let body = render();
    closing(([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response())
}

async fn not_found() -> Response {
    closing((StatusCode::NOT_FOUND, "only GET /metrics is served here\n").into_response())
}

/// Serves until shutdown.
pub async fn serve(listener: TcpListener, render: Render, shutdown: CancellationToken) {
    let app = axum::Router::new().route("/metrics", axum::routing::get(metrics)).fallback(not_found).with_state(render);
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::warn!(error = %e, "the Prometheus endpoint stopped");
    }
}

/// DCGM exporter's GPU labels, with `pod`, `namespace` and `container` when the CUDA processes
/// on the GPU all belong to one known Kubernetes container.
fn gpu_labels(gpus: &Gpus, dev: u32, host: &str, agents: &[Arc<crate::registry::Agent>]) -> String {
    let g = gpus.found.iter().find(|g| g.index == dev);
    let (uuid, pci) = (g.map_or("", |g| g.uuid.as_str()), g.map_or("", |g| g.pci_bus_id.as_str()));
    let mut l = format!(
        "gpu=\"{dev}\",UUID=\"{}\",pci_bus_id=\"{}\",modelName=\"{}\",Hostname=\"{}\"",
        esc(uuid),
        esc(pci),
        esc(g.map_or("", |g| &g.model)),
        esc(host)
    );
    let on_gpu = || agents.iter().filter(|a| uses_gpu(&a.devices, g.map(|_| (uuid, pci)), dev));
    if let Some((pod, ns, container)) = one_workload(on_gpu().map(|a| &a.placement)) {
        let _ = write!(l, ",pod=\"{}\",namespace=\"{}\",container=\"{}\"", esc(pod), esc(ns), esc(container));
    }
    if let Some((job, rank)) = one_rank(on_gpu().map(|a| &a.job)) {
        let _ = write!(l, ",job_id=\"{}\",rank=\"{rank}\"", esc(job));
    }
    l
}

/// The (job id, rank) of the one distributed-job rank among these processes' identities
/// (processes without a rank, such as a launcher, aside); None when there are none or several.
/// The label is `job_id`, not `job`: Prometheus keeps `job` for the scrape job.
fn one_rank<'a>(jobs: impl Iterator<Item = &'a gpuprof_proto::agent::JobIdentity>) -> Option<(&'a str, u32)> {
    let mut ranks = jobs.filter_map(|j| j.rank.map(|r| (j.job_id.as_str(), r)));
    let first = ranks.next()?;
    ranks.all(|r| r == first).then_some(first)
}

/// A process's `job_id` and `rank` label values (empty when it reported none).
fn job_labels(j: &gpuprof_proto::agent::JobIdentity) -> (String, String) {
    (esc(&j.job_id), j.rank.map(|r| r.to_string()).unwrap_or_default())
}

/// Whether a process that reported `devices` uses the GPU with this UUID and PCI bus id (or,
/// when the daemon has no driver list, this CUDA ordinal).
fn uses_gpu(devices: &[gpuprof_proto::agent::Device], ids: Option<(&str, &str)>, index: u32) -> bool {
    devices.iter().any(|x| match ids {
        Some((uuid, pci)) => {
            (!x.uuid.is_empty() && x.uuid.eq_ignore_ascii_case(uuid))
                || (!x.pci_bus_id.is_empty() && x.pci_bus_id.eq_ignore_ascii_case(pci))
        }
        None => x.id == index,
    })
}

/// The (pod, namespace, container) every placement shares, if they share one with a pod name.
fn one_workload<'a>(
    mut placements: impl Iterator<Item = &'a crate::registry::Placement>,
) -> Option<(&'a str, &'a str, &'a str)> {
    let key =
        |p: &'a crate::registry::Placement| (p.pod_name.as_str(), p.pod_namespace.as_str(), p.container_name.as_str());
    let first = key(placements.next()?);
    if first.0.is_empty() || placements.any(|p| key(p) != first) {
        return None;
    }
    Some(first)
}

/// The unit of a CUPTI metric, from its name: "percent", "bytes" or "" (unitless).
fn pm_unit(metric: &str) -> &'static str {
    if metric.contains("pct") {
        "percent"
    } else if metric.contains("bytes") && !metric.contains("per_") {
        "bytes"
    } else {
        ""
    }
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The exposition text.
pub fn render(d: Scrape<'_>) -> String {
    let mut o = String::with_capacity(4096);
    let s = d.stats;
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let host = crate::otlp::host_name();
    let agents: Vec<_> = d.registry.all().into_iter().filter(|a| a.kind == "injector").collect();
    // Each GPU's labels are built once per scrape (they look through every connected process).
    let cache = std::cell::RefCell::new(std::collections::HashMap::<u32, String>::new());
    let labels = |dev: u32| -> String {
        cache.borrow_mut().entry(dev).or_insert_with(|| gpu_labels(d.gpus, dev, &host, &agents)).clone()
    };
    let latest = d.pm.latest();
    // NVML and GPM: a family per metric, its unit in its name.
    for (name, _, counter, help) in crate::nvml::METRICS {
        let series: Vec<(u32, f64)> = latest
            .iter()
            .filter_map(|(dev, l)| l.metrics.iter().position(|m| m == name).map(|i| (*dev, l.values[i])))
            .collect();
        if series.is_empty() {
            continue;
        }
        let fam = format!("gpuprof_gpu_{name}");
        family(&mut o, &fam, if *counter { "counter" } else { "gauge" }, help);
        for (dev, v) in series {
            let _ = writeln!(o, "{fam}{{{}}} {v}", labels(dev));
        }
    }
    // CUPTI PM: by unit.
    for (fam, unit, help) in [
        ("gpuprof_pm_percent", "percent", "Latest CUPTI PM sample of a percentage metric, per GPU and metric."),
        ("gpuprof_pm_bytes", "bytes", "Latest CUPTI PM sample of a byte-count metric, per GPU and metric."),
        ("gpuprof_pm_value", "", "Latest CUPTI PM sample of a unitless metric (ratios, rates per cycle, counts)."),
    ] {
        let mut lines = Vec::new();
        for (dev, l) in &latest {
            for ((m, v), src) in l.metrics.iter().zip(&l.values).zip(&l.sources) {
                if *src == Source::CuptiPm && pm_unit(m) == unit {
                    lines.push(format!("{fam}{{{},metric=\"{}\"}} {v}", labels(*dev), esc(m)));
                }
            }
        }
        if !lines.is_empty() {
            family(&mut o, fam, "gauge", help);
            for l in lines {
                let _ = writeln!(o, "{l}");
            }
        }
    }
    let cupti: Vec<_> = latest.iter().filter(|(_, l)| l.samples > 0).collect();
    if !cupti.is_empty() {
        family(
            &mut o,
            "gpuprof_pm_last_sample_seconds",
            "gauge",
            "End time of the latest CUPTI PM sample (Unix seconds).",
        );
        for (dev, l) in &cupti {
            let _ = writeln!(o, "gpuprof_pm_last_sample_seconds{{{}}} {:.6}", labels(**dev), l.end_ns as f64 / 1e9);
        }
        family(&mut o, "gpuprof_pm_samples_total", "counter", "CUPTI PM samples received per GPU since start.");
        for (dev, l) in &cupti {
            let _ = writeln!(o, "gpuprof_pm_samples_total{{{}}} {}", labels(**dev), l.samples);
        }
    }
    let res = d.arbiter.reservations();
    family(&mut o, "gpuprof_gpu_paused", "gauge", "1 while an operator's pause holds the GPU's performance monitor.");
    for r in &res {
        let paused = r.holder.as_ref().is_some_and(|h| h.holder_kind == "pause");
        let _ = writeln!(o, "gpuprof_gpu_paused{{{}}} {}", labels(r.device), u8::from(paused));
    }
    family(
        &mut o,
        "gpuprof_gpu_held_externally",
        "gauge",
        "1 while an outside tool holds the GPU's performance monitor.",
    );
    for r in &res {
        let _ = writeln!(o, "gpuprof_gpu_held_externally{{{}}} {}", labels(r.device), u8::from(r.held_externally));
    }
    family(
        &mut o,
        "gpuprof_gpu_cupti_sampling",
        "gauge",
        "1 while gpuprof's CUPTI PM sampler holds the GPU's performance monitor.",
    );
    for r in &res {
        let on = r.holder.as_ref().is_some_and(|h| h.holder_kind == "sampler") && !r.held_externally;
        let _ = writeln!(o, "gpuprof_gpu_cupti_sampling{{{}}} {}", labels(r.device), u8::from(on));
    }
    family(&mut o, "gpuprof_sampler_restarts_total", "counter", "PM sampler child restarts per GPU.");
    for (dev, st) in d.gpus.snapshot() {
        let _ = writeln!(o, "gpuprof_sampler_restarts_total{{{}}} {}", labels(dev), st.restarts);
    }
    family(&mut o, "gpuprof_build_info", "gauge", "Always 1; the labels say which gpuprofd and NVIDIA driver this is.");
    let _ = writeln!(
        o,
        "gpuprof_build_info{{version=\"{}\",driver_version=\"{}\",cuda_version=\"{}\",Hostname=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        esc(&d.nvml.inventory.driver_version),
        esc(&d.nvml.inventory.cuda_version),
        esc(&host)
    );
    processes(&mut o, d);
    family(&mut o, "gpuprof_uptime_seconds", "gauge", "Seconds since gpuprofd started.");
    let _ = writeln!(o, "gpuprof_uptime_seconds {}", s.started.elapsed().as_secs_f64());
    family(&mut o, "gpuprof_connected_agents", "gauge", "Agent connections (injectors and samplers).");
    let _ = writeln!(o, "gpuprof_connected_agents {}", s.connected_agents.load(Relaxed));
    family(&mut o, "gpuprof_records_ingested_total", "counter", "Records committed to the database, per kind.");
    for k in Kind::ALL {
        let _ =
            writeln!(o, "gpuprof_records_ingested_total{{kind=\"{}\"}} {}", k.name(), s.kind(k).ingested.load(Relaxed));
    }
    family(&mut o, "gpuprof_records_dropped_total", "counter", "Records lost (by agents and by the daemon), per kind.");
    for k in Kind::ALL {
        let c = s.kind(k);
        let n = c.dropped_by_agents.load(Relaxed) + c.dropped_by_daemon.load(Relaxed);
        let _ = writeln!(o, "gpuprof_records_dropped_total{{kind=\"{}\"}} {n}", k.name());
    }
    family(&mut o, "gpuprof_ingest_queue_records", "gauge", "Records accepted but not yet committed.");
    let _ = writeln!(o, "gpuprof_ingest_queue_records {}", s.queued_records.load(Relaxed));
    family(&mut o, "gpuprof_protocol_errors_total", "counter", "Agent connections closed for protocol errors.");
    let _ = writeln!(o, "gpuprof_protocol_errors_total {}", s.protocol_errors.load(Relaxed));
    family(&mut o, "gpuprof_database_bytes", "gauge", "Database size (main file and WAL).");
    let _ = writeln!(o, "gpuprof_database_bytes {}", crate::store::database_bytes(d.db_path));
    for (name, help, v) in [
        ("gpuprof_otlp_points_sent_total", "OTLP data points the collector accepted.", &s.otlp_points_sent),
        (
            "gpuprof_otlp_points_dropped_total",
            "OTLP data points lost to failed exports or rejected by the collector.",
            &s.otlp_points_dropped,
        ),
        ("gpuprof_otlp_failed_exports_total", "OTLP exports that failed.", &s.otlp_failed_exports),
        ("gpuprof_otlp_pc_samples_sent_total", "PC samples sent as OTLP profiles.", &s.otlp_pc_samples_sent),
        (
            "gpuprof_otlp_pc_samples_dropped_total",
            "PC samples lost to failed OTLP profile exports or over the pending bound.",
            &s.otlp_pc_samples_dropped,
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {}", v.load(Relaxed));
    }
    family(&mut o, "gpuprof_pm_subscribers", "gauge", "StreamPmSamples subscribers now.");
    let _ = writeln!(o, "gpuprof_pm_subscribers {}", d.pm.subscribers.load(Relaxed));
    family(&mut o, "gpuprof_pm_subscribers_dropped_total", "counter", "Slow StreamPmSamples subscribers dropped.");
    let _ = writeln!(o, "gpuprof_pm_subscribers_dropped_total {}", d.pm.dropped_subscribers.load(Relaxed));
    o
}

/// Per connected injector: identity labels with its container and pod, so that dashboards
/// join GPU processes to workloads.
fn processes(o: &mut String, d: Scrape<'_>) {
    let _ = writeln!(
        o,
        "# HELP gpuprof_process_tracing 1 while a session traces the process, 0 while it is idle; one series per \
         connected CUDA process.\n# TYPE gpuprof_process_tracing gauge"
    );
    let mut agents: Vec<_> = d.registry.all().into_iter().filter(|a| a.kind == "injector").collect();
    agents.sort_by_key(|a| a.id);
    for a in &agents {
        let p = &a.placement;
        let exe = a.exe.rsplit('/').next().unwrap_or_default();
        let (job, rank) = job_labels(&a.job);
        let _ = writeln!(
            o,
            "gpuprof_process_tracing{{process_id=\"{}\",pid=\"{}\",exe=\"{}\",container_id=\"{}\",pod_uid=\"{}\",pod=\"{}\",namespace=\"{}\",container=\"{}\",job_id=\"{job}\",rank=\"{rank}\"}} {}",
            a.id,
            a.pid,
            esc(exe),
            esc(&p.container_id),
            esc(&p.pod_uid),
            esc(&p.pod_name),
            esc(&p.pod_namespace),
            esc(&p.container_name),
            u8::from(a.trace_state() == "tracing"),
        );
    }
    let _ = writeln!(
        o,
        "# HELP gpuprof_process_pc_sampling 1 while PC sampling runs on the device, 0 while a session wants it \
         there but it waits, is preempted or failed; per connected CUDA process and device (its CUDA \
         ordinal).\n# TYPE gpuprof_process_pc_sampling gauge"
    );
    for ((id, dev), on) in d.pc.process_devices() {
        let Some(a) = agents.iter().find(|a| a.id == id) else { continue };
        let uuid = a.devices.iter().find(|x| x.id == dev).map_or("", |x| x.uuid.as_str());
        let p = &a.placement;
        let (job, rank) = job_labels(&a.job);
        let _ = writeln!(
            o,
            "gpuprof_process_pc_sampling{{process_id=\"{id}\",pid=\"{}\",exe=\"{}\",device=\"{dev}\",UUID=\"{}\",pod=\"{}\",namespace=\"{}\",container=\"{}\",job_id=\"{job}\",rank=\"{rank}\"}} {}",
            a.pid,
            esc(a.exe.rsplit('/').next().unwrap_or_default()),
            esc(uuid),
            esc(&p.pod_name),
            esc(&p.pod_namespace),
            esc(&p.container_name),
            u8::from(on),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Placement;

    /// The endpoint built from its parts, no daemon: a scrape of empty parts has the daemon's
    /// own families (a counter per record kind, build info, the database's size); GET /metrics
    /// serves what the render gives, anything else is 404.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_endpoint_without_a_daemon() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cfg = crate::config::Config::from_toml("").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let conn = crate::store::open_writer(&db, &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        let (stats, registry, pm, nvml) =
            (Stats::default(), Registry::default(), PmHub::default(), NvmlState::default());
        let gpus = Gpus::from_config_in(&cfg, dir.path());
        let pc = PcHub::new(16, crate::pcsamp::sched::SchedConfig::from_config(&cfg.pc));
        let (registry, pm) = (&registry, &pm);
        let text = render(Scrape {
            stats: &stats,
            registry,
            pm,
            arbiter: &arbiter,
            gpus: &gpus,
            nvml: &nvml,
            db_path: &db,
            pc: &pc,
        });
        for k in Kind::ALL {
            let line = format!("gpuprof_records_ingested_total{{kind=\"{}\"}} 0", k.name());
            assert!(text.contains(&line), "{line} missing");
        }
        assert!(text.contains("gpuprof_build_info{version=\""), "{text}");
        let bytes: u64 = text.lines().find_map(|l| l.strip_prefix("gpuprof_database_bytes ")).unwrap().parse().unwrap();
        assert!(bytes > 0);

        let mut pcfg = cfg.prometheus.clone();
        pcfg.listen = "127.0.0.1:0".into();
        let l = bind(&pcfg).await.unwrap().unwrap();
        let addr = l.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(l, Arc::new(|| "gpuprof_test 1\n".to_string()), shutdown.clone()));
        let get = |path: &'static str| async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            c.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("gpuprof_test 1\n"), "{ok}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), task).await.unwrap().unwrap();
    }

    fn at(pod: &str, container: &str) -> Placement {
        Placement {
            pod_name: pod.into(),
            pod_namespace: "ml".into(),
            container_name: container.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_gpu_is_labelled_with_the_one_workload_on_it() {
        let a = [at("trainer-0", "pytorch"), at("trainer-0", "pytorch")];
        assert_eq!(one_workload(a.iter()), Some(("trainer-0", "ml", "pytorch")));
        let two = [at("trainer-0", "pytorch"), at("trainer-1", "pytorch")];
        assert_eq!(one_workload(two.iter()), None, "shared by two pods: no pod label");
        let sidecar = [at("trainer-0", "pytorch"), at("trainer-0", "profiler")];
        assert_eq!(one_workload(sidecar.iter()), None, "two containers: no container label");
        assert_eq!(one_workload([at("", "")].iter()), None, "not in a named pod");
        assert_eq!(one_workload(std::iter::empty()), None, "nobody on the GPU");
    }

    #[test]
    fn a_gpu_is_labelled_with_the_one_rank_on_it() {
        let j = |job: &str, rank: Option<u32>| gpuprof_proto::agent::JobIdentity {
            job_id: job.into(),
            rank,
            ..Default::default()
        };
        let (launcher, r0, r1) = (j("run-1", None), j("run-1", Some(0)), j("run-1", Some(1)));
        assert_eq!(one_rank([&launcher, &r0].into_iter()), Some(("run-1", 0)), "a launcher is no rank");
        assert_eq!(one_rank([&r0, &r1].into_iter()), None, "two ranks share the GPU");
        assert_eq!(one_rank([&r0, &j("run-2", Some(0))].into_iter()), None, "rank 0 of two jobs");
        assert_eq!(one_rank([&r0, &r0.clone()].into_iter()), Some(("run-1", 0)), "a rank restarted");
        assert_eq!(one_rank([&launcher].into_iter()), None);
        assert_eq!(job_labels(&r1), ("run-1".to_string(), "1".to_string()));
        assert_eq!(job_labels(&launcher), ("run-1".to_string(), String::new()));
    }

    #[test]
    fn a_process_uses_the_gpu_it_reported() {
        let dev = |id, uuid: &str, pci: &str| gpuprof_proto::agent::Device {
            id,
            uuid: uuid.into(),
            pci_bus_id: pci.into(),
            ..Default::default()
        };
        // CUDA_VISIBLE_DEVICES=3: the process's device 0 is the node's GPU 3.
        let devs = [dev(0, "GPU-abc", "00000000:1B:00.0")];
        assert!(uses_gpu(&devs, Some(("gpu-ABC", "")), 3), "by UUID, any case");
        assert!(uses_gpu(&devs, Some(("", "00000000:1b:00.0")), 3), "by PCI bus id");
        assert!(!uses_gpu(&devs, Some(("GPU-def", "00000000:2C:00.0")), 0), "not by ordinal when ids are known");
        assert!(uses_gpu(&devs, None, 0) && !uses_gpu(&devs, None, 3), "by ordinal without a driver list");
        assert!(!uses_gpu(&[dev(0, "", "")], Some(("", "")), 0), "empty ids match nothing");
    }
}
