//! Retention, run every `retention.interval`.
//!
//! PM samples: full-rate rows in `pm_sample` for `retention.pm_full_rate`, then folded into
//! `pm_rollup` aggregates (count, mean, min, max per bucket of `retention.pm_rollup_width`)
//! kept for `retention.pm_rollup_keep`.
//!
//! Sessions and records: finished sessions (completed, failed, interrupted; never pending,
//! active or stopping) that ended more than `retention.sessions_max_age` ago are deleted with
//! everything they own: their rows in every record table, `session_processes`, the rollups
//! and `session_rows`, and their PC samples. While the database (pages in use plus the WAL)
//! is larger than `retention.database_max_size`, the oldest finished sessions go the same
//! way. Records outside sessions (session 0) older than the max age go too, and finally
//! processes rows that nothing refers to any more and that disconnected before that age.
//!
//! Nothing here stalls ingest: the record tables have no index on `session`, so rows are
//! found by the rowid ranges the rollup keeps in `session_rows` and deleted by rowid range,
//! at most [`CHUNK_ROWS`] rows per writer call, each call queued like any ingest batch with
//! a pause after it. A session's `sessions` row goes first (it disappears from the API at
//! once) and its `session_rows` last, so a restart in between finishes the job (a session
//! in `session_rows` that `sessions` no longer has is deleted like an expired one).
//!
//! Freed pages: a database created by this version uses `auto_vacuum=INCREMENTAL`, and each
//! pass that leaves free pages hands them back to the file system in small
//! `incremental_vacuum` steps, then finishes the checkpoint that copies the shrink to disk
//! if a reader held the automatic one back ([`settle_files`]), so the file shrinks. Older databases keep their free pages
//! (SQLite reuses them for new rows, so the file stops growing but does not shrink); the size
//! limit counts only pages in use either way.
//!
//! Where things are: `pm` folds PM samples; `pass` is one pass over sessions, records
//! outside sessions and processes (age, then size); `select` finds what to delete; `delete`
//! deletes it in small writer calls; `vacuum` hands freed pages back and settles the files;
//! `steps` runs each writer call and read so that ingest goes first.

mod delete;
mod pass;
mod pm;
mod select;
mod steps;
mod vacuum;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{RetentionConfig, StorageConfig};
use crate::ingest::WriterHandle;
use crate::rollup::Rollup;
use crate::stats::Stats;
use crate::store::Pages;
use pass::expire;
use pm::pm_pass;
use steps::Halt;

pub use delete::{CHUNK_ROWS, Forget, expire_processes, expire_unsessioned_chunk, forget_session};
pub use pm::{expire_rollups, rollup_step};
pub use select::{finished_before, oldest_finished, orphan_sessions, session_ranges, unsessioned_work};
pub use vacuum::{settle_files, vacuum_step};

/// The settings a SIGHUP changes while retention runs: `[retention]` and
/// `storage.max_database_mib`, read at each pass.
pub struct Live {
    retention: RwLock<RetentionConfig>,
    max_database_mib: AtomicU64,
}

impl Live {
    pub fn new(retention: RetentionConfig, max_database_mib: u64) -> Live {
        Live { retention: RwLock::new(retention), max_database_mib: AtomicU64::new(max_database_mib) }
    }

    /// The `[retention]` settings in force.
    pub fn retention(&self) -> RetentionConfig {
        self.retention.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    pub fn set_retention(&self, r: RetentionConfig) {
        *self.retention.write().unwrap_or_else(std::sync::PoisonError::into_inner) = r;
    }

    /// `storage.max_database_mib` in force.
    pub fn max_database_mib(&self) -> u64 {
        self.max_database_mib.load(Relaxed)
    }

    pub fn set_max_database_mib(&self, mib: u64) {
        self.max_database_mib.store(mib, Relaxed);
    }

    /// `base` (the `[storage]` settings at start) with `max_database_mib` as reloaded.
    pub fn storage(&self, base: &StorageConfig) -> StorageConfig {
        StorageConfig { max_database_mib: self.max_database_mib(), ..base.clone() }
    }
}

/// What retention uses: the database (read connections, the writer), the rollup it holds off
/// while it deletes, the counters it adds to, the settings (`storage` as at start, with `live`
/// for what reloads), how long the always-on PC profile is kept, and the daemon's shutdown.
pub struct Retention {
    pub db_path: PathBuf,
    pub writer: WriterHandle,
    pub rollup: Arc<Rollup>,
    pub stats: Arc<Stats>,
    pub storage: StorageConfig,
    pub live: Arc<Live>,
    pub always_on_keep: Duration,
    pub shutdown: CancellationToken,
}

impl Retention {
    fn retention(&self) -> RetentionConfig {
        self.live.retention()
    }

    /// The `[storage]` settings in force (`max_database_mib` as reloaded).
    fn storage(&self) -> StorageConfig {
        self.live.storage(&self.storage)
    }
}

/// Runs retention every `retention.interval` (as it is at each pass) until shutdown.
pub async fn run(d: Retention) {
    let shutdown = d.shutdown.clone();
    if let Ok(Ok(p)) = d.writer.call(|c| Pages::read(c)).await
        && p.auto_vacuum != 2
    {
        tracing::info!(
            "this database was created without incremental auto-vacuum: space freed by retention is reused \
             for new records but the file does not shrink (VACUUM it offline to change that, see docs/operating.md)"
        );
    }
    // The size limit's state between passes; "over the limit" is said once (until the
    // database is under it again) rather than every pass.
    let mut size = pass::SizeWatch::default();
    loop {
        // Read each pass: SIGHUP may have changed them.
        let r = d.retention();
        let width = r.pm_rollup_width.0.as_nanos() as i64;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(r.interval.0) => {}
        }
        if !pm_pass(&d, &shutdown, width).await {
            return;
        }
        match expire(&d, &shutdown, &mut size).await {
            Ok(()) => {}
            Err(Halt::Stopped) => return,
            Err(Halt::Failed(e)) => tracing::warn!(error = %e, "session retention pass failed; retrying next interval"),
        }
    }
}

#[cfg(test)]
mod component_tests {
    use super::*;

    /// Retention built from its parts, no daemon: a pass deletes the session older than
    /// `sessions_max_age` with its records, keeps the recent one, and counts what it deleted.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_pass_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let mut cfg = crate::config::Config::from_toml("").unwrap();
        let c = crate::store::open_writer(&db, &cfg.storage).unwrap();
        let now = crate::clock::now_ns() as i64;
        c.execute_batch(&format!(
            "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
               connected_ns) VALUES (1, 42, 0, 0, 'injector', 'x', '[]', '', 0, {now}, {now});
             INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, started_ns,
               stopped_ns, duration_ms, max_records, stop_reason)
               VALUES (1, 'old', 'completed', '[]', '{{}}', 0, 0, 0, 0, 1000000000, 0, 0, ''),
                      (2, 'new', 'completed', '[]', '{{}}', 0, 0, 0, 0, {now}, 0, 0, '');
             INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (1, 1, 0, 1, 7, 0, 0), (2, 1, 0, 1, 7, 0, 0);
             INSERT INTO kernel_shapes VALUES (1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
             INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (1, 1, 1, 100, 40, 1), (2, 2, 1, 100, 40, 1);"
        ))
        .unwrap();
        drop(c);
        let writer =
            crate::ingest::TestWriter::start(crate::store::open_writer(&db, &cfg.storage).unwrap(), &cfg.ingest);
        cfg.retention.sessions_max_age = crate::config::Dur(Duration::from_secs(3600));
        let r = Retention {
            db_path: db.clone(),
            writer: writer.handle.clone(),
            rollup: Arc::new(Rollup::new(db.clone(), writer.handle.clone())),
            stats: Arc::new(Stats::default()),
            storage: cfg.storage.clone(),
            live: Arc::new(Live::new(cfg.retention.clone(), 0)),
            always_on_keep: Duration::from_secs(3600),
            shutdown: CancellationToken::new(),
        };
        let shutdown = r.shutdown.clone();
        expire(&r, &shutdown, &mut pass::SizeWatch::default()).await.unwrap();
        let c = crate::store::open_reader(&db).unwrap();
        let ids: Vec<i64> = c
            .prepare("SELECT id FROM sessions")
            .unwrap()
            .query_map([], |x| x.get(0))
            .unwrap()
            .map(|x| x.unwrap())
            .collect();
        assert_eq!(ids, [2]);
        let kernels: i64 = c.query_row("SELECT count(*) FROM kernel", [], |x| x.get(0)).unwrap();
        assert_eq!(kernels, 1);
        assert_eq!(r.stats.expired_sessions.load(Relaxed), 1);
        drop(r);
        writer.stop().await;
    }
}
