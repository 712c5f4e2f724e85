//! Record filters: which columns a table has and the WHERE clause (rowid range of the
//! session, then process, device, stream, name and time conditions) that selects its rows.

use gpuprof_proto::api as pb;
use rusqlite::Connection;
use rusqlite::types::Value;

use super::rollups;
use crate::error::{ApiError, ApiResult};

/// A WHERE clause with its parameters.
#[derive(Debug, Default, Clone)]
pub struct Where {
    pub sql: String,
    pub params: Vec<Value>,
}

impl Where {
    fn and(&mut self, cond: &str, params: impl IntoIterator<Item = Value>) {
        self.sql.push_str(" AND ");
        self.sql.push_str(cond);
        self.params.extend(params);
    }

    fn in_list(&mut self, col: &str, vals: impl IntoIterator<Item = i64>) {
        let vals: Vec<i64> = vals.into_iter().collect();
        if vals.is_empty() {
            return;
        }
        let marks = vec!["?"; vals.len()].join(",");
        self.and(&format!("{col} IN ({marks})"), vals.into_iter().map(Value::Integer));
    }
}

/// Which columns a table has, for filters.
#[derive(Debug, Clone, Copy)]
pub struct Cols {
    pub dev: bool,
    pub stream: bool,
    pub name: bool,
    pub time: bool,
}

pub fn cols(table: &str) -> Cols {
    match table {
        "kernel" => Cols { dev: true, stream: true, name: true, time: true },
        "memcpy" | "memset" | "graph" => Cols { dev: true, stream: true, name: false, time: true },
        "sync" => Cols { dev: false, stream: true, name: false, time: true },
        "api" | "marker" | "overhead" => Cols { dev: false, stream: false, name: false, time: true },
        "collective" => Cols { dev: false, stream: false, name: true, time: true },
        _ => Cols { dev: false, stream: false, name: false, time: false },
    }
}

/// Checks a filter's fields.
pub fn check_filter(f: &pb::RecordFilter) -> ApiResult<()> {
    if !f.name_pattern.is_empty() {
        gpuprof_proto::glob::check(&f.name_pattern).map_err(|e| ApiError::invalid("filter.name_pattern", e))?;
    }
    if let Some(t) = &f.time_range
        && t.end_ns != 0
        && t.end_ns <= t.start_ns
    {
        return Err(ApiError::invalid(
            "filter.time_range",
            format!("end_ns {} is not after start_ns {}", t.end_ns, t.start_ns),
        ));
    }
    Ok(())
}

/// The WHERE clause selecting `session`'s rows of `table` (alias `t`, processes joined as
/// `p` when `time` filters apply) that pass `f`.
pub fn where_for(c: &Connection, table: &str, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Where> {
    let (lo, hi) = rollups::rowid_range(c, table, session)?;
    let mut w = Where {
        sql: "t.rowid BETWEEN ? AND ? AND t.session = ?".into(),
        params: vec![Value::Integer(lo), Value::Integer(hi), Value::Integer(session as i64)],
    };
    let cl = cols(table);
    w.in_list("t.proc", f.process_ids.iter().map(|p| *p as i64));
    if cl.dev {
        w.in_list("t.dev", f.device_ids.iter().map(|d| i64::from(*d)));
    }
    if cl.stream {
        w.in_list("t.stream", f.stream_ids.iter().map(|d| i64::from(*d)));
    }
    if cl.name && !f.name_pattern.is_empty() {
        let pattern = Value::Text(f.name_pattern.clone());
        w.and(&format!("t.name IN (SELECT id FROM strings WHERE {})", super::NAME_GLOB), [pattern.clone(), pattern]);
    }
    if cl.time
        && let Some(tr) = &f.time_range
    {
        if tr.start_ns > 0 {
            w.and(
                "t.start + t.dur + (SELECT base_ns FROM processes WHERE id = t.proc) >= ?",
                [Value::Integer(tr.start_ns as i64)],
            );
        }
        if tr.end_ns > 0 {
            w.and(
                "t.start + (SELECT base_ns FROM processes WHERE id = t.proc) < ?",
                [Value::Integer(tr.end_ns as i64)],
            );
        }
    }
    Ok(w)
}

/// Whether a filter needs the rows themselves: the rollups have no time dimension.
pub(super) fn needs_scan(f: &pb::RecordFilter) -> bool {
    f.time_range.as_ref().is_some_and(|t| t.start_ns > 0 || t.end_ns > 0)
}
