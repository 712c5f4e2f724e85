//! What to delete: finished sessions by age or oldest first, sessions left half-deleted, the
//! rowid ranges of a session's rows, and records outside sessions that are old enough.

use rusqlite::{Connection, OptionalExtension};

use crate::catalog::{RECORD_TABLES, timed};

/// The `&'static` name of a record table stored as text (in `session_rows.tbl`).
fn record_table(name: &str) -> Option<&'static str> {
    RECORD_TABLES.iter().copied().find(|t| *t == name)
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
