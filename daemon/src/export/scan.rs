//! A session's rows of one event table, read from its `_data` table (migration 0008) with
//! each row's track, shape and kind looked up in maps held here, not joined by SQLite row by
//! row: the record views' joins were most of an export's SQLite work. The rows are those the
//! view gives with [`where_for`](crate::query::where_for): the session's rowid range and
//! tracks, the filter's processes, and its devices, streams and kernel name pattern where the
//! table has them, and its time range. Rows of a process without a `processes` row (no base
//! for its times) are left out, as the exports always did. [`tracks`] and [`Filter`] serve
//! the Parquet reader (`parquet_rows`) too.

use std::collections::HashSet;

use gpuprof_proto::api as pb;
use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};

use super::rec::{EVENT_TABLES, Rec};
use crate::catalog::Second;
use crate::fasthash::FastMap;
use crate::query::{NAME_GLOB, cols, rollups};

/// What a row takes from its track (and the track's process).
pub(super) struct Track {
    pub(super) session: i64,
    pub(super) proc: i64,
    pub(super) dev: i64,
    pub(super) ctx: i64,
    pub(super) stream: i64,
    pub(super) tid: i64,
    /// The process's pid.
    pub(super) pid: i64,
    /// The process's `base_ns` plus the track's `base`: a stored start plus this is ns since
    /// the epoch.
    pub(super) base: i64,
}

/// The session's tracks by id, of processes with a `processes` row.
pub(super) fn tracks(c: &Connection, session: u64) -> rusqlite::Result<FastMap<i64, Track>> {
    let mut tracks = FastMap::default();
    let mut st = c.prepare(
        "SELECT t.id, t.session, t.proc, t.dev, t.ctx, t.stream, t.tid, p.pid, p.base_ns + t.base FROM tracks t
         JOIN processes p ON p.id = t.proc WHERE t.session = ?1",
    )?;
    let mut rows = st.query([session as i64])?;
    while let Some(r) = rows.next()? {
        let t = Track {
            session: r.get(1)?,
            proc: r.get(2)?,
            dev: r.get(3)?,
            ctx: r.get(4)?,
            stream: r.get(5)?,
            tid: r.get(6)?,
            pid: r.get(7)?,
            base: r.get(8)?,
        };
        tracks.insert(r.get(0)?, t);
    }
    Ok(tracks)
}

/// Which rows of a table pass a filter: SQLite bounds the rowids (and matches kernel names),
/// [`Filter::keeps`] the rest by the row's track and times.
pub(super) struct Filter {
    table: &'static str,
    lo: i64,
    hi: i64,
    procs: HashSet<i64>,
    devs: HashSet<i64>,
    streams: HashSet<i64>,
    /// Rows ending before `from` or starting at or after `to` are left out.
    from: i64,
    to: i64,
    pattern: Option<String>,
}

impl Filter {
    pub(super) fn new(
        c: &Connection,
        table: &'static str,
        session: u64,
        f: &pb::RecordFilter,
    ) -> rusqlite::Result<Filter> {
        let (lo, hi) = rollups::rowid_range(c, table, session)?;
        let cl = cols(table);
        let list = |on: bool, ids: &[u32]| -> HashSet<i64> {
            if on { ids.iter().map(|x| i64::from(*x)).collect() } else { HashSet::new() }
        };
        let (from, to) = match f.time_range.as_ref().filter(|_| cl.time) {
            Some(t) => (
                if t.start_ns > 0 { t.start_ns as i64 } else { i64::MIN },
                if t.end_ns > 0 { t.end_ns as i64 } else { i64::MAX },
            ),
            None => (i64::MIN, i64::MAX),
        };
        Ok(Filter {
            table,
            lo,
            hi,
            procs: f.process_ids.iter().map(|p| *p as i64).collect(),
            devs: list(cl.dev, &f.device_ids),
            streams: list(cl.stream, &f.stream_ids),
            from,
            to,
            pattern: (cl.name && !f.name_pattern.is_empty()).then(|| f.name_pattern.clone()),
        })
    }

    /// The statement reading `cols` (names of the `_data` table's columns or literals, split by
    /// ", ") after the track id, one row per record, and its parameters. A row of a paired
    /// table (migration 0012) gives its second record too, right after its first.
    pub(super) fn select(&self, cols: &str) -> (String, Vec<Value>) {
        let table = self.table;
        let pair = crate::catalog::pair_columns(table);
        let paired = !pair.is_empty();
        let col = |c: &str| -> String {
            match pair.iter().find(|(p, _)| *p == c).map(|(_, second)| second) {
                Some(Second::Delta) => format!("CASE h.n WHEN 0 THEN d.{c} ELSE d.{c} + d.{c}2 END"),
                Some(Second::Own) => format!("CASE h.n WHEN 0 THEN d.{c} ELSE d.{c}2 END"),
                None if c.chars().all(|x| x.is_ascii_lowercase() || x == '_') => format!("d.{c}"),
                None => c.to_string(),
            }
        };
        let cols = cols.split(", ").map(col).collect::<Vec<_>>().join(", ");
        let mut sql = if paired {
            format!(
                "SELECT d.track, {cols} FROM {table}_data d CROSS JOIN halves h
                 WHERE d.rowid BETWEEN ?1 AND ?2 AND (h.n = 0 OR d.dur2 IS NOT NULL)"
            )
        } else {
            format!("SELECT d.track, {cols} FROM {table}_data d WHERE d.rowid BETWEEN ?1 AND ?2")
        };
        let mut params = vec![Value::Integer(self.lo), Value::Integer(self.hi)];
        if let Some(p) = &self.pattern {
            let names = format!("(SELECT id FROM strings WHERE {})", NAME_GLOB.replace("?", "?3"));
            // Kernels name themselves through their shape; the other named kinds directly.
            if table == "kernel" {
                sql.push_str(&format!(" AND {} IN (SELECT id FROM kernel_shapes WHERE name IN {names})", col("shape")));
            } else {
                sql.push_str(&format!(" AND {} IN {names}", col("name")));
            }
            params.push(Value::Text(p.clone()));
        }
        (sql, params)
    }

    /// Whether a row of track `t` starting at `start` (ns since the epoch) and lasting `dur`
    /// passes (untimed tables: any times).
    pub(super) fn keeps(&self, t: &Track, start: i64, dur: i64) -> bool {
        (self.procs.is_empty() || self.procs.contains(&t.proc))
            && (self.devs.is_empty() || self.devs.contains(&t.dev))
            && (self.streams.is_empty() || self.streams.contains(&t.stream))
            && start.saturating_add(dur) >= self.from
            && start < self.to
    }
}

/// The session's tracks, kernel shapes, copy shapes and API kinds: read once by each reading
/// thread.
pub(super) struct Dims {
    tracks: FastMap<i64, Track>,
    /// name, gy * 1000 + gz, bx * 1000000 + by * 1000 + bz, regs, ssmem + dsmem.
    kernel_shapes: FastMap<i64, [i64; 5]>,
    /// kind, src_dev, dst_dev.
    memcpy_shapes: FastMap<i64, [i64; 3]>,
    /// domain, cbid, ret.
    api_kinds: FastMap<i64, [i64; 3]>,
}

fn map<const N: usize>(c: &Connection, sql: &str) -> rusqlite::Result<FastMap<i64, [i64; N]>> {
    let mut st = c.prepare(sql)?;
    let mut rows = st.query([])?;
    let mut m = FastMap::default();
    while let Some(r) = rows.next()? {
        let mut v = [0; N];
        for (i, x) in v.iter_mut().enumerate() {
            *x = r.get(i + 1)?;
        }
        m.insert(r.get(0)?, v);
    }
    Ok(m)
}

impl Dims {
    pub(super) fn read(c: &Connection, session: u64) -> rusqlite::Result<Dims> {
        Ok(Dims {
            tracks: tracks(c, session)?,
            kernel_shapes: map(
                c,
                "SELECT id, name, gy * 1000 + gz, bx * 1000000 + by * 1000 + bz, regs, ssmem + dsmem FROM kernel_shapes",
            )?,
            memcpy_shapes: map(c, "SELECT id, kind, src_dev, dst_dev FROM memcpy_shapes")?,
            api_kinds: map(c, "SELECT id, domain, cbid, ret FROM api_kinds")?,
        })
    }
}

/// The columns read from each table's `_data` rows after track, start and duration.
fn data_cols(table: &str) -> &'static str {
    match table {
        "kernel" => "corr, shape, gx, 0",
        "memcpy" => "corr, bytes, shape, 0",
        "memset" => "corr, bytes, value, 0",
        "graph" => "corr, graph_id, 0, 0",
        "api" => "corr, kind, 0, 0",
        "marker" => "name, domain, is_mark, id",
        "sync" => "corr, type, event, 0",
        "collective" => "name, seq, comm, bytes",
        _ => "kind, obj_kind, obj_id, 0",
    }
}

/// A record's values (see `Rec::v`) from its track and `data_cols`.
fn values(table: &str, t: &Track, c: [i64; 4], d: &Dims) -> [i64; 8] {
    match table {
        "kernel" => {
            let s = d.kernel_shapes.get(&c[1]).copied().unwrap_or_default();
            [t.dev, t.stream, c[0], s[0], c[2].wrapping_mul(1_000_000).wrapping_add(s[1]), s[2], s[3], s[4]]
        }
        "memcpy" => {
            let s = d.memcpy_shapes.get(&c[2]).copied().unwrap_or_default();
            [t.dev, t.stream, c[0], c[1], s[0], s[1], s[2], 0]
        }
        "memset" => [t.dev, t.stream, c[0], c[1], c[2], 0, 0, 0],
        "graph" => [t.dev, t.stream, c[0], c[1], 0, 0, 0, 0],
        "api" => {
            let k = d.api_kinds.get(&c[1]).copied().unwrap_or_default();
            [t.tid, c[0], k[0], k[1], k[2], 0, 0, 0]
        }
        "marker" => [t.tid, c[0], c[1], c[2], c[3], 0, 0, 0],
        "sync" => [t.stream, c[0], c[1], c[2], 0, 0, 0, 0],
        "collective" => [t.tid, c[0], c[1], c[2], c[3], 0, 0, 0],
        _ => [c[0], c[1], c[2], 0, 0, 0, 0, 0],
    }
}

/// Calls `each` with every row of `EVENT_TABLES[table]` in the session that passes `f`, as a
/// record (start in ns since the epoch) and its duration as stored, in rowid order.
pub(super) fn scan(
    c: &Connection,
    d: &Dims,
    table: usize,
    session: u64,
    f: &pb::RecordFilter,
    mut each: impl FnMut(Rec, i64) -> Result<(), super::out::Stop>,
) -> Result<(), super::out::Stop> {
    let name = EVENT_TABLES[table];
    let filter = Filter::new(c, name, session, f)?;
    let (sql, params) = filter.select(&format!("start, dur, {}", data_cols(name)));
    let mut st = c.prepare(&sql)?;
    let mut rows = st.query(params_from_iter(params))?;
    while let Some(r) = rows.next()? {
        let Some(t) = d.tracks.get(&r.get::<_, i64>(0)?) else { continue };
        let start = r.get::<_, i64>(1)? + t.base;
        let dur: i64 = r.get(2)?;
        if !filter.keeps(t, start, dur) {
            continue;
        }
        let v = values(name, t, [r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?], d);
        each(Rec { proc: t.proc, start, table, v }, dur)?;
    }
    Ok(())
}
