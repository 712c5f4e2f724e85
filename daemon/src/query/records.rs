//! QueryRecords' body: a session's rows of one kind, streamed in messages.

use super::{Strings, copy_kind_name, sync_type_name, where_for};
use gpuprof_proto::api as pb;
use std::collections::HashMap;

use rusqlite::{Connection, params_from_iter};
use tokio::sync::mpsc;

/// Rows per QueryRecordsResponse message.
const ROWS_PER_MESSAGE: usize = 2000;

pub(super) fn stream_records(
    c: &Connection,
    session: u64,
    kinds: &[&str],
    f: &pb::RecordFilter,
    limit: u64,
    tx: &mpsc::Sender<Result<pb::QueryRecordsResponse, tonic::Status>>,
) -> rusqlite::Result<()> {
    let mut strings = Strings::default();
    let mut nccl = NcclKernels::default();
    let mut left = limit;
    let mut msg = pb::QueryRecordsResponse::default();
    let mut in_msg = 0usize;
    // Sends the message when full (or `force`); false when the client went away.
    let flush = |msg: &mut pb::QueryRecordsResponse, in_msg: &mut usize, force: bool| -> bool {
        if *in_msg == 0 || (!force && *in_msg < ROWS_PER_MESSAGE) {
            return true;
        }
        *in_msg = 0;
        tx.blocking_send(Ok(std::mem::take(msg))).is_ok()
    };
    for kind in kinds {
        if left == 0 {
            break;
        }
        let w = where_for(c, kind, session, f)?;
        let cols = match *kind {
            "kernel" => "t.dev, t.stream, t.corr, t.name, t.gx, t.gy, t.gz, t.bx, t.by, t.bz, t.regs, t.ssmem, t.dsmem",
            "memcpy" => "t.dev, t.stream, t.corr, t.bytes, t.kind, 0, 0, 0, 0, 0, 0, 0, 0",
            "memset" => "t.dev, t.stream, t.corr, t.bytes, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            "api" => "t.tid, t.corr, t.domain, t.cbid, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            "sync" => "t.stream, t.corr, t.type, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            "collective" => {
                "t.tid, t.name, t.seq, t.comm, t.rank, t.nranks, t.count, t.bytes, t.dtype, t.root, t.algo, t.proto, \
                 t.channels, t.gpu_off, t.gpu_dur"
            }
            _ => "t.tid, t.name, t.domain, t.is_mark, 0, 0, 0, 0, 0, 0, 0, 0, 0",
        };
        let mut stmt = c.prepare(&format!(
            "SELECT t.proc, t.start + p.base_ns, t.dur, {cols} FROM {kind} t JOIN processes p ON p.id = t.proc
             WHERE {} ORDER BY t.rowid",
            w.sql
        ))?;
        let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
        while let Some(r) = rows.next()? {
            let proc = r.get::<_, i64>(0)? as u64;
            let start = r.get::<_, i64>(1)?.max(0) as u64;
            let end = start + r.get::<_, i64>(2)?.max(0) as u64;
            let v = |i: usize| -> rusqlite::Result<i64> { r.get::<_, i64>(3 + i) };
            let u = |i: usize| -> rusqlite::Result<u32> { Ok(v(i)? as u32) };
            match *kind {
                "kernel" => {
                    let (name, mangled_name) = strings.both(c, v(3)?)?;
                    msg.kernels.push(pb::KernelRow {
                        process_id: proc,
                        start_ns: start,
                        end_ns: end,
                        device_id: u(0)?,
                        stream_id: u(1)?,
                        correlation_id: u(2)?,
                        name,
                        mangled_name,
                        grid_x: u(4)?,
                        grid_y: u(5)?,
                        grid_z: u(6)?,
                        block_x: u(7)?,
                        block_y: u(8)?,
                        block_z: u(9)?,
                        registers_per_thread: u(10)?,
                        static_shared_bytes: u(11)?,
                        dynamic_shared_bytes: u(12)?,
                    })
                }
                "memcpy" => msg.memcpys.push(pb::MemcpyRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    device_id: u(0)?,
                    stream_id: u(1)?,
                    correlation_id: u(2)?,
                    bytes: v(3)?.max(0) as u64,
                    direction: copy_kind_name(v(4)?),
                }),
                "memset" => msg.memsets.push(pb::MemsetRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    device_id: u(0)?,
                    stream_id: u(1)?,
                    correlation_id: u(2)?,
                    bytes: v(3)?.max(0) as u64,
                }),
                "api" => msg.api_calls.push(pb::ApiRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    thread_id: u(0)?,
                    correlation_id: u(1)?,
                    domain: crate::cbid::domain_name(v(2)?).into(),
                    name: crate::cbid::name(v(2)?, v(3)?),
                    cbid: u(3)?,
                }),
                "sync" => msg.syncs.push(pb::SyncRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    stream_id: u(0)?,
                    correlation_id: u(1)?,
                    sync_type: sync_type_name(v(2)?).into(),
                }),
                "collective" => {
                    let (gpu_off, gpu_dur) = (v(13)?, v(14)?);
                    let (gpu_start_ns, gpu_end_ns) = if gpu_dur < 0 {
                        (0, 0)
                    } else {
                        let s = (start as i64 + gpu_off).max(0) as u64;
                        (s, s + gpu_dur as u64)
                    };
                    let kernel = nccl.ran(c, session, proc, start, gpu_start_ns)?;
                    msg.collectives.push(pb::CollectiveRow {
                        process_id: proc,
                        start_ns: start,
                        end_ns: end,
                        thread_id: u(0)?,
                        name: strings.get(c, v(1)?)?,
                        seq: v(2)? as u64,
                        communicator: format!("{:016x}", v(3)? as u64),
                        rank: v(4)? as i32,
                        nranks: u(5)?,
                        count: v(6)? as u64,
                        bytes: v(7)? as u64,
                        datatype: strings.get(c, v(8)?)?,
                        root: v(9)? as i32,
                        algorithm: strings.get(c, v(10)?)?,
                        protocol: strings.get(c, v(11)?)?,
                        channels: u(12)?,
                        gpu_start_ns,
                        gpu_end_ns,
                        kernel_correlation_id: kernel.map_or(0, |k| k.corr),
                        device_id: kernel.map_or(0, |k| k.dev),
                    })
                }
                _ => msg.markers.push(pb::MarkerRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    thread_id: u(0)?,
                    name: strings.get(c, v(1)?)?,
                    domain: strings.get(c, v(2)?)?,
                    is_mark: v(3)? != 0,
                }),
            }
            in_msg += 1;
            left -= 1;
            if !flush(&mut msg, &mut in_msg, false) {
                return Ok(());
            }
            if left == 0 {
                break;
            }
        }
    }
    flush(&mut msg, &mut in_msg, true);
    Ok(())
}

/// An NCCL kernel of a process: start and end (ns since the Unix epoch), correlation id and
/// device.
#[derive(Debug, Clone, Copy)]
pub(super) struct NcclKernel {
    start: u64,
    end: u64,
    corr: u32,
    dev: u32,
}

/// How far NCCL's time of a collective's start in its kernel may lie outside the run CUPTI
/// recorded for that kernel, or CUPTI's start before the host's time of the enqueue: the two
/// clocks agree only to a few microseconds, and a small collective's kernel runs for ~5 us.
const CLOCK_SLACK_NS: u64 = 50_000;

/// The NCCL kernel (of `ks`, sorted by start) that ran a collective enqueued at `enqueued`:
/// where NCCL reported the execution's start (`gpu_start`, 0: not reported), the kernel whose
/// run holds it, else the nearest within [`CLOCK_SLACK_NS`]; without that, the first to start
/// after the enqueue (less the slack).
fn pick(ks: &[NcclKernel], enqueued: u64, gpu_start: u64) -> Option<NcclKernel> {
    if gpu_start != 0 {
        let i = ks.partition_point(|k| k.start <= gpu_start);
        let before = i.checked_sub(1).map(|j| (ks[j], gpu_start.saturating_sub(ks[j].end)));
        let after = ks.get(i).map(|k| (*k, k.start - gpu_start));
        let near = match (before, after) {
            (Some(b), Some(a)) => Some(if a.1 < b.1 { a } else { b }),
            (b, a) => b.or(a),
        };
        if let Some((k, d)) = near
            && d <= CLOCK_SLACK_NS
        {
            return Some(k);
        }
    }
    let i = ks.partition_point(|k| k.start < enqueued.saturating_sub(CLOCK_SLACK_NS));
    ks.get(i).copied()
}

/// The NCCL kernels of the processes asked about, read once per process.
#[derive(Default)]
pub(super) struct NcclKernels {
    by_proc: HashMap<u64, Vec<NcclKernel>>,
    names: Strings,
    /// Whether a kernel name (strings.id) is NCCL's.
    is_nccl: HashMap<i64, bool>,
}

impl NcclKernels {
    /// The NCCL kernel that ran a collective of `proc` enqueued at `enqueued` ([`pick`]).
    pub(super) fn ran(
        &mut self,
        c: &Connection,
        session: u64,
        proc: u64,
        enqueued: u64,
        gpu_start: u64,
    ) -> rusqlite::Result<Option<NcclKernel>> {
        if !self.by_proc.contains_key(&proc) {
            let list = self.read(c, session, proc)?;
            self.by_proc.insert(proc, list);
        }
        Ok(pick(&self.by_proc[&proc], enqueued, gpu_start))
    }

    fn read(&mut self, c: &Connection, session: u64, proc: u64) -> rusqlite::Result<Vec<NcclKernel>> {
        // The session's rows by rowid range, as every query reads them.
        let f = pb::RecordFilter { process_ids: vec![proc], ..Default::default() };
        let w = where_for(c, "kernel", session, &f)?;
        let mut st = c.prepare(&format!(
            "SELECT t.start + p.base_ns AS s, max(t.dur, 0), t.corr, t.dev, t.name FROM kernel t
             JOIN processes p ON p.id = t.proc WHERE {} ORDER BY s",
            w.sql
        ))?;
        let mut rows = st.query(params_from_iter(w.params.iter()))?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let name: i64 = r.get(4)?;
            let nccl = match self.is_nccl.get(&name) {
                Some(b) => *b,
                None => {
                    let (shown, reported) = self.names.both(c, name)?;
                    let b = super::collectives::is_nccl(&shown, &reported);
                    self.is_nccl.insert(name, b);
                    b
                }
            };
            if !nccl {
                continue;
            }
            let start = r.get::<_, i64>(0)?.max(0) as u64;
            out.push(NcclKernel {
                start,
                end: start + r.get::<_, i64>(1)? as u64,
                corr: r.get::<_, i64>(2)? as u32,
                dev: r.get::<_, i64>(3)? as u32,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{CLOCK_SLACK_NS, NcclKernel, pick};

    fn k(start: u64, end: u64, corr: u32) -> NcclKernel {
        NcclKernel { start, end, corr, dev: 0 }
    }

    #[test]
    fn a_collective_joins_the_kernel_that_ran_it_across_clock_skew() {
        // Kernels of 5 us every ms; the last one alone at the end.
        let ks = [k(1_000_000, 1_005_000, 1), k(2_000_000, 2_005_000, 2), k(3_000_000, 3_005_000, 3)];
        let corr = |enq, gpu| pick(&ks, enq, gpu).map(|k| k.corr);
        // NCCL's start inside the run.
        assert_eq!(corr(1_900_000, 2_001_000), Some(2));
        // NCCL's start a few us before CUPTI's (clocks differ), or just after the end.
        assert_eq!(corr(2_990_000, 2_997_000), Some(3));
        assert_eq!(corr(2_990_000, 3_008_000), Some(3));
        // The last collective, its kernel starting before the host's enqueue time: no later
        // kernel, yet it joins its own (not none, and never the next one's).
        assert_eq!(corr(3_002_000, 0), Some(3));
        assert_eq!(corr(1_990_000, 1_999_000), Some(2));
        // Far from every kernel: NCCL's time is not trusted, the first after the enqueue is.
        assert_eq!(corr(1_500_000, 1_500_000 + 2 * CLOCK_SLACK_NS), Some(2));
        assert_eq!(corr(3_500_000, 0), None);
        assert_eq!(pick(&[], 1, 1).map(|k| k.corr), None);
    }
}
