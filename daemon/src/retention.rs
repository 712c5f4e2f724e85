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

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, Transaction, params, params_from_iter};
use tokio_util::sync::CancellationToken;

use crate::Daemon;
use crate::catalog::RECORD_TABLES;
use crate::sessions::State;
use crate::store::Pages;

/// Samples folded per step, in ns of sample time.
const STEP_NS: i64 = 10_000_000_000;

/// One step: folds up to `STEP_NS` of the oldest samples of the first device that has samples
/// older than `cutoff`. Returns false when nothing older than `cutoff` is left.
pub fn rollup_step(c: &mut Connection, cutoff: i64, width: i64) -> rusqlite::Result<bool> {
    let width = width.max(1);
    let tx = c.transaction()?;
    let mut device: Option<i64> =
        tx.query_row("SELECT MIN(device) FROM pm_sample", [], |r| r.get(0)).optional()?.flatten();
    while let Some(dev) = device {
        let lo: Option<i64> =
            tx.query_row("SELECT MIN(ts) FROM pm_sample WHERE device = ?1", [dev], |r| r.get(0)).optional()?.flatten();
        if let Some(lo) = lo.filter(|lo| *lo < cutoff) {
            let lo = lo - lo.rem_euclid(width);
            let step = STEP_NS.max(width) / width * width;
            let hi = (lo + step).min(cutoff - cutoff.rem_euclid(width)).max(lo + width).min(cutoff);
            tx.execute(
                "INSERT INTO pm_rollup(device, bucket_ns, width_ns, metric, n, mean, min, max)
                 SELECT device, (ts / ?4) * ?4, ?4, metric, COUNT(*), AVG(value), MIN(value), MAX(value)
                 FROM pm_sample WHERE device = ?1 AND ts >= ?2 AND ts < ?3
                 GROUP BY 2, metric
                 ON CONFLICT(device, metric, bucket_ns) DO UPDATE SET
                   mean = (pm_rollup.mean * pm_rollup.n + excluded.mean * excluded.n) / (pm_rollup.n + excluded.n),
                   n = pm_rollup.n + excluded.n,
                   min = MIN(pm_rollup.min, excluded.min),
                   max = MAX(pm_rollup.max, excluded.max)",
                params![dev, lo, hi, width],
            )?;
            tx.execute("DELETE FROM pm_sample WHERE device = ?1 AND ts >= ?2 AND ts < ?3", params![dev, lo, hi])?;
            tx.commit()?;
            return Ok(true);
        }
        device = tx
            .query_row("SELECT MIN(device) FROM pm_sample WHERE device > ?1", [dev], |r| r.get(0))
            .optional()?
            .flatten();
    }
    tx.commit()?;
    Ok(false)
}

/// Drops aggregates older than `cutoff`.
pub fn expire_rollups(c: &mut Connection, cutoff: i64) -> rusqlite::Result<usize> {
    c.execute("DELETE FROM pm_rollup WHERE bucket_ns < ?1", [cutoff])
}

/// Runs retention every `retention.interval` until shutdown.
pub async fn run(d: Arc<Daemon>, shutdown: CancellationToken) {
    let r = d.config.retention.clone();
    let width = r.pm_rollup_width.0.as_nanos() as i64;
    if let Ok(Ok(p)) = d.writer.call(|c| Pages::read(c)).await
        && p.auto_vacuum != 2
    {
        tracing::info!(
            "this database was created without incremental auto-vacuum: space freed by retention is reused \
             for new records but the file does not shrink (VACUUM it offline to change that, see README)"
        );
    }
    // Said once (until the database is under its limit again) rather than every pass.
    let mut warned_over_limit = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(r.interval.0) => {}
        }
        if !pm_pass(&d, &shutdown, width).await {
            return;
        }
        match expire(&d, &shutdown, &mut warned_over_limit).await {
            Ok(()) => {}
            Err(Halt::Stopped) => return,
            Err(Halt::Failed(e)) => tracing::warn!(error = %e, "session retention pass failed; retrying next interval"),
        }
    }
}

/// One PM retention pass; false once the daemon is shutting down.
async fn pm_pass(d: &Daemon, shutdown: &CancellationToken, width: i64) -> bool {
    let r = &d.config.retention;
    let now = crate::clock::now_ns() as i64;
    let cutoff = now - r.pm_full_rate.0.as_nanos() as i64;
    let mut steps = 0u64;
    loop {
        if shutdown.is_cancelled() {
            return false;
        }
        match d.writer.call(move |c| rollup_step(c, cutoff, width)).await {
            Ok(Ok(true)) => steps += 1,
            Ok(Ok(false)) => break,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "PM retention step failed");
                break;
            }
            Err(_) => return false,
        }
        // Let queued ingest batches go first.
        tokio::time::sleep(YIELD).await;
    }
    let keep_cutoff = now - r.pm_rollup_keep.0.as_nanos() as i64;
    match d.writer.call(move |c| expire_rollups(c, keep_cutoff)).await {
        Ok(Ok(n)) if n > 0 || steps > 0 => {
            tracing::debug!(steps, expired_rollups = n, "PM retention done")
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "expiring PM rollups failed"),
        _ => {}
    }
    true
}

// ---------------------------------------------------------------- sessions and records

/// Rows deleted per writer call at most.
pub const CHUNK_ROWS: u64 = 4096;
/// Rowids looked at per writer call at most (rows of other sessions in a range are skipped).
const SCAN_ROWIDS: i64 = 65_536;
/// Rowids per DELETE statement.
const STEP_ROWIDS: i64 = 4096;
/// A writer call stops after this long even when it has deleted less.
const CALL_BUDGET: Duration = Duration::from_millis(20);
/// Free pages handed back to the file system per writer call.
const VACUUM_PAGES: u64 = 2048;
/// Pause after each writer call so that queued ingest goes first.
const YIELD: Duration = Duration::from_millis(5);

/// Tables keyed by session first (WITHOUT ROWID, small), with the rest of their primary key.
const SESSION_KEYED: &[(&str, &str)] = &[
    ("kernel_rollup", "name, proc, dev, stream, bucket"),
    ("memcpy_rollup", "proc, dev, stream, kind"),
    ("api_rollup", "proc, domain, cbid"),
    ("busy_rollup", "dev"),
    ("pc_sample", "proc, function, pc, stall"),
];

/// Whether a record table has `start` and `dur` (times relative to `processes.base_ns`).
fn timed(table: &str) -> bool {
    !matches!(table, "external_correlation" | "context" | "stream")
}

/// The `&'static` name of a record table stored as text (in `session_rows.tbl`).
fn record_table(name: &str) -> Option<&'static str> {
    RECORD_TABLES.iter().copied().find(|t| *t == name)
}

/// Why a pass stopped early.
#[derive(Debug)]
enum Halt {
    /// The daemon is shutting down (or the writer is gone).
    Stopped,
    Failed(String),
}

impl From<rusqlite::Error> for Halt {
    fn from(e: rusqlite::Error) -> Self {
        Halt::Failed(e.to_string())
    }
}

/// Runs `f` on the writer while rollup passes are held off, then yields to ingest.
async fn step<T: Send + 'static>(
    d: &Daemon,
    f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Halt> {
    if d.shutdown.is_cancelled() {
        return Err(Halt::Stopped);
    }
    let r = {
        let _no_rollup = d.rollup.exclusive().await;
        d.writer.call(f).await
    };
    tokio::time::sleep(YIELD).await;
    match r {
        Ok(r) => Ok(r?),
        Err(_) => Err(Halt::Stopped),
    }
}

/// Runs `f` on a read connection (off the writer thread).
async fn read<T: Send + 'static>(
    d: &Daemon,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Halt> {
    let path = d.db_path.clone();
    tokio::task::spawn_blocking(move || -> Result<T, Halt> {
        let c = crate::store::open_reader(&path).map_err(|e| Halt::Failed(format!("{e:#}")))?;
        Ok(f(&c)?)
    })
    .await
    .map_err(|e| Halt::Failed(e.to_string()))?
}

/// What one pass deleted.
#[derive(Debug, Default)]
struct Tally {
    sessions: u64,
    records: u64,
    unsessioned: u64,
    processes: u64,
    vacuumed_pages: u64,
}

/// One pass over sessions, records outside sessions and processes, then the size limit.
async fn expire(d: &Daemon, shutdown: &CancellationToken, warned_over_limit: &mut bool) -> Result<(), Halt> {
    let r = &d.config.retention;
    let max_age = r.sessions_max_age.0;
    let max_size = r.max_bytes(&d.config.storage);
    let t0 = Instant::now();
    let mut tally = Tally::default();
    if !max_age.is_zero() || max_size > 0 {
        // Every committed row in `session_rows` first: a session's ranges must be complete
        // before its rows are deleted, and session 0's entries are how old records are found.
        crate::rollup::catch_up(d).await.map_err(|e| Halt::Failed(format!("rollup pass: {e}")))?;
    }
    if shutdown.is_cancelled() {
        return Err(Halt::Stopped);
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
    }
    if max_size > 0 {
        let wal_cap = u64::from(d.config.storage.wal_autocheckpoint_pages);
        loop {
            let pages = step(d, |c| Pages::read(c)).await?;
            let used = pages.used_bytes() + crate::store::wal_bytes(&d.db_path).min(wal_cap * pages.page_size);
            if used <= max_size {
                *warned_over_limit = false;
                break;
            }
            match read(d, oldest_finished).await? {
                Some(id) => {
                    tracing::info!(
                        used_bytes = used,
                        max_bytes = max_size,
                        session = id,
                        "database over its size limit"
                    );
                    delete_session(d, id, "size", &mut tally).await?;
                }
                None => {
                    if !std::mem::replace(warned_over_limit, true) {
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
    let (path, wal_pages) = (d.db_path.clone(), u64::from(d.config.storage.wal_autocheckpoint_pages));
    step(d, move |c| settle_files(c, &path, wal_pages)).await?;
    if tally.sessions + tally.records + tally.unsessioned + tally.processes > 0 {
        tracing::info!(
            sessions = tally.sessions,
            session_records = tally.records,
            records_outside_sessions = tally.unsessioned,
            processes = tally.processes,
            pages_returned = tally.vacuumed_pages,
            elapsed_ms = t0.elapsed().as_millis() as u64,
            "retention pass deleted old data"
        );
    }
    Ok(())
}

/// Deletes one session (finished or already forgotten) with everything it owns.
async fn delete_session(d: &Daemon, id: i64, reason: &'static str, tally: &mut Tally) -> Result<(), Halt> {
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
    step(d, move |c| c.execute("DELETE FROM session_rows WHERE session = ?1", [id])).await?;
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
async fn expire_unsessioned(d: &Daemon, cutoff: i64, tally: &mut Tally) -> Result<(), Halt> {
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

/// Finished sessions that ended before `cutoff` (ns since the epoch), oldest first.
pub fn finished_before(c: &Connection, cutoff: i64) -> rusqlite::Result<Vec<i64>> {
    c.prepare(
        "SELECT id FROM sessions
         WHERE state IN ('completed', 'failed', 'interrupted') AND coalesce(stopped_ns, started_ns, created_ns) < ?1
         ORDER BY coalesce(stopped_ns, started_ns, created_ns), id",
    )?
    .query_map([cutoff], |r| r.get(0))?
    .collect()
}

/// The finished session that ended first.
pub fn oldest_finished(c: &Connection) -> rusqlite::Result<Option<i64>> {
    c.query_row(
        "SELECT id FROM sessions WHERE state IN ('completed', 'failed', 'interrupted')
         ORDER BY coalesce(stopped_ns, started_ns, created_ns), id LIMIT 1",
        [],
        |r| r.get(0),
    )
    .optional()
}

/// Sessions with rows in `session_rows` but no `sessions` row: a deletion cut short by a
/// restart, or records an agent sent for a session after it was deleted.
pub fn orphan_sessions(c: &Connection) -> rusqlite::Result<Vec<i64>> {
    c.prepare(
        "SELECT DISTINCT session FROM session_rows
         WHERE session != 0 AND session NOT IN (SELECT id FROM sessions) ORDER BY session",
    )?
    .query_map([], |r| r.get(0))?
    .collect()
}

/// What [`forget_session`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forget {
    /// The finished session's row and members are deleted.
    Deleted,
    /// No such session (already forgotten): only its rows are left to delete.
    Missing,
    /// Open (or in an unknown state): left alone.
    Open,
}

/// Deletes a finished session's `sessions` and `session_processes` rows, in one transaction.
pub fn forget_session(c: &mut Connection, id: i64) -> rusqlite::Result<Forget> {
    let tx = c.transaction()?;
    let state: Option<String> =
        tx.query_row("SELECT state FROM sessions WHERE id = ?1", [id], |r| r.get(0)).optional()?;
    let f = match state.as_deref().map(State::parse) {
        None => Forget::Missing,
        Some(Some(s)) if !s.is_open() => Forget::Deleted,
        Some(_) => return Ok(Forget::Open),
    };
    tx.execute("DELETE FROM sessions WHERE id = ?1", [id])?;
    tx.execute("DELETE FROM session_processes WHERE session = ?1", [id])?;
    tx.commit()?;
    Ok(f)
}

/// Deletes up to [`CHUNK_ROWS`] rows of `session` from a session-keyed table; returns how many.
fn delete_keyed_chunk(c: &mut Connection, table: &str, key: &str, session: i64) -> rusqlite::Result<u64> {
    let n = c
        .prepare_cached(&format!(
            "DELETE FROM {table} WHERE session = ?1 AND ({key}) IN
           (SELECT {key} FROM {table} WHERE session = ?1 LIMIT {CHUNK_ROWS})"
        ))?
        .execute([session])?;
    Ok(n as u64)
}

/// The rowid range of a session's rows in each record table.
pub fn session_ranges(c: &mut Connection, session: i64) -> rusqlite::Result<Vec<(&'static str, i64, i64)>> {
    let rows: Vec<(String, i64, i64)> = c
        .prepare_cached(
            "SELECT tbl, min(first_rowid), max(last_rowid) FROM session_rows WHERE session = ?1 GROUP BY tbl",
        )?
        .query_map([session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows.into_iter().filter_map(|(t, lo, hi)| record_table(&t).map(|t| (t, lo, hi))).collect())
}

/// Deletes the rows matching `cond` (with parameters `?3`, ... from `extra`) in rowid order
/// from `lo` up to `hi`, stopping after [`CHUNK_ROWS`] rows, [`SCAN_ROWIDS`] rowids or
/// [`CALL_BUDGET`]. Returns the rows deleted and the first rowid not looked at.
fn delete_steps(
    tx: &Transaction<'_>,
    table: &str,
    cond: &str,
    extra: &[i64],
    lo: i64,
    hi: i64,
) -> rusqlite::Result<(u64, i64)> {
    let t0 = Instant::now();
    let mut st = tx.prepare_cached(&format!("DELETE FROM {table} WHERE rowid >= ?1 AND rowid <= ?2 AND {cond}"))?;
    let mut deleted = 0u64;
    let mut at = lo;
    while at <= hi && deleted < CHUNK_ROWS && at - lo < SCAN_ROWIDS && t0.elapsed() < CALL_BUDGET {
        // A step deletes at most as many rows as it has rowids: never more than CHUNK_ROWS.
        let width = STEP_ROWIDS.min((CHUNK_ROWS - deleted) as i64);
        let end = at.saturating_add(width - 1).min(hi);
        let mut p = vec![at, end];
        p.extend_from_slice(extra);
        deleted += st.execute(params_from_iter(p))? as u64;
        if end == i64::MAX {
            return Ok((deleted, i64::MAX));
        }
        at = end + 1;
    }
    Ok((deleted, at))
}

/// After rows at the end of a table are deleted, SQLite hands their rowids out again: the
/// rollup's read position must come back so that it reads those new rows.
fn fix_progress(tx: &Transaction<'_>, table: &str) -> rusqlite::Result<()> {
    tx.prepare_cached(&format!(
        "UPDATE rollup_progress SET last_rowid = (SELECT coalesce(max(rowid), 0) FROM {table})
         WHERE tbl = ?1 AND last_rowid > (SELECT coalesce(max(rowid), 0) FROM {table})"
    ))?
    .execute([table])?;
    Ok(())
}

/// One chunk of a session's rows in `table`, from rowid `lo` up to `hi`.
fn delete_session_rows_chunk(
    c: &mut Connection,
    table: &'static str,
    session: i64,
    lo: i64,
    hi: i64,
) -> rusqlite::Result<(u64, i64)> {
    let tx = c.transaction()?;
    let r = delete_steps(&tx, table, "session = ?3", &[session], lo, hi)?;
    fix_progress(&tx, table)?;
    tx.commit()?;
    Ok(r)
}

/// Entries of session 0 in `session_rows` with rows to delete now: (table, process, None:
/// all of them (the process disconnected before `cutoff`), Some(t): those with
/// `start + dur < t`). Rows of a process come roughly in time order, so an entry whose
/// first row is recent is skipped without going to the writer.
pub fn unsessioned_work(c: &Connection, cutoff: i64) -> rusqlite::Result<Vec<(&'static str, i64, Option<i64>)>> {
    let mut st = c.prepare(
        "SELECT sr.tbl, sr.proc, sr.first_rowid, p.base_ns, CASE WHEN p.id IS NULL THEN 0 ELSE p.disconnected_ns END
         FROM session_rows sr LEFT JOIN processes p ON p.id = sr.proc WHERE sr.session = 0",
    )?;
    let mut rows = st.query([])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let Some(table) = record_table(&r.get::<_, String>(0)?) else { continue };
        let (proc, first): (i64, i64) = (r.get(1)?, r.get(2)?);
        let (base, gone): (Option<i64>, Option<i64>) = (r.get(3)?, r.get(4)?);
        if gone.is_some_and(|g| g < cutoff) {
            out.push((table, proc, None));
        } else if timed(table) {
            let before = cutoff.saturating_sub(base.unwrap_or(0));
            let oldest: Option<i64> = c
                .prepare_cached(&format!(
                    "SELECT start + dur FROM {table} WHERE rowid >= ?1 AND session = 0 AND proc = ?2 ORDER BY rowid LIMIT 1"
                ))?
                .query_row([first, proc], |r| r.get(0))
                .optional()?;
            if oldest.is_none_or(|end| end < before) {
                out.push((table, proc, Some(before)));
            }
        }
    }
    Ok(out)
}

/// One chunk of records outside sessions of `proc` in `table`: all of them (`before` None)
/// or, from the oldest on, those with `start + dur < before` up to the first that is newer.
/// Keeps the `session_rows` entry in step. Returns the rows deleted and whether the entry
/// is done for this pass.
pub fn expire_unsessioned_chunk(
    c: &mut Connection,
    table: &'static str,
    proc: i64,
    before: Option<i64>,
) -> rusqlite::Result<(u64, bool)> {
    let tx = c.transaction()?;
    let Some((lo, hi)) = tx
        .query_row(
            "SELECT first_rowid, last_rowid FROM session_rows WHERE session = 0 AND tbl = ?1 AND proc = ?2",
            params![table, proc],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?
    else {
        return Ok((0, true));
    };
    let (deleted, next) = match before {
        None => delete_steps(&tx, table, "session = 0 AND proc = ?3", &[proc], lo, hi)?,
        Some(b) => delete_steps(&tx, table, "session = 0 AND proc = ?3 AND start + dur < ?4", &[proc, b], lo, hi)?,
    };
    // A newer row of the process in the range looked at ends this pass's work on the entry.
    let newer: Option<i64> = match before {
        None => None,
        Some(_) => tx
            .prepare_cached(&format!(
                "SELECT min(rowid) FROM {table} WHERE rowid >= ?1 AND rowid < ?2 AND session = 0 AND proc = ?3"
            ))?
            .query_row([lo, next, proc], |r| r.get(0))?,
    };
    tx.execute(
        "UPDATE session_rows SET first_rowid = ?3, n = max(n - ?4, 0) WHERE session = 0 AND tbl = ?1 AND proc = ?2",
        params![table, proc, newer.unwrap_or(next), deleted as i64],
    )?;
    tx.execute(
        "DELETE FROM session_rows WHERE session = 0 AND tbl = ?1 AND proc = ?2 AND first_rowid > last_rowid",
        params![table, proc],
    )?;
    fix_progress(&tx, table)?;
    tx.commit()?;
    Ok((deleted, newer.is_some() || next > hi))
}

/// Processes deleted per writer call at most.
const PROCESS_BATCH: u64 = 500;

/// Deletes up to `limit` processes rows (with their `process_devices` and `drops` rows) that
/// disconnected before `cutoff` and that nothing refers to any more: no session lists them,
/// no records (in `session_rows`, session 0 included) or PC samples outside sessions are
/// theirs. The newest process is kept (its id would be handed out again), and so are
/// processes from before schema version 3 (`retention_process_floor`), which may own
/// records outside sessions that `session_rows` does not know.
pub fn expire_processes(c: &mut Connection, cutoff: i64, limit: u64) -> rusqlite::Result<u64> {
    let tx = c.transaction()?;
    let floor: i64 = tx
        .query_row("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'retention_process_floor'", [], |r| r.get(0))
        .optional()?
        .unwrap_or(i64::MAX);
    tx.execute_batch(
        "CREATE TEMP TABLE IF NOT EXISTS expired_procs(id INTEGER PRIMARY KEY); DELETE FROM temp.expired_procs;",
    )?;
    let n = tx.execute(
        "INSERT INTO temp.expired_procs(id)
         SELECT id FROM processes p
         WHERE id > ?1 AND id < (SELECT max(id) FROM processes)
           AND disconnected_ns IS NOT NULL AND disconnected_ns < ?2
           AND NOT EXISTS (SELECT 1 FROM session_processes WHERE proc = p.id)
           AND NOT EXISTS (SELECT 1 FROM session_rows WHERE proc = p.id)
           AND NOT EXISTS (SELECT 1 FROM pc_sample WHERE session = 0 AND proc = p.id)
         ORDER BY id LIMIT ?3",
        params![floor, cutoff, limit as i64],
    )?;
    if n > 0 {
        tx.execute_batch(
            "DELETE FROM process_devices WHERE proc IN (SELECT id FROM temp.expired_procs);
             DELETE FROM drops WHERE proc IN (SELECT id FROM temp.expired_procs);
             DELETE FROM processes WHERE id IN (SELECT id FROM temp.expired_procs);",
        )?;
    }
    tx.execute_batch("DELETE FROM temp.expired_procs")?;
    tx.commit()?;
    Ok(n as u64)
}

/// Hands up to [`VACUUM_PAGES`] free pages back to the file system when the database uses
/// incremental auto-vacuum. Returns the pages before and the number freed.
pub fn vacuum_step(c: &mut Connection) -> rusqlite::Result<(Pages, u64)> {
    let before = Pages::read(c)?;
    if before.auto_vacuum != 2 || before.free == 0 {
        return Ok((before, 0));
    }
    // The pragma frees one page per step (each step returns a row).
    let mut st = c.prepare_cached(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))?;
    let mut rows = st.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    drop(st);
    let after = Pages::read(c)?;
    Ok((after, before.free.saturating_sub(after.free)))
}

/// Brings the files on disk down to the database's size. SQLite shrinks the main file, and
/// empties the WAL, only at a checkpoint that copies every frame back; the automatic one
/// after a commit gives up while a reader still uses an older snapshot, and with no commit
/// after it (deletions done, ingest idle) the freed space would stay on disk. So when the
/// main file is larger than its pages, or the WAL is past twice its checkpoint size, this
/// checkpoints and truncates the WAL, without waiting for readers: one still in the way
/// leaves it to the next pass. Returns whether the files now match.
pub fn settle_files(c: &mut Connection, path: &std::path::Path, wal_pages: u64) -> rusqlite::Result<bool> {
    let oversized = |c: &Connection| -> rusqlite::Result<bool> {
        let pages = Pages::read(c)?;
        let main = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        let wal = crate::store::wal_bytes(path);
        Ok(main > pages.count * pages.page_size || wal > 2 * wal_pages * pages.page_size)
    };
    if !oversized(c)? {
        return Ok(true);
    }
    c.busy_timeout(Duration::ZERO)?;
    let busy = c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0));
    c.busy_timeout(crate::store::BUSY_TIMEOUT)?;
    Ok(busy? == 0 && !oversized(c)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_old_samples_into_rollups() {
        let mut c = Connection::open_in_memory().unwrap();
        crate::store::migrate(&c).unwrap();
        let s = 1_000_000_000i64;
        // 30 s of samples at 100 Hz on two devices, two metrics.
        for dev in [1, 2] {
            for i in 0..3000i64 {
                for m in [1, 2] {
                    c.execute(
                        "INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1, ?2, 10000000, ?3, ?4)",
                        params![dev, 1000 * s + i * 10_000_000, m, (i % 10) as f64 + m as f64],
                    )
                    .unwrap();
                }
            }
        }
        let cutoff = 1020 * s;
        let mut steps = 0;
        while rollup_step(&mut c, cutoff, s).unwrap() {
            steps += 1;
            assert!(steps < 100);
        }
        assert!(steps >= 4, "small steps: {steps}");
        let left: i64 = c.query_row("SELECT COUNT(*) FROM pm_sample", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 2 * 2 * 1000, "the last 10 s stay at full rate");
        let min_ts: i64 = c.query_row("SELECT MIN(ts) FROM pm_sample", [], |r| r.get(0)).unwrap();
        assert!(min_ts >= cutoff);
        let (buckets, n, mean, lo, hi): (i64, i64, f64, f64, f64) = c
            .query_row(
                "SELECT COUNT(*), SUM(n), AVG(mean), MIN(min), MAX(max) FROM pm_rollup WHERE device = 1 AND metric = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert_eq!(buckets, 20);
        assert_eq!(n, 2000);
        assert!((mean - 5.5).abs() < 1e-9, "{mean}");
        assert_eq!((lo, hi), (1.0, 10.0));
        assert_eq!(expire_rollups(&mut c, 1010 * s).unwrap(), 2 * 2 * 10);
    }
}

#[cfg(test)]
mod session_tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn db() -> Connection {
        let c = Connection::open_in_memory().unwrap();
        // As on the daemon's writer (the bundled SQLite enforces foreign keys by default).
        c.execute_batch("PRAGMA foreign_keys=OFF").unwrap();
        crate::store::migrate(&c).unwrap();
        c
    }

    fn process(c: &Connection, id: i64, base_ns: i64, disconnected_ns: Option<i64>) {
        c.execute(
            "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
                                   connected_ns, disconnected_ns)
             VALUES (?1, ?1, 0, 0, 'injector', 'x', '[]', '', 0, ?2, ?2, ?3)",
            params![id, base_ns, disconnected_ns],
        )
        .unwrap();
    }

    fn session(c: &Connection, id: i64, state: &str, stopped_ns: Option<i64>) {
        c.execute(
            "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, started_ns,
                                  stopped_ns, duration_ms, max_records, stop_reason)
             VALUES (?1, '', ?2, '[]', '{}', 0, 0, 0, 0, ?3, 0, 0, '')",
            params![id, state, stopped_ns],
        )
        .unwrap();
    }

    fn kernel(c: &Connection, session: i64, proc: i64, start: i64) {
        c.execute(
            "INSERT INTO kernel VALUES (?1, ?2, 0, 0, 7, 0, 1, ?3, 10, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)",
            params![session, proc, start],
        )
        .unwrap();
    }

    /// What the rollup pass would have written for every row so far.
    fn roll_up(c: &Connection) {
        c.execute_batch("DELETE FROM session_rows; DELETE FROM rollup_progress;").unwrap();
        for t in RECORD_TABLES {
            c.execute_batch(&format!(
                "INSERT INTO session_rows SELECT session, '{t}', proc, count(*), min(rowid), max(rowid)
                   FROM {t} GROUP BY session, proc;
                 INSERT INTO rollup_progress SELECT '{t}', coalesce(max(rowid), 0) FROM {t};"
            ))
            .unwrap();
        }
    }

    fn count(c: &Connection, sql: &str) -> i64 {
        c.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// The writer-side steps of [`delete_session`], in the same order.
    fn delete_now(c: &mut Connection, id: i64) -> (Forget, u64, usize) {
        let f = forget_session(c, id).unwrap();
        if f == Forget::Open {
            return (f, 0, 0);
        }
        let mut calls = 0;
        for &(table, key) in SESSION_KEYED {
            loop {
                let n = delete_keyed_chunk(c, table, key, id).unwrap();
                assert!(n <= CHUNK_ROWS);
                calls += 1;
                if n < CHUNK_ROWS {
                    break;
                }
            }
        }
        let mut records = 0;
        for (table, lo, hi) in session_ranges(c, id).unwrap() {
            let mut at = lo;
            while at <= hi {
                let (n, next) = delete_session_rows_chunk(c, table, id, at, hi).unwrap();
                assert!(n <= CHUNK_ROWS && next > at);
                records += n;
                calls += 1;
                at = next;
            }
        }
        c.execute("DELETE FROM session_rows WHERE session = ?1", [id]).unwrap();
        (f, records, calls)
    }

    #[test]
    fn deletes_old_finished_sessions_with_everything_they_own() {
        let mut c = db();
        process(&c, 1, 0, None);
        process(&c, 2, 0, None);
        session(&c, 1, "completed", Some(100 * S));
        session(&c, 2, "failed", Some(900 * S));
        session(&c, 3, "active", None);
        session(&c, 4, "interrupted", Some(200 * S));
        // Sessions 1 and 3 run side by side (their rowid ranges overlap), then 2; session 0 in between.
        for i in 0..10_000 {
            kernel(&c, if i % 3 == 0 { 3 } else { 1 }, 1 + i % 2, i);
            if i % 100 == 0 {
                kernel(&c, 0, 1, i);
            }
        }
        for i in 0..3000 {
            kernel(&c, 2, 2, i);
        }
        for s in [1, 2, 3] {
            c.execute(
                "INSERT INTO session_processes(session, proc, joined_ns, state) VALUES (?1, 1, 0, 'stopped')",
                [s],
            )
            .unwrap();
            c.execute("INSERT INTO busy_rollup VALUES (?1, 0, 1, 2, 3, 4, 5)", [s]).unwrap();
            c.execute("INSERT INTO pc_sample VALUES (?1, 1, 5, 16, 6, 0, 3)", [s]).unwrap();
        }
        // More rollup rows than one chunk.
        for b in 0..(CHUNK_ROWS as i64 + 100) {
            c.execute("INSERT INTO kernel_rollup VALUES (1, 1, 1, 0, 7, ?1, 1, 10, 10, 10)", [b]).unwrap();
        }
        for s in [2, 3] {
            c.execute("INSERT INTO kernel_rollup VALUES (?1, 1, 2, 0, 7, 5, 1, 10, 10, 10)", [s]).unwrap();
        }
        roll_up(&c);

        assert_eq!(finished_before(&c, 500 * S).unwrap(), [1, 4]);
        assert_eq!(oldest_finished(&c).unwrap(), Some(1));
        let s1 = count(&c, "SELECT count(*) FROM kernel WHERE session = 1");
        let (f, records, calls) = delete_now(&mut c, 1);
        assert_eq!(f, Forget::Deleted);
        assert_eq!(records as i64, s1);
        assert!(calls >= 4, "deleted in chunks: {calls} calls");
        for (t, col) in [
            ("kernel", "session"),
            ("sessions", "id"),
            ("session_processes", "session"),
            ("session_rows", "session"),
            ("kernel_rollup", "session"),
            ("busy_rollup", "session"),
            ("pc_sample", "session"),
        ] {
            assert_eq!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 1")), 0, "{t}");
            assert!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 2")) > 0, "{t} of session 2");
            assert!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 3")) > 0, "{t} of session 3");
        }
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 3"), 3334);
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 2"), 3000);
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0"), 100);
        // Open sessions are never deleted, whatever asks.
        assert_eq!(delete_now(&mut c, 3).0, Forget::Open);
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 3"), 3334);
        // Rows left behind by a deletion cut short are found and finished.
        c.execute("DELETE FROM sessions WHERE id = 2", []).unwrap();
        assert_eq!(orphan_sessions(&c).unwrap(), [2]);
        assert_eq!(delete_now(&mut c, 2), (Forget::Missing, 3000, SESSION_KEYED.len() + 1));
        assert!(orphan_sessions(&c).unwrap().is_empty());
    }

    #[test]
    fn deleting_the_last_rows_brings_the_rollup_position_back() {
        let mut c = db();
        process(&c, 1, 0, None);
        session(&c, 1, "completed", Some(S));
        for i in 0..100 {
            kernel(&c, 0, 1, i);
        }
        for i in 0..100 {
            kernel(&c, 1, 1, i);
        }
        roll_up(&c);
        assert_eq!(count(&c, "SELECT last_rowid FROM rollup_progress WHERE tbl = 'kernel'"), 200);
        delete_now(&mut c, 1);
        // The next row gets rowid 101 again: the rollup must read it.
        assert_eq!(count(&c, "SELECT last_rowid FROM rollup_progress WHERE tbl = 'kernel'"), 100);
        kernel(&c, 0, 1, 5);
        assert_eq!(count(&c, "SELECT max(rowid) FROM kernel"), 101);
    }

    #[test]
    fn session_ids_are_not_reused() {
        let mut c = db();
        session(&c, 1, "completed", Some(S));
        delete_now(&mut c, 1);
        c.execute(
            "INSERT INTO sessions(name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms,
                                  max_records) VALUES ('', 'active', '[]', '{}', 0, 0, 0, 0, 0)",
            [],
        )
        .unwrap();
        assert_eq!(c.last_insert_rowid(), 2);
    }

    #[test]
    fn expires_records_outside_sessions_by_age() {
        let mut c = db();
        let now = 10_000 * S;
        let cutoff = now - 100 * S;
        // Process 1 left long ago; process 2 is still connected, with old and new records.
        process(&c, 1, 1000 * S, Some(2000 * S));
        process(&c, 2, 5000 * S, None);
        session(&c, 1, "active", None);
        for i in 0..5000 {
            kernel(&c, 0, 1, i * S / 10);
            // Process 2: ends at 5000 s + i s, so the first 4900 are older than the cutoff.
            kernel(&c, 0, 2, i * S);
            kernel(&c, 1, 2, i * S);
        }
        for p in [1, 2] {
            c.execute("INSERT INTO context VALUES (0, ?1, 1, 0, 7)", [p]).unwrap();
        }
        roll_up(&c);
        let mut work = unsessioned_work(&c, cutoff).unwrap();
        work.sort();
        assert_eq!(work, [("context", 1, None), ("kernel", 1, None), ("kernel", 2, Some(cutoff - 5000 * S))]);
        let mut deleted = 0;
        for (t, p, before) in work {
            loop {
                let (n, done) = expire_unsessioned_chunk(&mut c, t, p, before).unwrap();
                assert!(n <= CHUNK_ROWS);
                deleted += n;
                if done {
                    break;
                }
            }
        }
        assert_eq!(deleted, 1 + 5000 + 4900);
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0 AND proc = 1"), 0);
        assert_eq!(count(&c, "SELECT count(*) FROM context WHERE proc = 1"), 0);
        assert_eq!(count(&c, "SELECT count(*) FROM context WHERE proc = 2"), 1, "the live process's context stays");
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0 AND proc = 2"), 100);
        assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 1"), 5000, "session rows untouched");
        assert_eq!(count(&c, "SELECT count(*) FROM session_rows WHERE session = 0 AND proc = 1"), 0);
        let (n, first): (i64, i64) = c
            .query_row(
                "SELECT n, first_rowid FROM session_rows WHERE session = 0 AND tbl = 'kernel' AND proc = 2",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(n, 100);
        assert_eq!(first, count(&c, "SELECT min(rowid) FROM kernel WHERE session = 0 AND proc = 2"));
        // Nothing more to do until time passes.
        assert!(unsessioned_work(&c, cutoff).unwrap().iter().all(|w| w.0 == "context" || w.1 != 2));
    }

    #[test]
    fn expires_processes_nothing_refers_to() {
        let mut c = db();
        let old = Some(10 * S);
        process(&c, 1, 0, old); // nothing refers to it
        process(&c, 2, 0, old); // member of a session
        process(&c, 3, 0, old); // has records outside sessions
        process(&c, 4, 0, None); // connected
        process(&c, 5, 0, Some(1000 * S)); // left recently
        process(&c, 6, 0, old); // PC samples outside sessions
        process(&c, 7, 0, old); // the newest: kept so that its id is not handed out again
        c.execute_batch(
            "INSERT INTO devices VALUES (1, 'GPU-1', 'H100', 9, 0, 132, 80, '0000:01:00.0', 0);
             INSERT INTO process_devices VALUES (1, 0, 1);
             INSERT INTO drops VALUES (1, 'kernel', 5);
             INSERT INTO session_processes(session, proc, joined_ns, state) VALUES (9, 2, 0, 'stopped');
             INSERT INTO session_rows VALUES (0, 'kernel', 3, 1, 1, 1);
             INSERT INTO pc_sample VALUES (0, 6, 1, 1, 1, 0, 1);",
        )
        .unwrap();
        assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 1);
        let left: Vec<i64> = c
            .prepare("SELECT id FROM processes ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(left, [2, 3, 4, 5, 6, 7]);
        assert_eq!(count(&c, "SELECT count(*) FROM process_devices"), 0);
        assert_eq!(count(&c, "SELECT count(*) FROM drops"), 0);
        assert_eq!(count(&c, "SELECT count(*) FROM devices"), 1, "devices stay");
        // Processes from before schema version 3 are never deleted.
        c.execute("UPDATE meta SET value = '3' WHERE key = 'retention_process_floor'", []).unwrap();
        c.execute("DELETE FROM session_processes", []).unwrap();
        assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 0);
        c.execute("UPDATE meta SET value = '0' WHERE key = 'retention_process_floor'", []).unwrap();
        assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 1);
    }

    /// A new database file in `dir` with `n` kernel rows, all checkpointed into the main file.
    fn database_with_kernels(dir: &std::path::Path, n: u32) -> (std::path::PathBuf, Connection) {
        let path = dir.join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap().storage;
        let c = crate::store::open_writer(&path, &cfg).unwrap();
        process(&c, 1, 0, None);
        c.execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
             INSERT INTO kernel SELECT 0, 1, 0, 0, 7, i, 1, i * 1000, 5000, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0 FROM n",
            [n],
        )
        .unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        (path, c)
    }

    #[test]
    fn incremental_vacuum_shrinks_a_new_database() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut c) = database_with_kernels(dir.path(), 300_000);
        let full = std::fs::metadata(&path).unwrap().len();
        c.execute("DELETE FROM kernel", []).unwrap();
        let p = Pages::read(&c).unwrap();
        assert_eq!(p.auto_vacuum, 2);
        assert!(p.free * p.page_size > full / 2, "{p:?}");
        let mut steps = 0;
        loop {
            let t = Instant::now();
            let (after, freed) = vacuum_step(&mut c).unwrap();
            eprintln!("incremental vacuum: {freed} pages in {:?}", t.elapsed());
            if steps == 0 {
                assert_eq!(freed, p.free.min(VACUUM_PAGES), "{after:?}");
            }
            steps += 1;
            if after.free == 0 || freed == 0 {
                break;
            }
        }
        assert_eq!(steps, p.free.div_ceil(VACUUM_PAGES));
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        let small = std::fs::metadata(&path).unwrap().len();
        assert!(small < full / 4, "{full} -> {small}");
    }

    /// A reader on an older snapshot holds the shrink back; once it is gone, one settle
    /// brings the main file down to the database's pages and empties the WAL.
    #[test]
    fn settle_files_shrinks_the_files_once_readers_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let (path, mut c) = database_with_kernels(dir.path(), 100_000);
        let wal_pages = u64::from(crate::config::Config::from_toml("").unwrap().storage.wal_autocheckpoint_pages);
        assert!(settle_files(&mut c, &path, wal_pages).unwrap(), "nothing to settle yet");
        let full = std::fs::metadata(&path).unwrap().len();
        // A reader in the middle of a read transaction, on the snapshot before the delete.
        let r = crate::store::open_reader(&path).unwrap();
        r.execute_batch("BEGIN").unwrap();
        let _: i64 = r.query_row("SELECT count(*) FROM kernel", [], |x| x.get(0)).unwrap();
        c.execute("DELETE FROM kernel", []).unwrap();
        while vacuum_step(&mut c).unwrap().1 > 0 {}
        let pages = Pages::read(&c).unwrap();
        assert!(pages.count * pages.page_size < full / 2, "{pages:?}, file {full}");
        assert!(!settle_files(&mut c, &path, wal_pages).unwrap(), "the reader holds the old pages");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), full);
        r.execute_batch("COMMIT").unwrap();
        drop(r);
        assert!(settle_files(&mut c, &path, wal_pages).unwrap());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), pages.count * pages.page_size);
        assert_eq!(crate::store::wal_bytes(&path), 0);
    }
}
