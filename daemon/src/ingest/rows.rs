//! The record tables and how a batch becomes rows: multi-row prepared INSERTs into the
//! `_data` tables, times made relative to the process's `base_ns`, connection-local string
//! ids mapped to `strings.id`, (session, process, device, context, stream, thread) to `tracks.id`
//! and launch shapes and call kinds to theirs (through the caches of `ids.rs`); kernels and API
//! calls two of a track to a row (migration 0012).

use gpuprof_proto::agent::{self as wire, RecordBatch};
use rusqlite::{Connection, params};

use super::ids::Tracks;
use crate::catalog::{API_PAIR, KERNEL_PAIR, Second};
use crate::fasthash::FastMap;

/// What rows of one connection are written with.
pub(super) struct ProcCtx {
    pub(super) base_ns: i64,
    /// Connection-local string id (index) → strings.id.
    pub(super) strings: Vec<i64>,
}

const MULTI_ROWS: usize = 256;

pub(super) struct Table {
    name: &'static str,
    /// Index of its buffer in [`RowBufs`] (record tables only).
    slot: usize,
    cols: usize,
    /// Appended to the INSERT (an upsert clause), or "".
    on_conflict: &'static str,
    /// Tables whose rows hold two records of a track (migration 0012): the columns the second
    /// record's values take after the first's, and how each is stored (empty for the others).
    pair: &'static [(&'static str, Second)],
}

impl Table {
    /// A record's values: the first `single()` of a row's (track first).
    const fn single(&self) -> usize {
        self.cols - self.pair.len()
    }
}

/// A bound value that stands for NULL: the second half of a row holding one record.
const NULL: i64 = i64::MIN;

/// Marks a field the injector could not know (a context or stream created before the trace).
pub const UNKNOWN: i64 = u32::MAX as i64;

const KERNEL: Table = paired("kernel_data", 0, KERNEL_PAIR);
const MEMCPY: Table = Table { name: "memcpy_data", slot: 1, cols: 6, on_conflict: "", pair: &[] };
const MEMSET: Table = Table { name: "memset_data", slot: 2, cols: 8, on_conflict: "", pair: &[] };
const API: Table = paired("api_data", 3, API_PAIR);
const SYNC: Table = Table { name: "sync_data", slot: 4, cols: 6, on_conflict: "", pair: &[] };
const OVERHEAD: Table = Table { name: "overhead_data", slot: 5, cols: 6, on_conflict: "", pair: &[] };
const MARKER: Table = Table { name: "marker_data", slot: 6, cols: 7, on_conflict: "", pair: &[] };
const EXTCORR: Table = Table { name: "external_correlation_data", slot: 7, cols: 4, on_conflict: "", pair: &[] };
// A context or stream row CUPTI reported replaces one derived from activity (see migration 0004).
pub(super) const CONTEXT: Table = Table {
    name: "context",
    slot: usize::MAX,
    cols: 5,
    on_conflict: " ON CONFLICT(session, proc, ctx) DO UPDATE SET dev = excluded.dev, null_stream = excluded.null_stream \
                  WHERE excluded.null_stream != 4294967295",
    pair: &[],
};
pub(super) const STREAM: Table = Table {
    name: "stream",
    slot: usize::MAX,
    cols: 6,
    on_conflict: " ON CONFLICT(session, proc, ctx, stream) DO UPDATE SET priority = excluded.priority, \
                  flags = excluded.flags WHERE excluded.flags != 4294967295",
    pair: &[],
};
const GRAPH: Table = Table { name: "graph_data", slot: 8, cols: 5, on_conflict: "", pair: &[] };

/// A table whose rows hold up to two records of a track: the track, the first record's `pair`
/// columns, then the second's.
const fn paired(name: &'static str, slot: usize, pair: &'static [(&'static str, Second)]) -> Table {
    Table { name, slot, cols: 1 + 2 * pair.len(), on_conflict: "", pair }
}

fn insert_sql(t: &Table, rows: usize) -> String {
    let one = format!("({})", vec!["?"; t.cols].join(","));
    format!("INSERT INTO {} VALUES {}{}", t.name, vec![one.as_str(); rows].join(","), t.on_conflict)
}

/// Executes one INSERT of `vals.len() / t.cols` rows.
fn exec_rows(conn: &Connection, t: &Table, vals: &[i64]) -> rusqlite::Result<()> {
    let mut stmt = conn.prepare_cached(&insert_sql(t, vals.len() / t.cols))?;
    for (i, v) in vals.iter().enumerate() {
        if *v == NULL {
            stmt.raw_bind_parameter(i + 1, rusqlite::types::Null)?;
        } else {
            stmt.raw_bind_parameter(i + 1, *v)?;
        }
    }
    stmt.raw_execute()?;
    Ok(())
}

/// Record rows of the open transaction not inserted yet, per record table: full
/// [`MULTI_ROWS`] statements go in as they fill, the rest at commit ([`RowBufs::flush`]), so
/// that the rows of many small batches share a few large statements. The transaction
/// commits all of them or none, as before.
///
/// Rows of the paired tables hold two consecutive records of a track: a record waits in
/// `waiting` for the next of its track, and one still waiting at commit is stored alone.
#[derive(Default)]
pub(super) struct RowBufs {
    vals: [Vec<i64>; 9],
    /// Per table slot: track → (arrival number, the record's values).
    waiting: [FastMap<i64, (u64, [i64; 8])>; 9],
    arrivals: u64,
}

const BUFFERED: [&Table; 9] = [&KERNEL, &MEMCPY, &MEMSET, &API, &SYNC, &OVERHEAD, &MARKER, &EXTCORR, &GRAPH];

impl RowBufs {
    /// Appends `rows` to `t`'s buffer, inserting each full chunk.
    fn push<T>(
        &mut self,
        conn: &Connection,
        t: &Table,
        rows: &[T],
        mut fill: impl FnMut(&T, &mut [i64]) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        let buf = &mut self.vals[t.slot];
        let waiting = &mut self.waiting[t.slot];
        let chunk = MULTI_ROWS * t.cols;
        let mut one = [0i64; 8];
        for r in rows {
            fill(r, &mut one[..t.single()])?;
            if t.pair.is_empty() {
                buf.extend_from_slice(&one[..t.cols]);
            } else {
                let Some((_, first)) = waiting.remove(&one[0]) else {
                    waiting.insert(one[0], (self.arrivals, one));
                    self.arrivals += 1;
                    continue;
                };
                buf.extend_from_slice(&first[..t.single()]);
                for (i, (v, (_, second))) in one[1..t.single()].iter().zip(t.pair).enumerate() {
                    buf.push(if *second == Second::Delta { v - first[i + 1] } else { *v });
                }
            }
            if buf.len() == chunk {
                let r = exec_rows(conn, t, buf);
                buf.clear();
                r?;
            }
        }
        Ok(())
    }

    /// Inserts what is buffered, records still waiting for a second alone, in statements of
    /// power-of-two row counts.
    pub(super) fn flush(&mut self, conn: &Connection) -> rusqlite::Result<()> {
        for t in BUFFERED {
            let mut alone: Vec<_> = self.waiting[t.slot].drain().map(|(_, w)| w).collect();
            alone.sort_unstable_by_key(|w| w.0);
            for (_, one) in alone {
                self.vals[t.slot].extend_from_slice(&one[..t.single()]);
                self.vals[t.slot].resize(self.vals[t.slot].len() + t.pair.len(), NULL);
            }
            let buf = std::mem::take(&mut self.vals[t.slot]);
            let mut done = 0;
            while done < buf.len() {
                let rows = (buf.len() - done) / t.cols;
                let n = 1usize << (usize::BITS - 1 - rows.leading_zeros());
                let end = done + n * t.cols;
                exec_rows(conn, t, &buf[done..end])?;
                done = end;
            }
            self.vals[t.slot] = buf;
            self.vals[t.slot].clear();
        }
        Ok(())
    }

    /// Forgets what is buffered (the transaction rolls back).
    pub(super) fn clear(&mut self) {
        for v in &mut self.vals {
            v.clear();
        }
        for w in &mut self.waiting {
            w.clear();
        }
    }
}

pub(super) fn now_ns() -> i64 {
    crate::clock::now_ns() as i64
}

/// Inserts `rows` into `t`, `MULTI_ROWS` at a time, each row's values produced by `fill`.
pub(super) fn insert_rows<T>(
    conn: &Connection,
    t: &Table,
    rows: &[T],
    mut fill: impl FnMut(&T, &mut [i64]) -> rusqlite::Result<()>,
) -> rusqlite::Result<()> {
    let mut vals = vec![0i64; t.cols];
    let mut chunks = rows.chunks_exact(MULTI_ROWS);
    if rows.len() >= MULTI_ROWS {
        let mut stmt = conn.prepare_cached(&insert_sql(t, MULTI_ROWS))?;
        for chunk in &mut chunks {
            let mut idx = 1;
            for r in chunk {
                fill(r, &mut vals)?;
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
            fill(r, &mut vals)?;
            for (i, v) in vals.iter().enumerate() {
                stmt.raw_bind_parameter(i + 1, *v)?;
            }
            stmt.raw_execute()?;
        }
    }
    Ok(())
}

/// Inserts the records of `b` from process `proc`.
pub(super) fn insert_batch(
    c: &Connection,
    bufs: &mut RowBufs,
    tracks: &mut Tracks,
    proc: u64,
    p: &ProcCtx,
    b: &RecordBatch,
) -> rusqlite::Result<()> {
    let s = b.session_id as i64;
    let pr = proc as i64;
    let base = p.base_ns;
    let st = |id: u32| p.strings.get(id as usize).copied().unwrap_or(0);
    let rel = |t: u64| t as i64 - base;
    let dur = |a: u64, e: u64| e.saturating_sub(a) as i64;
    // A record's stream key: its (device, context, stream, thread), 0 where the kind has none.
    let key = |dev: u32, ctx: u32, stream: u32, tid: u32| [s, pr, dev.into(), ctx.into(), stream.into(), tid.into()];
    bufs.push(c, &KERNEL, &b.kernels, |k, v| {
        let shape = tracks.shape(
            c,
            [
                st(k.name_id),
                k.grid_y.into(),
                k.grid_z.into(),
                k.block_x.into(),
                k.block_y.into(),
                k.block_z.into(),
                k.registers_per_thread.into(),
                k.static_shared_bytes.into(),
                k.dynamic_shared_bytes.into(),
                k.graph_node_id as i64,
            ],
        )?;
        let (track, start) = tracks.at(c, key(k.device_id, k.context_id, k.stream_id, 0), rel(k.start_ns))?;
        v.copy_from_slice(&[track, k.correlation_id.into(), shape, start, dur(k.start_ns, k.end_ns), k.grid_x.into()]);
        Ok(())
    })?;
    bufs.push(c, &API, &b.api_calls, |a, v| {
        let kind = tracks.api_kind(c, [a.domain.into(), a.cbid.into(), a.return_value.into()])?;
        let (track, start) = tracks.at(c, key(0, 0, 0, a.thread_id), rel(a.start_ns))?;
        v.copy_from_slice(&[track, a.correlation_id.into(), kind, start, dur(a.start_ns, a.end_ns)]);
        Ok(())
    })?;
    bufs.push(c, &MEMCPY, &b.memcpys, |m, v| {
        let shape = tracks.memcpy_shape(
            c,
            [
                m.copy_kind.into(),
                m.src_kind.into(),
                m.dst_kind.into(),
                m.src_device_id.into(),
                m.dst_device_id.into(),
                m.is_async.into(),
                m.graph_node_id as i64,
            ],
        )?;
        let (track, start) = tracks.at(c, key(m.device_id, m.context_id, m.stream_id, 0), rel(m.start_ns))?;
        v.copy_from_slice(&[track, m.correlation_id.into(), start, dur(m.start_ns, m.end_ns), m.bytes as i64, shape]);
        Ok(())
    })?;
    bufs.push(c, &MEMSET, &b.memsets, |m, v| {
        let (track, start) = tracks.at(c, key(m.device_id, m.context_id, m.stream_id, 0), rel(m.start_ns))?;
        v.copy_from_slice(&[
            track,
            m.correlation_id.into(),
            start,
            dur(m.start_ns, m.end_ns),
            m.bytes as i64,
            m.value.into(),
            m.memory_kind.into(),
            m.graph_node_id as i64,
        ]);
        Ok(())
    })?;
    bufs.push(c, &SYNC, &b.syncs, |y, v| {
        let (track, start) = tracks.at(c, key(0, y.context_id, y.stream_id, 0), rel(y.start_ns))?;
        v.copy_from_slice(&[
            track,
            y.sync_type.into(),
            y.event_id.into(),
            y.correlation_id.into(),
            start,
            dur(y.start_ns, y.end_ns),
        ]);
        Ok(())
    })?;
    bufs.push(c, &OVERHEAD, &b.overheads, |o, v| {
        let (track, start) = tracks.at(c, key(0, 0, 0, 0), rel(o.start_ns))?;
        v.copy_from_slice(&[
            track,
            o.overhead_kind.into(),
            o.object_kind.into(),
            o.object_id as i64,
            start,
            dur(o.start_ns, o.end_ns),
        ]);
        Ok(())
    })?;
    bufs.push(c, &MARKER, &b.markers, |m, v| {
        let (track, start) = tracks.at(c, key(0, 0, 0, m.thread_id), rel(m.start_ns))?;
        v.copy_from_slice(&[
            track,
            m.id as i64,
            st(m.name_id),
            st(m.domain_id),
            start,
            dur(m.start_ns, m.end_ns),
            m.is_mark.into(),
        ]);
        Ok(())
    })?;
    bufs.push(c, &EXTCORR, &b.external_correlations, |x, v| {
        // No start: the track of the process's first epoch.
        let (track, _) = tracks.at(c, key(0, 0, 0, 0), 0)?;
        v.copy_from_slice(&[track, x.external_kind.into(), x.external_id as i64, x.correlation_id.into()]);
        Ok(())
    })?;
    insert_rows(c, &CONTEXT, &b.contexts, |x, v| {
        v.copy_from_slice(&[s, pr, x.context_id.into(), x.device_id.into(), x.null_stream_id.into()]);
        Ok(())
    })?;
    insert_rows(c, &STREAM, &b.streams, |x, v| {
        v.copy_from_slice(&[s, pr, x.stream_id.into(), x.context_id.into(), x.priority.into(), x.flags.into()]);
        Ok(())
    })?;
    bufs.push(c, &GRAPH, &b.graphs, |g, v| {
        let (track, start) = tracks.at(c, key(g.device_id, g.context_id, g.stream_id, 0), rel(g.start_ns))?;
        v.copy_from_slice(&[track, g.correlation_id.into(), g.graph_id.into(), start, dur(g.start_ns, g.end_ns)]);
        Ok(())
    })?;
    if !b.devices.is_empty() {
        let now = now_ns();
        for d in &b.devices {
            upsert_device(c, proc, d, now)?;
        }
    }
    Ok(())
}

/// Inserts PM samples from the sampler `proc`, with the metric ids of `b.metrics`.
pub(super) fn insert_pm(c: &Connection, proc: u64, b: &wire::PmSampleBatch, ids: &[i64]) -> rusqlite::Result<()> {
    // The sampler's device ordinal maps to the global device row through process_devices.
    let device: i64 = c
        .prepare_cached("SELECT device FROM process_devices WHERE proc = ?1 AND device_id = ?2")?
        .query_row(params![proc as i64, b.device_id], |r| r.get(0))
        .unwrap_or(b.device_id as i64);
    let mut stmt = c.prepare_cached("INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1,?2,?3,?4,?5)")?;
    for s in &b.samples {
        for (id, v) in ids.iter().zip(&s.values) {
            stmt.execute(params![device, s.end_ns as i64, s.end_ns.saturating_sub(s.start_ns) as i64, id, v])?;
        }
    }
    Ok(())
}

/// Inserts device metrics read by the daemon (NVML, GPM) for the GPU `uuid`.
pub(super) fn insert_device_pm(
    c: &Connection,
    uuid: &str,
    name: &str,
    pci_bus_id: &str,
    b: &wire::PmSampleBatch,
    ids: &[i64],
) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO devices(uuid, name, compute_major, compute_minor, sm_count, global_memory_bytes, pci_bus_id, first_seen_ns)
         VALUES (?1, ?2, 0, 0, 0, 0, ?3, ?4) ON CONFLICT(uuid) DO NOTHING",
    )?
    .execute(params![uuid, name, pci_bus_id, now_ns()])?;
    let device: i64 = c.prepare_cached("SELECT id FROM devices WHERE uuid = ?1")?.query_row([uuid], |r| r.get(0))?;
    let mut stmt = c.prepare_cached("INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1,?2,?3,?4,?5)")?;
    for s in &b.samples {
        for (id, v) in ids.iter().zip(&s.values) {
            stmt.execute(params![device, s.end_ns as i64, s.end_ns.saturating_sub(s.start_ns) as i64, id, v])?;
        }
    }
    Ok(())
}

/// Adds aggregated PC samples from process `proc` to the counts stored so far, and the batch's
/// samples taken and lost to the (session, process, device) totals.
pub(super) fn insert_pc(c: &Connection, proc: u64, p: &ProcCtx, b: &wire::PcSampleBatch) -> rusqlite::Result<()> {
    let st = |id: u32| p.strings.get(id as usize).copied().unwrap_or(0);
    let mut stmt = c.prepare_cached(
        "INSERT INTO pc_sample(session, proc, function, pc, stall, module, count, file, line)
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)
         ON CONFLICT(session, proc, function, pc, stall) DO UPDATE SET count = count + excluded.count,
           module = CASE WHEN excluded.module != 0 THEN excluded.module ELSE module END,
           file = CASE WHEN excluded.file != 0 THEN excluded.file ELSE file END,
           line = CASE WHEN excluded.line != 0 THEN excluded.line ELSE line END",
    )?;
    let mut timeline = c.prepare_cached(
        "INSERT INTO pc_timeline(session, proc, function, stall, t, count) VALUES (?1,?2,?3,?4,?5,?6)
         ON CONFLICT(session, proc, function, stall, t) DO UPDATE SET count = count + excluded.count",
    )?;
    let t = (b.end_ns / 1_000_000_000) as i64;
    for s in &b.samples {
        stmt.execute(params![
            b.session_id as i64,
            proc as i64,
            st(s.function_name_id),
            s.pc_offset as i64,
            st(s.stall_reason_id),
            st(s.module_id),
            s.count as i64,
            st(s.file_id),
            s.line
        ])?;
        if b.end_ns > 0 {
            timeline.execute(params![
                b.session_id as i64,
                proc as i64,
                st(s.function_name_id),
                st(s.stall_reason_id),
                t,
                s.count as i64
            ])?;
        }
    }
    add_pc_totals(c, proc, b)
}

/// Adds PC samples of the node's always-on profile from process `proc` to its per-minute
/// rollups (the minute of the batch's end), and the batch's samples taken and lost to the
/// (session, process, device) totals.
pub(super) fn insert_pc_rollup(
    c: &Connection,
    proc: u64,
    p: &ProcCtx,
    b: &wire::PcSampleBatch,
) -> rusqlite::Result<()> {
    let st = |id: u32| p.strings.get(id as usize).copied().unwrap_or(0);
    let end = if b.end_ns > 0 { b.end_ns } else { crate::clock::now_ns() };
    let minute = (end / 60_000_000_000 * 60) as i64;
    let mut stmt = c.prepare_cached(
        "INSERT INTO pc_rollup(minute, proc, function, file, line, stall, count) VALUES (?1,?2,?3,?4,?5,?6,?7)
         ON CONFLICT(minute, proc, function, file, line, stall) DO UPDATE SET count = count + excluded.count",
    )?;
    for s in &b.samples {
        stmt.execute(params![
            minute,
            proc as i64,
            st(s.function_name_id),
            st(s.file_id),
            s.line,
            st(s.stall_reason_id),
            s.count as i64
        ])?;
    }
    add_pc_totals(c, proc, b)
}

/// Adds a batch's samples taken and lost to its (session, process, device) totals.
fn add_pc_totals(c: &Connection, proc: u64, b: &wire::PcSampleBatch) -> rusqlite::Result<()> {
    let (taken, lost) = batch_totals(b);
    if taken > 0 || lost > 0 {
        c.prepare_cached(
            "INSERT INTO pc_sampling(session, proc, device, samples, dropped) VALUES (?1,?2,?3,?4,?5)
             ON CONFLICT(session, proc, device) DO UPDATE SET samples = samples + excluded.samples,
               dropped = dropped + excluded.dropped",
        )?
        .execute(params![b.session_id as i64, proc as i64, b.device_id, taken as i64, lost as i64])?;
    }
    Ok(())
}

/// Samples a PC batch says the hardware took (its total, or else the sum of its counts plus
/// those dropped) and lost.
pub fn batch_totals(b: &wire::PcSampleBatch) -> (u64, u64) {
    let counted: u64 = b.samples.iter().map(|s| s.count).sum();
    let total = if b.total_samples > 0 { b.total_samples } else { counted.saturating_add(b.dropped_samples) };
    (total, b.dropped_samples)
}

/// Stores a cubin unless one with its hash is stored already.
pub(super) fn insert_cubin(c: &Connection, proc: u64, hash: &str, data: &[u8], now: i64) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO cubins(hash, size, data, first_seen_ns, proc) VALUES (?1,?2,?3,?4,?5)
         ON CONFLICT(hash) DO NOTHING",
    )?
    .execute(params![hash, data.len() as i64, data, now, proc as i64])?;
    Ok(())
}

/// The device row (by UUID) and the mapping from the process's device ordinal to it.
pub(super) fn upsert_device(c: &Connection, proc: u64, d: &wire::Device, now: i64) -> rusqlite::Result<()> {
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
