//! A crash loop: gpuprofd is killed with SIGKILL at a random moment of an active session's
//! ingest, then restarted on the same state directory, again and again. After every restart
//! the database passes `PRAGMA integrity_check`, every earlier session still has every row a
//! reader saw committed before the kill (and exactly the rows it had after the previous
//! restart), and every session that was active at the kill is `interrupted`.
//!
//! 20 rounds by default; set `GPUPROF_CRASH_LOOPS=100` (any number) for a long run:
//! `GPUPROF_CRASH_LOOPS=100 cargo test -p gpuprof-testkit --test crash_loop -- --nocapture`.
//! `GPUPROF_CRASH_SEED` picks other kill moments (the seed used is printed).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::mix_tables;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};
use rusqlite::{Connection, OpenFlags};

/// The highest rowid of each record table: rows after it are newer.
fn max_rowids(db: &Connection) -> Vec<i64> {
    mix_tables()
        .iter()
        .map(|t| db.query_row(&format!("SELECT coalesce(max(rowid), 0) FROM {t}"), [], |r| r.get(0)).unwrap())
        .collect()
}

/// Committed rows of `session` after rowids `after` (one per table), over all record tables.
fn session_rows(db: &Connection, session: u64, after: &[i64]) -> u64 {
    mix_tables()
        .iter()
        .zip(after)
        .map(|(t, a)| {
            db.query_row(
                &format!("SELECT count(*) FROM {t} WHERE rowid > ?1 AND session = ?2"),
                [*a, session as i64],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .sum()
}

/// Committed rows per session, over all record tables (one scan of each).
fn rows_by_session(db: &Connection) -> BTreeMap<u64, u64> {
    let mut out = BTreeMap::new();
    for t in mix_tables() {
        let mut st = db.prepare(&format!("SELECT session, count(*) FROM {t} GROUP BY session")).unwrap();
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))).unwrap();
        for r in rows {
            let (s, n) = r.unwrap();
            *out.entry(s).or_default() += n;
        }
    }
    out
}

fn read_only(path: &Path) -> Connection {
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

/// xorshift64*: kill moments that differ from round to round but repeat for a seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed >> 12;
    *seed ^= *seed << 25;
    *seed ^= *seed >> 27;
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn start_session(d: &TestDaemon) -> u64 {
    let out = d.ctl(&["--json", "session", "start", "--exe", "python3"]);
    assert!(out.status.success(), "session start: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["id"].as_u64().unwrap()
}

fn session_state(d: &TestDaemon, id: u64) -> String {
    let out = d.ctl(&["--json", "session", "show", &id.to_string()]);
    assert!(out.status.success(), "session show {id}: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = if v["session"].is_object() { &v["session"] } else { &v };
    s["state"].as_str().unwrap_or_else(|| panic!("state in {v}")).to_string()
}

/// Checks the database and the sessions after a restart. `seen` holds, per earlier session,
/// the rows a reader saw committed before the kill; `kept` the rows found after the previous
/// restart (which must not change any more).
fn check_after_restart(d: &TestDaemon, seen: &BTreeMap<u64, u64>, kept: &mut BTreeMap<u64, u64>, round: u64) {
    let db = read_only(&d.db_path());
    let ok: String = db.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(ok, "ok", "round {round}: integrity check");
    let rows = rows_by_session(&db);
    for (&id, &before) in seen {
        let now = rows.get(&id).copied().unwrap_or(0);
        assert!(now >= before, "round {round}: session {id} had {before} committed rows, now {now}");
        if let Some(&k) = kept.get(&id) {
            assert_eq!(now, k, "round {round}: session {id} changed after its restart");
        }
        kept.insert(id, now);
        assert_eq!(session_state(d, id), "interrupted", "round {round}: session {id} was active at the kill");
    }
}

#[test]
fn repeated_sigkill_during_sessions_keeps_the_database_and_marks_sessions_interrupted() {
    let rounds: u64 = std::env::var("GPUPROF_CRASH_LOOPS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let mut seed: u64 = std::env::var("GPUPROF_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0x5eed_c0de);
    println!("{rounds} rounds, seed {seed}");
    let dir = tempfile::tempdir().unwrap();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut kept: BTreeMap<u64, u64> = BTreeMap::new();
    let mut with_rows = 0;
    for round in 0..rounds {
        let d = TestDaemon::start(dir.path()).unwrap();
        check_after_restart(&d, &seen, &mut kept, round);

        let agents: Vec<TracedAgent> = (0..2)
            .map(|i| {
                let cfg = TracedConfig { rate: 20_000.0, batch: 200, seed: round * 2 + i, ..Default::default() };
                TracedAgent::start(&d.agent_socket, cfg).unwrap()
            })
            .collect();
        // Rows after these rowids are the new session's: counting them stays cheap.
        let reader = read_only(&d.db_path());
        let base = max_rowids(&reader);
        let id = start_session(&d);
        for a in &agents {
            assert_eq!(a.wait_event(Duration::from_secs(30)).unwrap(), Event::Started(id));
        }
        // A random moment of ingest: 0 to 1.5 s after tracing started.
        let delay = Duration::from_millis(next(&mut seed) % 1500);
        let until = Instant::now() + delay;
        let mut committed = session_rows(&reader, id, &base);
        while Instant::now() < until {
            committed = session_rows(&reader, id, &base);
        }
        drop(reader);
        d.kill9();
        for a in agents {
            let _ = a.finish(); // the daemon vanished under them
        }
        println!("round {round}: session {id} killed {delay:?} into tracing, {committed} rows seen committed");
        with_rows += u64::from(committed > 0);
        seen.insert(id, committed);
    }
    let d = TestDaemon::start(dir.path()).unwrap();
    check_after_restart(&d, &seen, &mut kept, rounds);
    println!("{rounds} kills; {with_rows} sessions had committed rows before their kill");
    assert!(with_rows > 0, "some kill landed after rows were committed");
    // The daemon still serves: a new session traces and completes.
    let a = TracedAgent::start(&d.agent_socket, TracedConfig { per_session: 1000, ..Default::default() }).unwrap();
    let id = start_session(&d);
    assert_eq!(a.wait_event(Duration::from_secs(30)).unwrap(), Event::Started(id));
    let out = d.ctl(&["session", "stop", &id.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(session_state(&d, id), "completed");
    a.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}
