//! Per-session rollups, kept behind the writer instead of indexes on the record tables.
//!
//! The hot record tables have no index (each would cost every insert). A rollup pass reads
//! the rows committed since its last pass, in rowid order, on a read connection, and hands
//! small aggregates to the writer (`migrations/0002_sessions.sql` describes the tables):
//! rows and rowid range per (session, table, process), kernel duration histograms, copy
//! and API totals, device busy time. Records outside sessions (session 0) get rows and
//! rowid ranges too, which retention uses to find them. Queries then read a session's rows by rowid range and
//! answer summaries from the aggregates, whatever the size of the database.
//!
//! Passes run every second while sessions are open and before every query ([`catch_up`]),
//! one at a time. Each record is read once in its life.

use std::collections::HashMap;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tokio_util::sync::CancellationToken;

use crate::catalog::RECORD_TABLES;
use crate::error::ApiResult;
use crate::ingest::WriterHandle;

/// Rows read per table and pass; a larger backlog takes several passes. A row of kernel_data
/// or api_data holds up to two records: at most a million records a pass, whose kernels' busy
/// intervals the pass holds until it sorts them.
const CHUNK: i64 = 500_000;
/// Background pass period while sessions are open.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The rollups of one database: passes read on their own connections to `db_path` and write
/// through the writer, one at a time.
pub struct Rollup {
    lock: tokio::sync::Mutex<()>,
    db_path: std::path::PathBuf,
    writer: WriterHandle,
}

impl Rollup {
    pub fn new(db_path: std::path::PathBuf, writer: WriterHandle) -> Rollup {
        Rollup { lock: tokio::sync::Mutex::new(()), db_path, writer }
    }

    /// Holds rollup passes off. Retention deletes record rows only while it holds this: a
    /// pass reads on its own connection and writes later, and must not write progress or
    /// ranges computed from rows deleted in between.
    pub async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Brings the rollups up to the rows committed now.
    pub async fn catch_up(&self) -> ApiResult<()> {
        let _one_at_a_time = self.lock.lock().await;
        loop {
            let path = self.db_path.clone();
            let delta = tokio::task::spawn_blocking(move || -> anyhow::Result<Delta> {
                let c = crate::store::open_reader(&path)?;
                Ok(read_delta(&c, CHUNK)?)
            })
            .await??;
            if delta.progress.is_empty() {
                return Ok(());
            }
            let more = delta.more;
            self.writer.call(move |c| delta.apply(c)).await??;
            if !more {
                return Ok(());
            }
        }
    }
}

/// Runs passes every [`PERIOD`] while `open()` says sessions are open, until shutdown.
pub async fn run(r: &Rollup, open: impl Fn() -> bool, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_open = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let open = open();
        // One more pass after the last session ended picks up its final rows.
        if (open || was_open)
            && let Err(e) = r.catch_up().await
        {
            tracing::warn!(error = %e, "rollup pass failed");
        }
        was_open = open;
    }
}

/// Log-scale duration bucket: exact below 64 ns, then 32 buckets per power of two.
pub fn bucket(d: i64) -> i64 {
    if d < 64 {
        return d.max(0);
    }
    let e = 63 - i64::from(d.leading_zeros());
    let m = (d >> (e - 5)) & 31;
    64 + (e - 6) * 32 + m
}

#[derive(Debug, Clone, Copy)]
struct Agg {
    n: i64,
    total: i64,
    min: i64,
    max: i64,
}

impl Agg {
    fn add(&mut self, d: i64) {
        self.n += 1;
        self.total += d;
        self.min = self.min.min(d);
        self.max = self.max.max(d);
    }
}

#[derive(Debug, Clone, Copy)]
struct Busy {
    closed: i64,
    open_start: i64,
    open_end: i64,
    first: i64,
    last: i64,
}

/// Three sums of a rollup row.
type Sums = (i64, i64, i64);

/// What one pass adds.
#[derive(Default)]
struct Delta {
    progress: Vec<(&'static str, i64)>,
    /// (session, table, proc) → (rows, first rowid, last rowid).
    rows: HashMap<(i64, &'static str, i64), Sums>,
    /// (session, name, proc, dev, stream, bucket).
    kernels: HashMap<(i64, i64, i64, i64, i64, i64), Agg>,
    /// (session, proc, dev, stream, kind) → (count, bytes, ns).
    memcpy: HashMap<(i64, i64, i64, i64, i64), Sums>,
    /// (session, proc, domain, cbid) → (count, ns, max ns).
    api: HashMap<(i64, i64, i64, i64), Sums>,
    busy: HashMap<(i64, i64), Busy>,
    more: bool,
}

fn read_delta(c: &Connection, chunk: i64) -> rusqlite::Result<Delta> {
    let mut delta = Delta::default();
    let progress: HashMap<String, i64> = c
        .prepare("SELECT tbl, last_rowid FROM rollup_progress")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut base: HashMap<i64, i64> = HashMap::new();
    let mut intervals: HashMap<(i64, i64), Vec<(i64, i64)>> = HashMap::new();
    for &t in RECORD_TABLES {
        let last = progress.get(t).copied().unwrap_or(0);
        let cols = match t {
            "kernel" => "rowid, session, proc, dev, stream, name, start, dur, 0",
            "memcpy" => "rowid, session, proc, dev, stream, kind, start, dur, bytes",
            "memset" => "rowid, session, proc, dev, stream, 0, start, dur, 0",
            "api" => "rowid, session, proc, domain, cbid, 0, 0, dur, 0",
            _ => "rowid, session, proc, 0, 0, 0, 0, 0, 0",
        };
        // At most `chunk` rows of the table, whole: a row of kernel_data or api_data holds up to
        // two records, both with its rowid (migration 0012).
        let stored = crate::catalog::data_table(t).unwrap_or(t);
        let mut stmt = c.prepare(&format!(
            "SELECT {cols} FROM {t} WHERE rowid > ?1 AND rowid <= (SELECT max(rowid) FROM
               (SELECT rowid FROM {stored} WHERE rowid > ?1 ORDER BY rowid LIMIT ?2)) ORDER BY rowid"
        ))?;
        let mut rows = stmt.query(params![last, chunk])?;
        let mut n = 0i64;
        let mut stored_rows = 0i64;
        let mut max_rowid = last;
        while let Some(r) = rows.next()? {
            n += 1;
            let rowid: i64 = r.get(0)?;
            if rowid != max_rowid {
                stored_rows += 1;
            }
            max_rowid = rowid;
            let session: i64 = r.get(1)?;
            let proc: i64 = r.get(2)?;
            // Session 0 (records outside sessions) gets its rows and rowid ranges too, for
            // retention; no aggregates.
            let e = delta.rows.entry((session, t, proc)).or_insert((0, rowid, rowid));
            e.0 += 1;
            e.2 = rowid;
            if session == 0 {
                continue;
            }
            let (a, b, k): (i64, i64, i64) = (r.get(3)?, r.get(4)?, r.get(5)?);
            let (start, dur, bytes): (i64, i64, i64) = (r.get(6)?, r.get(7)?, r.get(8)?);
            let dur = dur.max(0);
            match t {
                "kernel" => {
                    delta
                        .kernels
                        .entry((session, k, proc, a, b, bucket(dur)))
                        .or_insert(Agg { n: 0, total: 0, min: i64::MAX, max: i64::MIN })
                        .add(dur);
                }
                "memcpy" => {
                    let m = delta.memcpy.entry((session, proc, a, b, k)).or_insert((0, 0, 0));
                    m.0 += 1;
                    m.1 += bytes;
                    m.2 += dur;
                }
                "api" => {
                    let m = delta.api.entry((session, proc, a, b)).or_insert((0, 0, 0));
                    m.0 += 1;
                    m.1 += dur;
                    m.2 = m.2.max(dur);
                }
                _ => {}
            }
            if matches!(t, "kernel" | "memcpy" | "memset") {
                let base_ns = match base.get(&proc) {
                    Some(b) => *b,
                    None => {
                        let b: i64 = c
                            .prepare_cached("SELECT base_ns FROM processes WHERE id = ?1")?
                            .query_row([proc], |r| r.get(0))
                            .optional()?
                            .unwrap_or(0);
                        base.insert(proc, b);
                        b
                    }
                };
                if let Some(iv) = interval(base_ns, start, dur) {
                    intervals.entry((session, a)).or_default().push(iv);
                }
            }
        }
        if n > 0 {
            delta.progress.push((t, max_rowid));
        }
        if stored_rows == chunk {
            delta.more = true;
        }
    }
    for (key, mut iv) in intervals {
        let prev = c
            .prepare_cached(
                "SELECT closed_ns, open_start, open_end, first_ns, last_ns FROM busy_rollup WHERE session = ?1 AND dev = ?2",
            )?
            .query_row(params![key.0, key.1], |r| {
                Ok(Busy { closed: r.get(0)?, open_start: r.get(1)?, open_end: r.get(2)?, first: r.get(3)?, last: r.get(4)? })
            })
            .optional()?;
        iv.sort_unstable();
        delta.busy.insert(key, sweep(prev, &iv));
    }
    Ok(delta)
}

/// A record's absolute (start, end) for busy time, or None when its timestamp is missing:
/// CUPTI reports 0 for a record begun before a late attach, which would stretch the
/// device's span back to 1970 (the span then read 1795371632 s at 0 % utilization).
fn interval(base_ns: i64, start: i64, dur: i64) -> Option<(i64, i64)> {
    let s = base_ns.checked_add(start)?;
    (s > 0 && dur >= 0).then(|| (s, s.saturating_add(dur)))
}

/// Continues a busy-time sweep with intervals sorted by start. An interval that starts
/// before the open merged interval (it arrived in a later pass than records after it)
/// counts for its part before the open interval.
fn sweep(prev: Option<Busy>, iv: &[(i64, i64)]) -> Busy {
    let mut it = iv.iter().copied();
    let mut b = match prev {
        Some(b) => b,
        None => match it.next() {
            Some((s, e)) => Busy { closed: 0, open_start: s, open_end: e, first: s, last: e },
            None => return Busy { closed: 0, open_start: 0, open_end: 0, first: 0, last: 0 },
        },
    };
    for (s, e) in it {
        b.first = b.first.min(s);
        b.last = b.last.max(e);
        if s < b.open_start {
            b.closed += (e.min(b.open_start) - s).max(0);
            b.open_end = b.open_end.max(e);
        } else if s <= b.open_end {
            b.open_end = b.open_end.max(e);
        } else {
            b.closed += b.open_end - b.open_start;
            b.open_start = s;
            b.open_end = e;
        }
    }
    b
}

impl Delta {
    fn apply(self, c: &mut Connection) -> rusqlite::Result<()> {
        let tx = c.transaction()?;
        {
            let mut st =
                tx.prepare_cached("INSERT OR REPLACE INTO rollup_progress(tbl, last_rowid) VALUES (?1, ?2)")?;
            for (t, r) in &self.progress {
                st.execute(params![t, r])?;
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO session_rows(session, tbl, proc, n, first_rowid, last_rowid) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(session, tbl, proc) DO UPDATE SET n = n + excluded.n,
                   first_rowid = min(first_rowid, excluded.first_rowid), last_rowid = max(last_rowid, excluded.last_rowid)",
            )?;
            for ((s, t, p), (n, first, last)) in &self.rows {
                st.execute(params![s, t, p, n, first, last])?;
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO kernel_rollup(session, name, proc, dev, stream, bucket, n, total, min, max)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
                 ON CONFLICT(session, name, proc, dev, stream, bucket) DO UPDATE SET n = n + excluded.n,
                   total = total + excluded.total, min = min(min, excluded.min), max = max(max, excluded.max)",
            )?;
            let mut per_name: HashMap<(i64, i64, i64), Agg> = HashMap::new();
            for ((s, name, p, dev, stream, b), a) in &self.kernels {
                st.execute(params![s, name, p, dev, stream, b, a.n, a.total, a.min, a.max])?;
                let e = per_name.entry((*s, *name, *b)).or_insert(Agg { n: 0, total: 0, min: i64::MAX, max: i64::MIN });
                e.n += a.n;
                e.total += a.total;
                e.min = e.min.min(a.min);
                e.max = e.max.max(a.max);
            }
            // The same per (session, name, bucket): what top kernels read when the filter is on
            // names at most.
            let mut st = tx.prepare_cached(
                "INSERT INTO kernel_name_rollup(session, name, bucket, n, total, min, max) VALUES (?1,?2,?3,?4,?5,?6,?7)
                 ON CONFLICT(session, name, bucket) DO UPDATE SET n = n + excluded.n,
                   total = total + excluded.total, min = min(min, excluded.min), max = max(max, excluded.max)",
            )?;
            for ((s, name, b), a) in &per_name {
                st.execute(params![s, name, b, a.n, a.total, a.min, a.max])?;
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO memcpy_rollup(session, proc, dev, stream, kind, n, bytes, total) VALUES (?1,?2,?3,?4,?5,?6,?7,?8)
                 ON CONFLICT(session, proc, dev, stream, kind) DO UPDATE SET n = n + excluded.n,
                   bytes = bytes + excluded.bytes, total = total + excluded.total",
            )?;
            for ((s, p, dev, stream, k), (n, bytes, total)) in &self.memcpy {
                st.execute(params![s, p, dev, stream, k, n, bytes, total])?;
            }
            let mut st = tx.prepare_cached(
                "INSERT INTO api_rollup(session, proc, domain, cbid, n, total, max) VALUES (?1,?2,?3,?4,?5,?6,?7)
                 ON CONFLICT(session, proc, domain, cbid) DO UPDATE SET n = n + excluded.n,
                   total = total + excluded.total, max = max(max, excluded.max)",
            )?;
            for ((s, p, dom, cbid), (n, total, max)) in &self.api {
                st.execute(params![s, p, dom, cbid, n, total, max])?;
            }
            let mut st = tx.prepare_cached(
                "INSERT OR REPLACE INTO busy_rollup(session, dev, closed_ns, open_start, open_end, first_ns, last_ns)
                 VALUES (?1,?2,?3,?4,?5,?6,?7)",
            )?;
            for ((s, dev), b) in &self.busy {
                st.execute(params![s, dev, b.closed, b.open_start, b.open_end, b.first, b.last])?;
            }
        }
        tx.commit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rollup on a database file and its writer, no daemon: rows committed by another
    /// connection are rolled up by `catch_up`, once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn catch_up_rolls_up_what_was_committed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&db, &cfg.storage).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let other = Connection::open(&db).unwrap();
        other
            .execute_batch(
                "PRAGMA foreign_keys=OFF;
                 INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (3, 1, 0, 1, 7, 0, 0);
                 INSERT INTO kernel_shapes VALUES (1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
                 INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (1, 1, 1, 100, 40, 1);
                 INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (1, 2, 1, 200, 60, 1);",
            )
            .unwrap();
        let r = Rollup::new(db.clone(), writer.handle.clone());
        r.catch_up().await.unwrap();
        r.catch_up().await.unwrap();
        let (n, total): (i64, i64) = other
            .query_row("SELECT sum(n), sum(total) FROM kernel_rollup WHERE session = 3", [], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .unwrap();
        assert_eq!((n, total), (2, 100), "each kernel once");
        drop(r);
        writer.stop().await;
    }

    /// Passes of at most 3 rows over rows of one and two kernels: every kernel counted once,
    /// and the session's rowid range and kernel total as stored.
    #[test]
    fn passes_read_whole_rows_of_two_records() {
        let mut c = Connection::open_in_memory().unwrap();
        c.execute_batch("PRAGMA foreign_keys=OFF").unwrap();
        crate::store::migrate(&c).unwrap();
        c.execute_batch(
            "INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (5, 1, 0, 1, 7, 0, 0);
             INSERT INTO kernel_shapes VALUES (1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);",
        )
        .unwrap();
        for i in 0..10i64 {
            // Rows 3 and 7 hold one kernel, the others two: 18 kernels of 100 + i ns (+ 1000).
            let (d2, g2) = if i % 4 == 3 { (None, None) } else { (Some(1000 + i), Some(1)) };
            c.execute(
                "INSERT INTO kernel_data(track, corr, shape, start, dur, gx, corr2, shape2, start2, dur2, gx2)
                 VALUES (1, ?1, 1, ?2, ?3, 1, 1, 1, 50, ?4, ?5)",
                rusqlite::params![2 * i, 1000 * i, 100 + i, d2, g2],
            )
            .unwrap();
        }
        let mut passes = 0;
        loop {
            let delta = read_delta(&c, 3).unwrap();
            if delta.progress.is_empty() {
                break;
            }
            let more = delta.more;
            delta.apply(&mut c).unwrap();
            passes += 1;
            if !more {
                break;
            }
        }
        assert!(passes >= 4, "{passes} passes of 3 rows");
        let (n, lo, hi): (i64, i64, i64) = c
            .query_row(
                "SELECT n, first_rowid, last_rowid FROM session_rows WHERE session = 5 AND tbl = 'kernel'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!((n, lo, hi), (18, 1, 10));
        let (count, total): (i64, i64) = c
            .query_row("SELECT sum(n), sum(total) FROM kernel_rollup WHERE session = 5", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        let want: i64 = (0..10).map(|i| 100 + i + if i % 4 == 3 { 0 } else { 1000 + i }).sum();
        assert_eq!((count, total), (18, want));
    }

    #[test]
    fn records_without_a_timestamp_do_not_stretch_the_span() {
        let base = 1_795_371_632_000_000_000;
        assert_eq!(interval(base, -base, 5), None, "absolute 0: begun before a late attach");
        assert_eq!(interval(base, 10, -1), None);
        assert_eq!(interval(base, 10, 5), Some((base + 10, base + 15)));
        let b = sweep(None, &[(base + 10, base + 15), (base + 20, base + 30)]);
        assert_eq!((b.last - b.first, b.closed + b.open_end - b.open_start), (20, 15));
    }

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut prev = -1;
        for d in (0..100_000i64).chain([1 << 20, 1 << 40, i64::MAX]) {
            let b = bucket(d);
            assert!(b >= prev, "bucket({d}) = {b} < {prev}");
            prev = b;
        }
        assert_eq!(bucket(63), 63);
        // Values in one bucket are within 1/32 of each other.
        let (lo, hi) = (1_000_000i64, 1_031_000i64);
        assert!(bucket(lo) + 1 >= bucket(hi));
    }

    #[test]
    fn busy_sweep() {
        let b = sweep(None, &[(0, 10), (5, 20), (30, 40)]);
        assert_eq!(b.closed + b.open_end - b.open_start, 30);
        // Continues in a later pass.
        let b = sweep(Some(b), &[(35, 50), (60, 61)]);
        assert_eq!(b.closed + b.open_end - b.open_start, 20 + 20 + 1);
        assert_eq!((b.first, b.last), (0, 61));
    }
}
