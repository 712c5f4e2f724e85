//! The writer thread: drains the channel into one transaction per commit, interns strings
//! and metric names across connections, registers processes, and counts what was committed
//! or lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use anyhow::Result;
use gpuprof_proto::agent::{self as wire, RecordBatch};
use rusqlite::{Connection, params};
use tokio::sync::mpsc;

use super::ids::Tracks;
use super::msg::{ProcessInfo, WriterMsg};
use super::rows::{self, ProcCtx, RowBufs, now_ns, upsert_device};
use crate::catalog::Kind;
use crate::stats::Stats;

pub(super) struct Writer {
    conn: Connection,
    stats: Arc<Stats>,
    commit_max_records: u64,
    procs: HashMap<u64, ProcCtx>,
    tracks: Tracks,
    bufs: RowBufs,
    strings: HashMap<Box<str>, i64>,
    /// The id the next new string gets: the writer allocates string ids itself, so that an id
    /// handed to a connection stays valid when the transaction that inserted it rolls back.
    next_string_id: i64,
    /// Strings inserted by the open transaction.
    txn_strings: Vec<(i64, Box<str>)>,
    /// Strings whose ids are in use but whose rows a failed transaction lost; inserted again
    /// first thing in every transaction until one commits them.
    unsaved_strings: Vec<(i64, Box<str>)>,
    metrics: HashMap<String, i64>,
    /// Metric names inserted by the open transaction (forgotten if it rolls back).
    txn_metrics: Vec<String>,
    in_txn: bool,
    failed: Option<String>,
    pending: [u64; Kind::COUNT],
    pending_total: u64,
    checkpointer: Option<Checkpointer>,
}

/// A thread that copies committed WAL pages into the database file on its own connection
/// (PASSIVE checkpoints, which never wait for or block the writer), so that the writer's
/// automatic checkpoint, which stalls ingest while it runs, finds (almost) nothing left to do.
/// Durability is the WAL's: a commit is on disk before it is acknowledged either way.
struct Checkpointer {
    wake: std::sync::mpsc::SyncSender<()>,
    join: std::thread::JoinHandle<()>,
}

impl Checkpointer {
    /// Pause after each checkpoint, so that one covers many commits.
    const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

    fn start(path: &str) -> Option<Checkpointer> {
        let conn = match Connection::open(path) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "no background WAL checkpoints: cannot open the database again");
                return None;
            }
        };
        let (wake, rx) = std::sync::mpsc::sync_channel::<()>(1);
        let join = std::thread::Builder::new()
            .name("gpuprof-checkpoint".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                        tracing::debug!(error = %e, "background WAL checkpoint failed");
                    }
                    std::thread::sleep(Self::PAUSE);
                }
            })
            .ok()?;
        Some(Checkpointer { wake, join })
    }

    fn stop(self) {
        drop(self.wake);
        let _ = self.join.join();
    }
}

impl Writer {
    pub(super) fn new(conn: Connection, stats: Arc<Stats>, commit_max_records: usize) -> Result<Writer> {
        // Each record table has up to 10 INSERT sizes (see `RowBufs`), plus everything else.
        conn.set_prepared_statement_cache_capacity(160);
        let filled = crate::demangle::fill_missing(&conn)?;
        if filled > 0 {
            tracing::info!(names = filled, "stored the demangled form of names kept by an older gpuprofd");
        }
        let mut strings = HashMap::new();
        {
            let mut stmt = conn.prepare("SELECT id, value FROM strings")?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let v: String = r.get(1)?;
                strings.insert(v.into_boxed_str(), r.get(0)?);
            }
        }
        let next_string_id = strings.values().max().copied().unwrap_or(0) + 1;
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
            tracks: Tracks::default(),
            bufs: RowBufs::default(),
            strings,
            next_string_id,
            txn_strings: Vec::new(),
            unsaved_strings: Vec::new(),
            metrics,
            txn_metrics: Vec::new(),
            in_txn: false,
            failed: None,
            pending: [0; Kind::COUNT],
            pending_total: 0,
            checkpointer: None,
        })
    }

    pub(super) fn run(&mut self, mut rx: mpsc::Receiver<WriterMsg>) {
        self.checkpointer = self.conn.path().filter(|p| !p.is_empty()).and_then(Checkpointer::start);
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
        if let Some(c) = self.checkpointer.take() {
            c.stop();
        }
        if let Err(e) = self.conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)") {
            tracing::warn!(error = %e, "final WAL checkpoint failed");
        }
        tracing::info!("database writer stopped");
    }

    fn begin(&mut self) {
        if !self.in_txn {
            match self.conn.execute_batch("BEGIN") {
                Ok(()) => self.in_txn = true,
                Err(e) => return self.fail(format!("cannot begin transaction: {e}")),
            }
            for (id, v) in std::mem::take(&mut self.unsaved_strings) {
                let r = self.failed.is_none().then(|| self.insert_string(id, &v));
                match r {
                    Some(Ok(())) => self.txn_strings.push((id, v)),
                    Some(Err(e)) => {
                        self.fail(format!("cannot restore string {id}: {e}"));
                        self.unsaved_strings.push((id, v));
                    }
                    None => self.unsaved_strings.push((id, v)),
                }
            }
        }
    }

    fn insert_string(&self, id: i64, v: &str) -> rusqlite::Result<()> {
        // OR IGNORE: a row an autocommit write already stored is fine as it is.
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO strings(id, value, demangled) VALUES (?1, ?2, ?3)")?
            .execute(params![id, v, crate::demangle::demangle(v)])?;
        Ok(())
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
            self.bufs
                .flush(&self.conn)
                .map_err(|e| e.to_string())
                .and_then(|()| self.conn.execute_batch("COMMIT").map_err(|e| format!("commit failed: {e}")))
        } else {
            Ok(())
        };
        let pending = std::mem::take(&mut self.pending);
        match result {
            Ok(()) => {
                if let Some(c) = &self.checkpointer
                    && self.in_txn
                {
                    let _ = c.wake.try_send(());
                }
                self.txn_strings.clear();
                self.txn_metrics.clear();
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
                // Ids already given out keep their meaning: their rows go in again later.
                self.unsaved_strings.append(&mut self.txn_strings);
                for m in self.txn_metrics.drain(..) {
                    self.metrics.remove(&m);
                }
                self.tracks.clear();
                self.bufs.clear();
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
                // It may have deleted tracks (retention): look them up again.
                self.tracks.forget_tracks();
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
                    // The id is the string's even when storing it failed, so that the
                    // connection's later string ids still line up.
                    let (id, r) = self.intern(&v);
                    if let Some(p) = self.procs.get_mut(&proc) {
                        p.strings.push(id);
                    }
                    if let Err(e) = r {
                        self.fail(e.to_string());
                    }
                }
            }
            WriterMsg::Records { proc, batch, count, permit: _permit } => {
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
            WriterMsg::DevicePm { uuid, name, pci_bus_id, batch } => {
                self.begin();
                let n = (batch.samples.len() * batch.metrics.len()) as u64;
                let r = batch
                    .metrics
                    .iter()
                    .map(|m| self.metric_id(m))
                    .collect::<rusqlite::Result<Vec<_>>>()
                    .and_then(|ids| rows::insert_device_pm(&self.conn, &uuid, &name, &pci_bus_id, &batch, &ids));
                if let Err(e) = r {
                    self.fail(e.to_string());
                }
                self.pending[Kind::PmSample.index()] += n;
                self.pending_total += n;
            }
            WriterMsg::PcSamples { proc, batch, rollup } => {
                self.begin();
                let n = batch.samples.len() as u64;
                if let Err(e) = self.insert_pc(proc, &batch, rollup) {
                    self.fail(e.to_string());
                }
                self.pending[Kind::PcSample.index()] += n;
                self.pending_total += n;
            }
            WriterMsg::Cubin { proc, hash, data } => {
                self.begin();
                if let Err(e) = rows::insert_cubin(&self.conn, proc, &hash, &data, now_ns()) {
                    self.fail(e.to_string());
                }
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
            "INSERT INTO processes(pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns, connected_ns,
                                   container_id, container_runtime, pod_uid, pod_name, pod_namespace,
                                   job_launcher, job_id, job_rank, job_local_rank, job_world_size, job_group_rank,
                                   parent_pid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
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
                now,
                info.placement.container_id,
                info.placement.container_runtime,
                info.placement.pod_uid,
                info.placement.pod_name,
                info.placement.pod_namespace,
                info.job.launcher,
                info.job.job_id,
                info.job.rank,
                info.job.local_rank,
                info.job.world_size,
                info.job.group_rank,
                info.job.parent_pid,
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

    /// The id of string `v`, allocating and inserting it if new; the insert's result apart.
    fn intern(&mut self, v: &str) -> (i64, rusqlite::Result<()>) {
        if let Some(id) = self.strings.get(v) {
            return (*id, Ok(()));
        }
        let id = self.next_string_id;
        self.next_string_id += 1;
        self.strings.insert(v.into(), id);
        if self.failed.is_some() || !self.in_txn {
            // The transaction is lost anyway: store the string with the next one.
            self.unsaved_strings.push((id, v.into()));
            return (id, Ok(()));
        }
        let r = self.insert_string(id, v);
        match &r {
            Ok(()) => self.txn_strings.push((id, v.into())),
            Err(_) => self.unsaved_strings.push((id, v.into())),
        }
        (id, r)
    }

    fn insert_batch(&mut self, proc: u64, b: &RecordBatch) -> rusqlite::Result<()> {
        let Some(p) = self.procs.get(&proc) else {
            return Err(rusqlite::Error::InvalidParameterName(format!("records from unregistered process {proc}")));
        };
        super::fill::insert_batch(&self.conn, &mut self.bufs, &mut self.tracks, proc, p, b)
    }

    fn metric_id(&mut self, name: &str) -> rusqlite::Result<i64> {
        if let Some(id) = self.metrics.get(name) {
            return Ok(*id);
        }
        self.conn.prepare_cached("INSERT INTO pm_metrics(name) VALUES (?1)")?.execute([name])?;
        let id = self.conn.last_insert_rowid();
        self.metrics.insert(name.to_string(), id);
        self.txn_metrics.push(name.to_string());
        Ok(id)
    }

    fn insert_pm(&mut self, proc: u64, b: &wire::PmSampleBatch) -> rusqlite::Result<()> {
        let ids = b.metrics.iter().map(|m| self.metric_id(m)).collect::<rusqlite::Result<Vec<_>>>()?;
        rows::insert_pm(&self.conn, proc, b, &ids)
    }

    fn insert_pc(&mut self, proc: u64, b: &wire::PcSampleBatch, rollup: bool) -> rusqlite::Result<()> {
        let Some(p) = self.procs.get(&proc) else {
            return Ok(());
        };
        if rollup {
            return rows::insert_pc_rollup(&self.conn, proc, p, b);
        }
        rows::insert_pc(&self.conn, proc, p, b)
    }
}
