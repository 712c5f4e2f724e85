//! QueryRecords' body: a session's rows of one kind, streamed in messages.

use super::{Strings, copy_kind_name, sync_type_name, where_for};
use gpuprof_proto::api as pb;
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
