//! gpuprofd: the gpuprof daemon.
//!
//! Agents (the injector inside CUDA processes, the per-GPU samplers) connect to the agent
//! socket ([`agent`]); their records go through a bounded channel to one SQLite writer
//! thread ([`ingest`], schema in [`store`]); clients use the gRPC API ([`api`]) on the api
//! socket. See ARCHITECTURE.md for the whole picture.
#![forbid(unsafe_code)]

pub mod access;
pub mod agent;
pub mod api;
pub mod arbiter;
pub mod cbid;
pub mod config;
pub mod error;
pub mod export;
pub mod ingest;
pub mod pmstream;
pub mod prometheus;
pub mod query;
pub mod registry;
pub mod retention;
pub mod rollup;
pub mod sampler;
pub mod sessions;
pub mod stats;
pub mod store;
pub mod systemd;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use anyhow::{Context, Result};
use dashmap::DashMap;
use gpuprof_proto::agent::PmSampleBatch;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::ingest::WriterHandle;
use crate::registry::Registry;
use crate::stats::Stats;

/// Shared daemon state, one per process.
pub struct Daemon {
    pub config: Config,
    pub db_path: PathBuf,
    pub stats: Arc<Stats>,
    pub registry: Registry,
    pub writer: WriterHandle,
    /// Records received per session (for record limits and progress).
    pub session_records: DashMap<u64, AtomicU64>,
    /// Live PM samples: (process id of the sampler, batch).
    pub pm_samples: broadcast::Sender<Arc<(u64, PmSampleBatch)>>,
    pub shutdown: CancellationToken,
    /// Profiling sessions (see [`sessions`]).
    pub sessions: sessions::Sessions,
    /// Per-session rollups behind the writer (see [`rollup`]).
    pub rollup: rollup::Rollup,
    /// Per-GPU performance-monitor leases (see [`arbiter`]).
    pub arbiter: Arc<arbiter::Arbiter>,
    /// GPUs managed and their PM samplers (see [`sampler`]).
    pub gpus: Arc<sampler::Gpus>,
    /// PM stream subscribers and latest values (see [`pmstream`]).
    pub pm: pmstream::PmHub,
}

impl Daemon {
    pub fn count_session_records(&self, session: u64, n: u64) {
        if let Some(c) = self.session_records.get(&session) {
            c.fetch_add(n, Relaxed);
            return;
        }
        self.session_records.entry(session).or_default().fetch_add(n, Relaxed);
    }

    pub fn publish_pm(&self, proc: u64, b: &PmSampleBatch) {
        if self.pm_samples.receiver_count() > 0 {
            let _ = self.pm_samples.send(Arc::new((proc, b.clone())));
        }
    }
}

/// Runs the daemon until SIGTERM/SIGINT: opens the database, binds both sockets, serves,
/// then drains and commits everything queued before returning.
pub async fn run(config: Config) -> Result<()> {
    let db_path = config.database_path();
    let stats = Arc::new(Stats::default());
    let conn = store::open_writer(&db_path, &config.storage)?;
    sessions::recover(&conn).context("marking sessions of the previous run interrupted")?;
    let arbiter = arbiter::open(&conn, &config).context("restoring performance-monitor leases")?;
    let gpus = Arc::new(sampler::Gpus::from_config(&config));
    let (writer, writer_thread) =
        ingest::spawn(conn, config.ingest.queue_messages, config.ingest.commit_max_records, stats.clone())?;
    // TCP first: once the sockets answer, the whole API is up (tests and units rely on it).
    let api_tcp = api::bind_tcp(&config.api).await?;
    let agent_listener = agent::bind(&config.agent_socket)?;
    let api_listener = agent::bind_unix(&config.api_socket, config.api.socket_mode)?;
    let shutdown = CancellationToken::new();
    let d = Arc::new(Daemon {
        db_path: db_path.clone(),
        stats,
        registry: Registry::default(),
        session_records: DashMap::new(),
        pm_samples: broadcast::channel(1024).0,
        shutdown: shutdown.clone(),
        sessions: sessions::Sessions::new(writer.clone()),
        rollup: rollup::Rollup::default(),
        arbiter,
        gpus,
        pm: pmstream::PmHub::default(),
        writer,
        config,
    });
    let pm_tasks = arbiter::start(&d, &shutdown).await?;
    let sessions_task = sessions::spawn(d.clone());

    let agent_task = tokio::spawn(agent::serve(agent_listener, d.clone(), shutdown.clone()));
    let api_task = tokio::spawn(api::serve(api_listener, api_tcp, d.clone(), shutdown.clone()));

    tracing::info!(
        database = %db_path.display(),
        agent_socket = %d.config.agent_socket.display(),
        api_socket = %d.config.api_socket.display(),
        version = env!("CARGO_PKG_VERSION"),
        "gpuprofd ready"
    );
    systemd::ready();

    wait_for_signal().await;
    tracing::info!("shutting down: no new connections, draining queued records");
    systemd::stopping();
    shutdown.cancel();
    // Every task gets a bounded time to wind down: a stuck one must not keep the queued
    // records from being committed.
    let api_result = bounded("api server", api_task).await;
    bounded("agent connections", agent_task).await;
    bounded("sessions", sessions_task).await;
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

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}
