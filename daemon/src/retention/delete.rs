//! Deleting in small writer calls: each call deletes at most [`CHUNK_ROWS`] rows by rowid
//! range (the record tables have no index on `session`), keeps the rollup's read position
//! right, and returns where the next call goes on.

use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, Transaction, params, params_from_iter};

use crate::sessions::State;

/// Rows deleted per writer call at most.
pub const CHUNK_ROWS: u64 = 4096;
/// Rowids looked at per writer call at most (rows of other sessions in a range are skipped).
const SCAN_ROWIDS: i64 = 65_536;
/// Rowids per DELETE statement.
const STEP_ROWIDS: i64 = 4096;
/// A writer call stops after this long even when it has deleted less.
const CALL_BUDGET: Duration = Duration::from_millis(20);

/// Tables keyed by session first (WITHOUT ROWID, small), with the rest of their primary key.
pub(super) const SESSION_KEYED: &[(&str, &str)] = &[
    ("kernel_rollup", "name, proc, dev, stream, bucket"),
    ("kernel_name_rollup", "name, bucket"),
    ("memcpy_rollup", "proc, dev, stream, kind"),
    ("api_rollup", "proc, domain, cbid"),
    ("busy_rollup", "dev"),
    ("pc_sample", "proc, function, pc, stall"),
    ("pc_sampling", "proc, device"),
    ("pc_timeline", "proc, function, stall, t"),
];

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
pub(super) fn delete_keyed_chunk(c: &mut Connection, table: &str, key: &str, session: i64) -> rusqlite::Result<u64> {
    let n = c
        .prepare_cached(&format!(
            "DELETE FROM {table} WHERE session = ?1 AND ({key}) IN
           (SELECT {key} FROM {table} WHERE session = ?1 LIMIT {CHUNK_ROWS})"
        ))?
        .execute([session])?;
    Ok(n as u64)
}

/// Deletes the rows of `owner` (a condition on `session` and `proc`) that also match `cond`
/// (a condition on the row's own columns, or "1"), with parameters `?3`, ... from `extra`,
/// in rowid order from `lo` up to `hi`, stopping after [`CHUNK_ROWS`] rows, [`SCAN_ROWIDS`]
/// rowids or [`CALL_BUDGET`]. Returns the rows deleted and the first rowid not looked at.
fn delete_steps(
    tx: &Transaction<'_>,
    table: &str,
    owner: &str,
    cond: &str,
    extra: &[i64],
    lo: i64,
    hi: i64,
) -> rusqlite::Result<(u64, i64)> {
    let t0 = Instant::now();
    // Rows of the record views are stored in their `_data` table, owned through `tracks`.
    // A row of a paired table holds one record or two: it says which as it goes.
    let paired = crate::catalog::paired(table);
    let sql = match crate::catalog::data_table(table) {
        Some(data) => format!(
            "DELETE FROM {data} WHERE rowid >= ?1 AND rowid <= ?2 AND track IN (SELECT id FROM tracks WHERE {owner}) AND {cond}{}",
            if paired { " RETURNING dur2 IS NOT NULL" } else { "" }
        ),
        None => format!("DELETE FROM {table} WHERE rowid >= ?1 AND rowid <= ?2 AND {owner} AND {cond}"),
    };
    let mut st = tx.prepare_cached(&sql)?;
    let mut deleted = 0u64;
    let mut at = lo;
    while at <= hi && deleted < CHUNK_ROWS && at - lo < SCAN_ROWIDS && t0.elapsed() < CALL_BUDGET {
        // A step deletes at most as many rows as it has rowids: never more than CHUNK_ROWS.
        let width = STEP_ROWIDS.min((CHUNK_ROWS - deleted) as i64);
        let end = at.saturating_add(width - 1).min(hi);
        let mut p = vec![at, end];
        p.extend_from_slice(extra);
        if paired {
            let mut rows = st.query(params_from_iter(p))?;
            while let Some(r) = rows.next()? {
                deleted += 1 + u64::from(r.get::<_, bool>(0)?);
            }
        } else {
            deleted += st.execute(params_from_iter(p))? as u64;
        }
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
    // max(rowid) of the `_data` table is one b-tree descent; of the view, a scan.
    let stored = crate::catalog::data_table(table).unwrap_or(table);
    tx.prepare_cached(&format!(
        "UPDATE rollup_progress SET last_rowid = (SELECT coalesce(max(rowid), 0) FROM {stored})
         WHERE tbl = ?1 AND last_rowid > (SELECT coalesce(max(rowid), 0) FROM {stored})"
    ))?
    .execute([table])?;
    Ok(())
}

/// One chunk of a session's rows in `table`, from rowid `lo` up to `hi`.
pub(super) fn delete_session_rows_chunk(
    c: &mut Connection,
    table: &'static str,
    session: i64,
    lo: i64,
    hi: i64,
) -> rusqlite::Result<(u64, i64)> {
    let tx = c.transaction()?;
    let r = delete_steps(&tx, table, "session = ?3", "1", &[session], lo, hi)?;
    fix_progress(&tx, table)?;
    tx.commit()?;
    Ok(r)
}

/// The last step of deleting a session: its `session_rows` entries and its tracks, once its
/// rows are gone. A late record of the session gets a new track (and `session_rows` entry),
/// which the next pass deletes in turn.
pub(super) fn finish_session(c: &mut Connection, session: i64) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    tx.execute("DELETE FROM session_rows WHERE session = ?1", [session])?;
    tx.execute("DELETE FROM tracks WHERE session = ?1", [session])?;
    tx.commit()
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
        None => delete_steps(&tx, table, "session = 0 AND proc = ?3", "1", &[proc], lo, hi)?,
        // A `_data` row's start counts from its track's base (migration 0011).
        Some(b) => {
            let older = if crate::catalog::paired(table) {
                // Both records of the row: the second starts `start2` after the first.
                "start + max(dur, coalesce(start2 + dur2, dur)) < ?4 - (SELECT base FROM tracks WHERE id = track)"
            } else {
                "start + dur < ?4 - (SELECT base FROM tracks WHERE id = track)"
            };
            delete_steps(&tx, table, "session = 0 AND proc = ?3", older, &[proc, b], lo, hi)?
        }
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

/// Deletes the cubins first seen before `cutoff` that no PC sample row refers to (its module);
/// a few per pass (one cubin is one row, however large).
pub fn expire_cubins(c: &mut Connection, cutoff: i64) -> rusqlite::Result<u64> {
    let n = c.execute(
        "DELETE FROM cubins WHERE hash IN (
           SELECT hash FROM cubins WHERE first_seen_ns < ?1
             AND hash NOT IN (SELECT value FROM strings WHERE id IN (SELECT DISTINCT module FROM pc_sample))
           LIMIT 64)",
        [cutoff],
    )?;
    Ok(n as u64)
}

/// Processes deleted per writer call at most.
pub(super) const PROCESS_BATCH: u64 = 500;

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
           AND NOT EXISTS (SELECT 1 FROM pc_rollup WHERE proc = p.id)
         ORDER BY id LIMIT ?3",
        params![floor, cutoff, limit as i64],
    )?;
    if n > 0 {
        tx.execute_batch(
            "DELETE FROM process_devices WHERE proc IN (SELECT id FROM temp.expired_procs);
             DELETE FROM drops WHERE proc IN (SELECT id FROM temp.expired_procs);
             DELETE FROM tracks WHERE proc IN (SELECT id FROM temp.expired_procs);
             DELETE FROM processes WHERE id IN (SELECT id FROM temp.expired_procs);",
        )?;
    }
    tx.execute_batch("DELETE FROM temp.expired_procs")?;
    tx.commit()?;
    Ok(n as u64)
}

/// Minutes of the always-on PC profile deleted per call.
pub const ROLLUP_MINUTES: i64 = 60;

/// Deletes the always-on PC profile's rollups of minutes before `cutoff_s` (s since the Unix
/// epoch), the oldest [`ROLLUP_MINUTES`] minutes at most; returns the rows deleted.
pub fn expire_pc_rollups(c: &mut Connection, cutoff_s: i64) -> rusqlite::Result<u64> {
    let n = c.execute(
        "DELETE FROM pc_rollup WHERE minute < ?1 AND minute IN
           (SELECT DISTINCT minute FROM pc_rollup WHERE minute < ?1 ORDER BY minute LIMIT ?2)",
        params![cutoff_s, ROLLUP_MINUTES],
    )?;
    Ok(n as u64)
}
