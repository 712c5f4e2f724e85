//! How a batch's records become row values: one fill function per record kind, run in turn
//! by [`insert_batch`] from the table [`FILLS`]. Times are made relative to the record's track
//! (see `ids.rs`), connection-local string ids mapped to `strings.id`, launch shapes and call
//! kinds to their ids.

use gpuprof_proto::agent::RecordBatch;
use rusqlite::Connection;

use super::ids::Tracks;
use super::rows::{ProcCtx, RowBufs, insert_rows, now_ns, table, upsert_device};
use crate::catalog::Kind;

/// What the fill functions of one batch share.
struct Fill<'a> {
    c: &'a Connection,
    bufs: &'a mut RowBufs,
    tracks: &'a mut Tracks,
    proc: u64,
    at: At<'a>,
}

/// The batch's session and process, and its connection's time base and strings.
#[derive(Clone, Copy)]
struct At<'a> {
    session: i64,
    proc: i64,
    base: i64,
    strings: &'a [i64],
}

impl At<'_> {
    /// `strings.id` of a connection-local string id (0 if undefined).
    fn st(self, id: u32) -> i64 {
        self.strings.get(id as usize).copied().unwrap_or(0)
    }

    /// A time relative to the process's base.
    fn rel(self, t: u64) -> i64 {
        t as i64 - self.base
    }

    /// A record's stream key: its (device, context, stream, thread), 0 where the kind has none.
    fn key(self, dev: u32, ctx: u32, stream: u32, tid: u32) -> [i64; 6] {
        [self.session, self.proc, dev.into(), ctx.into(), stream.into(), tid.into()]
    }
}

fn dur(start: u64, end: u64) -> i64 {
    end.saturating_sub(start) as i64
}

type FillFn = fn(&mut Fill<'_>, &RecordBatch) -> rusqlite::Result<()>;

/// Each kind a batch carries with the function that stores its records, in the order they are
/// stored (which decides the order new tracks, shapes and call kinds get their ids).
const FILLS: [(Kind, FillFn); gpuprof_proto::kinds::IN_BATCH] = [
    (Kind::Kernel, kernels),
    (Kind::Api, api_calls),
    (Kind::Memcpy, memcpys),
    (Kind::Memset, memsets),
    (Kind::Sync, syncs),
    (Kind::Overhead, overheads),
    (Kind::Marker, markers),
    (Kind::ExternalCorrelation, external_correlations),
    (Kind::Context, contexts),
    (Kind::Stream, streams),
    (Kind::Graph, graphs),
    (Kind::Collective, collectives),
    (Kind::Device, devices),
];

/// Inserts the records of `b` from process `proc`.
pub(super) fn insert_batch(
    c: &Connection,
    bufs: &mut RowBufs,
    tracks: &mut Tracks,
    proc: u64,
    p: &ProcCtx,
    b: &RecordBatch,
) -> rusqlite::Result<()> {
    let at = At { session: b.session_id as i64, proc: proc as i64, base: p.base_ns, strings: &p.strings };
    let mut f = Fill { c, bufs, tracks, proc, at };
    for (_, fill) in FILLS {
        fill(&mut f, b)?;
    }
    Ok(())
}

fn kernels(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Kernel), &b.kernels, |k, v| {
        let shape = f.tracks.shape(
            c,
            [
                at.st(k.name_id),
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
        let (track, start) = f.tracks.at(c, at.key(k.device_id, k.context_id, k.stream_id, 0), at.rel(k.start_ns))?;
        v.copy_from_slice(&[track, k.correlation_id.into(), shape, start, dur(k.start_ns, k.end_ns), k.grid_x.into()]);
        Ok(())
    })
}

fn api_calls(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Api), &b.api_calls, |a, v| {
        let kind = f.tracks.api_kind(c, [a.domain.into(), a.cbid.into(), a.return_value.into()])?;
        let (track, start) = f.tracks.at(c, at.key(0, 0, 0, a.thread_id), at.rel(a.start_ns))?;
        v.copy_from_slice(&[track, a.correlation_id.into(), kind, start, dur(a.start_ns, a.end_ns)]);
        Ok(())
    })
}

fn memcpys(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Memcpy), &b.memcpys, |m, v| {
        let shape = f.tracks.memcpy_shape(
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
        let (track, start) = f.tracks.at(c, at.key(m.device_id, m.context_id, m.stream_id, 0), at.rel(m.start_ns))?;
        v.copy_from_slice(&[track, m.correlation_id.into(), start, dur(m.start_ns, m.end_ns), m.bytes as i64, shape]);
        Ok(())
    })
}

fn memsets(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Memset), &b.memsets, |m, v| {
        let (track, start) = f.tracks.at(c, at.key(m.device_id, m.context_id, m.stream_id, 0), at.rel(m.start_ns))?;
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
    })
}

fn syncs(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Sync), &b.syncs, |y, v| {
        let (track, start) = f.tracks.at(c, at.key(0, y.context_id, y.stream_id, 0), at.rel(y.start_ns))?;
        v.copy_from_slice(&[
            track,
            y.sync_type.into(),
            y.event_id.into(),
            y.correlation_id.into(),
            start,
            dur(y.start_ns, y.end_ns),
        ]);
        Ok(())
    })
}

fn overheads(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Overhead), &b.overheads, |o, v| {
        let (track, start) = f.tracks.at(c, at.key(0, 0, 0, 0), at.rel(o.start_ns))?;
        v.copy_from_slice(&[
            track,
            o.overhead_kind.into(),
            o.object_kind.into(),
            o.object_id as i64,
            start,
            dur(o.start_ns, o.end_ns),
        ]);
        Ok(())
    })
}

fn markers(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Marker), &b.markers, |m, v| {
        let (track, start) = f.tracks.at(c, at.key(0, 0, 0, m.thread_id), at.rel(m.start_ns))?;
        v.copy_from_slice(&[
            track,
            m.id as i64,
            at.st(m.name_id),
            at.st(m.domain_id),
            start,
            dur(m.start_ns, m.end_ns),
            m.is_mark.into(),
        ]);
        Ok(())
    })
}

fn external_correlations(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::ExternalCorrelation), &b.external_correlations, |x, v| {
        // No start: the track of the process's first epoch.
        let (track, _) = f.tracks.at(c, at.key(0, 0, 0, 0), 0)?;
        v.copy_from_slice(&[track, x.external_kind.into(), x.external_id as i64, x.correlation_id.into()]);
        Ok(())
    })
}

fn contexts(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let at = f.at;
    insert_rows(f.c, table(Kind::Context), &b.contexts, |x, v| {
        v.copy_from_slice(&[at.session, at.proc, x.context_id.into(), x.device_id.into(), x.null_stream_id.into()]);
        Ok(())
    })
}

fn streams(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let at = f.at;
    insert_rows(f.c, table(Kind::Stream), &b.streams, |x, v| {
        v.copy_from_slice(&[
            at.session,
            at.proc,
            x.stream_id.into(),
            x.context_id.into(),
            x.priority.into(),
            x.flags.into(),
        ]);
        Ok(())
    })
}

fn graphs(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Graph), &b.graphs, |g, v| {
        let (track, start) = f.tracks.at(c, at.key(g.device_id, g.context_id, g.stream_id, 0), at.rel(g.start_ns))?;
        v.copy_from_slice(&[track, g.correlation_id.into(), g.graph_id.into(), start, dur(g.start_ns, g.end_ns)]);
        Ok(())
    })
}

/// How far from its enqueue a collective's run in the kernel may start (60 s).
const GPU_TIME_WINDOW_NS: u64 = 60_000_000_000;

fn collectives(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    let (c, at) = (f.c, f.at);
    f.bufs.push(c, table(Kind::Collective), &b.collectives, |x, v| {
        let (track, start) = f.tracks.at(c, at.key(0, 0, 0, x.thread_id), at.rel(x.start_ns))?;
        // NCCL times the run with the GPU's global timer, which the driver keeps near the host's
        // clock: a time far from the enqueue (another clock, or half a run reported) is left out.
        let gpu_off = x.gpu_start_ns as i64 - x.start_ns as i64;
        let (gpu_off, gpu_dur) =
            if x.gpu_start_ns != 0 && x.gpu_end_ns >= x.gpu_start_ns && gpu_off.unsigned_abs() <= GPU_TIME_WINDOW_NS {
                (gpu_off, dur(x.gpu_start_ns, x.gpu_end_ns))
            } else {
                (0, -1)
            };
        v.copy_from_slice(&[
            track,
            at.st(x.name_id),
            start,
            dur(x.start_ns, x.end_ns),
            gpu_off,
            gpu_dur,
            x.seq as i64,
            x.comm_hash as i64,
            x.count as i64,
            x.bytes as i64,
            at.st(x.datatype_id),
            at.st(x.algo_id),
            at.st(x.proto_id),
            x.root.into(),
            x.rank.into(),
            x.nranks.into(),
            x.channels.into(),
        ]);
        Ok(())
    })
}

fn devices(f: &mut Fill<'_>, b: &RecordBatch) -> rusqlite::Result<()> {
    if !b.devices.is_empty() {
        let now = now_ns();
        for d in &b.devices {
            upsert_device(f.c, f.proc, d, now)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_a_batch_is_filled_once() {
        let mut filled: Vec<Kind> = FILLS.iter().map(|(k, _)| *k).collect();
        filled.sort_by_key(|k| k.index());
        let carried: Vec<Kind> = gpuprof_proto::kinds::batch_counts(&RecordBatch::default())
            .iter()
            .map(|(w, _)| Kind::from_wire(*w as i32).unwrap())
            .collect();
        assert_eq!(filled, carried);
        for k in filled {
            // Devices are upserted, not rows of a record table.
            assert_eq!(k.spec().cols > 0, k != Kind::Device, "{k:?}");
            if k != Kind::Device {
                assert_eq!(table(k).name, k.spec().data.unwrap_or(k.name()));
            }
        }
    }
}
