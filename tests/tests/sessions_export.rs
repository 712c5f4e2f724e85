//! ExportTrace checked, not eyeballed: the Chrome JSON parses, holds one event per stored
//! record, every flow arrow has both ends, timestamps never go back on a track; the SQLite
//! export holds the session's rows.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::{EVENT_TABLES, mix_tables};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};

fn count(c: &rusqlite::Connection, table: &str, session: u64) -> u64 {
    c.query_row(&format!("SELECT count(*) FROM {table} WHERE session = ?1"), [session as i64], |r| r.get::<_, i64>(0))
        .unwrap() as u64
}

/// Starts a session over two traced agents, lets each send `per` records, stops it.
fn recorded_session(d: &TestDaemon, per: u64, exe: &str) -> (u64, Vec<TracedAgent>) {
    let agents: Vec<TracedAgent> = (0..2)
        .map(|i| {
            TracedAgent::start(
                &d.agent_socket,
                TracedConfig {
                    exe: format!("/usr/bin/{exe}"),
                    cmdline: vec![exe.into()],
                    seed: 11 + i,
                    per_session: per,
                    rate: 200_000.0,
                    batch: 500,
                    ..Default::default()
                },
            )
            .unwrap()
        })
        .collect();
    let out = d.ctl(&["session", "start", "--exe", exe, "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    for a in &agents {
        assert_eq!(a.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(id));
    }
    let t = std::time::Instant::now();
    while agents.iter().any(|a| a.sent_for(id) < per) {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = d.ctl(&["session", "stop", &id.to_string(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["records"].as_u64().unwrap(), 2 * per, "{s}");
    (id, agents)
}

#[test]
fn chrome_trace_is_complete_and_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let (id, agents) = recorded_session(&d, 20_000, "python3");
    let file = dir.path().join("trace.json");
    let out = d.ctl(&["export", &id.to_string(), "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).expect("export is valid JSON");
    let events = v["traceEvents"].as_array().unwrap();

    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let rows: u64 = EVENT_TABLES.iter().map(|t| count(&db, t, id)).sum();
    assert!(rows >= 40_000 - count(&db, "external_correlation", id) - 100, "{rows}");
    let mut by_ph: BTreeMap<String, u64> = BTreeMap::new();
    for e in events {
        *by_ph.entry(e["ph"].as_str().unwrap().to_string()).or_default() += 1;
    }
    assert_eq!(by_ph.get("X").copied().unwrap_or(0) + by_ph.get("i").copied().unwrap_or(0), rows, "{by_ph:?}");
    // Per kind too.
    for (t, cat) in [
        ("kernel", "kernel"),
        ("memcpy", "memcpy"),
        ("memset", "memset"),
        ("api", "cuda_runtime"),
        ("marker", "nvtx"),
        ("sync", "sync"),
        ("overhead", "overhead"),
    ] {
        let n = events.iter().filter(|e| e["cat"] == cat && (e["ph"] == "X" || e["ph"] == "i")).count() as u64;
        assert_eq!(n, count(&db, t, id), "{t}");
    }

    // Flows: every start has exactly one end and the other way round; as many as device
    // activities whose correlation id has an API call in the same process.
    let mut starts: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut ends: HashMap<u64, (u64, u64)> = HashMap::new();
    for e in events {
        let id = e["id"].as_u64();
        match e["ph"].as_str().unwrap() {
            "s" => {
                assert!(starts.insert(id.unwrap(), (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())).is_none())
            }
            "f" => {
                assert_eq!(e["bp"], "e");
                assert!(ends.insert(id.unwrap(), (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())).is_none())
            }
            _ => {}
        }
    }
    assert!(!starts.is_empty());
    assert_eq!(starts.len(), ends.len());
    for (k, s) in &starts {
        let f = ends.get(k).unwrap_or_else(|| panic!("flow {k} has no end"));
        // Host thread → GPU stream of the same process.
        assert_eq!(s.0 / 1000, f.0 / 1000);
        assert_ne!(s.0, f.0);
    }
    let linked: u64 = ["kernel", "memcpy", "memset"]
        .iter()
        .map(|t| {
            db.query_row(
                &format!(
                    "SELECT count(*) FROM {t} k WHERE k.session = ?1 AND k.corr != 0 AND EXISTS
                       (SELECT 1 FROM api a WHERE a.session = ?1 AND a.proc = k.proc AND a.corr = k.corr)"
                ),
                [id as i64],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .sum();
    assert_eq!(starts.len() as u64, linked);

    // Timestamps never decrease along a track, and each track is named.
    let mut last: HashMap<(u64, u64), f64> = HashMap::new();
    let mut named: std::collections::HashSet<(u64, u64)> = std::collections::HashSet::new();
    for e in events {
        let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap_or(0));
        if e["ph"] == "M" {
            if e["name"] == "thread_name" {
                named.insert((pid, tid));
            }
            continue;
        }
        let ts = e["ts"].as_f64().unwrap();
        assert!(ts >= 0.0);
        let prev = last.entry((pid, tid)).or_insert(ts);
        assert!(ts >= *prev, "track {pid}/{tid}: {ts} after {prev}");
        *prev = ts;
    }
    for t in last.keys() {
        assert!(named.contains(t), "track {t:?} has no thread_name");
    }
    // One device track per (process, GPU) with one thread per stream; one host track per process.
    let pids: std::collections::BTreeSet<u64> = last.keys().map(|k| k.0).collect();
    assert_eq!(pids.len(), 2 * (1 + 2), "{pids:?}");
    for a in agents {
        a.finish().unwrap();
    }
}

#[test]
fn sqlite_export_holds_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let (id, agents) = recorded_session(&d, 5_000, "python3");
    // A second session whose rows must not leak into the export.
    let (other, agents2) = recorded_session(&d, 1_000, "torchrun");
    let file = dir.path().join("s.db");
    let out = d.ctl(&["export", &id.to_string(), "-o", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let ex = rusqlite::Connection::open(&file).unwrap();
    // The processes carry their job and rank columns.
    let job_cols: i64 = ex
        .query_row(
            "SELECT count(*) FROM pragma_table_info('processes') WHERE name IN ('job_id', 'job_rank', 'parent_pid')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(job_cols, 3);
    let mut total = 0;
    for t in mix_tables() {
        let n = count(&ex, t, id);
        assert_eq!(n, count(&db, t, id), "{t}");
        assert_eq!(count(&ex, t, other), 0);
        total += n;
    }
    assert_eq!(total, 10_000);
    // The views work: absolute times and kernel names resolve.
    let (named, bad): (i64, i64) = ex
        .query_row(
            "SELECT count(s.value), sum(k.start_ns < 1600000000000000000) FROM kernel_v k LEFT JOIN strings s ON s.id = k.name",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(named as u64, count(&db, "kernel", id));
    assert_eq!(bad, 0);
    // Both forms of the names: the tiny kernel's demangled form is kept beside it.
    let demangled: String =
        ex.query_row("SELECT demangled FROM strings WHERE value = '_Z11tiny_kernelPf'", [], |r| r.get(0)).unwrap();
    assert_eq!(demangled, "tiny_kernel(float*)");
    let state: String = ex.query_row("SELECT state FROM sessions WHERE id = ?1", [id as i64], |r| r.get(0)).unwrap();
    assert_eq!(state, "completed");
    // The session's processes come with the cgroup gpuprofd read and what it says.
    let placement = "SELECT group_concat(cgroup || '|' || container_id || '|' || pod_uid) FROM processes
                     WHERE id IN (SELECT proc FROM session_processes WHERE session = ?1) ORDER BY id";
    let want: String = db.query_row(placement, [id as i64], |r| r.get(0)).unwrap();
    assert_eq!(ex.query_row(placement, [id as i64], |r| r.get::<_, String>(0)).unwrap(), want);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["events"].as_u64().unwrap(), 10_000);
    // Nothing is left behind in the daemon's state directory.
    let left: Vec<_> = std::fs::read_dir(dir.path().join("exports")).map(|r| r.flatten().collect()).unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    for a in agents.into_iter().chain(agents2) {
        a.finish().unwrap();
    }
}
