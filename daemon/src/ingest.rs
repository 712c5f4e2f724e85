//! The single SQLite writer.
//!
//! Agent connections hand decoded messages to one dedicated thread through a bounded
//! channel; the thread drains whatever is queued into one transaction and commits, so
//! under load each commit covers many batches and when idle each batch is committed at
//! once. Rows are inserted with multi-row prepared statements. When the channel is full,
//! connections stop reading their sockets and the backpressure reaches the agents, whose
//! own bounded queues drop and count.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::Result;
use gpuprof_proto::agent::{self as wire, RecordBatch};
use rusqlite::{Connection, params};
use tokio::sync::{mpsc, oneshot};

use crate::catalog::Kind;
use crate::error::WriterGone;
use crate::stats::Stats;

/// Facts about a newly connected agent, stored in `processes`.
#[derive(Debug, Clone)]
pub struct ProcessInfo {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub agent_kind: &'static str,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    pub cupti_version: u32,
    /// Record times of this connection are stored relative to this.
    pub base_ns: u64,
    pub devices: Vec<wire::Device>,
}

/// A closure run on the writer's connection, outside any open transaction, in queue order.
pub type WriterCall = Box<dyn FnOnce(&mut Connection) + Send>;

/// Work for the writer thread.
pub enum WriterMsg {
    /// Insert the process row; replies with its id once committed.
    RegisterProcess(ProcessInfo, oneshot::Sender<Result<u64, String>>),
    /// The connection closed.
    ProcessClosed { proc: u64, reason: String },
    /// Strings defined by a connection, in id order starting after the previous ones.
    Strings { proc: u64, values: Vec<String> },
    /// Activity records; `count` is the number of records in the batch.
    Records { proc: u64, batch: RecordBatch, count: u64 },
    /// Cumulative drop counters of a connection (`None`: CUPTI's own drops, kind unknown).
    Drops { proc: u64, counts: Vec<(Option<Kind>, u64)> },
    /// PM samples from a sampler.
    PmSamples { proc: u64, batch: wire::PmSampleBatch },
    /// PC samples (aggregated) from an injector.
    PcSamples { proc: u64, batch: wire::PcSampleBatch },
    /// Run arbitrary writes in order (sessions, arbiter audit, ...).
    Call(WriterCall),
    /// Commit everything queued before this, then reply.
    Flush(oneshot::Sender<()>),
    /// Commit everything queued before this and stop (shutdown). Handles that are still
    /// held elsewhere get `WriterGone` from then on.
    Stop,
}

/// Sending side of the writer channel.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<WriterMsg>,
}

impl WriterHandle {
    /// Queues a message, waiting while the queue is full (backpressure).
    pub async fn send(&self, msg: WriterMsg) -> Result<(), WriterGone> {
        self.tx.send(msg).await.map_err(|_| WriterGone)
    }

    /// Runs `f` on the writer connection and returns its result.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, WriterGone> {
        let (tx, rx) = oneshot::channel();
        self.send(WriterMsg::Call(Box::new(move |c| {
            let _ = tx.send(f(c));
        })))
        .await?;
        rx.await.map_err(|_| WriterGone)
    }

    /// Waits until everything queued so far is committed.
    pub async fn flush(&self) -> Result<(), WriterGone> {
        let (tx, rx) = oneshot::channel();
        self.send(WriterMsg::Flush(tx)).await?;
        rx.await.map_err(|_| WriterGone)
    }

    /// Asks the writer to commit everything queued so far and stop.
    pub async fn stop(&self) -> Result<(), WriterGone> {
        self.send(WriterMsg::Stop).await
    }

    /// Messages waiting in the queue.
    pub fn queued_messages(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// Starts the writer thread on an open connection.
pub fn spawn(
    conn: Connection,
    queue: usize,
    commit_max_records: usize,
    stats: Arc<Stats>,
) -> Result<(WriterHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel(queue);
    let mut w = Writer::new(conn, stats, commit_max_records)?;
    let join = std::thread::Builder::new().name("gpuprof-writer".into()).spawn(move || w.run(rx))?;
    Ok((WriterHandle { tx }, join))
}

struct ProcCtx {
    base_ns: i64,
    /// Connection-local string id (index) → strings.id.
    strings: Vec<i64>,
}

struct Writer {
    conn: Connection,
    stats: Arc<Stats>,
    commit_max_records: u64,
    procs: HashMap<u64, ProcCtx>,
    strings: HashMap<Box<str>, i64>,
    metrics: HashMap<String, i64>,
    in_txn: bool,
    failed: Option<String>,
    pending: [u64; 14],
    pending_total: u64,
}

const MULTI_ROWS: usize = 64;

struct Table {
    name: &'static str,
    cols: usize,
    /// Appended to the INSERT (an upsert clause), or "".
    on_conflict: &'static str,
}

/// Marks a field the injector could not know (a context or stream created before the trace).
pub const UNKNOWN: i64 = u32::MAX as i64;

const KERNEL: Table = Table { name: "kernel", cols: 19, on_conflict: "" };
const MEMCPY: Table = Table { name: "memcpy", cols: 16, on_conflict: "" };
const MEMSET: Table = Table { name: "memset", cols: 12, on_conflict: "" };
const API: Table = Table { name: "api", cols: 9, on_conflict: "" };
const SYNC: Table = Table { name: "sync", cols: 9, on_conflict: "" };
const OVERHEAD: Table = Table { name: "overhead", cols: 7, on_conflict: "" };
const MARKER: Table = Table { name: "marker", cols: 9, on_conflict: "" };
const EXTCORR: Table = Table { name: "external_correlation", cols: 5, on_conflict: "" };
// A context or stream row CUPTI reported replaces one derived from activity (see migration 0004).
const CONTEXT: Table = Table {
    name: "context",
    cols: 5,
    on_conflict: " ON CONFLICT(session, proc, ctx) DO UPDATE SET dev = excluded.dev, null_stream = excluded.null_stream \
                  WHERE excluded.null_stream != 4294967295",
};
const STREAM: Table = Table {
    name: "stream",
    cols: 6,
    on_conflict: " ON CONFLICT(session, proc, ctx, stream) DO UPDATE SET priority = excluded.priority, \
                  flags = excluded.flags WHERE excluded.flags != 4294967295",
};
const GRAPH: Table = Table { name: "graph", cols: 9, on_conflict: "" };

fn insert_sql(t: &Table, rows: usize) -> String {
    let one = format!("({})", vec!["?"; t.cols].join(","));
    format!("INSERT INTO {} VALUES {}{}", t.name, vec![one.as_str(); rows].join(","), t.on_conflict)
}

fn now_ns() -> i64 {
    crate::clock::now_ns() as i64
}

/// Inserts `rows` into `t`, `MULTI_ROWS` at a time, each row's values produced by `fill`.
fn insert_rows<T>(
    conn: &Connection,
    t: &Table,
    rows: &[T],
    mut fill: impl FnMut(&T, &mut [i64]),
) -> rusqlite::Result<()> {
    let mut vals = vec![0i64; t.cols];
    let mut chunks = rows.chunks_exact(MULTI_ROWS);
    if rows.len() >= MULTI_ROWS {
        let mut stmt = conn.prepare_cached(&insert_sql(t, MULTI_ROWS))?;
        for chunk in &mut chunks {
            let mut idx = 1;
            for r in chunk {
                fill(r, &mut vals);
                for v in &vals {
                    stmt.raw_bind_parameter(idx, *v)?;
                    idx += 1;
                }
            }
            stmt.raw_execute()?;
        }
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut stmt = conn.prepare_cached(&insert_sql(t, 1))?;
        for r in rest {
            fill(r, &mut vals);
            for (i, v) in vals.iter().enumerate() {
                stmt.raw_bind_parameter(i + 1, *v)?;
            }
            stmt.raw_execute()?;
        }
    }
    Ok(())
}

impl Writer {
    fn new(conn: Connection, stats: Arc<Stats>, commit_max_records: usize) -> Result<Writer> {
        conn.set_prepared_statement_cache_capacity(64);
        let mut strings = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT id, value FROM strings")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let v: String = r.get(1)?;
                strings.insert(v.into_boxed_str(), r.get(0)?);
            }
        }
        let mut metrics = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT id, name FROM pm_metrics")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                metrics.insert(r.get(1)?, r.get(0)?);
            }
        }
        Ok(Writer {
            conn,
            stats,
            commit_max_records: commit_max_records as u64,
            procs: HashMap::new(),
            strings,
            metrics,
            in_txn: false,
            failed: None,
            pending: [0; 14],
            pending_total: 0,
        })
    }

    fn run(&mut self, mut rx: mpsc::Receiver<WriterMsg>) {
        'outer: while let Some(first) = rx.blocking_recv() {
            if matches!(first, WriterMsg::Stop) {
                break;
            }
            self.handle(first);
            while self.pending_total < self.commit_max_records {
                match rx.try_recv() {
                    Ok(WriterMsg::Stop) => break 'outer,
                    Ok(m) => self.handle(m),
                    Err(_) => break,
                }
            }
            self.commit();
        }
        rx.close();
        self.commit();
        if let Err(e) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
            tracing::warn!(error = %e, "final WAL checkpoint failed");
        }
        tracing::info!("database writer stopped");
    }

    fn begin(&mut self) {
        if !self.in_txn {
            match self.conn.execute_batch("BEGIN") {
                Ok(()) => self.in_txn = true,
                Err(e) => self.fail(format!("cannot begin transaction: {e}")),
            }
        }
    }

    fn fail(&mut self, msg: String) {
        if self.failed.is_none() {
            self.failed = Some(msg);
        }
    }

    /// Commits the open transaction; on failure rolls back and counts its records as dropped.
    fn commit(&mut self) {
        let result = if let Some(err) = self.failed.take() {
            Err(err)
        } else if self.in_txn {
            self.conn.execute_batch("COMMIT").map_err(|e| format!("commit failed: {e}"))
        } else {
            Ok(())
        };
        let pending = std::mem::take(&mut self.pending);
        match result {
            Ok(()) => {
                for k in Kind::ALL {
                    if pending[k.index()] > 0 {
                        self.stats.add_ingested(k, pending[k.index()]);
                    }
                }
            }
            Err(msg) => {
                if self.in_txn {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                let lost: u64 = pending.iter().sum();
                for k in Kind::ALL {
                    self.stats.kind(k).dropped_by_daemon.fetch_add(pending[k.index()], Relaxed);
                }
                tracing::error!(error = %msg, lost_records = lost, "storage error: transaction rolled back");
                // Kept until restart (not cleared by a later successful commit): records were lost.
                self.stats.set_storage_error(format!(
                    "{msg} ({lost} records lost at unix time {}s)",
                    crate::clock::now_ns() / 1_000_000_000
                ));
            }
        }
        self.stats.queued_records.fetch_sub(self.pending_total, Relaxed);
        self.pending_total = 0;
        self.in_txn = false;
    }

    fn handle(&mut self, msg: WriterMsg) {
        match msg {
            WriterMsg::RegisterProcess(info, reply) => {
                self.commit();
                let r = self.register(&info).map_err(|e| e.to_string());
                if let Err(e) = &r {
                    self.stats.set_storage_error(format!("cannot register process: {e}"));
                }
                let _ = reply.send(r);
            }
            WriterMsg::Call(f) => {
                self.commit();
                f(&mut self.conn);
            }
            WriterMsg::Flush(reply) => {
                self.commit();
                let _ = reply.send(());
            }
            WriterMsg::Stop => {}
            WriterMsg::ProcessClosed { proc, reason } => {
                self.procs.remove(&proc);
                self.begin();
                if let Err(e) = self.conn.execute(
                    "UPDATE processes SET disconnected_ns = ?1, close_reason = ?2 WHERE id = ?3",
                    params![now_ns(), reason, proc as i64],
                ) {
                    self.fail(e.to_string());
                }
            }
            WriterMsg::Strings { proc, values } => {
                self.begin();
                for v in values {
                    match self.intern(&v) {
                        Ok(id) => {
                            if let Some(p) = self.procs.get_mut(&proc) {
                                p.strings.push(id);
                            }
                        }
                        Err(e) => self.fail(e.to_string()),
                    }
                }
            }
            WriterMsg::Records { proc, batch, count } => {
                self.begin();
                if self.failed.is_some() {
                    self.count_pending_batch(&batch);
                    return;
                }
                if let Err(e) = self.insert_batch(proc, &batch) {
                    self.fail(e.to_string());
                }
                self.count_pending_batch(&batch);
                debug_assert_eq!(count, crate::catalog::batch_len(&batch));
            }
            WriterMsg::Drops { proc, counts } => {
                self.begin();
                let r = (|| -> rusqlite::Result<()> {
                    let mut stmt = self.conn.prepare_cached(
                        "INSERT INTO drops(proc, kind, dropped) VALUES (?1, ?2, ?3)
                         ON CONFLICT(proc, kind) DO UPDATE SET dropped = excluded.dropped",
                    )?;
                    for (k, n) in &counts {
                        stmt.execute(params![proc as i64, k.map_or("cupti", |k| k.name()), *n as i64])?;
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    self.fail(e.to_string());
                }
            }
            WriterMsg::PmSamples { proc, batch } => {
                self.begin();
                let n = (batch.samples.len() * batch.metrics.len()) as u64;
                if let Err(e) = self.insert_pm(proc, &batch) {
                    self.fail(e.to_string());
                }
                self.pending[Kind::PmSample.index()] += n;
                self.pending_total += n;
            }
            WriterMsg::PcSamples { proc, batch } => {
                self.begin();
                let n = batch.samples.len() as u64;
                if let Err(e) = self.insert_pc(proc, &batch) {
                    self.fail(e.to_string());
                }
                self.pending[Kind::PcSample.index()] += n;
                self.pending_total += n;
            }
        }
    }

    fn count_pending_batch(&mut self, b: &RecordBatch) {
        for (k, n) in crate::catalog::batch_counts(b) {
            self.pending[k.index()] += n;
            self.pending_total += n;
        }
    }

    fn register(&mut self, info: &ProcessInfo) -> rusqlite::Result<u64> {
        let tx = self.conn.transaction()?;
        let now = now_ns();
        tx.execute(
            "INSERT INTO processes(pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns, connected_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                info.pid,
                info.uid,
                info.gid,
                info.agent_kind,
                info.exe,
                serde_json::to_string(&info.cmdline).unwrap_or_default(),
                info.cgroup,
                info.cupti_version,
                info.base_ns as i64,
                now
            ],
        )?;
        let id = tx.last_insert_rowid() as u64;
        for d in &info.devices {
            upsert_device(&tx, id, d, now)?;
        }
        tx.commit()?;
        self.procs.insert(id, ProcCtx { base_ns: info.base_ns as i64, strings: vec![0] });
        Ok(id)
    }

    fn intern(&mut self, v: &str) -> rusqlite::Result<i64> {
        if let Some(id) = self.strings.get(v) {
            return Ok(*id);
        }
        self.conn.prepare_cached("INSERT INTO strings(value) VALUES (?1)")?.execute([v])?;
        let id = self.conn.last_insert_rowid();
        self.strings.insert(v.into(), id);
        Ok(id)
    }

    fn insert_batch(&mut self, proc: u64, b: &RecordBatch) -> rusqlite::Result<()> {
        let Some(p) = self.procs.get(&proc) else {
            return Err(rusqlite::Error::InvalidParameterName(format!("records from unregistered process {proc}")));
        };
        let c = &self.conn;
        let s = b.session_id as i64;
        let pr = proc as i64;
        let base = p.base_ns;
        let st = |id: u32| p.strings.get(id as usize).copied().unwrap_or(0);
        let rel = |t: u64| t as i64 - base;
        let dur = |a: u64, e: u64| e.saturating_sub(a) as i64;
        insert_rows(c, &KERNEL, &b.kernels, |k, v| {
            v.copy_from_slice(&[
                s,
                pr,
                k.device_id.into(),
                k.context_id.into(),
                k.stream_id.into(),
                k.correlation_id.into(),
                st(k.name_id),
                rel(k.start_ns),
                dur(k.start_ns, k.end_ns),
                k.grid_x.into(),
                k.grid_y.into(),
                k.grid_z.into(),
                k.block_x.into(),
                k.block_y.into(),
                k.block_z.into(),
                k.registers_per_thread.into(),
                k.static_shared_bytes.into(),
                k.dynamic_shared_bytes.into(),
                k.graph_node_id as i64,
            ])
        })?;
        insert_rows(c, &MEMCPY, &b.memcpys, |m, v| {
            v.copy_from_slice(&[
                s,
                pr,
                m.device_id.into(),
                m.context_id.into(),
                m.stream_id.into(),
                m.correlation_id.into(),
                rel(m.start_ns),
                dur(m.start_ns, m.end_ns),
                m.bytes as i64,
                m.copy_kind.into(),
                m.src_kind.into(),
                m.dst_kind.into(),
                m.src_device_id.into(),
                m.dst_device_id.into(),
                m.is_async.into(),
                m.graph_node_id as i64,
            ])
        })?;
        insert_rows(c, &MEMSET, &b.memsets, |m, v| {
            v.copy_from_slice(&[
                s,
                pr,
                m.device_id.into(),
                m.context_id.into(),
                m.stream_id.into(),
                m.correlation_id.into(),
                rel(m.start_ns),
                dur(m.start_ns, m.end_ns),
                m.bytes as i64,
                m.value.into(),
                m.memory_kind.into(),
                m.graph_node_id as i64,
            ])
        })?;
        insert_rows(c, &API, &b.api_calls, |a, v| {
            v.copy_from_slice(&[
                s,
                pr,
                a.domain.into(),
                a.cbid.into(),
                a.correlation_id.into(),
                a.thread_id.into(),
                rel(a.start_ns),
                dur(a.start_ns, a.end_ns),
                a.return_value.into(),
            ])
        })?;
        insert_rows(c, &SYNC, &b.syncs, |y, v| {
            v.copy_from_slice(&[
                s,
                pr,
                y.sync_type.into(),
                y.context_id.into(),
                y.stream_id.into(),
                y.event_id.into(),
                y.correlation_id.into(),
                rel(y.start_ns),
                dur(y.start_ns, y.end_ns),
            ])
        })?;
        insert_rows(c, &OVERHEAD, &b.overheads, |o, v| {
            v.copy_from_slice(&[
                s,
                pr,
                o.overhead_kind.into(),
                o.object_kind.into(),
                o.object_id as i64,
                rel(o.start_ns),
                dur(o.start_ns, o.end_ns),
            ])
        })?;
        insert_rows(c, &MARKER, &b.markers, |m, v| {
            v.copy_from_slice(&[
                s,
                pr,
                m.id as i64,
                st(m.name_id),
                st(m.domain_id),
                m.thread_id.into(),
                rel(m.start_ns),
                dur(m.start_ns, m.end_ns),
                m.is_mark.into(),
            ])
        })?;
        insert_rows(c, &EXTCORR, &b.external_correlations, |x, v| {
            v.copy_from_slice(&[s, pr, x.external_kind.into(), x.external_id as i64, x.correlation_id.into()])
        })?;
        insert_rows(c, &CONTEXT, &b.contexts, |x, v| {
            v.copy_from_slice(&[s, pr, x.context_id.into(), x.device_id.into(), x.null_stream_id.into()])
        })?;
        insert_rows(c, &STREAM, &b.streams, |x, v| {
            v.copy_from_slice(&[s, pr, x.stream_id.into(), x.context_id.into(), x.priority.into(), x.flags.into()])
        })?;
        insert_rows(c, &GRAPH, &b.graphs, |g, v| {
            v.copy_from_slice(&[
                s,
                pr,
                g.device_id.into(),
                g.context_id.into(),
                g.stream_id.into(),
                g.correlation_id.into(),
                g.graph_id.into(),
                rel(g.start_ns),
                dur(g.start_ns, g.end_ns),
            ])
        })?;
        if !b.devices.is_empty() {
            let now = now_ns();
            for d in &b.devices {
                upsert_device(c, proc, d, now)?;
            }
        }
        Ok(())
    }

    fn metric_id(&mut self, name: &str) -> rusqlite::Result<i64> {
        if let Some(id) = self.metrics.get(name) {
            return Ok(*id);
        }
        self.conn.prepare_cached("INSERT INTO pm_metrics(name) VALUES (?1)")?.execute([name])?;
        let id = self.conn.last_insert_rowid();
        self.metrics.insert(name.to_string(), id);
        Ok(id)
    }

    fn insert_pm(&mut self, proc: u64, b: &wire::PmSampleBatch) -> rusqlite::Result<()> {
        let ids = b.metrics.iter().map(|m| self.metric_id(m)).collect::<rusqlite::Result<Vec<_>>>()?;
        // The sampler's device ordinal maps to the global device row through process_devices.
        let device: i64 = self
            .conn
            .prepare_cached("SELECT device FROM process_devices WHERE proc = ?1 AND device_id = ?2")?
            .query_row(params![proc as i64, b.device_id], |r| r.get(0))
            .unwrap_or(b.device_id as i64);
        let mut stmt = self
            .conn
            .prepare_cached("INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1,?2,?3,?4,?5)")?;
        for s in &b.samples {
            for (id, v) in ids.iter().zip(&s.values) {
                stmt.execute(params![device, s.end_ns as i64, s.end_ns.saturating_sub(s.start_ns) as i64, id, v])?;
            }
        }
        Ok(())
    }

    fn insert_pc(&mut self, proc: u64, b: &wire::PcSampleBatch) -> rusqlite::Result<()> {
        let Some(p) = self.procs.get(&proc) else {
            return Ok(());
        };
        let st = |id: u32| p.strings.get(id as usize).copied().unwrap_or(0);
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO pc_sample(session, proc, function, pc, stall, module, count) VALUES (?1,?2,?3,?4,?5,?6,?7)
             ON CONFLICT(session, proc, function, pc, stall) DO UPDATE SET count = count + excluded.count",
        )?;
        for s in &b.samples {
            stmt.execute(params![
                b.session_id as i64,
                proc as i64,
                st(s.function_name_id),
                s.pc_offset as i64,
                st(s.stall_reason_id),
                st(s.module_id),
                s.count as i64
            ])?;
        }
        Ok(())
    }
}

fn upsert_device(c: &Connection, proc: u64, d: &wire::Device, now: i64) -> rusqlite::Result<()> {
    if d.uuid.is_empty() {
        return Ok(());
    }
    c.prepare_cached(
        "INSERT INTO devices(uuid, name, compute_major, compute_minor, sm_count, global_memory_bytes, pci_bus_id, first_seen_ns)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8)
         ON CONFLICT(uuid) DO UPDATE SET name = excluded.name, compute_major = excluded.compute_major,
           compute_minor = excluded.compute_minor, sm_count = excluded.sm_count,
           global_memory_bytes = excluded.global_memory_bytes, pci_bus_id = excluded.pci_bus_id",
    )?
    .execute(params![
        d.uuid,
        d.name,
        d.compute_major,
        d.compute_minor,
        d.sm_count,
        d.global_memory_bytes as i64,
        d.pci_bus_id,
        now
    ])?;
    let dev: i64 = c.prepare_cached("SELECT id FROM devices WHERE uuid = ?1")?.query_row([&d.uuid], |r| r.get(0))?;
    c.prepare_cached("INSERT OR REPLACE INTO process_devices(proc, device_id, device) VALUES (?1,?2,?3)")?
        .execute(params![proc as i64, d.id, dev])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A context/stream row CUPTI reported replaces a derived one (unknown fields), never
    /// the other way round; one row per key, also within one multi-row statement.
    /// The first two columns of every row of `sql`.
    fn pairs(c: &Connection, sql: &str) -> Vec<(i64, i64)> {
        c.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn topology_rows_upsert_reported_over_derived() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap().storage;
        let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
        let ctx = |ctx: i64, null_stream: i64| [7, 1, ctx, 0, null_stream];
        // Derived first, then reported: the reported values win.
        insert_rows(&c, &CONTEXT, &[ctx(1, UNKNOWN)], |x, v| v.copy_from_slice(x)).unwrap();
        insert_rows(&c, &CONTEXT, &[ctx(1, 7)], |x, v| v.copy_from_slice(x)).unwrap();
        // Reported first, then derived: the reported values stay.
        insert_rows(&c, &CONTEXT, &[ctx(2, 9)], |x, v| v.copy_from_slice(x)).unwrap();
        insert_rows(&c, &CONTEXT, &[ctx(2, UNKNOWN)], |x, v| v.copy_from_slice(x)).unwrap();
        let rows = pairs(&c, "SELECT ctx, null_stream FROM context ORDER BY ctx");
        assert_eq!(rows, [(1, 7), (2, 9)]);
        // 70 stream rows (a multi-row statement and a remainder) over 10 keys, derived and
        // reported mixed: one row per key, reported flags where any was reported.
        let streams: Vec<[i64; 6]> =
            (0..70).map(|i| [7, 1, i % 10, 1, 0, if i % 10 < 5 && i >= 35 { 1 } else { UNKNOWN }]).collect();
        insert_rows(&c, &STREAM, &streams, |x, v| v.copy_from_slice(x)).unwrap();
        let rows = pairs(&c, "SELECT stream, flags FROM stream ORDER BY stream");
        let want: Vec<(i64, i64)> = (0..10).map(|s| (s, if s < 5 { 1 } else { UNKNOWN })).collect();
        assert_eq!(rows, want);
    }
}
