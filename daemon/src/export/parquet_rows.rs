//! The Parquet export's rows of the record kinds stored in `_data` tables with tracks
//! (migration 0008), read as [`super::scan`] reads them for the traces: from the `_data`
//! table, the track, process, shape or API kind of each row looked up in maps, the rows passing
//! the same filter. Each file column's value comes from where its SQL expression over the view
//! (in `parquet_files::columns`, the one definition of the files' columns) says: [`plan`]
//! resolves the expressions once per kind; one it does not know is an error.

use gpuprof_proto::api as pb;
use rusqlite::{Connection, params_from_iter};

use super::out::Stop;
use super::scan::{Filter, Track};
use crate::fasthash::FastMap;

/// Where a column's value comes from.
#[derive(Debug, Clone, Copy)]
enum Src {
    Const(i64),
    Session,
    Proc,
    Dev,
    Ctx,
    Stream,
    Tid,
    Pid,
    /// The start as ns since the epoch.
    StartNs,
    /// The end as ns since the epoch.
    EndNs,
    /// The n-th column read from the `_data` row.
    Data(usize),
    /// The n-th column of the row's shape or API kind.
    Dim(usize),
    /// `domain << 32 | cbid` of the API kind, from its columns at these places.
    ApiName(usize, usize),
}

/// The table a kind's `_data` rows point into for the rest of their columns, and the column
/// that points.
fn dim_table(kind: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        "kernel" => Some(("kernel_shapes", "shape")),
        "memcpy" => Some(("memcpy_shapes", "shape")),
        "api" => Some(("api_kinds", "kind")),
        _ => None,
    }
}

/// The index of `col` in `list`, appended if it is not there yet.
fn place(list: &mut Vec<String>, col: &str) -> usize {
    match list.iter().position(|c| c == col) {
        Some(i) => i,
        None => {
            list.push(col.to_string());
            list.len() - 1
        }
    }
}

/// Column names of a table.
fn columns_of(c: &Connection, table: &str) -> rusqlite::Result<Vec<String>> {
    c.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?.query_map([], |r| r.get(0))?.collect()
}

/// How to read one kind's file columns from its `_data` table.
pub(super) struct Plan {
    kind: &'static str,
    /// `_data` columns read after the track id.
    data: Vec<String>,
    /// The index in `data` of the column pointing into the dim table, and that table's rows.
    dim: Option<(usize, FastMap<i64, Vec<i64>>)>,
    srcs: Vec<Src>,
    /// The indexes in `data` of start and duration (untimed kinds: none).
    times: Option<(usize, usize)>,
}

/// The plan for `kind`'s columns, given as their SQL expressions over the kind's view (alias
/// `t`, its process `p`); None for kinds without a `_data` table.
pub(super) fn plan(c: &Connection, kind: &'static str, exprs: &[&str]) -> Result<Option<Plan>, Stop> {
    let own = columns_of(c, &format!("{kind}_data"))?;
    if own.is_empty() {
        return Ok(None);
    }
    let (dim_cols, dim) = match dim_table(kind) {
        Some((t, by)) => (columns_of(c, t)?, Some((t, by))),
        None => (Vec::new(), None),
    };
    let mut data: Vec<String> = Vec::new();
    let mut dim_used: Vec<String> = Vec::new();
    let times = own.iter().any(|c| c == "start").then(|| (place(&mut data, "start"), place(&mut data, "dur")));
    let mut srcs = Vec::with_capacity(exprs.len());
    for e in exprs {
        let src = match *e {
            "0" => Src::Const(0),
            "p.pid" => Src::Pid,
            "t.start + p.base_ns" if times.is_some() => Src::StartNs,
            "t.start + t.dur + p.base_ns" if times.is_some() => Src::EndNs,
            "(t.domain << 32) | t.cbid" if kind == "api" => {
                Src::ApiName(place(&mut dim_used, "domain"), place(&mut dim_used, "cbid"))
            }
            e => match e.strip_prefix("t.") {
                Some("session") => Src::Session,
                Some("proc") => Src::Proc,
                Some("dev") => Src::Dev,
                Some("ctx") => Src::Ctx,
                Some("stream") => Src::Stream,
                Some("tid") => Src::Tid,
                Some(col) if own.iter().any(|o| o == col) && col != "track" => Src::Data(place(&mut data, col)),
                Some(col) if dim_cols.iter().any(|o| o == col) && col != "id" => Src::Dim(place(&mut dim_used, col)),
                _ => {
                    return Err(Stop::Failed(crate::error::ApiError::Internal(format!(
                        "export: Parquet column {e} of {kind} has no source in {kind}_data"
                    ))));
                }
            },
        };
        srcs.push(src);
    }
    let dim = match dim {
        Some((table, by)) if !dim_used.is_empty() => {
            let i = place(&mut data, by);
            let sql = format!("SELECT id, {} FROM {table}", dim_used.join(", "));
            let mut st = c.prepare(&sql)?;
            let mut rows = st.query([])?;
            let mut m = FastMap::default();
            while let Some(r) = rows.next()? {
                let v = (0..dim_used.len()).map(|k| r.get(k + 1)).collect::<Result<Vec<i64>, _>>()?;
                m.insert(r.get(0)?, v);
            }
            Some((i, m))
        }
        _ => None,
    };
    Ok(Some(Plan { kind, data, dim, srcs, times }))
}

/// Calls `each` with the column values of every row of the plan's kind in the session that
/// passes `f`, in rowid order (the order of the view's rows); `tracks` are the session's
/// ([`super::scan::tracks`]).
pub(super) fn rows(
    c: &Connection,
    tracks: &FastMap<i64, Track>,
    p: &Plan,
    session: u64,
    f: &pb::RecordFilter,
    mut each: impl FnMut(&[i64]) -> Result<(), Stop>,
) -> Result<(), Stop> {
    let filter = Filter::new(c, p.kind, session, f)?;
    let (sql, params) = filter.select(&p.data.join(", "));
    let mut st = c.prepare(&sql)?;
    let mut rows = st.query(params_from_iter(params))?;
    let mut d = vec![0i64; p.data.len()];
    let mut v = vec![0i64; p.srcs.len()];
    let none = Vec::new();
    while let Some(r) = rows.next()? {
        let Some(t) = tracks.get(&r.get::<_, i64>(0)?) else { continue };
        for (i, x) in d.iter_mut().enumerate() {
            *x = r.get(i + 1)?;
        }
        let (start, dur) = match p.times {
            Some((s, u)) => (d[s] + t.base, d[u]),
            None => (0, 0),
        };
        if !filter.keeps(t, start, dur) {
            continue;
        }
        let dim = match &p.dim {
            Some((i, m)) => m.get(&d[*i]).unwrap_or(&none),
            None => &none,
        };
        for (x, s) in v.iter_mut().zip(&p.srcs) {
            *x = value(*s, t, &d, dim, start, dur);
        }
        each(&v)?;
    }
    Ok(())
}

fn value(s: Src, t: &Track, d: &[i64], dim: &[i64], start: i64, dur: i64) -> i64 {
    match s {
        Src::Const(x) => x,
        Src::Session => t.session,
        Src::Proc => t.proc,
        Src::Dev => t.dev,
        Src::Ctx => t.ctx,
        Src::Stream => t.stream,
        Src::Tid => t.tid,
        Src::Pid => t.pid,
        Src::StartNs => start,
        Src::EndNs => start + dur,
        Src::Data(i) => d[i],
        // A row whose shape is missing reads 0 there.
        Src::Dim(i) => dim.get(i).copied().unwrap_or(0),
        Src::ApiName(d, b) => (dim.get(d).copied().unwrap_or(0) << 32) | dim.get(b).copied().unwrap_or(0),
    }
}
