//! The session's records for the Chrome trace: one cursor per event table, each in
//! (process, start) order, merged into one stream.

use gpuprof_proto::api as pb;
use rusqlite::types::Value;
use rusqlite::{Connection, Row, Rows, Statement, params_from_iter};

use crate::query::where_for;

/// Tables whose rows become trace events.
pub const EVENT_TABLES: &[&str] = &["kernel", "memcpy", "memset", "graph", "api", "marker", "sync", "overhead"];

/// One record from any table, as the merge sees it.
pub(super) struct Rec {
    pub(super) proc: i64,
    pub(super) start: i64,
    pub(super) table: usize,
    /// Columns after proc/start, as in `select_cols`.
    pub(super) v: [i64; 8],
}

fn select_cols(table: &str) -> &'static str {
    // proc, abs start, dur, then up to 8 table-specific integers.
    match table {
        "kernel" => {
            "t.dev, t.stream, t.corr, t.name, t.gx * 1000000 + t.gy * 1000 + t.gz, t.bx * 1000000 + t.by * 1000 + t.bz, t.regs, t.ssmem + t.dsmem"
        }
        "memcpy" => "t.dev, t.stream, t.corr, t.bytes, t.kind, t.src_dev, t.dst_dev, 0",
        "memset" => "t.dev, t.stream, t.corr, t.bytes, t.value, 0, 0, 0",
        "graph" => "t.dev, t.stream, t.corr, t.graph_id, 0, 0, 0, 0",
        "api" => "t.tid, t.corr, t.domain, t.cbid, t.ret, 0, 0, 0",
        "marker" => "t.tid, t.name, t.domain, t.is_mark, t.id, 0, 0, 0",
        "sync" => "t.stream, t.corr, t.type, t.event, 0, 0, 0, 0",
        _ => "t.kind, t.obj_kind, t.obj_id, 0, 0, 0, 0, 0",
    }
}

fn read_rec(r: &Row<'_>, table: usize) -> rusqlite::Result<(Rec, i64)> {
    let mut v = [0i64; 8];
    for (i, x) in v.iter_mut().enumerate() {
        *x = r.get(3 + i)?;
    }
    Ok((Rec { proc: r.get(0)?, start: r.get(1)?, table, v }, r.get::<_, i64>(2)?.max(0)))
}

/// One statement per event table, reading its rows in (process, start) order with absolute
/// start times, and the parameters of each.
pub(super) fn record_queries<'c>(
    c: &'c Connection,
    session: u64,
    f: &pb::RecordFilter,
) -> rusqlite::Result<(Vec<Statement<'c>>, Vec<Vec<Value>>)> {
    let mut stmts = Vec::new();
    let mut params = Vec::new();
    for t in EVENT_TABLES {
        let w = where_for(c, t, session, f)?;
        stmts.push(c.prepare(&format!(
            "SELECT t.proc, t.start + p.base_ns, t.dur, {} FROM {t} t JOIN processes p ON p.id = t.proc
             WHERE {} ORDER BY t.proc, t.start",
            select_cols(t),
            w.sql
        ))?);
        params.push(w.params);
    }
    Ok((stmts, params))
}

/// The earliest start over all tables and processes (ns since the epoch), 0 when there is
/// no record; `params` as from [`record_queries`].
pub(super) fn first_start(
    c: &Connection,
    session: u64,
    f: &pb::RecordFilter,
    params: &[Vec<Value>],
) -> rusqlite::Result<i64> {
    let mut t0 = i64::MAX;
    for (t, p) in EVENT_TABLES.iter().zip(params) {
        let w = where_for(c, t, session, f)?;
        let m: Option<i64> = c
            .prepare(&format!(
                "SELECT min(s) FROM (SELECT min(t.start) + (SELECT base_ns FROM processes WHERE id = t.proc) AS s
                 FROM {t} t WHERE {} GROUP BY t.proc)",
                w.sql
            ))?
            .query_row(params_from_iter(p.iter()), |r| r.get(0))?;
        if let Some(m) = m {
            t0 = t0.min(m);
        }
    }
    if t0 == i64::MAX {
        t0 = 0;
    }
    Ok(t0)
}

/// The cursors of [`record_queries`] merged: records in (process, start) order.
pub(super) struct Merge<'s> {
    cursors: Vec<Rows<'s>>,
    /// The next record of each cursor and its duration; None once the cursor is done.
    heads: Vec<Option<(Rec, i64)>>,
}

impl<'s> Merge<'s> {
    /// Runs the statements and reads the first record of each.
    pub(super) fn open(stmts: &'s mut [Statement<'_>], params: &[Vec<Value>]) -> rusqlite::Result<Merge<'s>> {
        let mut cursors = Vec::new();
        for (st, p) in stmts.iter_mut().zip(params) {
            cursors.push(st.query(params_from_iter(p.iter()))?);
        }
        let mut heads: Vec<Option<(Rec, i64)>> = Vec::with_capacity(cursors.len());
        for (i, cur) in cursors.iter_mut().enumerate() {
            heads.push(match cur.next()? {
                Some(r) => Some(read_rec(r, i)?),
                None => None,
            });
        }
        Ok(Merge { cursors, heads })
    }

    /// The record with the smallest (process, start) and its duration; None at the end.
    pub(super) fn next_record(&mut self) -> rusqlite::Result<Option<(Rec, i64)>> {
        let heads = &self.heads;
        let mut best: Option<usize> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some((r, _)) = h {
                let better = match best.and_then(|b| heads[b].as_ref()) {
                    None => true,
                    Some((b, _)) => (r.proc, r.start) < (b.proc, b.start),
                };
                if better {
                    best = Some(i);
                }
            }
        }
        let Some(i) = best else { return Ok(None) };
        let Some(head) = self.heads[i].take() else { return Ok(None) };
        self.heads[i] = match self.cursors[i].next()? {
            Some(r) => Some(read_rec(r, i)?),
            None => None,
        };
        Ok(Some(head))
    }
}
