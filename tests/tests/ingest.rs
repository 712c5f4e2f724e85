//! End-to-end ingest: real gpuprofd, real sockets, real SQLite, fake agents.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{AgentMessage, InternedString, KernelRecord, RecordBatch, StringTable, agent_message::Msg};
use gpuprof_proto::frame::encode_frame;
use gpuprof_testkit::fake_agent::hello;
use gpuprof_testkit::{FakeAgent, Mix, Sent, TestDaemon};

const AGENTS: u64 = 4;
const PER_AGENT: u64 = 100_000;

fn frame(m: Msg) -> Vec<u8> {
    let mut b = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut b);
    b
}

/// Sends `bytes` on a fresh connection and asserts that the daemon closes it.
fn expect_dropped(socket: &Path, what: &str, bytes: &[u8], close_write: bool) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).unwrap();
    if close_write {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    // The daemon may send Welcome first (after a valid Hello); read until EOF.
    let mut sink = Vec::new();
    let r = s.read_to_end(&mut sink);
    assert!(r.is_ok(), "{what}: connection was not closed by the daemon: {r:?}");
}

fn malformed_inputs(socket: &Path) -> usize {
    let h = frame(Msg::Hello(hello("/bad/agent")));
    let mut cases: Vec<(&str, Vec<u8>, bool)> = Vec::new();
    // 1. A length prefix far above the maximum frame size.
    cases.push(("oversized length", [h.clone(), u32::MAX.to_le_bytes().to_vec()].concat(), false));
    // 2. Garbage that does not decode as a message.
    let mut garbage = 64u32.to_le_bytes().to_vec();
    garbage.extend(std::iter::repeat_n(0xffu8, 64));
    cases.push(("garbage", [h.clone(), garbage].concat(), false));
    // 3. A frame cut short by the end of the stream.
    let rec = frame(Msg::Records(RecordBatch::default()));
    cases.push(("truncated frame", [h.clone(), rec[..rec.len().min(3)].to_vec(), vec![9, 0, 0, 0, 1]].concat(), true));
    // 4. A Hello with a protocol version this daemon does not speak.
    let mut bad = hello("/bad/agent");
    bad.protocol_version = 99;
    cases.push(("wrong version", frame(Msg::Hello(bad)), false));
    // 5. Records before Hello.
    cases.push(("records before hello", frame(Msg::Records(RecordBatch::default())), false));
    // 6. A record using a string id never defined.
    let undefined = RecordBatch {
        kernels: vec![KernelRecord { name_id: 77, start_ns: 1, end_ns: 2, ..Default::default() }],
        ..Default::default()
    };
    cases.push(("undefined string id", [h.clone(), frame(Msg::Records(undefined))].concat(), false));
    // 7. String ids out of order.
    let ooo = StringTable { strings: vec![InternedString { id: 5, value: "x".into() }] };
    cases.push(("string ids out of order", [h.clone(), frame(Msg::Strings(ooo))].concat(), false));
    // 8. A second Hello.
    cases.push(("duplicate hello", [h.clone(), h.clone()].concat(), false));
    for (what, bytes, close) in &cases {
        expect_dropped(socket, what, bytes, *close);
    }
    cases.len()
}

fn wait_ingested(d: &TestDaemon, expect_total: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        let st = d.status().unwrap();
        let total: u64 = st["records"].as_object().unwrap().values().map(|v| v["ingested"].as_u64().unwrap()).sum();
        if total >= expect_total || t.elapsed() > Duration::from_secs(60) {
            return st;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn four_agents_and_a_malformed_one() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let socket = d.agent_socket.clone();

    let handles: Vec<_> = (0..AGENTS)
        .map(|i| {
            let socket = socket.clone();
            std::thread::spawn(move || -> (u64, Sent) {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default()).unwrap();
                let sent = a.send_records(PER_AGENT, 1000, 0.0, 0).unwrap();
                let id = a.process_id;
                a.goodbye().unwrap();
                (id, sent)
            })
        })
        .collect();
    let malformed = malformed_inputs(&socket);
    let results: Vec<(u64, Sent)> = handles.into_iter().map(|h| h.join().unwrap()).collect();

    let st = wait_ingested(&d, AGENTS * PER_AGENT);

    // The database holds exactly the rows sent, per kind and per process.
    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let mut kinds_seen = 0;
    for (proc, sent) in &results {
        assert_eq!(sent.values().sum::<u64>(), PER_AGENT);
        for (kind, n) in sent {
            let got: u64 = db
                .query_row(&format!("SELECT count(*) FROM {kind} WHERE proc = ?1"), [*proc as i64], |r| r.get(0))
                .unwrap();
            assert_eq!(got, *n, "{kind} rows of process {proc}");
        }
        kinds_seen = kinds_seen.max(sent.len());
    }
    assert!(kinds_seen >= 6, "test traffic should cover several kinds");

    // Totals per kind match `gpuprofctl status`.
    let mut expect: BTreeMap<&str, u64> = BTreeMap::new();
    for (_, sent) in &results {
        for (k, n) in sent {
            *expect.entry(k).or_default() += n;
        }
    }
    for (k, n) in &expect {
        assert_eq!(st["records"][k]["ingested"].as_u64().unwrap(), *n, "status ingested for {k}");
        assert_eq!(st["records"][k]["dropped"].as_u64().unwrap(), 0, "status dropped for {k}");
    }
    assert!(
        st["protocol_errors"].as_u64().unwrap() >= malformed as u64,
        "every malformed connection counts as a protocol error: {st}"
    );
    // Kernel names were interned once each and joined correctly.
    let names: i64 = db.query_row("SELECT count(DISTINCT name) FROM kernel", [], |r| r.get(0)).unwrap();
    assert_eq!(names as usize, gpuprof_testkit::records::KERNEL_NAMES.len());
    let bad: i64 = db
        .query_row("SELECT count(*) FROM kernel k LEFT JOIN strings s ON s.id = k.name WHERE s.id IS NULL", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(bad, 0, "every kernel name resolves to a string");

    // Human-readable status works too.
    let out = d.ctl(&["status"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kernel") && text.contains("INGESTED"), "{text}");

    let log = d.log_text();
    assert!(log.contains("exceeds the maximum"), "oversized frame reason logged:\n{log}");
    assert!(log.contains("unsupported protocol version 99"), "version reason logged");
    assert_eq!(d.terminate().unwrap(), 0, "SIGTERM exits 0");
}

#[test]
fn sigterm_drains_queued_records() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 9, Mix::default()).unwrap();
    let sent = a.send_records(50_000, 500, 0.0, 0).unwrap();
    let proc = a.process_id;
    // Make sure the daemon has read everything, then stop it right away.
    a.goodbye().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let db_path = d.db_path();
    assert_eq!(d.terminate().unwrap(), 0);
    let db = rusqlite::Connection::open(&db_path).unwrap();
    for (kind, n) in &sent {
        let got: u64 =
            db.query_row(&format!("SELECT count(*) FROM {kind} WHERE proc = ?1"), [proc as i64], |r| r.get(0)).unwrap();
        assert_eq!(got, *n, "{kind}");
    }
    let closed: Option<String> =
        db.query_row("SELECT close_reason FROM processes WHERE id = ?1", [proc as i64], |r| r.get(0)).unwrap();
    assert_eq!(closed.as_deref(), Some("goodbye"));
}

#[test]
fn check_config_names_the_bad_key() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    std::fs::write(&f, "[ingest]\nqueue_messages = 10\ncommit_max_recordz = 5\n").unwrap();
    let out =
        std::process::Command::new(gpuprof_testkit::bin_path("gpuprofd")).arg("check-config").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("commit_max_recordz"), "{err}");
    std::fs::write(&f, "[agent]\nmax_frame_bytes = 12\n").unwrap();
    let out =
        std::process::Command::new(gpuprof_testkit::bin_path("gpuprofd")).arg("check-config").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("agent.max_frame_bytes"));
    std::fs::write(&f, "log_level = \"debug\"\n[ingest]\nqueue_messages = 64\n").unwrap();
    let out =
        std::process::Command::new(gpuprof_testkit::bin_path("gpuprofd")).arg("check-config").arg(&f).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn agent_drop_reports_show_in_status_and_database() {
    use gpuprof_proto::agent::{DropCount, DropReport, RecordKind};
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 3, Mix::default()).unwrap();
    let report = |k: &[(RecordKind, u64)]| {
        Msg::Drops(DropReport {
            counts: k.iter().map(|(kind, n)| DropCount { kind: *kind as i32, dropped: *n }).collect(),
            cupti_dropped: 7,
        })
    };
    a.send(report(&[(RecordKind::Kernel, 5), (RecordKind::Api, 3)])).unwrap();
    a.send(report(&[(RecordKind::Kernel, 12)])).unwrap();
    let proc = a.process_id;
    a.flush().unwrap();
    let t = Instant::now();
    loop {
        let st = d.status().unwrap();
        if st["records"]["kernel"]["dropped"] == 12 && st["records"]["api"]["dropped"] == 3 && st["cupti_dropped"] == 7
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "drops not reported: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.goodbye().unwrap();
    let db_path = d.db_path();
    assert_eq!(d.terminate().unwrap(), 0);
    let db = rusqlite::Connection::open(db_path).unwrap();
    let n: i64 = db
        .query_row("SELECT dropped FROM drops WHERE proc = ?1 AND kind = 'kernel'", [proc as i64], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 12);
}

#[test]
fn full_database_is_reported_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("small.toml");
    std::fs::write(&cfg, "[storage]\nmax_database_mib = 1\n").unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 5, Mix::default()).unwrap();
    a.send_records(200_000, 1000, 0.0, 0).unwrap();
    let t = Instant::now();
    let st = loop {
        let st = d.status().unwrap();
        let total: u64 = st["records"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["ingested"].as_u64().unwrap() + v["dropped"].as_u64().unwrap())
            .sum();
        if total >= 200_000 {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "records neither stored nor counted as dropped: {st}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = st["storage_error"].as_str().unwrap();
    assert!(err.contains("full"), "storage error is shown: {st}");
    let dropped: u64 = st["records"].as_object().unwrap().values().map(|v| v["dropped"].as_u64().unwrap()).sum();
    assert!(dropped > 0, "{st}");
    // The connection and the daemon survive: more records are accepted (and counted).
    a.send_records(1000, 1000, 0.0, 0).unwrap();
    a.goodbye().unwrap();
    let out = d.ctl(&["status"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("STORAGE ERROR"));
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn systemd_readiness_and_stopping_are_notified() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let d = TestDaemon::start_opts(&dir.path().join("state"), &[], &[("NOTIFY_SOCKET", sock_path.to_str().unwrap())])
        .unwrap();
    let mut buf = [0u8; 256];
    let n = notify.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));
    // Ready means the sockets are up and the schema is applied.
    assert!(d.status().is_ok());
    let code = d.terminate().unwrap();
    let n = notify.recv(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert_eq!(code, 0);
}

#[test]
fn fake_agent_command_streams_at_a_rate() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let t = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuprof-fake-agent"))
        .arg("--socket")
        .arg(&d.agent_socket)
        .args(["--agents", "2", "--records", "5000", "--rate", "10000", "--batch", "500"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // 5000 records at 10000/s take at least half a second per agent.
    assert!(t.elapsed() >= Duration::from_millis(450), "rate was not honoured: {:?}", t.elapsed());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sent 10000 records"), "{text}");
    let st = wait_ingested(&d, 10_000);
    let total: u64 = st["records"].as_object().unwrap().values().map(|v| v["ingested"].as_u64().unwrap()).sum();
    assert_eq!(total, 10_000, "{st}");
}
