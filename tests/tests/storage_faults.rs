//! Storage faults: the database locked by another process, a corrupt database file at start,
//! and a full disk. Each shows as a clear error in the log and in `gpuprofctl status`, the
//! records it costs are counted as dropped, and ingestion recovers by itself once the fault
//! clears, with the names of kernels defined during the fault intact.
//!
//! The full-disk test mounts a small tmpfs, which needs root and a working `mount`; without
//! them it says why and returns (run it as root: `sudo -E cargo test -p gpuprof-testkit --test
//! storage_faults full_disk`).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::mix_tables;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuprof_testkit::{FakeAgent, Mix, Sent, TestDaemon};
use rusqlite::Connection;

fn totals(st: &serde_json::Value) -> (u64, u64) {
    let recs = st["records"].as_object().unwrap();
    let sum = |key: &str| recs.values().map(|v| v[key].as_u64().unwrap()).sum::<u64>();
    (sum("ingested"), sum("dropped"))
}

fn add(total: &mut Sent, s: Sent) -> u64 {
    let mut n = 0;
    for (k, v) in s {
        *total.entry(k).or_default() += v;
        n += v;
    }
    n
}

/// Rows of process `proc` in the tables of `sent`.
fn db_rows(db: &Connection, proc: u64, sent: &Sent) -> u64 {
    sent.keys()
        .map(|t| {
            db.query_row(&format!("SELECT count(*) FROM {t} WHERE proc = ?1"), [proc as i64], |r| r.get::<_, i64>(0))
                .unwrap() as u64
        })
        .sum()
}

/// Kernels defined while storage failed, then used after it recovered, keep their names.
fn check_names(db: &Connection, proc: u64, names: &[&str]) {
    let dangling: i64 = db
        .query_row("SELECT count(*) FROM kernel k LEFT JOIN strings s ON s.id = k.name WHERE s.id IS NULL", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(dangling, 0, "every kernel name resolves to a string");
    let named: i64 = db
        .query_row(
            &format!(
                "SELECT count(*) FROM kernel k JOIN strings s ON s.id = k.name WHERE k.proc = ?1 AND s.value IN ({})",
                names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(",")
            ),
            [proc as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert!(named > 0, "kernels after recovery carry the names defined during the fault");
}

/// Runs a fault: `phase1` records stored, then `fault()` starts it, records (and new kernel
/// names) sent until status shows drops and an error matching `expect`, then `clear()` ends
/// it and records sent after that are all stored.
fn fault_cycle(d: &TestDaemon, expect: &str, fault: impl FnOnce(), clear: impl FnOnce()) {
    let mut a = FakeAgent::connect(&d.agent_socket, 9, Mix::default()).unwrap();
    let mut sent = Sent::new();
    let n1 = add(&mut sent, a.send_records(5_000, 500, 0.0, 0).unwrap());
    d.wait_status("first records stored", |st| totals(st).0 == n1);
    fault();
    let names = ["fault_kernel_a", "fault_kernel_b"];
    let ids = a.define_strings(&names).unwrap();
    let mut during = 0;
    let t = Instant::now();
    let st = loop {
        during += add(&mut sent, a.send_records(1_000, 500, 0.0, 0).unwrap());
        let st = d.status().unwrap();
        if totals(&st).1 > 0 && st["storage_error"].as_str().unwrap().contains(expect) {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no drop or no {expect:?} error shown: {st}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = d.ctl(&["status"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("STORAGE ERROR"), "gpuprofctl status shows it");
    assert!(d.log_text().contains("storage error"), "the log says so");
    clear();
    // Recovered: kernels named during the fault arrive with their names.
    a.generator.kernel_name_ids = ids;
    let n3 = add(&mut sent, a.send_records(5_000, 500, 0.0, 0).unwrap());
    let proc = a.process_id;
    a.goodbye().unwrap();
    let total = n1 + during + n3;
    let st2 = d.wait_status("every record stored or counted dropped", |st| {
        let (i, dr) = totals(st);
        i + dr == total
    });
    let (ingested, dropped) = totals(&st2);
    println!("{expect}: {total} sent, {dropped} dropped, {ingested} stored; error shown: {}", st["storage_error"]);
    assert!(dropped > 0 && dropped <= during, "only records sent during the fault are lost: {st2}");
    let db = Connection::open(d.db_path()).unwrap();
    assert_eq!(db_rows(&db, proc, &sent), ingested, "stored rows match the ingested count");
    check_names(&db, proc, &names);
}

#[test]
fn locked_database_drops_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let locker = Connection::open(d.db_path()).unwrap();
    locker.busy_timeout(Duration::from_secs(30)).unwrap();
    fault_cycle(
        &d,
        "locked",
        || locker.execute_batch("BEGIN EXCLUSIVE").unwrap(),
        || locker.execute_batch("COMMIT").unwrap(),
    );
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn corrupt_database_is_moved_aside_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let garbage: Vec<u8> = b"this was never a SQLite database\n".repeat(200);
    std::fs::write(dir.path().join("gpuprof.db"), &garbage).unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let aside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("gpuprof.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "one file moved aside: {aside:?}");
    assert_eq!(std::fs::read(&aside[0]).unwrap(), garbage, "kept byte for byte");
    let st = d.status().unwrap();
    let err = st["storage_error"].as_str().unwrap();
    assert!(err.contains("moved aside") && err.contains("corrupt-"), "status says where it went: {st}");
    assert!(d.log_text().contains("moved aside"), "the log says so");
    // The new database works.
    let mut a = FakeAgent::connect(&d.agent_socket, 3, Mix::default()).unwrap();
    let n: u64 = a.send_records(2_000, 500, 0.0, 0).unwrap().values().sum();
    a.goodbye().unwrap();
    d.wait_status("records in the new database", |st| totals(st).0 == n);
    assert_eq!(d.terminate().unwrap(), 0);
    // A second start finds a healthy database and moves nothing.
    let d = TestDaemon::start(dir.path()).unwrap();
    assert_eq!(d.status().unwrap()["storage_error"].as_str(), Some(""));
    assert_eq!(d.terminate().unwrap(), 0);
}

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd).args(args).status().is_ok_and(|s| s.success())
}

/// Unmounts the tmpfs even when the test fails.
struct Mount<'a>(&'a Path);

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        let _ = run("umount", &["-l", self.0.to_str().unwrap()]);
    }
}

#[test]
fn full_disk_drops_then_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    if !run("mount", &["-t", "tmpfs", "-o", "size=24m", "tmpfs", state.to_str().unwrap()]) {
        eprintln!("skipped: mounting a tmpfs failed (needs root and mount); run this test as root");
        return;
    }
    let _m = Mount(&state);
    let d = TestDaemon::start_logged(&state, &[], &[], &dir.path().join("gpuprofd.log")).unwrap();
    let filler = state.join("filler");
    fault_cycle(
        &d,
        "full",
        || {
            // Take all the free space but the daemon's own.
            let mut f = std::fs::File::create(&filler).unwrap();
            let chunk = vec![0x5au8; 64 << 10];
            while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
            let _ = f.sync_all();
        },
        || std::fs::remove_file(&filler).unwrap(),
    );
    assert_eq!(d.terminate().unwrap(), 0);
}

/// A read-only state directory (a read-only bind mount; root ignores file modes) is refused at
/// start with a message naming the problem, the database in it untouched; once writable
/// again, the daemon starts on it with every record kept. (A directory that turns read-only
/// under a running daemon cannot be made here: the kernel refuses to remount a mount
/// read-only while files on it are open for writing.)
#[test]
fn read_only_state_dir_is_refused_clearly_then_used_when_writable() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let s = state.to_str().unwrap();
    if !run("mount", &["--bind", s, s]) {
        eprintln!("skipped: a bind mount failed (needs root and mount); run this test as root");
        return;
    }
    let _m = Mount(&state);
    let log = dir.path().join("gpuprofd.log");
    let d = TestDaemon::start_logged(&state, &[], &[], &log).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 4, Mix::default()).unwrap();
    let n: u64 = a.send_records(3_000, 500, 0.0, 0).unwrap().values().sum();
    a.goodbye().unwrap();
    d.wait_status("records stored", |st| totals(st).0 == n);
    assert_eq!(d.terminate().unwrap(), 0);
    let before = std::fs::read(state.join("gpuprof.db")).unwrap();

    assert!(run("mount", &["-o", "remount,ro,bind", s]), "remounting read-only");
    let e = TestDaemon::start_logged(&state, &[], &[], &log).err().expect("a read-only state dir is refused");
    let msg = format!("{e:#}");
    println!("read-only state dir: {}", msg.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or(""));
    assert!(msg.contains("is not writable") && msg.to_lowercase().contains("read-only"), "the reason is named: {msg}");
    assert_eq!(std::fs::read(state.join("gpuprof.db")).unwrap(), before, "database untouched");

    assert!(run("mount", &["-o", "remount,rw,bind", s]), "remounting read-write");
    let d = TestDaemon::start_logged(&state, &[], &[], &log).unwrap();
    let db = Connection::open(d.db_path()).unwrap();
    let kept: i64 = mix_tables()
        .iter()
        .map(|t| db.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get::<_, i64>(0)).unwrap())
        .sum();
    assert!(kept > 0 && kept as u64 <= n, "records kept: {kept} of {n}");
    assert_eq!(d.terminate().unwrap(), 0);
}
