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
pub mod catalog;
pub mod cbid;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod demangle;
pub mod devmetrics;
pub mod error;
pub mod export;
mod fasthash;
pub mod ingest;
pub mod job;
pub mod kubelet;
pub mod nvml;
pub mod otlp;
pub mod otlp_profiles;
pub mod pcsamp;
pub mod pmstream;
pub mod prometheus;
pub mod query;
pub mod registry;
pub mod reload;
pub mod retention;
pub mod rollup;
pub mod runtime;
pub mod sampler;
pub mod sessions;
pub mod stats;
pub mod store;
pub mod systemd;
pub mod uds_authority;

pub use runtime::run;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use dashmap::DashMap;
use gpuprof_proto::agent::PmSampleBatch;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::ingest::WriterHandle;
use crate::registry::Registry;
use crate::stats::Stats;

/// One batch on `Daemon::pm_samples`.
#[derive(Debug)]
pub struct PmPublished {
    /// The sampler's connection (0 for readings the daemon made itself).
    pub proc: u64,
    pub source: nvml::Source,
    /// `device_id` is the daemon's device index.
    pub batch: PmSampleBatch,
}

impl PmPublished {
    /// Publishes batch `b` of `source` from connection `proc` on `to` (when anyone listens).
    pub fn publish(to: &broadcast::Sender<Arc<PmPublished>>, proc: u64, source: nvml::Source, b: &PmSampleBatch) {
        if to.receiver_count() > 0 {
            let _ = to.send(Arc::new(PmPublished { proc, source, batch: b.clone() }));
        }
    }
}

/// NVML's answer at start.
#[derive(Debug, Clone, Default)]
pub struct NvmlState {
    pub inventory: nvml::Inventory,
    /// Why NVML is not available ("no NVIDIA driver found (...)"), if it is not.
    pub error: Option<String>,
}

impl NvmlState {
    /// The device of NVML index `index`.
    pub fn device(&self, index: u32) -> Option<&nvml::DeviceInfo> {
        self.inventory.devices.iter().find(|d| d.index == index)
    }
}

/// Shared daemon state, one per process.
pub struct Daemon {
    /// The settings the daemon started with; those that SIGHUP reloads are read from their
    /// own cells (`retention()`).
    pub config: Config,
    /// `[retention]` and `storage.max_database_mib`, as SIGHUP reloads them.
    pub live: Arc<retention::Live>,
    pub db_path: PathBuf,
    pub stats: Arc<Stats>,
    pub registry: Registry,
    pub writer: WriterHandle,
    /// Records received per session (for record limits and progress).
    pub session_records: DashMap<u64, AtomicU64>,
    /// Live samples of every source (CUPTI PM samplers, NVML, GPM).
    pub pm_samples: broadcast::Sender<Arc<PmPublished>>,
    /// What NVML said at start: the GPUs, or why there are none.
    pub nvml: NvmlState,
    pub shutdown: CancellationToken,
    /// Pod names and namespaces from the kubelet (`[kubernetes]`).
    pub pods: kubelet::Pods,
    /// Profiling sessions (see [`sessions`]).
    pub sessions: sessions::Sessions,
    /// Per-session rollups behind the writer (see [`rollup`]).
    pub rollup: Arc<rollup::Rollup>,
    /// Per-GPU performance-monitor leases (see [`arbiter`]).
    pub arbiter: Arc<arbiter::Arbiter>,
    /// GPUs managed and their PM samplers (see [`sampler`]).
    pub gpus: Arc<sampler::Gpus>,
    /// PM stream subscribers and latest values (see [`pmstream`]).
    pub pm: Arc<pmstream::PmHub>,
    /// PC sampling per (session, process, device), its leases and stream (see [`pcsamp`]).
    pub pc: Arc<pcsamp::PcHub>,
    /// PC samples waiting for the next OTLP profiles export (see [`otlp_profiles`]).
    pub otlp_pc: otlp_profiles::PcProfiles,
}

impl Daemon {
    /// Checks that session `id` exists and that `caller` may read it
    /// ([`access::authorize_session`] with this daemon's sessions, database and admin group).
    pub async fn authorize_session(&self, caller: &access::Caller, id: u64) -> error::ApiResult<()> {
        access::authorize_session(self.session_owners(id), caller, id).await
    }

    /// Who owns session `id`, for [`access::authorize_session`].
    /// What a Prometheus scrape reads ([`prometheus::render`]).
    pub fn scrape(&self) -> prometheus::Scrape<'_> {
        prometheus::Scrape {
            stats: &self.stats,
            registry: &self.registry,
            pm: &self.pm,
            arbiter: &self.arbiter,
            gpus: &self.gpus,
            nvml: &self.nvml,
            db_path: &self.db_path,
            pc: &self.pc,
        }
    }

    /// What an OTLP metrics snapshot reads ([`otlp::Snapshot::take`]).
    pub fn otlp_sources(&self) -> otlp::Sources<'_> {
        otlp::Sources { pm: &self.pm, gpus: &self.gpus, registry: &self.registry, stats: &self.stats }
    }

    /// What the sessions' CUPTI PM sampling uses ([`sessions::pm`]).
    pub(crate) fn pm(&self) -> sessions::pm::Pm<'_> {
        sessions::pm::Pm { sampler: &self.config.sampler, arbiter: &self.arbiter }
    }

    /// What the sessions' PC sampling of their members uses ([`sessions::pc`]).
    pub(crate) fn session_pc(&self) -> sessions::pc::Pc<'_> {
        sessions::pc::Pc {
            settings: &self.config.pc,
            busy_retry: self.config.sampler.pc_busy_retry.0,
            hub: &self.pc,
            arbiter: &self.arbiter,
            found: &self.gpus.found,
            registry: &self.registry,
            sessions: &self.sessions,
        }
    }

    /// What the sessions' transitions and their supervisor use ([`sessions::supervise`]).
    pub(crate) fn session_supervisor(&self) -> sessions::supervisor::Supervisor<'_> {
        sessions::supervisor::Supervisor {
            sessions: &self.sessions,
            registry: &self.registry,
            session_records: &self.session_records,
            agent: &self.config.agent,
            agent_socket: &self.config.agent_socket,
            pm: self.pm(),
            pc: self.session_pc(),
        }
    }

    /// What the session handlers use ([`sessions::start`] and the others).
    pub(crate) fn session_api(&self) -> sessions::api::Handlers<'_> {
        sessions::api::Handlers {
            supervisor: self.session_supervisor(),
            writer: &self.writer,
            db_path: &self.db_path,
            rollup: &self.rollup,
            admin_group: &self.config.api.admin_group,
        }
    }

    /// What a PM stream subscription uses ([`pmstream::subscribe`]).
    pub fn pm_streams(&self) -> pmstream::Streams<'_> {
        pmstream::Streams {
            sampler: &self.config.sampler,
            samples: &self.pm_samples,
            hub: &self.pm,
            arbiter: &self.arbiter,
            nvml: &self.nvml,
            no_gpu: self.no_gpu_reason(),
            shutdown: &self.shutdown,
        }
    }

    /// What a stream of session `id`'s PC samples uses ([`pmstream::pc_stream`]).
    pub fn pc_streams(&self, id: u64) -> pmstream::PcStreams<'_> {
        pmstream::PcStreams { owners: self.session_owners(id), hub: &self.pc, sessions: &self.sessions }
    }

    pub fn session_owners(&self, id: u64) -> access::SessionOwners<'_> {
        access::SessionOwners {
            live: self.sessions.live_owner(id),
            db_path: &self.db_path,
            admin_group: &self.config.api.admin_group,
        }
    }

    /// What the calls reading session `id` use (see [`query::Reads`]).
    pub fn reads(&self, id: u64) -> query::Reads<'_> {
        query::Reads {
            db_path: &self.db_path,
            rollup: &self.rollup,
            writer: &self.writer,
            owners: self.session_owners(id),
        }
    }

    /// The retention settings in force (reloaded by SIGHUP).
    pub fn retention(&self) -> crate::config::RetentionConfig {
        self.live.retention()
    }

    /// The `[storage]` settings in force (`max_database_mib` reloaded by SIGHUP).
    pub fn storage(&self) -> crate::config::StorageConfig {
        self.live.storage(&self.config.storage)
    }

    pub fn publish(&self, proc: u64, source: nvml::Source, b: &PmSampleBatch) {
        PmPublished::publish(&self.pm_samples, proc, source, b);
    }

    /// What the agent connections use ([`agent::handle`]).
    pub fn agent_connections(&self) -> agent::Connections<'_> {
        agent::Connections {
            agent: &self.config.agent,
            otlp_profiles: self.config.otlp.profiles && !self.config.otlp.endpoint.is_empty(),
            writer: &self.writer,
            stats: &self.stats,
            registry: &self.registry,
            pods: &self.pods,
            session_records: &self.session_records,
            sessions: &self.sessions,
            pc: &self.pc,
            arbiter: &self.arbiter,
            otlp_pc: &self.otlp_pc,
            pm_samples: &self.pm_samples,
            db_path: &self.db_path,
        }
    }

    /// Why GPU commands cannot work here: no GPU managed and none found by NVML (the NVML
    /// error first, which names the missing driver).
    pub fn no_gpu_reason(&self) -> Option<String> {
        if !self.arbiter.devices().is_empty() || !self.nvml.inventory.devices.is_empty() {
            return None;
        }
        Some(match &self.nvml.error {
            Some(e) => e.clone(),
            None if !self.gpus.note.is_empty() => self.gpus.note.clone(),
            None => "this gpuprofd manages no GPU".into(),
        })
    }
}
