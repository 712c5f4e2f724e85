//! A Prometheus text endpoint (`[prometheus] listen`, off by default): the latest PM values
//! per GPU, the arbiter's state per GPU, and the daemon's own counters, so an existing
//! monitoring stack can scrape every node. Plain HTTP/1.1, `GET /metrics` only.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Daemon;
use crate::catalog::Kind;

/// Binds the endpoint if configured.
pub async fn bind(d: &Daemon) -> Result<Option<TcpListener>> {
    if d.config.prometheus.listen.is_empty() {
        return Ok(None);
    }
    let addr = &d.config.prometheus.listen;
    let l = TcpListener::bind(addr).await.with_context(|| format!("binding prometheus.listen {addr}"))?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(Some(l))
}

/// Serves until shutdown.
pub async fn serve(listener: TcpListener, d: Arc<Daemon>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok((stream, _)) => {
                    let d = d.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(Duration::from_secs(10), answer(stream, &d)).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "prometheus accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

async fn answer(mut s: tokio::net::TcpStream, d: &Daemon) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut chunk).await?;
        if n == 0 || buf.len() > 16 * 1024 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = String::from_utf8_lossy(&buf);
    let first = line.lines().next().unwrap_or_default();
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
        ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(d))
    } else {
        ("404 Not Found", "text/plain; charset=utf-8", "only GET /metrics is served here\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

fn esc(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The exposition text.
pub fn render(d: &Daemon) -> String {
    let mut o = String::with_capacity(4096);
    let s = &d.stats;
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    family(&mut o, "gpuprof_pm_value", "gauge", "Latest PM sample value per GPU and metric.");
    let latest = d.pm.latest();
    for (dev, l) in &latest {
        for (m, v) in l.metrics.iter().zip(&l.values) {
            let _ = writeln!(o, "gpuprof_pm_value{{gpu=\"{dev}\",metric=\"{}\"}} {v}", esc(m));
        }
    }
    family(&mut o, "gpuprof_pm_last_sample_seconds", "gauge", "End time of the latest PM sample (Unix seconds).");
    for (dev, l) in &latest {
        let _ = writeln!(o, "gpuprof_pm_last_sample_seconds{{gpu=\"{dev}\"}} {:.6}", l.end_ns as f64 / 1e9);
    }
    family(&mut o, "gpuprof_pm_samples_total", "counter", "PM samples received per GPU since start.");
    for (dev, l) in &latest {
        let _ = writeln!(o, "gpuprof_pm_samples_total{{gpu=\"{dev}\"}} {}", l.samples);
    }
    let res = d.arbiter.reservations();
    family(&mut o, "gpuprof_gpu_paused", "gauge", "1 while an operator's pause holds the GPU's performance monitor.");
    for r in &res {
        let paused = r.holder.as_ref().is_some_and(|h| h.holder_kind == "pause");
        let _ = writeln!(o, "gpuprof_gpu_paused{{gpu=\"{}\"}} {}", r.device, u8::from(paused));
    }
    family(
        &mut o,
        "gpuprof_gpu_held_externally",
        "gauge",
        "1 while an outside tool holds the GPU's performance monitor.",
    );
    for r in &res {
        let _ = writeln!(o, "gpuprof_gpu_held_externally{{gpu=\"{}\"}} {}", r.device, u8::from(r.held_externally));
    }
    family(&mut o, "gpuprof_sampler_restarts_total", "counter", "PM sampler child restarts per GPU.");
    for (dev, st) in d.gpus.snapshot() {
        let _ = writeln!(o, "gpuprof_sampler_restarts_total{{gpu=\"{dev}\"}} {}", st.restarts);
    }
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
    let _ = writeln!(o, "gpuprof_database_bytes {}", crate::store::database_bytes(&d.db_path));
    for (name, help, v) in [
        ("gpuprof_otlp_points_sent_total", "OTLP data points the collector accepted.", &s.otlp_points_sent),
        (
            "gpuprof_otlp_points_dropped_total",
            "OTLP data points lost to failed exports or rejected by the collector.",
            &s.otlp_points_dropped,
        ),
        ("gpuprof_otlp_failed_exports_total", "OTLP exports that failed.", &s.otlp_failed_exports),
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
fn processes(o: &mut String, d: &Daemon) {
    let _ = writeln!(
        o,
        "# HELP gpuprof_process_tracing 1 while a session traces the process, 0 while it is idle; one series per \
         connected CUDA process.\n# TYPE gpuprof_process_tracing gauge"
    );
    let mut agents: Vec<_> = d.registry.all().into_iter().filter(|a| a.kind == "injector").collect();
    agents.sort_by_key(|a| a.id);
    for a in agents {
        let p = &a.placement;
        let exe = a.exe.rsplit('/').next().unwrap_or_default();
        let _ = writeln!(
            o,
            "gpuprof_process_tracing{{process_id=\"{}\",pid=\"{}\",exe=\"{}\",container_id=\"{}\",pod_uid=\"{}\",pod=\"{}\",namespace=\"{}\"}} {}",
            a.id,
            a.pid,
            esc(exe),
            esc(&p.container_id),
            esc(&p.pod_uid),
            esc(&p.pod_name),
            esc(&p.pod_namespace),
            u8::from(a.trace_state() == "tracing"),
        );
    }
}
