//! The record tables and how a batch becomes rows: multi-row prepared INSERTs into the
//! `_data` tables, times made relative to the process's `base_ns`, connection-local string
//! ids mapped to `strings.id`, (session, process, device, context, stream, thread) to `tracks.id`
//! and launch shapes and call kinds to theirs (through the caches of `ids.rs`); kernels and API
//! calls two of a track to a row (migration 0012).

use gpuprof_proto::agent as wire;
use rusqlite::{Connection, params};

use crate::catalog::{Kind, Second};
use crate::fasthash::FastMap;

/// What rows of one connection are written with.
pub(super) struct ProcCtx {
    pub(super) base_ns: i64,
    /// Connection-local string id (index) → strings.id.
    pub(super) strings: Vec<i64>,
}

const MULTI_ROWS: usize = 256;

pub(super) struct Table {
    pub(super) name: &'static str,
    /// Index of its buffer in [`RowBufs`]: the kind's index.
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

/// Appended to a table's INSERT: a context or stream row CUPTI reported replaces one derived
/// from activity (see migration 0004).
const fn on_conflict(k: Kind) -> &'static str {
    match k {
        Kind::Context => {
            " ON CONFLICT(session, proc, ctx) DO UPDATE SET dev = excluded.dev, null_stream = excluded.null_stream \
             WHERE excluded.null_stream != 4294967295"
        }
        Kind::Stream => {
            " ON CONFLICT(session, proc, ctx, stream) DO UPDATE SET priority = excluded.priority, \
             flags = excluded.flags WHERE excluded.flags != 4294967295"
        }
        _ => "",
    }
}

/// Most values a record takes in a row (its first half in a paired table).
const MAX_VALUES: usize = 17;

/// The writer's table of each kind, from the catalogue (those with no `cols` are not written
/// from a batch's rows).
static TABLES: [Table; Kind::COUNT] = {
    const NONE: Table = Table { name: "", slot: 0, cols: 0, on_conflict: "", pair: &[] };
    let mut t = [NONE; Kind::COUNT];
    let mut i = 0;
    while i < Kind::COUNT {
        let k = Kind::ALL[i];
        let s = k.spec();
        let name = match s.data {
            Some(d) => d,
            None => k.name(),
        };
        t[i] = Table { name, slot: i, cols: s.cols, on_conflict: on_conflict(k), pair: s.pair };
        assert!(t[i].single() <= MAX_VALUES, "a record's values fit MAX_VALUES");
        i += 1;
    }
    t
};

/// The table the records of kind `k` are written to.
pub(super) fn table(k: Kind) -> &'static Table {
    &TABLES[k.index()]
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
    vals: [Vec<i64>; Kind::COUNT],
    /// Per table slot: track → (arrival number, the record's values).
    waiting: [FastMap<i64, (u64, [i64; MAX_VALUES])>; Kind::COUNT],
    arrivals: u64,
}

impl RowBufs {
    /// Appends `rows` to `t`'s buffer, inserting each full chunk.
    pub(super) fn push<T>(
        &mut self,
        conn: &Connection,
        t: &Table,
        rows: &[T],
        mut fill: impl FnMut(&T, &mut [i64]) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        let buf = &mut self.vals[t.slot];
        let waiting = &mut self.waiting[t.slot];
        let chunk = MULTI_ROWS * t.cols;
        let mut one = [0i64; MAX_VALUES];
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
        // The tables stored in `_data` tables are the buffered ones, flushed in kind order.
        for t in Kind::ALL.into_iter().filter(|k| k.spec().data.is_some()).map(table) {
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
