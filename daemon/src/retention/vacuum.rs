//! Freed pages back to the file system (databases with incremental auto-vacuum) and the
//! files on disk brought down to the database's size.

use std::time::Duration;

use rusqlite::Connection;

use crate::store::Pages;

/// Free pages handed back to the file system per writer call.
pub(super) const VACUUM_PAGES: u64 = 2048;

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
