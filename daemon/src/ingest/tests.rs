use rusqlite::Connection;

use gpuprof_proto::agent::RecordBatch;

use super::fill::insert_batch;
use super::ids::Tracks;
use super::rows::{ProcCtx, RowBufs, UNKNOWN, insert_rows, table};
use crate::catalog::Kind;

/// A context/stream row CUPTI reported replaces a derived one (unknown fields), never
/// the other way round; one row per key, also within one multi-row statement.
/// The first two columns of every row of `sql`.
fn pairs(c: &Connection, sql: &str) -> Vec<(i64, i64)> {
    c.prepare(sql).unwrap().query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn topology_rows_upsert_reported_over_derived() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("").unwrap().storage;
    let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
    let ctx = |ctx: i64, null_stream: i64| [7, 1, ctx, 0, null_stream];
    // Derived first, then reported: the reported values win.
    insert_rows(&c, table(Kind::Context), &[ctx(1, UNKNOWN)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    insert_rows(&c, table(Kind::Context), &[ctx(1, 7)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    // Reported first, then derived: the reported values stay.
    insert_rows(&c, table(Kind::Context), &[ctx(2, 9)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    insert_rows(&c, table(Kind::Context), &[ctx(2, UNKNOWN)], |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    let rows = pairs(&c, "SELECT ctx, null_stream FROM context ORDER BY ctx");
    assert_eq!(rows, [(1, 7), (2, 9)]);
    // 70 stream rows (a multi-row statement and a remainder) over 10 keys, derived and
    // reported mixed: one row per key, reported flags where any was reported.
    let streams: Vec<[i64; 6]> =
        (0..70).map(|i| [7, 1, i % 10, 1, 0, if i % 10 < 5 && i >= 35 { 1 } else { UNKNOWN }]).collect();
    insert_rows(&c, table(Kind::Stream), &streams, |x, v| {
        v.copy_from_slice(x);
        Ok(())
    })
    .unwrap();
    let rows = pairs(&c, "SELECT stream, flags FROM stream ORDER BY stream");
    let want: Vec<(i64, i64)> = (0..10).map(|s| (s, if s < 5 { 1 } else { UNKNOWN })).collect();
    assert_eq!(rows, want);
}

/// A new database holding `batches` of process 9 (base `base_ns`), inserted as the writer
/// inserts them, each with a track cache of its own, in one transaction.
fn stored(base_ns: i64, batches: &[&RecordBatch]) -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("").unwrap().storage;
    let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
    let mut bufs = RowBufs::default();
    let p = ProcCtx { base_ns, strings: vec![0] };
    c.execute_batch("BEGIN").unwrap();
    for b in batches {
        insert_batch(&c, &mut bufs, &mut Tracks::default(), 9, &p, b).unwrap();
    }
    bufs.flush(&c).unwrap();
    c.execute_batch("COMMIT").unwrap();
    (dir, c)
}

/// A kernel's grid and block read back as sent, whatever their values (through the shape).
#[test]
fn kernel_dimensions_read_back_as_sent() {
    use gpuprof_proto::agent::KernelRecord;

    let dims: [[u32; 6]; 5] = [
        [1, 1, 1, 1, 1, 1],
        [4096, 65535, 65535, 1024, 1024, 64],
        [7, 65536, 2, 3, 65536, 32768],
        [1, 70000, 0, 1, 2, 32769],
        [u32::MAX, u32::MAX, 1, 0, u32::MAX, 0],
    ];
    let mut b = RecordBatch { session_id: 3, ..Default::default() };
    for (i, d) in dims.iter().enumerate() {
        b.kernels.push(KernelRecord {
            start_ns: 1000 + i as u64,
            end_ns: 2000,
            grid_x: d[0],
            grid_y: d[1],
            grid_z: d[2],
            block_x: d[3],
            block_y: d[4],
            block_z: d[5],
            graph_node_id: (i as u64 % 2) << 40,
            ..Default::default()
        });
    }
    // Twice: the second batch stays buffered until the flush.
    let (_dir, c) = stored(0, &[&b, &b]);
    let got: Vec<[u32; 6]> = c
        .prepare("SELECT gx, gy, gz, bx, by, bz FROM kernel WHERE session = 3 AND proc = 9 ORDER BY rowid")
        .unwrap()
        .query_map([], |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?]))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(got, [dims, dims].concat());
    let nodes: Vec<i64> = c
        .prepare("SELECT graph_node FROM kernel WHERE session = 3 ORDER BY rowid")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(nodes, [0, 1 << 40, 0, 1 << 40, 0, 0, 1 << 40, 0, 1 << 40, 0]);
    // Each launch shape is stored once.
    let shapes: i64 = c.query_row("SELECT count(*) FROM kernel_shapes", [], |r| r.get(0)).unwrap();
    assert_eq!(shapes, 5);
}

/// An API call's domain, cbid, return value, thread and times read back as sent (through its
/// kind), and each kind is stored once.
#[test]
fn api_calls_read_back_as_sent() {
    use gpuprof_proto::agent::ApiRecord;

    let mut b = RecordBatch { session_id: 3, ..Default::default() };
    let kinds: [(i32, u32, u32); 4] = [(1, 211, 0), (2, 307, 0), (1, 211, 700), (1, u32::MAX, u32::MAX)];
    for i in 0..40u32 {
        let (domain, cbid, return_value) = kinds[i as usize % 4];
        b.api_calls.push(ApiRecord {
            domain,
            cbid,
            start_ns: 5000 + u64::from(i) * 100,
            end_ns: 5050 + u64::from(i) * 100,
            correlation_id: i + 1,
            thread_id: 10 + i % 3,
            return_value,
        });
    }
    let (_dir, c) = stored(1000, &[&b]);
    let got: Vec<[i64; 7]> = c
        .prepare(
            "SELECT domain, cbid, ret, corr, tid, start, dur FROM api WHERE session = 3 AND proc = 9 ORDER BY rowid",
        )
        .unwrap()
        .query_map([], |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?]))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<[i64; 7]> = b
        .api_calls
        .iter()
        .map(|a| {
            let (corr, tid, start) = (a.correlation_id.into(), a.thread_id.into(), a.start_ns as i64 - 1000);
            [a.domain.into(), a.cbid.into(), a.return_value.into(), corr, tid, start, 50]
        })
        .collect();
    // Rows hold two records of a thread each (migration 0012): in rowid order a row's records
    // come together, so the calls of different threads come in another order than sent.
    let mut got = got;
    got.sort_unstable_by_key(|r| r[3]);
    assert_eq!(got, want);
    let rows: i64 = c.query_row("SELECT count(*) FROM api_data", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 21, "40 calls on threads of 14, 13 and 13 calls: 7 pairs, then 6 pairs and one alone twice");
    let stored: i64 = c.query_row("SELECT count(*) FROM api_kinds", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 4);
}

/// A copy's columns read back as sent (through its shape), and each shape is stored once.
#[test]
fn copies_read_back_as_sent() {
    use gpuprof_proto::agent::MemcpyRecord;

    let mut b = RecordBatch { session_id: 3, ..Default::default() };
    // (kind, source kind, destination kind, source device, destination device, async, graph node)
    let shapes: [(u32, u32, u32, u32, u32, bool, u64); 3] =
        [(1, 2, 3, 0, 0, true, 0), (8, 3, 3, 0, 1, false, 0), (2, 3, 2, u32::MAX, 5, true, 1 << 50)];
    for i in 0..30u32 {
        let (copy_kind, src_kind, dst_kind, src_device_id, dst_device_id, is_async, graph_node_id) =
            shapes[i as usize % 3];
        b.memcpys.push(MemcpyRecord {
            start_ns: 7000 + u64::from(i),
            end_ns: 7100 + u64::from(i),
            device_id: 1,
            stream_id: 7 + i % 2,
            correlation_id: i,
            bytes: 1 << i,
            copy_kind,
            src_kind,
            dst_kind,
            src_device_id,
            dst_device_id,
            is_async,
            graph_node_id,
            ..Default::default()
        });
    }
    let (_dir, c) = stored(0, &[&b]);
    let got: Vec<[i64; 11]> = c
        .prepare(
            "SELECT stream, corr, start, dur, bytes, kind, src_kind, dst_kind, src_dev, dst_dev, async
             FROM memcpy WHERE session = 3 AND proc = 9 ORDER BY rowid",
        )
        .unwrap()
        .query_map([], |r| {
            let mut v = [0i64; 11];
            for (i, x) in v.iter_mut().enumerate() {
                *x = r.get(i)?;
            }
            Ok(v)
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<[i64; 11]> = b
        .memcpys
        .iter()
        .map(|m| {
            [
                m.stream_id.into(),
                m.correlation_id.into(),
                m.start_ns as i64,
                100,
                m.bytes as i64,
                m.copy_kind.into(),
                m.src_kind.into(),
                m.dst_kind.into(),
                m.src_device_id.into(),
                m.dst_device_id.into(),
                m.is_async.into(),
            ]
        })
        .collect();
    assert_eq!(got, want);
    let nodes: i64 = c.query_row("SELECT sum(graph_node = 1 << 50) FROM memcpy", [], |r| r.get(0)).unwrap();
    assert_eq!(nodes, 10);
    let stored: i64 = c.query_row("SELECT count(*) FROM memcpy_shapes", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, 3);
}

/// A process hours old: every start reads back as sent, while each row stores it in 4 bytes
/// at most (relative to its track's base), one track row per 2^32 ns epoch of the stream.
#[test]
fn starts_of_a_long_running_process_read_back_as_sent() {
    use gpuprof_proto::agent::KernelRecord;

    let base_ns = 1_000_000;
    let rel: [i64; 8] = [0, (1 << 31) - 1, 1 << 31, 5_000_000_000, 3_600_000_000_000, 3_600_000_000_001, 7, 1 << 40];
    let mut b = RecordBatch { session_id: 3, ..Default::default() };
    for r in rel {
        let start_ns = (base_ns + r) as u64;
        b.kernels.push(KernelRecord { start_ns, end_ns: start_ns + 10, stream_id: 7, ..Default::default() });
    }
    let (_dir, c) = stored(base_ns, &[&b]);
    let got: Vec<(i64, i64)> = c
        .prepare("SELECT start, start + dur FROM kernel WHERE session = 3 ORDER BY rowid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<(i64, i64)> = rel.iter().map(|&r| (r, r + 10)).collect();
    assert_eq!(got, want);
    let (lo, hi): (i64, i64) =
        c.query_row("SELECT min(start), max(start) FROM kernel_data", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
    assert!(lo >= -(1 << 31) && hi < 1 << 31, "stored starts {lo}..={hi} take more than 4 bytes");
    // Epochs 0 (0, 2^31 - 1, 7), 1 (2^31, 5e9), 838 (3.6e12, twice) and 256 (2^40).
    let tracks: i64 = c.query_row("SELECT count(*) FROM tracks WHERE stream = 7", [], |r| r.get(0)).unwrap();
    assert_eq!(tracks, 4);
}

/// The queue's record budget: a batch's permit is held until the writer takes the batch, so
/// connections wait once `queue_records` records are queued, and go on when the writer drains.
#[test]
fn queued_records_are_bounded_by_the_budget() {
    use std::time::Duration;

    use gpuprof_proto::agent::{KernelRecord, RecordBatch};

    use super::WriterMsg;

    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("[ingest]\nqueue_records = 10000\n").unwrap();
    let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
    let stats = std::sync::Arc::new(crate::stats::Stats::default());
    let (w, write) = super::writer(c, &cfg.ingest, stats).unwrap();
    let join = std::thread::spawn(write);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        // 6000 + 4000 fill the budget; a third batch waits for a permit.
        let a = w.reserve_records(6000).await.unwrap();
        let b = w.reserve_records(4000).await.unwrap();
        assert!(tokio::time::timeout(Duration::from_millis(200), w.reserve_records(1)).await.is_err());
        drop(b);
        let c = tokio::time::timeout(Duration::from_secs(5), w.reserve_records(4000)).await.unwrap().unwrap();
        // A batch larger than the whole budget takes all of it, not forever.
        drop(a);
        drop(c);
        let all = tokio::time::timeout(Duration::from_secs(5), w.reserve_records(50_000)).await.unwrap().unwrap();
        assert_eq!(all.num_permits(), 10_000);
        // The writer gives a batch's permit back once it has taken the batch.
        let batch = RecordBatch {
            kernels: vec![KernelRecord { correlation_id: 1, ..Default::default() }],
            ..Default::default()
        };
        w.send(WriterMsg::Records { proc: 0, batch, count: 1, permit: Some(all) }).await.unwrap();
        w.flush().await.unwrap();
        let again = tokio::time::timeout(Duration::from_secs(5), w.reserve_records(10_000)).await;
        assert!(again.is_ok_and(|p| p.is_ok()), "the writer kept the batch's permit");
        w.stop().await.unwrap();
    });
    join.join().unwrap();
}
