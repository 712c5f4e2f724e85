use std::time::Instant;

use rusqlite::{Connection, params};

use super::delete::{CHUNK_ROWS, Forget, SESSION_KEYED, delete_keyed_chunk, delete_session_rows_chunk};
use super::delete::{expire_processes, expire_unsessioned_chunk, finish_session, forget_session};
use super::pm::{expire_rollups, rollup_step};
use super::select::{finished_before, oldest_finished, orphan_sessions, session_ranges, unsessioned_work};
use super::vacuum::{VACUUM_PAGES, settle_files, vacuum_step};
use crate::catalog::RECORD_TABLES;
use crate::store::Pages;

#[test]
fn folds_old_samples_into_rollups() {
    let mut c = Connection::open_in_memory().unwrap();
    crate::store::migrate(&c).unwrap();
    let s = 1_000_000_000i64;
    // 30 s of samples at 100 Hz on two devices, two metrics.
    for dev in [1, 2] {
        for i in 0..3000i64 {
            for m in [1, 2] {
                c.execute(
                    "INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1, ?2, 10000000, ?3, ?4)",
                    params![dev, 1000 * s + i * 10_000_000, m, (i % 10) as f64 + m as f64],
                )
                .unwrap();
            }
        }
    }
    let cutoff = 1020 * s;
    let mut steps = 0;
    while rollup_step(&mut c, cutoff, s).unwrap() {
        steps += 1;
        assert!(steps < 100);
    }
    assert!(steps >= 4, "small steps: {steps}");
    let left: i64 = c.query_row("SELECT COUNT(*) FROM pm_sample", [], |r| r.get(0)).unwrap();
    assert_eq!(left, 2 * 2 * 1000, "the last 10 s stay at full rate");
    let min_ts: i64 = c.query_row("SELECT MIN(ts) FROM pm_sample", [], |r| r.get(0)).unwrap();
    assert!(min_ts >= cutoff);
    let (buckets, n, mean, lo, hi): (i64, i64, f64, f64, f64) = c
        .query_row(
            "SELECT COUNT(*), SUM(n), AVG(mean), MIN(min), MAX(max) FROM pm_rollup WHERE device = 1 AND metric = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(buckets, 20);
    assert_eq!(n, 2000);
    assert!((mean - 5.5).abs() < 1e-9, "{mean}");
    assert_eq!((lo, hi), (1.0, 10.0));
    assert_eq!(expire_rollups(&mut c, 1010 * s).unwrap(), 2 * 2 * 10);
}

// ---------------------------------------------------------------- sessions and records

const S: i64 = 1_000_000_000;

fn db() -> Connection {
    let c = Connection::open_in_memory().unwrap();
    // As on the daemon's writer (the bundled SQLite enforces foreign keys by default).
    c.execute_batch("PRAGMA foreign_keys=OFF").unwrap();
    crate::store::migrate(&c).unwrap();
    c
}

fn process(c: &Connection, id: i64, base_ns: i64, disconnected_ns: Option<i64>) {
    c.execute(
        "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
                               connected_ns, disconnected_ns)
         VALUES (?1, ?1, 0, 0, 'injector', 'x', '[]', '', 0, ?2, ?2, ?3)",
        params![id, base_ns, disconnected_ns],
    )
    .unwrap();
}

fn session(c: &Connection, id: i64, state: &str, stopped_ns: Option<i64>) {
    c.execute(
        "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, started_ns,
                              stopped_ns, duration_ms, max_records, stop_reason)
         VALUES (?1, '', ?2, '[]', '{}', 0, 0, 0, 0, ?3, 0, 0, '')",
        params![id, state, stopped_ns],
    )
    .unwrap();
}

/// The track of (session, process) on device 0, context 0, stream 7, whose starts count from `base`.
fn track_at(c: &Connection, session: i64, proc: i64, base: i64) -> i64 {
    c.execute(
        "INSERT OR IGNORE INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (?1, ?2, 0, 0, 7, 0, ?3)",
        params![session, proc, base],
    )
    .unwrap();
    c.query_row(
        "SELECT id FROM tracks WHERE session = ?1 AND proc = ?2 AND stream = 7 AND base = ?3",
        params![session, proc, base],
        |r| r.get(0),
    )
    .unwrap()
}

/// The track of (session, process)'s first 2.1 s.
fn track(c: &Connection, session: i64, proc: i64) -> i64 {
    track_at(c, session, proc, 0)
}

/// A kernel stored as the writer stores it: its start relative to its track's base, a multiple
/// of 2^32 ns within ±2^31 of it.
fn kernel(c: &Connection, session: i64, proc: i64, start: i64) {
    let base = ((start + (1 << 31)) >> 32) << 32;
    let t = track_at(c, session, proc, base);
    let shape = shape(c);
    c.execute(
        "INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (?1, 0, ?2, ?3, 10, 1)",
        params![t, shape, start - base],
    )
    .unwrap();
}

/// Two kernels of a track in one row, as the writer pairs them (migration 0012): the second
/// starts `later` ns after the first.
fn kernel_pair(c: &Connection, session: i64, proc: i64, start: i64, later: i64) {
    let base = ((start + (1 << 31)) >> 32) << 32;
    let t = track_at(c, session, proc, base);
    let shape = shape(c);
    c.execute(
        "INSERT INTO kernel_data(track, corr, shape, start, dur, gx, corr2, shape2, start2, dur2, gx2)
         VALUES (?1, 0, ?2, ?3, 10, 1, 1, ?2, ?4, 10, 1)",
        params![t, shape, start - base, later],
    )
    .unwrap();
}

/// The one kernel shape of these tests (name 1, 1×1×1 blocks).
fn shape(c: &Connection) -> i64 {
    c.execute("INSERT OR IGNORE INTO kernel_shapes VALUES (1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0)", []).unwrap();
    1
}

/// What the rollup pass would have written for every row so far.
fn roll_up(c: &Connection) {
    c.execute_batch("DELETE FROM session_rows; DELETE FROM rollup_progress;").unwrap();
    for t in RECORD_TABLES {
        c.execute_batch(&format!(
            "INSERT INTO session_rows SELECT session, '{t}', proc, count(*), min(rowid), max(rowid)
               FROM {t} GROUP BY session, proc;
             INSERT INTO rollup_progress SELECT '{t}', coalesce(max(rowid), 0) FROM {t};"
        ))
        .unwrap();
    }
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The writer-side steps of [`delete_session`], in the same order.
fn delete_now(c: &mut Connection, id: i64) -> (Forget, u64, usize) {
    let f = forget_session(c, id).unwrap();
    if f == Forget::Open {
        return (f, 0, 0);
    }
    let mut calls = 0;
    for &(table, key) in SESSION_KEYED {
        loop {
            let n = delete_keyed_chunk(c, table, key, id).unwrap();
            assert!(n <= CHUNK_ROWS);
            calls += 1;
            if n < CHUNK_ROWS {
                break;
            }
        }
    }
    let mut records = 0;
    for (table, lo, hi) in session_ranges(c, id).unwrap() {
        let mut at = lo;
        while at <= hi {
            let (n, next) = delete_session_rows_chunk(c, table, id, at, hi).unwrap();
            assert!(n <= CHUNK_ROWS && next > at);
            records += n;
            calls += 1;
            at = next;
        }
    }
    finish_session(c, id).unwrap();
    (f, records, calls)
}

#[test]
fn deletes_old_finished_sessions_with_everything_they_own() {
    let mut c = db();
    process(&c, 1, 0, None);
    process(&c, 2, 0, None);
    session(&c, 1, "completed", Some(100 * S));
    session(&c, 2, "failed", Some(900 * S));
    session(&c, 3, "active", None);
    session(&c, 4, "interrupted", Some(200 * S));
    // Sessions 1 and 3 run side by side (their rowid ranges overlap), then 2; session 0 in between.
    for i in 0..10_000 {
        kernel(&c, if i % 3 == 0 { 3 } else { 1 }, 1 + i % 2, i);
        if i % 100 == 0 {
            kernel(&c, 0, 1, i);
        }
    }
    for i in 0..3000 {
        kernel(&c, 2, 2, i);
    }
    for s in [1, 2, 3] {
        c.execute("INSERT INTO session_processes(session, proc, joined_ns, state) VALUES (?1, 1, 0, 'stopped')", [s])
            .unwrap();
        c.execute("INSERT INTO busy_rollup VALUES (?1, 0, 1, 2, 3, 4, 5)", [s]).unwrap();
        c.execute("INSERT INTO pc_sample VALUES (?1, 1, 5, 16, 6, 0, 3, 0, 0)", [s]).unwrap();
        c.execute(
            "INSERT INTO pc_sampling(session, proc, device, state, samples) VALUES (?1, 1, 0, 'stopped', 3)",
            [s],
        )
        .unwrap();
    }
    // More rollup rows than one chunk.
    for b in 0..(CHUNK_ROWS as i64 + 100) {
        c.execute("INSERT INTO kernel_rollup VALUES (1, 1, 1, 0, 7, ?1, 1, 10, 10, 10)", [b]).unwrap();
    }
    for s in [2, 3] {
        c.execute("INSERT INTO kernel_rollup VALUES (?1, 1, 2, 0, 7, 5, 1, 10, 10, 10)", [s]).unwrap();
    }
    for s in [1, 2, 3] {
        c.execute("INSERT INTO kernel_name_rollup VALUES (?1, 1, 5, 1, 10, 10, 10)", [s]).unwrap();
    }
    roll_up(&c);

    assert_eq!(finished_before(&c, 500 * S).unwrap(), [1, 4]);
    assert_eq!(oldest_finished(&c).unwrap(), Some(1));
    let s1 = count(&c, "SELECT count(*) FROM kernel WHERE session = 1");
    let (f, records, calls) = delete_now(&mut c, 1);
    assert_eq!(f, Forget::Deleted);
    assert_eq!(records as i64, s1);
    assert!(calls >= 4, "deleted in chunks: {calls} calls");
    for (t, col) in [
        ("kernel", "session"),
        ("sessions", "id"),
        ("session_processes", "session"),
        ("session_rows", "session"),
        ("kernel_rollup", "session"),
        ("kernel_name_rollup", "session"),
        ("busy_rollup", "session"),
        ("tracks", "session"),
        ("pc_sample", "session"),
        ("pc_sampling", "session"),
    ] {
        assert_eq!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 1")), 0, "{t}");
        assert!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 2")) > 0, "{t} of session 2");
        assert!(count(&c, &format!("SELECT count(*) FROM {t} WHERE {col} = 3")) > 0, "{t} of session 3");
    }
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 3"), 3334);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 2"), 3000);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0"), 100);
    // Open sessions are never deleted, whatever asks.
    assert_eq!(delete_now(&mut c, 3).0, Forget::Open);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 3"), 3334);
    // Rows left behind by a deletion cut short are found and finished.
    c.execute("DELETE FROM sessions WHERE id = 2", []).unwrap();
    assert_eq!(orphan_sessions(&c).unwrap(), [2]);
    assert_eq!(delete_now(&mut c, 2), (Forget::Missing, 3000, SESSION_KEYED.len() + 1));
    assert!(orphan_sessions(&c).unwrap().is_empty());
}

#[test]
fn deleting_the_last_rows_brings_the_rollup_position_back() {
    let mut c = db();
    process(&c, 1, 0, None);
    session(&c, 1, "completed", Some(S));
    for i in 0..100 {
        kernel(&c, 0, 1, i);
    }
    for i in 0..100 {
        kernel(&c, 1, 1, i);
    }
    roll_up(&c);
    assert_eq!(count(&c, "SELECT last_rowid FROM rollup_progress WHERE tbl = 'kernel'"), 200);
    delete_now(&mut c, 1);
    // The next row gets rowid 101 again: the rollup must read it.
    assert_eq!(count(&c, "SELECT last_rowid FROM rollup_progress WHERE tbl = 'kernel'"), 100);
    kernel(&c, 0, 1, 5);
    assert_eq!(count(&c, "SELECT max(rowid) FROM kernel"), 101);
}

#[test]
fn session_ids_are_not_reused() {
    let mut c = db();
    session(&c, 1, "completed", Some(S));
    delete_now(&mut c, 1);
    c.execute(
        "INSERT INTO sessions(name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms,
                              max_records) VALUES ('', 'active', '[]', '{}', 0, 0, 0, 0, 0)",
        [],
    )
    .unwrap();
    assert_eq!(c.last_insert_rowid(), 2);
}

#[test]
fn expires_records_outside_sessions_by_age() {
    let mut c = db();
    let now = 10_000 * S;
    let cutoff = now - 100 * S;
    // Process 1 left long ago; process 2 is still connected, with old and new records.
    process(&c, 1, 1000 * S, Some(2000 * S));
    process(&c, 2, 5000 * S, None);
    session(&c, 1, "active", None);
    for i in 0..5000 {
        kernel(&c, 0, 1, i * S / 10);
        // Process 2: ends at 5000 s + i s, so the first 4900 are older than the cutoff.
        kernel(&c, 0, 2, i * S);
        kernel(&c, 1, 2, i * S);
    }
    for p in [1, 2] {
        c.execute("INSERT INTO context VALUES (0, ?1, 1, 0, 7)", [p]).unwrap();
    }
    roll_up(&c);
    let mut work = unsessioned_work(&c, cutoff).unwrap();
    work.sort();
    assert_eq!(work, [("context", 1, None), ("kernel", 1, None), ("kernel", 2, Some(cutoff - 5000 * S))]);
    let mut deleted = 0;
    for (t, p, before) in work {
        loop {
            let (n, done) = expire_unsessioned_chunk(&mut c, t, p, before).unwrap();
            assert!(n <= CHUNK_ROWS);
            deleted += n;
            if done {
                break;
            }
        }
    }
    assert_eq!(deleted, 1 + 5000 + 4900);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0 AND proc = 1"), 0);
    assert_eq!(count(&c, "SELECT count(*) FROM context WHERE proc = 1"), 0);
    assert_eq!(count(&c, "SELECT count(*) FROM context WHERE proc = 2"), 1, "the live process's context stays");
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 0 AND proc = 2"), 100);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel WHERE session = 1"), 5000, "session rows untouched");
    assert_eq!(count(&c, "SELECT count(*) FROM session_rows WHERE session = 0 AND proc = 1"), 0);
    let (n, first): (i64, i64) = c
        .query_row(
            "SELECT n, first_rowid FROM session_rows WHERE session = 0 AND tbl = 'kernel' AND proc = 2",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(n, 100);
    assert_eq!(first, count(&c, "SELECT min(rowid) FROM kernel WHERE session = 0 AND proc = 2"));
    // Nothing more to do until time passes.
    assert!(unsessioned_work(&c, cutoff).unwrap().iter().all(|w| w.0 == "context" || w.1 != 2));
}

#[test]
fn expires_paired_records_by_the_later_of_the_two() {
    let mut c = db();
    let now = 10_000 * S;
    let cutoff = now - 100 * S;
    process(&c, 2, 5000 * S, None);
    // Rows of two kernels 1 s apart, every 2 s: all 4900 before the cutoff (at 4900 s after
    // the process's base) go; the row whose second kernel ends after it stays whole.
    for i in 0..2450 {
        kernel_pair(&c, 0, 2, 2 * i * S, S);
    }
    kernel_pair(&c, 0, 2, 4899 * S + S / 2, S);
    for i in 2451..2500 {
        kernel_pair(&c, 0, 2, 2 * i * S, S);
    }
    roll_up(&c);
    assert_eq!(count(&c, "SELECT n FROM session_rows WHERE session = 0 AND tbl = 'kernel' AND proc = 2"), 5000);
    let work = unsessioned_work(&c, cutoff).unwrap();
    assert_eq!(work, [("kernel", 2, Some(cutoff - 5000 * S))]);
    let mut deleted = 0;
    loop {
        let (n, done) = expire_unsessioned_chunk(&mut c, "kernel", 2, Some(cutoff - 5000 * S)).unwrap();
        assert!(n <= 2 * CHUNK_ROWS);
        deleted += n;
        if done {
            break;
        }
    }
    assert_eq!(deleted, 4900, "records, two per row");
    assert_eq!(count(&c, "SELECT count(*) FROM kernel_data"), 50);
    assert_eq!(count(&c, "SELECT count(*) FROM kernel"), 100);
    assert_eq!(count(&c, "SELECT min(start) FROM kernel"), 4899 * S + S / 2);
    assert_eq!(count(&c, "SELECT n FROM session_rows WHERE session = 0 AND tbl = 'kernel' AND proc = 2"), 100);
}

#[test]
fn expires_processes_nothing_refers_to() {
    let mut c = db();
    let old = Some(10 * S);
    process(&c, 1, 0, old); // nothing refers to it
    process(&c, 2, 0, old); // member of a session
    process(&c, 3, 0, old); // has records outside sessions
    process(&c, 4, 0, None); // connected
    process(&c, 5, 0, Some(1000 * S)); // left recently
    process(&c, 6, 0, old); // PC samples outside sessions
    process(&c, 7, 0, old); // the newest: kept so that its id is not handed out again
    c.execute_batch(
        "INSERT INTO devices VALUES (1, 'GPU-1', 'H100', 9, 0, 132, 80, '0000:01:00.0', 0);
         INSERT INTO process_devices VALUES (1, 0, 1);
         INSERT INTO drops VALUES (1, 'kernel', 5);
         INSERT INTO session_processes(session, proc, joined_ns, state) VALUES (9, 2, 0, 'stopped');
         INSERT INTO session_rows VALUES (0, 'kernel', 3, 1, 1, 1);
         INSERT INTO pc_sample VALUES (0, 6, 1, 1, 1, 0, 1, 0, 0);",
    )
    .unwrap();
    assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 1);
    // Cubins: kept while a PC sample refers to them or while they are recent.
    c.execute_batch(
        "INSERT INTO strings(id, value) VALUES (9001, '00000000000000aa');
         INSERT INTO pc_sample VALUES (0, 7, 1, 2, 1, 9001, 1, 0, 0);
         INSERT INTO cubins VALUES ('00000000000000aa', 1, x'00', 0, 7);
         INSERT INTO cubins VALUES ('00000000000000bb', 1, x'00', 0, 7);",
    )
    .unwrap();
    c.execute("INSERT INTO cubins VALUES ('00000000000000cc', 1, x'00', ?1, 7)", [1000 * S]).unwrap();
    assert_eq!(super::delete::expire_cubins(&mut c, 100 * S).unwrap(), 1);
    assert_eq!(count(&c, "SELECT count(*) FROM cubins WHERE hash != '00000000000000bb'"), 2);
    let left: Vec<i64> = c
        .prepare("SELECT id FROM processes ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(left, [2, 3, 4, 5, 6, 7]);
    assert_eq!(count(&c, "SELECT count(*) FROM process_devices"), 0);
    assert_eq!(count(&c, "SELECT count(*) FROM drops"), 0);
    assert_eq!(count(&c, "SELECT count(*) FROM devices"), 1, "devices stay");
    // Processes from before schema version 3 are never deleted.
    c.execute("UPDATE meta SET value = '3' WHERE key = 'retention_process_floor'", []).unwrap();
    c.execute("DELETE FROM session_processes", []).unwrap();
    assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 0);
    c.execute("UPDATE meta SET value = '0' WHERE key = 'retention_process_floor'", []).unwrap();
    assert_eq!(expire_processes(&mut c, 100 * S, 500).unwrap(), 1);
}

/// A new database file in `dir` with `n` kernel rows, all checkpointed into the main file.
fn database_with_kernels(dir: &std::path::Path, n: u32) -> (std::path::PathBuf, Connection) {
    let path = dir.join("t.db");
    let cfg = crate::config::Config::from_toml("").unwrap().storage;
    let c = crate::store::open_writer(&path, &cfg).unwrap();
    process(&c, 1, 0, None);
    let t = track(&c, 0, 1);
    let shape = shape(&c);
    c.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO kernel_data(track, corr, shape, start, dur, gx) SELECT ?2, i, ?3, i * 1000, 5000, 1 FROM n",
        [n, t as u32, shape as u32],
    )
    .unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    (path, c)
}

#[test]
fn incremental_vacuum_shrinks_a_new_database() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut c) = database_with_kernels(dir.path(), 300_000);
    let full = std::fs::metadata(&path).unwrap().len();
    c.execute("DELETE FROM kernel_data", []).unwrap();
    let p = Pages::read(&c).unwrap();
    assert_eq!(p.auto_vacuum, 2);
    assert!(p.free * p.page_size > full / 2, "{p:?}");
    let mut steps = 0;
    loop {
        let t = Instant::now();
        let (after, freed) = vacuum_step(&mut c).unwrap();
        eprintln!("incremental vacuum: {freed} pages in {:?}", t.elapsed());
        if steps == 0 {
            assert_eq!(freed, p.free.min(VACUUM_PAGES), "{after:?}");
        }
        steps += 1;
        if after.free == 0 || freed == 0 {
            break;
        }
    }
    assert_eq!(steps, p.free.div_ceil(VACUUM_PAGES));
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
    let small = std::fs::metadata(&path).unwrap().len();
    assert!(small < full / 4, "{full} -> {small}");
}

/// A reader on an older snapshot holds the shrink back; once it is gone, one settle
/// brings the main file down to the database's pages and empties the WAL.
#[test]
fn settle_files_shrinks_the_files_once_readers_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let (path, mut c) = database_with_kernels(dir.path(), 100_000);
    let wal_pages = u64::from(crate::config::Config::from_toml("").unwrap().storage.wal_autocheckpoint_pages);
    assert!(settle_files(&mut c, &path, wal_pages).unwrap(), "nothing to settle yet");
    let full = std::fs::metadata(&path).unwrap().len();
    // A reader in the middle of a read transaction, on the snapshot before the delete.
    let r = crate::store::open_reader(&path).unwrap();
    r.execute_batch("BEGIN").unwrap();
    let _: i64 = r.query_row("SELECT count(*) FROM kernel", [], |x| x.get(0)).unwrap();
    c.execute("DELETE FROM kernel_data", []).unwrap();
    while vacuum_step(&mut c).unwrap().1 > 0 {}
    let pages = Pages::read(&c).unwrap();
    assert!(pages.count * pages.page_size < full / 2, "{pages:?}, file {full}");
    assert!(!settle_files(&mut c, &path, wal_pages).unwrap(), "the reader holds the old pages");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), full);
    r.execute_batch("COMMIT").unwrap();
    drop(r);
    assert!(settle_files(&mut c, &path, wal_pages).unwrap());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), pages.count * pages.page_size);
    assert_eq!(crate::store::wal_bytes(&path), 0);
}

#[test]
fn the_size_limit_leaves_room_for_what_comes_before_the_next_pass() {
    use super::pass::SizeWatch;
    let mut w = SizeWatch::default();
    // Nothing seen yet: 1 % of the limit.
    assert_eq!(w.target(1000), 990);
    // The first pass only notes the size; the growth is what came between two passes.
    w.grew(500);
    assert_eq!(w.target(1000), 990);
    w.after_pass = Some(500);
    w.grew(620);
    assert_eq!(w.target(1000), 880);
    // The largest of the last four growths counts, and never more than half the limit.
    w.after_pass = Some(600);
    w.grew(610);
    assert_eq!(w.target(1000), 880);
    w.after_pass = Some(0);
    w.grew(900);
    assert_eq!(w.target(1000), 500);
    for _ in 0..4 {
        w.after_pass = Some(100);
        w.grew(150);
    }
    assert_eq!(w.target(1000), 950);
}

#[test]
fn always_on_rollups_go_after_their_keep_and_hold_their_processes_until_then() {
    use super::delete::{ROLLUP_MINUTES, expire_pc_rollups};
    let mut c = Connection::open_in_memory().unwrap();
    crate::store::migrate(&c).unwrap();
    for id in [1i64, 2, 3] {
        c.execute(
            "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
                                   connected_ns, disconnected_ns) VALUES (?1, 10, 0, 0, 'injector', 'x', '[]', '', 0, 0, 0, 1)",
            [id],
        )
        .unwrap();
    }
    // Process 1: 200 old minutes; process 2: one recent minute.
    for m in 0..200i64 {
        c.execute("INSERT INTO pc_rollup VALUES (?1, 1, 7, 0, 0, 8, 5)", [m * 60]).unwrap();
    }
    c.execute("INSERT INTO pc_rollup VALUES (?1, 2, 7, 0, 0, 8, 5)", [10_000 * 60]).unwrap();
    assert_eq!(expire_processes(&mut c, 2, 100).unwrap(), 0, "both have rollups (3 is the newest)");
    let cutoff = 5_000 * 60;
    let mut calls = 0;
    loop {
        let n = expire_pc_rollups(&mut c, cutoff).unwrap();
        assert!(n <= ROLLUP_MINUTES as u64);
        calls += 1;
        if n == 0 {
            break;
        }
    }
    assert_eq!(calls, 5, "200 minutes, 60 a call, and the empty one");
    let left: Vec<i64> = c
        .prepare("SELECT proc FROM pc_rollup")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(left, [2]);
    assert_eq!(expire_processes(&mut c, 2, 100).unwrap(), 1, "process 1 goes with its last rollup");
}
