//! The session's records for the Chrome and Perfetto traces: one cursor per event table, each
//! in (process, start) order, read on a few threads and merged into one stream.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use gpuprof_proto::api as pb;
use rusqlite::types::Value;
use rusqlite::{Connection, Row, Rows, Statement, params_from_iter};

use super::flows::FLOW_TABLES;
use super::out::Stop;
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
    // proc, start (relative to the process's base), dur, then up to 8 table-specific integers.
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

/// A row of `table_query` as a record with its absolute start, and its duration; None when
/// its process has no base (no `processes` row).
fn read_rec(r: &Row<'_>, table: usize, bases: &HashMap<i64, i64>) -> rusqlite::Result<Option<(Rec, i64)>> {
    let proc: i64 = r.get(0)?;
    let Some(base) = bases.get(&proc) else { return Ok(None) };
    let mut v = [0i64; 8];
    for (i, x) in v.iter_mut().enumerate() {
        *x = r.get(3 + i)?;
    }
    let start = r.get::<_, i64>(1)? + base;
    Ok(Some((Rec { proc, start, table, v }, r.get::<_, i64>(2)?.max(0))))
}

/// Every process's `base_ns` (record starts are stored relative to it), by process id.
pub(super) fn process_bases(c: &Connection) -> rusqlite::Result<HashMap<i64, i64>> {
    c.prepare("SELECT id, base_ns FROM processes")?.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect()
}

/// The statement reading one event table's rows in (process, start) order, and its
/// parameters. Starts stay relative to the process's base (the order is the same); `read_rec`
/// adds the base.
fn table_query<'c>(
    c: &'c Connection,
    table: &str,
    session: u64,
    f: &pb::RecordFilter,
) -> rusqlite::Result<(Statement<'c>, Vec<Value>)> {
    let w = where_for(c, table, session, f)?;
    let st = c.prepare(&format!(
        "SELECT t.proc, t.start, t.dur, {} FROM {table} t WHERE {} ORDER BY t.proc, t.start",
        select_cols(table),
        w.sql
    ))?;
    Ok((st, w.params))
}

/// The earliest start (ns since the epoch) of the session's rows that pass `f` in the event
/// tables [`Flows::build`](super::flows::Flows::build) does not read (it finds that of its
/// own), `i64::MAX` when there is none: one pass over each table's rows, no sorting.
pub(super) fn first_start_beyond_flows(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<i64> {
    let mut t0 = i64::MAX;
    for t in EVENT_TABLES.iter().filter(|t| !FLOW_TABLES.contains(t)) {
        let w = where_for(c, t, session, f)?;
        let m: Option<i64> = c
            .prepare(&format!(
                "SELECT min(t.start + p.base_ns) FROM {t} t JOIN processes p ON p.id = t.proc WHERE {}",
                w.sql
            ))?
            .query_row(params_from_iter(w.params.iter()), |r| r.get(0))?;
        if let Some(m) = m {
            t0 = t0.min(m);
        }
    }
    Ok(t0)
}

/// Records (and their durations) per batch handed from a reading thread to the merging one.
const BATCH: usize = 2048;

type Batch = Vec<(Rec, i64)>;

/// The tables each reading thread reads (indexes into [`EVENT_TABLES`]): kernels and API
/// calls, the bulk of any CUDA trace, get a thread each; the other kinds share one.
pub(super) const READERS: &[&[usize]] = &[&[0], &[4], &[1, 2, 3, 5, 6, 7]];

/// Which of two records comes first: (process, start), ties in table order.
fn sort_key(r: &Rec) -> (i64, i64, usize) {
    (r.proc, r.start, r.table)
}

/// The index of the smallest head by [`sort_key`], if any.
fn first_of<'a>(heads: impl Iterator<Item = Option<&'a Rec>>) -> Option<usize> {
    let mut best: Option<(usize, (i64, i64, usize))> = None;
    for (i, h) in heads.enumerate() {
        if let Some(r) = h
            && best.is_none_or(|(_, b)| sort_key(r) < b)
        {
            best = Some((i, sort_key(r)));
        }
    }
    best.map(|(i, _)| i)
}

/// Calls `write` with each of the session's records (and its duration) in (process, start)
/// order, on the writer `start` makes, and returns that writer. The tables are read and
/// sorted on a few threads (see [`READERS`]), each with a read connection of its own
/// (SQLite's stepping and sorting is most of an export's work), from before `start` is
/// called, so that the writer's own preparation (flows, the first start) overlaps the
/// sorting; this thread merges what they send and `write` formats. At most two batches per
/// reader wait, so memory stays bounded. A reading error ends the export with that error; an
/// error of `start` or `write` (the client gone) ends the readers. Which rows are read does
/// not depend on the connection: every cursor is bounded by the rollup's rowid range.
pub(super) fn each_record<W>(
    db: &Path,
    session: u64,
    f: &pb::RecordFilter,
    start: impl FnOnce() -> Result<W, Stop>,
    mut write: impl FnMut(&mut W, &Rec, i64) -> Result<(), Stop>,
) -> Result<W, Stop> {
    std::thread::scope(|s| {
        let mut readers = Vec::with_capacity(READERS.len());
        for tables in READERS {
            let (tx, batches) = sync_channel::<Result<Batch, Stop>>(2);
            s.spawn(move || {
                if let Err(e) = read_tables(db, tables, session, f, &tx) {
                    let _ = tx.send(Err(e));
                }
            });
            readers.push(Source { batches, batch: Vec::new().into_iter(), head: None });
        }
        // Returning drops the receivers, which ends each reader at its next send.
        let mut w = start()?;
        for r in &mut readers {
            r.advance()?;
        }
        while let Some(i) = first_of(readers.iter().map(|r| r.head.as_ref().map(|(rec, _)| rec))) {
            let r = &mut readers[i];
            if let Some((rec, dur)) = r.head.take() {
                write(&mut w, &rec, dur)?;
            }
            r.advance()?;
        }
        Ok(w)
    })
}

/// One reader: its tables' rows merged, sent in batches; returns once every row is sent or
/// the receiver is gone.
fn read_tables(
    db: &Path,
    tables: &[usize],
    session: u64,
    f: &pb::RecordFilter,
    tx: &SyncSender<Result<Batch, Stop>>,
) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let bases = process_bases(&c)?;
    let mut stmts = Vec::with_capacity(tables.len());
    for &t in tables {
        stmts.push(table_query(&c, EVENT_TABLES[t], session, f)?);
    }
    let mut cursors = Vec::with_capacity(tables.len());
    for (st, params) in &mut stmts {
        cursors.push(st.query(params_from_iter(params.iter()))?);
    }
    // The next record of each table (None once it is done).
    let mut heads = Vec::with_capacity(tables.len());
    for (cur, &t) in cursors.iter_mut().zip(tables) {
        heads.push(next_rec(cur, t, &bases)?);
    }
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(i) = first_of(heads.iter().map(|h| h.as_ref().map(|(rec, _)| rec))) {
        if let Some(r) = heads[i].take() {
            batch.push(r);
        }
        heads[i] = next_rec(&mut cursors[i], tables[i], &bases)?;
        if batch.len() == BATCH && tx.send(Ok(std::mem::replace(&mut batch, Vec::with_capacity(BATCH)))).is_err() {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(batch));
    }
    Ok(())
}

/// The next record of a table's cursor (rows of processes without a base skipped).
fn next_rec(cur: &mut Rows<'_>, table: usize, bases: &HashMap<i64, i64>) -> rusqlite::Result<Option<(Rec, i64)>> {
    while let Some(r) = cur.next()? {
        if let Some(rec) = read_rec(r, table, bases)? {
            return Ok(Some(rec));
        }
    }
    Ok(None)
}

/// One reader's records as the merge sees them: the batches still to come, the rest of the
/// current one, and the next record (None once the reader is done).
struct Source {
    batches: Receiver<Result<Batch, Stop>>,
    batch: std::vec::IntoIter<(Rec, i64)>,
    head: Option<(Rec, i64)>,
}

impl Source {
    /// The next record into `head`, receiving the next batch when the current one is used up.
    fn advance(&mut self) -> Result<(), Stop> {
        self.head = self.batch.next();
        if self.head.is_none()
            && let Ok(b) = self.batches.recv()
        {
            self.batch = b?.into_iter();
            self.head = self.batch.next();
        }
        Ok(())
    }
}
