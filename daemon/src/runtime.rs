//! The one place that starts gpuprofd's long-lived tasks and wires their channels: open the
//! database and the writer thread, bind the sockets, start the managers' tasks, serve, reload
//! the reloadable settings on SIGHUP, and on SIGTERM/SIGINT wind everything down in order so
//! every queued record is committed.

use std::sync::Arc;

use anyhow::{Context, Result};
use dashmap::DashMap;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::registry::Registry;
use crate::stats::Stats;
use crate::{
    Daemon, agent, api, arbiter, devmetrics, ingest, kubelet, nvml, otlp, pmstream, prometheus, reload, retention,
    rollup, sampler, sessions, store, systemd,
};

/// Runs the daemon until SIGTERM/SIGINT: opens the database, binds both sockets, serves
/// (reloading on SIGHUP from `source`), then drains and commits everything queued before
/// returning.
pub async fn run(config: Config, source: reload::Source) -> Result<()> {
    // The handlers exist before the sockets are even bound: a SIGTERM sent as soon as a socket
    // answers a connect (the accept loops may not run yet), or right after READY=1, must stop
    // the daemon cleanly, not kill it. One received during start is acted on once it serves.
    let signals = Signals::install();
    let db_path = config.database_path();
    let stats = Arc::new(Stats::default());
    let (conn, moved_aside) = store::open_writer_or_move_aside(&db_path, &config.storage)?;
    if let Some(msg) = moved_aside {
        stats.set_storage_error(msg);
    }
    sessions::recover(&conn).context("marking sessions of the previous run interrupted")?;
    let arbiter = arbiter::open(&conn, &config).context("restoring performance-monitor leases")?;
    let (nvml, nvml_state) = open_nvml(&config);
    let gpus = Arc::new(sampler::Gpus::from_nvml(&config, &nvml_state));
    let (writer, write) = ingest::writer(conn, &config.ingest, stats.clone())?;
    let writer_thread = std::thread::Builder::new().name("gpuprof-writer".into()).spawn(write)?;
    // TCP first: once the sockets answer, the whole API is up (tests and units rely on it).
    let api_tcp = api::bind_tcp(&config.api).await?;
    let agent_listener = agent::bind(&config.agent_socket)?;
    let api_listener = agent::bind_unix(&config.api_socket, config.api.socket_mode)?;
    let shutdown = CancellationToken::new();
    let (sessions, sessions_persister) = sessions::Sessions::new(writer.clone());
    let tcp_auth = api_tcp.as_ref().map(|t| t.security.auth.clone());
    let mut reloader = reload::Reloader::new(source, config.clone(), tcp_auth);
    let d = Arc::new(Daemon {
        live: Arc::new(retention::Live::new(config.retention.clone(), config.storage.max_database_mib)),
        db_path: db_path.clone(),
        stats,
        registry: Registry::default(),
        session_records: DashMap::new(),
        pm_samples: broadcast::channel(1024).0,
        nvml: nvml_state,
        shutdown: shutdown.clone(),
        pods: kubelet::Pods::new(&config.kubernetes),
        sessions,
        rollup: Arc::new(rollup::Rollup::new(config.database_path(), writer.clone())),
        arbiter,
        gpus,
        pm: Arc::default(),
        pc: Arc::new(crate::pcsamp::PcHub::new(
            config.sampler.stream_queue,
            crate::pcsamp::sched::SchedConfig::from_config(&config.pc),
        )),
        otlp_pc: Default::default(),
        writer,
        config,
    });
    // Long-lived tasks, all started here. Subscriptions to agent events are taken before the
    // agent socket serves, so no join or leave is missed.
    // The session persister writes until the last `Sessions` handle is gone.
    tokio::spawn(sessions_persister);
    let mut pm_tasks = start_pm(&d, &shutdown).await?;
    if let Some(n) = nvml
        && d.config.metrics.enabled
        && !d.nvml.inventory.devices.is_empty()
    {
        let publisher = d.clone();
        let parts = devmetrics::DevMetrics {
            cfg: d.config.metrics.clone(),
            devices: d.nvml.inventory.devices.clone(),
            writer: d.writer.clone(),
            stats: d.stats.clone(),
            publish: Box::new(move |source, b| publisher.publish(0, source, b)),
        };
        pm_tasks.push(tokio::spawn(devmetrics::run(parts, n, shutdown.clone())));
    }
    let sessions_task = {
        let (d, events, shutdown) = (d.clone(), d.registry.subscribe(), shutdown.clone());
        tokio::spawn(async move { sessions::supervise(d.session_supervisor(), events, shutdown).await })
    };
    sessions::start_always_on(d.session_api(), d.config.pc.always_on).await;
    let rollup_task = {
        let d = d.clone();
        tokio::spawn(async move { rollup::run(&d.rollup, || d.sessions.open_count() > 0, d.shutdown.clone()).await })
    };
    let retention_task = tokio::spawn(retention::run(retention::Retention {
        db_path: d.db_path.clone(),
        writer: d.writer.clone(),
        rollup: d.rollup.clone(),
        stats: d.stats.clone(),
        storage: d.config.storage.clone(),
        live: d.live.clone(),
        always_on_keep: d.config.pc.always_on_keep.0,
        shutdown: shutdown.clone(),
    }));

    let agent_task = {
        let (d, sd) = (d.clone(), shutdown.clone());
        let connection = move |stream| {
            let (d, sd) = (d.clone(), sd.clone());
            async move { agent::handle(stream, d.agent_connections(), sd).await }
        };
        tokio::spawn(agent::serve(agent_listener, connection, shutdown.clone()))
    };
    let api_task = tokio::spawn(api::serve(api_listener, api_tcp, d.clone(), shutdown.clone()));

    tracing::info!("{}", ready_line(&d.config.api_socket, &d.config.agent_socket, &db_path));
    systemd::ready();

    serve_signals(signals, &d, &mut reloader).await;
    tracing::info!("shutting down: no new connections, draining queued records");
    systemd::stopping();
    shutdown.cancel();
    // Every task gets a bounded time to wind down: a stuck one must not keep the queued
    // records from being committed.
    let api_result = bounded("api server", api_task).await;
    bounded("agent connections", agent_task).await;
    bounded("sessions", sessions_task).await;
    bounded("rollup", rollup_task).await;
    bounded("retention", retention_task).await;
    for t in pm_tasks {
        bounded("performance-monitor tasks", t).await;
    }
    let sock_paths = [
        d.config.agent_socket.clone(),
        d.config.api_socket.clone(),
        gpuprof_proto::hint::hint_path(&d.config.agent_socket),
    ];
    // Everything queued before Stop is committed; the writer then checkpoints and exits.
    let _ = d.writer.stop().await;
    drop(d);
    tokio::task::spawn_blocking(move || writer_thread.join())
        .await
        .context("joining writer")?
        .map_err(|_| anyhow::anyhow!("database writer panicked"))?;
    for p in sock_paths {
        let _ = std::fs::remove_file(p);
    }
    if let Some(Err(e)) = api_result {
        return Err(e);
    }
    tracing::info!("gpuprofd stopped");
    Ok(())
}

/// Starts everything PM-related: the arbiter's driver, one sampler supervisor per GPU, and
/// the Prometheus endpoint (with the latest-value tracker it reads) when configured.
async fn start_pm(d: &Arc<Daemon>, shutdown: &CancellationToken) -> Result<Vec<JoinHandle<()>>> {
    let agents = d.registry.subscribe();
    for dev in d.gpus.managed() {
        if d.config.sampler.always_on {
            d.arbiter.add_device(dev);
        } else {
            d.arbiter.manage_device(dev);
        }
    }
    let driver = {
        let (d, shutdown) = (d.clone(), shutdown.clone());
        tokio::spawn(async move {
            let parts = arbiter::Driver {
                arbiter: &d.arbiter,
                registry: &d.registry,
                gpus: &*d.gpus,
                pc: &d.pc,
                writer: &d.writer,
                sampler: &d.config.sampler,
            };
            arbiter::run(parts, agents, shutdown).await
        })
    };
    let mut tasks = vec![driver];
    tasks.extend(sampler::spawned_devices(&d.config.sampler, &d.gpus).into_iter().map(|dev| {
        let parts = sampler::Supervised {
            sampler: d.config.sampler.clone(),
            agent_socket: d.config.agent_socket.clone(),
            gpus: d.gpus.clone(),
        };
        tokio::spawn(sampler::supervise(parts, dev, shutdown.clone()))
    }));
    let prometheus = prometheus::bind(&d.config.prometheus).await?;
    let otlp = if d.config.otlp.endpoint.is_empty() { None } else { Some(otlp::channel(&d.config.otlp)?) };
    if prometheus.is_some() || otlp.is_some() {
        tasks.push(tokio::spawn(pmstream::track_latest(d.pm_samples.subscribe(), d.pm.clone(), shutdown.clone())));
    }
    if let Some(l) = prometheus {
        let dd = d.clone();
        let render: prometheus::Render = Arc::new(move || prometheus::render(dd.scrape()));
        tasks.push(tokio::spawn(prometheus::serve(l, render, shutdown.clone())));
    }
    if let Some(channel) = otlp {
        let (ds, dp) = (d.clone(), d.clone());
        let exporter = otlp::Exporter {
            config: d.config.otlp.clone(),
            stats: d.stats.clone(),
            snapshot: Box::new(move || otlp::Snapshot::take(ds.otlp_sources())),
            pc: Box::new(move || (dp.otlp_pc.take(), otlp::proc_infos(&dp.registry))),
        };
        tasks.push(tokio::spawn(otlp::run(exporter, channel, shutdown.clone())));
    }
    let (n, note) = d.gpus.summary(&d.arbiter);
    // Without GPUs the note repeats why (NVML's warning said it already).
    if n > 0 {
        tracing::info!(gpus = n, note = %note, "performance-monitor arbiter ready");
    } else {
        tracing::debug!(note = %note, "performance-monitor arbiter ready, no GPU");
    }
    Ok(tasks)
}

/// The API socket gpuprofctl uses and the agent socket traced processes connect to when
/// nothing says otherwise.
const DEFAULT_API_SOCKET: &str = "/run/gpuprof/api.sock";
const DEFAULT_AGENT_SOCKET: &str = "/run/gpuprof/agent.sock";

/// The one start-up line: where gpuprofd listens and, where a socket is not the default, the
/// `export` that points gpuprofctl (GPUPROF_API_SOCKET) and traced processes
/// (GPUPROF_AGENT_SOCKET) at it, with absolute paths so that it works from any directory.
pub fn ready_line(api: &std::path::Path, agent: &std::path::Path, db: &std::path::Path) -> String {
    let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (api, agent, db) = (abs(api), abs(agent), abs(db));
    let mut line = format!(
        "gpuprofd {} ready: API on {}, agents on {}, database {}",
        env!("CARGO_PKG_VERSION"),
        api.display(),
        agent.display(),
        db.display()
    );
    let mut exports = Vec::new();
    if api != std::path::Path::new(DEFAULT_API_SOCKET) {
        exports.push(format!("GPUPROF_API_SOCKET={}", api.display()));
    }
    if agent != std::path::Path::new(DEFAULT_AGENT_SOCKET) {
        exports.push(format!("GPUPROF_AGENT_SOCKET={}", agent.display()));
    }
    if !exports.is_empty() {
        line.push_str(&format!("; in another shell: export {}", exports.join(" ")));
    }
    line
}

/// Opens NVML (or its script) for the inventory and the always-on metrics; without it the
/// daemon runs on and the state says why.
fn open_nvml(config: &Config) -> (Option<Box<dyn nvml::Nvml>>, crate::NvmlState) {
    match nvml::open(&config.metrics) {
        Ok(n) => {
            let inventory = n.inventory();
            tracing::info!(
                gpus = inventory.devices.len(),
                driver = %inventory.driver_version,
                cuda = %inventory.cuda_version,
                "NVML loaded"
            );
            (Some(n), crate::NvmlState { inventory, error: None })
        }
        Err(e) => {
            tracing::warn!("{e}");
            (None, crate::NvmlState { inventory: Default::default(), error: Some(e) })
        }
    }
}

/// Awaits a task for at most 10 s; `None` (and a warning) if it did not finish or panicked.
async fn bounded<T>(what: &str, task: tokio::task::JoinHandle<T>) -> Option<T> {
    match tokio::time::timeout(std::time::Duration::from_secs(10), task).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::error!(task = what, error = %e, "task failed during shutdown");
            None
        }
        Err(_) => {
            tracing::warn!(task = what, "task still running 10 s after shutdown began; leaving it");
            None
        }
    }
}

/// SIGTERM, SIGINT and SIGHUP, caught from the moment they are installed.
struct Signals(
    std::io::Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
);

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals((|| {
            Ok((signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?))
        })())
    }
}

/// Returns at SIGTERM or SIGINT; reloads the configuration at each SIGHUP meanwhile.
async fn serve_signals(signals: Signals, d: &Daemon, reloader: &mut reload::Reloader) {
    let Ok((mut term, mut int, mut hup)) = signals.0 else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                systemd::reloading();
                reloader.reload(&d.writer, &d.live).await;
                systemd::ready();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn the_ready_line_says_where_and_how_to_point_clients_there() {
        let line = super::ready_line(
            Path::new("/run/gpuprof/api.sock"),
            Path::new("/run/gpuprof/agent.sock"),
            Path::new("/var/lib/gpuprof/gpuprof.db"),
        );
        assert!(line.starts_with("gpuprofd ") && line.contains(" ready: API on /run/gpuprof/api.sock, "), "{line}");
        assert!(!line.contains("export"), "the defaults need no export: {line}");
        let line =
            super::ready_line(Path::new("state/api.sock"), Path::new("state/agent.sock"), Path::new("state/x.db"));
        let cwd = std::env::current_dir().unwrap();
        let want = format!(
            "; in another shell: export GPUPROF_API_SOCKET={} GPUPROF_AGENT_SOCKET={}",
            cwd.join("state/api.sock").display(),
            cwd.join("state/agent.sock").display()
        );
        assert!(line.ends_with(&want), "{line}");
    }
}
