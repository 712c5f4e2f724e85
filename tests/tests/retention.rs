//! Retention of sessions and their records, end to end: a real gpuprofd with small limits in
//! its config, traced fake agents, the gRPC API, and the database read directly.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::RECORD_TABLES;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};
use gpuprofctl::pb;
use rusqlite::{Connection, OpenFlags};
use tonic::transport::Channel;

type Client = GpuprofClient<Channel>;

/// Every table with a `session` column besides the record tables.
const SESSION_TABLES: &[&str] = &[
    "session_processes",
    "session_rows",
    "kernel_rollup",
    "kernel_name_rollup",
    "memcpy_rollup",
    "api_rollup",
    "busy_rollup",
    "pc_sample",
    "pc_sampling",
];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn daemon(dir: &Path, config: &str) -> TestDaemon {
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(&cfg, config).unwrap();
    TestDaemon::start_with(&dir.join("state"), &["--config", cfg.to_str().unwrap()]).unwrap()
}

/// A traced agent whose executable is `/usr/bin/NAME` (sessions target it by that name).
fn agent(d: &TestDaemon, name: &str, rate: f64, per_session: u64, seed: u64) -> TracedAgent {
    let cfg = TracedConfig {
        exe: format!("/usr/bin/{name}"),
        cmdline: vec![name.to_string()],
        rate,
        per_session,
        seed,
        ..Default::default()
    };
    TracedAgent::start(&d.agent_socket, cfg).unwrap()
}

async fn start(c: &mut Client, exe: &str) -> u64 {
    let req = pb::StartSessionRequest {
        name: exe.into(),
        targets: vec![pb::Target { target: Some(pb::target::Target::ExeName(exe.into())) }],
        ..Default::default()
    };
    c.start_session(req).await.unwrap().into_inner().id
}

/// Starts a session over `a`, waits until it has sent `n` records, stops it.
async fn finished_session(c: &mut Client, a: &TracedAgent, exe: &str, n: u64) -> u64 {
    let id = start(c, exe).await;
    let t = Instant::now();
    while a.sent_for(id) < n {
        assert!(t.elapsed() < Duration::from_secs(60), "agent sent {} of {n} records", a.sent_for(id));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let s = c.stop_session(pb::StopSessionRequest { session_id: id }).await.unwrap().into_inner();
    assert_eq!(pb::SessionState::try_from(s.state).unwrap(), pb::SessionState::Completed, "{s:?}");
    id
}

async fn exists(c: &mut Client, id: u64) -> bool {
    match c.get_session(pb::GetSessionRequest { session_id: id }).await {
        Ok(_) => true,
        Err(e) if e.code() == tonic::Code::NotFound => false,
        Err(e) => panic!("GetSession {id}: {e}"),
    }
}

fn reader(d: &TestDaemon) -> Connection {
    Connection::open_with_flags(d.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

/// Rows of `session` in the record tables.
fn records(c: &Connection, session: u64) -> u64 {
    RECORD_TABLES
        .iter()
        .map(|t| {
            c.query_row(&format!("SELECT count(*) FROM {t} WHERE session = ?1"), [session as i64], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap() as u64
        })
        .sum()
}

/// Tables other than the record tables that still hold rows of `session`.
fn leftovers(c: &Connection, session: u64) -> Vec<&'static str> {
    let mut out = Vec::new();
    for t in SESSION_TABLES {
        let n: i64 = c
            .query_row(&format!("SELECT count(*) FROM {t} WHERE session = ?1"), [session as i64], |r| r.get(0))
            .unwrap();
        if n > 0 {
            out.push(*t);
        }
    }
    let n: i64 = c.query_row("SELECT count(*) FROM sessions WHERE id = ?1", [session as i64], |r| r.get(0)).unwrap();
    if n > 0 {
        out.push("sessions");
    }
    out
}

/// Waits until `n` records of `session` are committed.
fn wait_records(d: &TestDaemon, session: u64, n: u64) {
    let t = Instant::now();
    loop {
        let have = records(&reader(d), session);
        if have == n {
            return;
        }
        assert!(have < n && t.elapsed() < Duration::from_secs(30), "session {session}: {have} of {n} records");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status(s: &pb::GetStatusResponse) -> (u64, u64, u64) {
    let ingested = s.records.iter().map(|r| r.ingested).sum();
    (ingested, s.expired_sessions, s.expired_records)
}

/// A session that ended more than `sessions_max_age` ago is deleted with every row it owns;
/// a newer finished session and an active one (older than the max age itself) are untouched.
#[test]
fn sessions_older_than_the_max_age_are_deleted_with_all_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), "[retention]\ninterval = \"200ms\"\nsessions_max_age = \"8s\"\ndatabase_max_size = 0\n");
    let active_agent = agent(&d, "gamma", 2_000.0, 0, 1);
    let old_agent = agent(&d, "alpha", 50_000.0, 20_000, 2);
    let new_agent = agent(&d, "beta", 50_000.0, 20_000, 3);
    rt().block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let active = start(&mut c, "gamma").await;
        let old = finished_session(&mut c, &old_agent, "alpha", 20_000).await;
        tokio::time::sleep(Duration::from_millis(5_000)).await;
        let new = finished_session(&mut c, &new_agent, "beta", 20_000).await;
        let new_done = Instant::now();
        wait_records(&d, old, 20_000);
        wait_records(&d, new, 20_000);

        let t = Instant::now();
        while exists(&mut c, old).await {
            assert!(t.elapsed() < Duration::from_secs(30), "session {old} not deleted:\n{}", d.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The newer session ended less than 8 s ago: still there, whole.
        assert!(new_done.elapsed() < Duration::from_secs(6), "too slow to tell: {:?}", new_done.elapsed());
        assert!(exists(&mut c, new).await);
        let s = c.get_session(pb::GetSessionRequest { session_id: new }).await.unwrap().into_inner();
        assert_eq!(s.records, 20_000, "{s:?}");
        let s = c.get_session(pb::GetSessionRequest { session_id: active }).await.unwrap().into_inner();
        assert_eq!(pb::SessionState::try_from(s.state).unwrap(), pb::SessionState::Active);

        // The deletion finishes in chunks after the session disappears from the API.
        let t = Instant::now();
        loop {
            let db = reader(&d);
            let (n, left) = (records(&db, old), leftovers(&db, old));
            if n == 0 && left.is_empty() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "{n} records and rows in {left:?} left");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let db = reader(&d);
        assert_eq!(records(&db, new), 20_000);
        assert!(leftovers(&db, new).contains(&"session_rows"));
        assert!(leftovers(&db, new).contains(&"session_processes"));
        assert!(leftovers(&db, new).contains(&"kernel_rollup"));
        assert!(records(&db, active) > 0);
        let st = c.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
        let (_, sessions, expired) = status(&st);
        assert_eq!((sessions, expired), (1, 20_000), "{st:?}");
        let out = d.ctl(&["status"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("expired            1 sessions, 20000 records"), "{text}");
        assert!(d.log_text().contains("expired session deleted"), "{}", d.log_text());

        // Once it has ended too, the active session goes the same way.
        c.stop_session(pb::StopSessionRequest { session_id: active }).await.unwrap();
        let t = Instant::now();
        while exists(&mut c, active).await || exists(&mut c, new).await {
            assert!(t.elapsed() < Duration::from_secs(30), "sessions {new} and {active} not deleted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    for a in [active_agent, old_agent, new_agent] {
        a.finish().unwrap();
    }
    assert_eq!(d.terminate().unwrap(), 0);
}

/// Past `database_max_size` the oldest finished sessions are deleted first, until the pages
/// in use fit; the newest stays.
#[test]
fn size_limit_deletes_the_oldest_finished_sessions_first() {
    let dir = tempfile::tempdir().unwrap();
    let limit: u64 = 4 << 20;
    let d = daemon(
        dir.path(),
        "[storage]\nwal_autocheckpoint_pages = 64\n\
         [retention]\ninterval = \"200ms\"\nsessions_max_age = \"0\"\ndatabase_max_size = \"4MiB\"\n",
    );
    let a = agent(&d, "alpha", 200_000.0, 30_000, 7);
    let mut ids = Vec::new();
    rt().block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        for _ in 0..6 {
            ids.push(finished_session(&mut c, &a, "alpha", 30_000).await);
        }
        // Wait until retention has brought the pages in use under the limit and stopped.
        let t = Instant::now();
        let mut last: (Vec<u64>, Instant) = (Vec::new(), Instant::now());
        let (used, kept) = loop {
            let db = reader(&d);
            let q = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64;
            let used = (q("PRAGMA page_count") - q("PRAGMA freelist_count")) * q("PRAGMA page_size");
            let mut kept = Vec::new();
            for id in &ids {
                if exists(&mut c, *id).await {
                    kept.push(*id);
                }
            }
            if kept != last.0 {
                last = (kept.clone(), Instant::now());
            }
            // A new database hands freed pages back: the files shrink too, not just the
            // pages in use (once no reader holds an older snapshot).
            let files = c.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner().database_bytes;
            let settled = kept.len() < ids.len() && used <= limit && files <= limit && leftovers_gone(&db, &ids, &kept);
            if settled && last.1.elapsed() > Duration::from_secs(1) {
                break (used, kept);
            }
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "used {used} bytes, sessions {kept:?} kept:\n{}",
                d.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        eprintln!("size limit {limit} bytes: {used} bytes in use, sessions kept {kept:?} of {ids:?}");
        // The deleted ones are the oldest: what is kept is the newest sessions, in order.
        assert_eq!(kept, ids[ids.len() - kept.len()..], "kept {kept:?} of {ids:?}");
        assert!(kept.contains(ids.last().unwrap()));
        let db = reader(&d);
        for id in &kept {
            assert_eq!(records(&db, *id), 30_000, "session {id}");
        }
        let st = c.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
        let (_, sessions, expired) = status(&st);
        eprintln!("database files (main + WAL): {} bytes", st.database_bytes);
        assert!(st.database_bytes <= limit, "{st:?}");
        assert_eq!(sessions as usize, ids.len() - kept.len(), "{st:?}");
        assert_eq!(expired, sessions * 30_000, "{st:?}");
        let log = d.log_text();
        assert!(log.contains("database over its size limit"), "{log}");
        for l in log.lines().filter(|l| l.contains("size limit") || l.contains("expired session")) {
            eprintln!("{l}");
        }
    });
    a.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}

/// Deleted sessions have no rows left anywhere.
fn leftovers_gone(db: &Connection, ids: &[u64], kept: &[u64]) -> bool {
    ids.iter().filter(|id| !kept.contains(id)).all(|id| records(db, *id) == 0 && leftovers(db, *id).is_empty())
}

/// A large session is deleted in small writer calls while another session's agent keeps
/// sending: its records keep being committed throughout, and none are lost.
#[test]
fn ingest_keeps_flowing_while_a_large_session_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let d = daemon(dir.path(), "[retention]\ninterval = \"200ms\"\nsessions_max_age = \"3s\"\ndatabase_max_size = 0\n");
    let big_n = 300_000u64;
    let bulk = agent(&d, "bulk", 400_000.0, big_n, 11);
    let steady = agent(&d, "steady", 5_000.0, 0, 12);
    rt().block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let big = finished_session(&mut c, &bulk, "bulk", big_n).await;
        let live = start(&mut c, "steady").await;
        // (elapsed, ingested, expired records), every 20 ms until the big session is gone.
        let t0 = Instant::now();
        let mut samples: Vec<(Duration, u64, u64)> = Vec::new();
        loop {
            let st = c.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
            let (ingested, _, expired) = status(&st);
            samples.push((t0.elapsed(), ingested, expired));
            if expired >= big_n {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(90), "deleted {expired} of {big_n}:\n{}", d.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Keep sending a little after the deletion, then stop: nothing of the live session is lost.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let s = c.stop_session(pb::StopSessionRequest { session_id: live }).await.unwrap().into_inner();
        let sent = steady.sent_for(live);
        assert!(sent > 0);
        let db = reader(&d);
        assert_eq!(records(&db, live), sent, "{s:?}");
        assert_eq!(records(&db, big), 0);
        assert!(!exists(&mut c, big).await);

        // The deletion window: from the first sample with records deleted to the last sample.
        let first = samples.iter().position(|s| s.2 > 0).unwrap();
        let window = &samples[first.saturating_sub(1)..];
        let took = window.last().unwrap().0 - window[0].0;
        let partial: std::collections::BTreeSet<u64> =
            window.iter().map(|s| s.2).filter(|e| *e > 0 && *e < big_n).collect();
        // Longest time the committed-record count stood still during the deletion.
        let mut stall = Duration::ZERO;
        let mut since = window[0].0;
        for w in window.windows(2) {
            if w[1].1 > w[0].1 {
                since = w[1].0;
            }
            stall = stall.max(w[1].0 - since);
        }
        eprintln!(
            "deleted {big_n} records in {took:?} ({:.0} records/s) seen at {} intermediate counts; \
             longest ingest standstill meanwhile {stall:?} (agent at 5000 records/s)",
            big_n as f64 / took.as_secs_f64().max(1e-3),
            partial.len()
        );
        assert!(partial.len() >= 3, "deleted in chunks, seen in status as it goes: {partial:?}");
        // Not blocked for the deletion: the longest standstill is a small part of it (a loaded
        // machine stretches both alike), or under half a second.
        assert!(
            stall < (took / 3).max(Duration::from_millis(500)),
            "ingest stood still for {stall:?} during a deletion of {took:?}"
        );
    });
    bulk.finish().unwrap();
    steady.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}
