//! Daemon-wide counters, updated lock-free and read by `GetStatus`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use crate::catalog::Kind;

/// Per-kind record counters.
#[derive(Default)]
pub struct KindCounters {
    /// Committed to the database.
    pub ingested: AtomicU64,
    /// Dropped by agents (sum of their cumulative reports).
    pub dropped_by_agents: AtomicU64,
    /// Dropped by the daemon (storage failures).
    pub dropped_by_daemon: AtomicU64,
}

/// All daemon counters.
pub struct Stats {
    pub started: Instant,
    pub kinds: [KindCounters; Kind::COUNT],
    pub connected_agents: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Records CUPTI dropped inside agents (no kind known), sum of their cumulative reports.
    pub cupti_dropped: AtomicU64,
    /// Records accepted from sockets but not yet committed.
    pub queued_records: AtomicU64,
    /// Last storage error, empty when healthy.
    pub storage_error: std::sync::Mutex<String>,
    /// Sessions deleted by retention since start.
    pub expired_sessions: AtomicU64,
    /// Records deleted by retention since start (of those sessions, and outside sessions).
    pub expired_records: AtomicU64,
    /// OTLP data points the collector accepted.
    pub otlp_points_sent: AtomicU64,
    /// OTLP data points lost to failed exports or rejected by the collector.
    pub otlp_points_dropped: AtomicU64,
    /// OTLP exports that failed (collector down, slow or refusing).
    pub otlp_failed_exports: AtomicU64,
    /// PC samples sent as OTLP profiles.
    pub otlp_pc_samples_sent: AtomicU64,
    /// PC samples lost to failed profile exports or over the pending bound.
    pub otlp_pc_samples_dropped: AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            started: Instant::now(),
            kinds: Default::default(),
            connected_agents: AtomicU64::new(0),
            protocol_errors: AtomicU64::new(0),
            cupti_dropped: AtomicU64::new(0),
            queued_records: AtomicU64::new(0),
            storage_error: std::sync::Mutex::new(String::new()),
            expired_sessions: AtomicU64::new(0),
            expired_records: AtomicU64::new(0),
            otlp_points_sent: AtomicU64::new(0),
            otlp_points_dropped: AtomicU64::new(0),
            otlp_failed_exports: AtomicU64::new(0),
            otlp_pc_samples_sent: AtomicU64::new(0),
            otlp_pc_samples_dropped: AtomicU64::new(0),
        }
    }
}

impl Stats {
    pub fn kind(&self, k: Kind) -> &KindCounters {
        &self.kinds[k.index()]
    }

    pub fn add_ingested(&self, k: Kind, n: u64) {
        self.kind(k).ingested.fetch_add(n, Relaxed);
    }

    pub fn set_storage_error(&self, msg: String) {
        *self.storage_error.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    }

    pub fn storage_error(&self) -> String {
        self.storage_error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
