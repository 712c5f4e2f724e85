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

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::Daemon;
use crate::store::Pages;
use pass::expire;
use pm::pm_pass;
use steps::Halt;

pub use delete::{CHUNK_ROWS, Forget, expire_processes, expire_unsessioned_chunk, forget_session};
pub use pm::{expire_rollups, rollup_step};
pub use select::{finished_before, oldest_finished, orphan_sessions, session_ranges, unsessioned_work};
pub use vacuum::{settle_files, vacuum_step};

/// Runs retention every `retention.interval` (as it is at each pass) until shutdown.
pub async fn run(d: Arc<Daemon>, shutdown: CancellationToken) {
    if let Ok(Ok(p)) = d.writer.call(|c| Pages::read(c)).await
        && p.auto_vacuum != 2
    {
        tracing::info!(
            "this database was created without incremental auto-vacuum: space freed by retention is reused \
             for new records but the file does not shrink (VACUUM it offline to change that, see README)"
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
