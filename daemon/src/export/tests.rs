use super::flows::key;
use super::json::us;

#[test]
fn microseconds_from_integers() {
    let mut b = Vec::new();
    us(&mut b, 1_234_567);
    b.push(b' ');
    us(&mut b, 5);
    b.push(b' ');
    us(&mut b, -1500);
    assert_eq!(String::from_utf8(b).unwrap(), "1234.567 0.005 -1.500");
}

#[test]
fn flow_keys() {
    assert_ne!(key(1, 5), key(2, 5));
    assert_eq!(key(3, 0xffff_ffff) >> 32, 3);
}

#[test]
fn flows_join_the_readers_keys() {
    use super::flows::{FlowKeys, Flows};
    use super::records::{EVENT_TABLES, Rec};
    let t = |name: &str| EVENT_TABLES.iter().position(|x| *x == name).unwrap();
    let rec = |table: &str, proc: i64, corr: i64| {
        let mut v = [0; 8];
        v[if table == "api" { 1 } else { 2 }] = corr;
        Rec { proc, start: 0, table: t(table), v }
    };
    // API calls on one reader, device activities on two others, as the readers split them.
    let mut api = FlowKeys::default();
    for (p, c) in [(1, 5), (1, 5), (1, 6), (2, 5), (1, 0), (1, 9)] {
        api.for_table(t("api"))(&rec("api", p, c));
    }
    let mut kernels = FlowKeys::default();
    for (p, c) in [(1, 5), (1, 7), (2, 5), (1, 5), (1, 0)] {
        kernels.for_table(t("kernel"))(&rec("kernel", p, c));
    }
    let mut others = FlowKeys::default();
    others.for_table(t("memcpy"))(&rec("memcpy", 1, 6));
    others.for_table(t("memset"))(&rec("memset", 1, 9));
    // Graphs and syncs have correlation ids but start and end no flow.
    others.for_table(t("graph"))(&rec("graph", 1, 9));
    others.for_table(t("sync"))(&rec("sync", 1, 6));
    let mut f = Flows::from_keys(vec![kernels, api, others]);
    // Ids are given in key order: (1, 5) two kernels, (1, 6) a copy, (1, 9) a set, (2, 5) a kernel.
    assert_eq!(f.starts(key(1, 5)), Some((1, 2)));
    assert_eq!(f.starts(key(1, 6)), Some((3, 1)));
    assert_eq!(f.starts(key(1, 9)), Some((4, 1)));
    assert_eq!(f.starts(key(2, 5)), Some((5, 1)));
    // No device activity, no API call, no correlation id: no flow.
    assert_eq!(f.starts(key(1, 7)), None);
    assert_eq!(f.starts(key(1, 0)), None);
    assert_eq!(f.end(key(1, 7)), None);
    assert_eq!((f.end(key(1, 5)), f.end(key(1, 5)), f.end(key(1, 5))), (Some(1), Some(2), None));
    assert_eq!((f.end(key(1, 6)), f.end(key(1, 6))), (Some(3), None));
    assert_eq!(f.end(key(1, 9)), Some(4));
}

#[test]
fn the_export_readers_read_every_table_once() {
    use super::records::{EVENT_TABLES, READERS};
    let mut seen: Vec<usize> = READERS.iter().flat_map(|r| r.iter().copied()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..EVENT_TABLES.len()).collect::<Vec<_>>());
    // The two big kinds have a thread each.
    assert_eq!(EVENT_TABLES[READERS[0][0]], "kernel");
    assert_eq!(EVENT_TABLES[READERS[1][0]], "api");
}

/// The record views' columns that became a record's values before the exports read the
/// `_data` tables themselves: the definition the scans must keep.
fn view_values(table: &str) -> &'static str {
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
        "collective" => "t.tid, t.name, t.seq, t.comm, t.bytes, 0, 0, 0",
        _ => "t.kind, t.obj_kind, t.obj_id, 0, 0, 0, 0, 0",
    }
}

/// Each record table's `_data` columns after track (and start and duration, but for external
/// correlations), and how many values each takes (0: any small integer).
const DATA: &[(&str, &[(&str, i64)])] = &[
    ("kernel", &[("corr", 0), ("shape", 2), ("gx", 0)]),
    ("memcpy", &[("corr", 0), ("bytes", 0), ("shape", 2)]),
    ("memset", &[("corr", 0), ("bytes", 0), ("value", 0), ("mem_kind", 0), ("graph_node", 0)]),
    ("graph", &[("corr", 0), ("graph_id", 0)]),
    ("api", &[("corr", 0), ("kind", 2)]),
    ("marker", &[("id", 0), ("name", 3), ("domain", 3), ("is_mark", 2)]),
    ("sync", &[("type", 0), ("event", 0), ("corr", 0)]),
    ("overhead", &[("kind", 0), ("obj_kind", 0), ("obj_id", 0)]),
    ("external_correlation", &[("ext_kind", 0), ("ext_id", 0), ("corr", 0)]),
    (
        "collective",
        &[
            ("name", 3),
            ("gpu_off", 0),
            ("gpu_dur", 0),
            ("seq", 0),
            ("comm", 0),
            ("count", 0),
            ("bytes", 0),
            ("dtype", 3),
            ("algo", 3),
            ("proto", 3),
            ("root", 0),
            ("rank", 0),
            ("nranks", 0),
            ("channels", 0),
        ],
    ),
];

/// A database of two sessions (3 and 4) whose tracks cover three processes (11 without a
/// `processes` row), two devices, two streams, three threads and two bases, with 300 rows of
/// varied values in each record table with tracks, and two kernel shapes, copy shapes and API
/// kinds.
pub(super) fn varied_db() -> (tempfile::TempDir, rusqlite::Connection) {
    use rusqlite::params_from_iter;

    let dir = tempfile::tempdir().unwrap();
    let cfg = crate::config::Config::from_toml("").unwrap().storage;
    let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
    c.execute_batch(
        "INSERT INTO strings(id, value) VALUES (1, 'gemm_tile'), (2, 'relu'), (3, 'train');
         INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns, connected_ns)
             VALUES (9, 1, 0, 0, 'injector', 'a', '[]', '', 0, 5000000000, 0),
                    (10, 2, 0, 0, 'injector', 'b', '[]', '', 0, 7000000000, 0);
         INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms, max_records)
             VALUES (3, 'a', 'active', '{}', '{}', 0, 0, 0, 0, 0), (4, 'b', 'active', '{}', '{}', 0, 0, 0, 0, 0);
         INSERT INTO kernel_shapes VALUES (1, 1, 2, 3, 128, 1, 1, 32, 0, 1024, 0), (2, 2, 1, 1, 256, 2, 1, 16, 48, 0, 7);
         INSERT INTO memcpy_shapes VALUES (1, 1, 1, 2, 0, 0, 1, 0), (2, 2, 2, 1, 1, 1, 0, 5);
         INSERT INTO api_kinds VALUES (1, 1, 211, 0), (2, 2, 307, 1);",
    )
    .unwrap();
    // Tracks of two sessions, of processes 9, 10 and 11 (which has no `processes` row), two
    // devices, two streams, two thread ids and two bases.
    let mut tracks = 0;
    for session in [3, 4] {
        for proc in [9, 10, 11] {
            for (dev, stream, tid) in [(0, 7, 100), (1, 8, 101), (1, 7, 102)] {
                for base in [0i64, 1 << 32] {
                    c.execute(
                        "INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6)",
                        rusqlite::params![session, proc, dev, stream, tid, base],
                    )
                    .unwrap();
                    tracks += 1;
                }
            }
        }
    }
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rand = |n: i64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as i64
    };
    for (table, cols) in DATA {
        let timed = *table != "external_correlation";
        let mut names: Vec<&str> = if timed { vec!["track", "start", "dur"] } else { vec!["track"] };
        names.extend(cols.iter().map(|(n, _)| *n));
        let sql = format!("INSERT INTO {table}_data({}) VALUES (?{})", names.join(", "), ", ?".repeat(names.len() - 1));
        for _ in 0..300 {
            let mut v = vec![1 + rand(tracks)];
            if timed {
                v.extend([rand(1 << 32) - (1 << 31), rand(3_000_000_000)]);
            }
            v.extend(cols.iter().map(|(_, n)| if *n > 0 { 1 + rand(*n) } else { rand(40) }));
            c.execute(&sql, params_from_iter(v)).unwrap();
        }
    }
    (dir, c)
}

/// Filters of each kind (the index is what the tests' messages name): none; processes;
/// processes, one without a `processes` row; a device; a stream; all three; a kernel name
/// pattern; one nothing matches; a time range; its start only; its end only.
pub(super) fn filters() -> Vec<gpuprof_proto::api::RecordFilter> {
    use gpuprof_proto::api as pb;

    vec![
        pb::RecordFilter::default(),
        pb::RecordFilter { process_ids: vec![10], ..Default::default() },
        pb::RecordFilter { process_ids: vec![9, 11], ..Default::default() },
        pb::RecordFilter { device_ids: vec![1], ..Default::default() },
        pb::RecordFilter { stream_ids: vec![8], ..Default::default() },
        pb::RecordFilter { process_ids: vec![9], device_ids: vec![1], stream_ids: vec![7], ..Default::default() },
        pb::RecordFilter { name_pattern: "gemm*".into(), ..Default::default() },
        pb::RecordFilter { name_pattern: "*none*".into(), ..Default::default() },
        pb::RecordFilter {
            time_range: Some(pb::TimeRange { start_ns: 8_000_000_000, end_ns: 10_000_000_000 }),
            ..Default::default()
        },
        pb::RecordFilter {
            time_range: Some(pb::TimeRange { start_ns: 9_000_000_000, end_ns: 0 }),
            ..Default::default()
        },
        pb::RecordFilter {
            time_range: Some(pb::TimeRange { start_ns: 0, end_ns: 7_500_000_000 }),
            ..Default::default()
        },
    ]
}

/// The export's scans of the `_data` tables give, for every event table and filter, the rows
/// the record views give with `where_for` (joined to `processes`, as the exports always
/// required), in the same order and with the same values.
#[test]
fn scans_give_the_rows_the_views_give() {
    use rusqlite::params_from_iter;

    use super::records::EVENT_TABLES;
    use super::scan::{Dims, scan};

    let (_dir, c) = varied_db();
    let filters = filters();
    for session in [3u64, 4] {
        let d = Dims::read(&c, session).unwrap();
        // Rows of each table without a filter.
        let mut all = Vec::new();
        for (fi, f) in filters.iter().enumerate() {
            for (ti, table) in EVENT_TABLES.iter().enumerate() {
                let w = crate::query::where_for(&c, table, session, f).unwrap();
                let want: Vec<(i64, i64, i64, [i64; 8])> = c
                    .prepare(&format!(
                        "SELECT t.proc, t.start + p.base_ns, t.dur, {} FROM {table} t JOIN processes p ON p.id = t.proc
                         WHERE {} ORDER BY t.rowid",
                        view_values(table),
                        w.sql
                    ))
                    .unwrap()
                    .query_map(params_from_iter(w.params.iter()), |r| {
                        let mut v = [0; 8];
                        for (i, x) in v.iter_mut().enumerate() {
                            *x = r.get(3 + i)?;
                        }
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, v))
                    })
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
                let mut got = Vec::new();
                if scan(&c, &d, ti, session, f, |r, dur| {
                    got.push((r.proc, r.start, dur, r.v));
                    Ok(())
                })
                .is_err()
                {
                    panic!("scanning {table}");
                }
                assert_eq!(got, want, "{table}, session {session}, filter {fi}: {f:?}");
                // Every filter keeps some rows (but the name nothing matches), and each that
                // applies to the table drops some.
                let expect_none = fi == 7 && crate::query::cols(table).name;
                assert_eq!(got.is_empty(), expect_none, "{table}, filter {fi}: {} rows", got.len());
                let cl = crate::query::cols(table);
                let applies = match fi {
                    0 => false,
                    3 => cl.dev,
                    4 => cl.stream,
                    6 | 7 => cl.name,
                    8..=10 => cl.time,
                    _ => true,
                };
                if fi == 0 {
                    all.push(got.len());
                } else if applies {
                    assert!(got.len() < all[ti], "{table}, filter {fi}: {} of {} rows", got.len(), all[ti]);
                }
            }
        }
    }
}
