//! One pass over sessions, records outside sessions and processes: sessions left
//! half-deleted first, then everything older than `retention.sessions_max_age`, then the
//! oldest finished sessions while the database is over `retention.database_max_size`, and
//! last the freed pages handed back and the files settled.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::Retention;
use super::delete::{
    CHUNK_ROWS, Forget, PROCESS_BATCH, SESSION_KEYED, delete_keyed_chunk, delete_session_rows_chunk, expire_cubins,
    expire_pc_rollups, expire_processes, expire_unsessioned_chunk, finish_session, forget_session,
};
use super::select::{finished_before, oldest_finished, orphan_sessions, session_ranges, unsessioned_work};
use super::steps::{Halt, read, step};
use super::vacuum::{settle_files, vacuum_step};
use crate::store::Pages;

/// What one pass deleted.
#[derive(Debug, Default)]
struct Tally {
    sessions: u64,
    records: u64,
    unsessioned: u64,
    processes: u64,
    pc_rollups: u64,
    vacuumed_pages: u64,
}

/// How fast the database grows between passes, so that the size limit holds until the next
/// one: a pass deletes down to the limit less the growth of the last interval (the most of the
/// last few), not just to the limit.
#[derive(Debug, Default)]
pub(super) struct SizeWatch {
    /// Bytes in use when the last pass ended.
    pub(super) after_pass: Option<u64>,
    /// Growth between the end of a pass and the start of the next, the last few.
    growth: [u64; 4],
    next: usize,
    /// Over the limit with nothing left to delete has been logged (once, until it is under).
    warned: bool,
}

impl SizeWatch {
    /// Records the growth since the last pass, `used` being the size now.
    pub(super) fn grew(&mut self, used: u64) {
        if let Some(before) = self.after_pass {
            self.growth[self.next % self.growth.len()] = used.saturating_sub(before);
            self.next += 1;
        }
    }

    /// What a pass deletes down to under `max`: `max` less the largest recent growth (at least
    /// 1 % of `max`, at most half of it).
    pub(super) fn target(&self, max: u64) -> u64 {
        let headroom = self.growth.iter().copied().max().unwrap_or(0).max(max / 100).min(max / 2);
        max - headroom
    }
}

/// One pass over sessions, records outside sessions and processes, then the size limit.
pub(super) async fn expire(d: &Retention, shutdown: &CancellationToken, size: &mut SizeWatch) -> Result<(), Halt> {
    let r = &d.retention();
    let max_age = r.sessions_max_age.0;
    let max_size = r.max_bytes(&d.storage());
    let t0 = Instant::now();
    let mut tally = Tally::default();
    if !max_age.is_zero() || max_size > 0 {
        // Every committed row in `session_rows` first: a session's ranges must be complete
        // before its rows are deleted, and session 0's entries are how old records are found.
        d.rollup.catch_up().await.map_err(|e| Halt::Failed(format!("rollup pass: {e}")))?;
    }
    if shutdown.is_cancelled() {
        return Err(Halt::Stopped);
    }
    // The always-on PC profile's rollups, after `[pc] always_on_keep` (whatever the rest).
    let keep = d.always_on_keep.as_secs() as i64;
    let rollup_cutoff = (crate::clock::now_ns() / 1_000_000_000) as i64 - keep;
    loop {
        let n = step(d, move |c| expire_pc_rollups(c, rollup_cutoff)).await?;
        tally.pc_rollups += n;
        if n == 0 {
            break;
        }
    }
    if !max_age.is_zero() || max_size > 0 {
        for id in read(d, orphan_sessions).await? {
            delete_session(d, id, "orphaned", &mut tally).await?;
        }
    }
    if !max_age.is_zero() {
        let cutoff = (crate::clock::now_ns() as i64).saturating_sub(max_age.as_nanos() as i64);
        let old = read(d, move |c| finished_before(c, cutoff)).await?;
        for id in old {
            delete_session(d, id, "age", &mut tally).await?;
        }
        expire_unsessioned(d, cutoff, &mut tally).await?;
        loop {
            let n = step(d, move |c| expire_processes(c, cutoff, PROCESS_BATCH)).await?;
            tally.processes += n;
            if n < PROCESS_BATCH {
                break;
            }
        }
        step(d, move |c| expire_cubins(c, cutoff)).await?;
    }
    if max_size > 0 {
        let wal_cap = u64::from(d.storage.wal_autocheckpoint_pages);
        let mut first = true;
        loop {
            let pages = step(d, |c| Pages::read(c)).await?;
            // The WAL counts as the size it may reach between two checkpoints, whatever it is
            // now (it grows back to that under writes), but no more (a reader holding a
            // checkpoint back is passing).
            let used = pages.used_bytes() + wal_cap * pages.page_size;
            if std::mem::take(&mut first) {
                size.grew(used);
            }
            let target = size.target(max_size);
            if used <= target {
                size.after_pass = Some(used);
                size.warned = false;
                break;
            }
            match read(d, oldest_finished).await? {
                Some(id) => {
                    tracing::info!(
                        used_bytes = used,
                        max_bytes = max_size,
                        target_bytes = target,
                        session = id,
                        "database over its size limit, or would be before the next pass"
                    );
                    delete_session(d, id, "size", &mut tally).await?;
                }
                None => {
                    size.after_pass = Some(used);
                    if used > max_size && !std::mem::replace(&mut size.warned, true) {
                        tracing::warn!(
                            used_bytes = used,
                            max_bytes = max_size,
                            "database over its retention size limit but no finished session is left to delete \
                             (open sessions, records outside sessions and PM samples are not deleted for size)"
                        );
                    }
                    break;
                }
            }
        }
    }
    // Hand free pages back to the file system (databases with incremental auto-vacuum).
    loop {
        let (pages, freed) = step(d, vacuum_step).await?;
        tally.vacuumed_pages += freed;
        if pages.auto_vacuum != 2 || pages.free == 0 || freed == 0 {
            break;
        }
    }
    let (path, wal_pages) = (d.db_path.clone(), u64::from(d.storage.wal_autocheckpoint_pages));
    step(d, move |c| settle_files(c, &path, wal_pages)).await?;
    if tally.sessions + tally.records + tally.unsessioned + tally.processes + tally.pc_rollups > 0 {
        tracing::info!(
            sessions = tally.sessions,
            session_records = tally.records,
            records_outside_sessions = tally.unsessioned,
            processes = tally.processes,
            always_on_pc_rollups = tally.pc_rollups,
            pages_returned = tally.vacuumed_pages,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "retention pass deleted old data"
        );
    }
    Ok(())
}

/// Deletes one session (finished or already forgotten) with everything it owns.
async fn delete_session(d: &Retention, id: i64, reason: &'static str, tally: &mut Tally) -> Result<(), Halt> {
    let t0 = Instant::now();
    match step(d, move |c| forget_session(c, id)).await? {
        Forget::Open => return Ok(()),
        Forget::Deleted => {
            tally.sessions += 1;
            d.stats.expired_sessions.fetch_add(1, Relaxed);
        }
        Forget::Missing => {}
    }
    let mut records = 0u64;
    for &(table, key) in SESSION_KEYED {
        loop {
            let n = step(d, move |c| delete_keyed_chunk(c, table, key, id)).await?;
            if table == "pc_sample" {
                records += n;
                d.stats.expired_records.fetch_add(n, Relaxed);
            }
            if n < CHUNK_ROWS {
                break;
            }
        }
    }
    let ranges = step(d, move |c| session_ranges(c, id)).await?;
    for (table, lo, hi) in ranges {
        let mut at = lo;
        while at <= hi {
            let (n, next) = step(d, move |c| delete_session_rows_chunk(c, table, id, at, hi)).await?;
            records += n;
            d.stats.expired_records.fetch_add(n, Relaxed);
            at = next;
        }
    }
    step(d, move |c| finish_session(c, id)).await?;
    tally.records += records;
    tracing::info!(
        session = id,
        reason,
        records,
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "expired session deleted"
    );
    Ok(())
}

/// Deletes records outside sessions that are older than `cutoff`.
async fn expire_unsessioned(d: &Retention, cutoff: i64, tally: &mut Tally) -> Result<(), Halt> {
    let work = read(d, move |c| unsessioned_work(c, cutoff)).await?;
    for (table, proc, before) in work {
        loop {
            let (n, done) = step(d, move |c| expire_unsessioned_chunk(c, table, proc, before)).await?;
            tally.unsessioned += n;
            d.stats.expired_records.fetch_add(n, Relaxed);
            if done {
                break;
            }
        }
    }
    Ok(())
}
