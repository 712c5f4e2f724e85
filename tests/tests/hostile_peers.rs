//! Hostile peers on the agent socket: oversized and truncated frames, a wrong protocol version,
//! a silent peer, slowloris peers (a Hello sent byte by byte, a frame stalled half way), a peer
//! that never reads, and 1,000 simultaneous connections that each announce a full-size frame and
//! stall. Each bad connection is closed and counted as a protocol error; meanwhile a well-behaved
//! agent loses no record and `GetStatus` keeps answering.
//!
//! The 1,000 connections need about 1,000 file descriptors in the test and in the daemon (which
//! inherits the test's limit); the test raises its soft `RLIMIT_NOFILE` to the hard limit and
//! uses fewer connections if even that is too low, printing the number it used.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{
    AgentMessage, Heartbeat, InternedString, KernelRecord, RecordBatch, StringTable, agent_message::Msg,
};
use gpuprof_proto::frame::encode_frame;
use gpuprof_testkit::fake_agent::hello;
use gpuprof_testkit::{FakeAgent, Mix, Sent, TestDaemon};

/// Short timeouts so that stalled peers are cut within seconds (the handshake deadline is the
/// smaller of 10 s and the liveness timeout).
const CONFIG: &str = "[agent]\nheartbeat_interval_ms = 1000\nliveness_timeout_ms = 4000\nmax_frame_bytes = 4194304\n";
const MAX_FRAME: u32 = 4 << 20;
/// Generous: a stalled peer is cut after 4 s; a loaded machine may take much longer to notice.
const CUT_WITHIN: Duration = Duration::from_secs(45);
const CONNECTIONS: u64 = 1000;

fn frame(m: Msg) -> Vec<u8> {
    let mut b = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut b);
    b
}

fn connect(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(CUT_WITHIN)).unwrap();
    s
}

/// Reads (and discards, a Welcome included) until the daemon closes the connection.
fn wait_closed(mut s: UnixStream, what: &str) {
    let t = Instant::now();
    let mut sink = Vec::new();
    let r = s.read_to_end(&mut sink);
    assert!(r.is_ok(), "{what}: the daemon did not close the connection within {CUT_WITHIN:?}: {r:?}");
    assert!(t.elapsed() < CUT_WITHIN, "{what}: closed only after {:?}", t.elapsed());
}

/// Sends `bytes` (then ends the stream when `eof`) and waits for the daemon to close.
fn send_and_expect_close(socket: &Path, what: &str, bytes: &[u8], eof: bool) {
    let mut s = connect(socket);
    s.write_all(bytes).unwrap();
    if eof {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    wait_closed(s, what);
}

/// Sends a Hello one byte at a time, a byte every 300 ms, until the daemon hangs up.
fn slowloris_hello(socket: &Path) {
    let mut s = connect(socket);
    s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let h = frame(Msg::Hello(hello("/slow/loris")));
    let t = Instant::now();
    let mut buf = [0u8; 64];
    for (i, b) in h.iter().enumerate() {
        if s.write_all(&[*b]).is_err() {
            return assert!(t.elapsed() < CUT_WITHIN);
        }
        // Waiting for a reply paces the bytes and notices the close.
        match s.read(&mut buf) {
            Ok(0) | Err(_) if t.elapsed() >= CUT_WITHIN => panic!("slowloris Hello not cut after {:?}", t.elapsed()),
            Ok(0) => return assert!(i + 1 < h.len(), "the whole Hello went out before the cut"),
            Ok(_) => panic!("the daemon answered a Hello it never fully received"),
            Err(_) => {}
        }
    }
    panic!("the daemon waited for a Hello sent over {:?}", t.elapsed());
}

/// Says Hello, reads Welcome, then sends `tail` and stalls.
fn hello_then(socket: &Path, tail: &[u8]) -> UnixStream {
    let mut s = connect(socket);
    s.write_all(&frame(Msg::Hello(hello("/stalled/agent")))).unwrap();
    let _welcome: gpuprof_proto::agent::DaemonMessage = gpuprof_proto::frame::read_message(&mut s, 1 << 20).unwrap();
    s.write_all(tail).unwrap();
    s
}

/// A frame header announcing `len` bytes, then `sent` of them.
fn partial_frame(len: u32, sent: usize) -> Vec<u8> {
    let mut b = len.to_le_bytes().to_vec();
    b.extend(std::iter::repeat_n(0x0au8, sent));
    b
}

/// A peer that sends a Hello, a name and `n` kernel records and never reads (not even the
/// Welcome); it heartbeats past the liveness timeout, then hangs up without a Goodbye.
fn never_reads(socket: &Path, n: usize) {
    let mut s = connect(socket);
    let names = StringTable { strings: vec![InternedString { id: 1, value: "never_read_kernel".into() }] };
    let kernels = (0..n as u64)
        .map(|i| KernelRecord { name_id: 1, start_ns: i * 10, end_ns: i * 10 + 5, ..Default::default() })
        .collect();
    let mut bytes = frame(Msg::Hello(hello("/never/reads")));
    bytes.extend(frame(Msg::Strings(names)));
    bytes.extend(frame(Msg::Records(RecordBatch { kernels, ..Default::default() })));
    s.write_all(&bytes).unwrap();
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        s.write_all(&frame(Msg::Heartbeat(Heartbeat::default()))).unwrap();
    }
}

/// Raises the soft file-descriptor limit to the hard one; returns the soft limit now in force.
#[allow(unsafe_code)]
fn raise_nofile() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // Safety: getrlimit/setrlimit write/read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let want = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                r = want;
            }
        }
    }
    r.rlim_cur
}

fn status_u64(st: &serde_json::Value, key: &str) -> u64 {
    st[key].as_u64().unwrap_or_else(|| panic!("{key} in {st}"))
}

/// 1,000 (or as many as the fd limit allows) connections at once, each saying Hello and
/// announcing a full-size frame in one write, sending 1 KiB of it and stalling. Returns how
/// many were opened.
fn many_stalled_connections(d: &TestDaemon, n: u64) -> u64 {
    let bytes = [frame(Msg::Hello(hello("/many/agent"))), partial_frame(MAX_FRAME - 1, 1024)].concat();
    let mut conns = Vec::new();
    for _ in 0..n {
        let mut s = connect(&d.agent_socket);
        s.write_all(&bytes).unwrap();
        conns.push(s);
    }
    // Every one was registered (its Welcome came), then cut for leaving its frame unfinished.
    for mut s in conns {
        let _welcome: gpuprof_proto::agent::DaemonMessage =
            gpuprof_proto::frame::read_message(&mut s, 1 << 20).unwrap();
        wait_closed(s, "one of many stalled connections");
    }
    d.wait_status("stalled connections gone", |st| status_u64(st, "connected_agents") == 1);
    n
}

#[test]
fn hostile_peers_are_cut_and_counted_while_a_good_agent_loses_nothing() {
    let limit = raise_nofile();
    let conns = CONNECTIONS.min(limit.saturating_sub(200) / 2);
    println!("fd limit {limit}: {conns} simultaneous connections");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("hostile.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    let socket = d.agent_socket.clone();
    let hostile_done = AtomicBool::new(false);
    let polling_done = AtomicBool::new(false);

    let (max_latency, polls, (proc_id, sent), expected_errors) = std::thread::scope(|sc| {
        // GetStatus, answered throughout.
        let poller = sc.spawn(|| {
            let (mut max, mut n) = (Duration::ZERO, 0u64);
            while !polling_done.load(Ordering::Relaxed) {
                let t = Instant::now();
                d.status().unwrap();
                max = max.max(t.elapsed());
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            (max, n)
        });
        // A well-behaved agent streams until the hostile peers are done.
        let good = sc.spawn(|| -> (u64, Sent) {
            let mut a = FakeAgent::connect(&socket, 42, Mix::default()).unwrap();
            let mut sent = Sent::new();
            while !hostile_done.load(Ordering::Relaxed) {
                for (k, n) in a.send_records(2_000, 500, 10_000.0, 0).unwrap() {
                    *sent.entry(k).or_default() += n;
                }
            }
            let id = a.process_id;
            a.goodbye().unwrap();
            (id, sent)
        });

        let h = frame(Msg::Hello(hello("/bad/agent")));
        let mut bad_version = hello("/bad/agent");
        bad_version.protocol_version = 99;
        let one_shot: Vec<(&str, Vec<u8>, bool)> = vec![
            ("oversized before hello", partial_frame(2 << 20, 16), false),
            ("oversized after hello", [h.clone(), u32::MAX.to_le_bytes().to_vec()].concat(), false),
            ("truncated length", vec![7, 0], true),
            ("truncated body", [h.clone(), partial_frame(100, 10)].concat(), true),
            ("wrong protocol version", frame(Msg::Hello(bad_version)), false),
            ("silent peer", Vec::new(), false),
        ];
        let cases = one_shot.len() as u64 + 2;
        let singles: Vec<_> = one_shot
            .into_iter()
            .map(|(what, bytes, eof)| {
                let socket = socket.clone();
                sc.spawn(move || send_and_expect_close(&socket, what, &bytes, eof))
            })
            .collect();
        let slow = sc.spawn(|| slowloris_hello(&socket));
        let stalled = sc.spawn(|| {
            let s = hello_then(&socket, &partial_frame(4096, 100));
            wait_closed(s, "frame stalled half way");
        });
        let unread = sc.spawn(|| never_reads(&socket, 5_000));
        for t in singles {
            t.join().unwrap();
        }
        slow.join().unwrap();
        stalled.join().unwrap();
        unread.join().unwrap();
        let many = many_stalled_connections(&d, conns);

        hostile_done.store(true, Ordering::Relaxed);
        let good = good.join().unwrap();
        polling_done.store(true, Ordering::Relaxed);
        let (max, n) = poller.join().unwrap();
        (max, n, good, cases + many)
    });

    // The good agent's records are all stored, exactly.
    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let t = Instant::now();
    for (kind, n) in &sent {
        loop {
            let got: u64 = db
                .query_row(&format!("SELECT count(*) FROM {kind} WHERE proc = ?1"), [proc_id as i64], |r| r.get(0))
                .unwrap();
            if got == *n {
                break;
            }
            assert!(got < *n && t.elapsed() < Duration::from_secs(60), "{kind}: {got} stored of {n} sent");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // So are those of the peer that never read.
    let unread: i64 = db
        .query_row(
            "SELECT count(*) FROM kernel k JOIN processes p ON p.id = k.proc WHERE p.exe = '/never/reads'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unread, 5_000, "records of the peer that never reads");

    let st = d.wait_status("good agent gone", |st| status_u64(st, "connected_agents") == 0);
    assert_eq!(status_u64(&st, "protocol_errors"), expected_errors, "one protocol error per hostile peer: {st}");
    let dropped: u64 = st["records"].as_object().unwrap().values().map(|v| v["dropped"].as_u64().unwrap()).sum();
    assert_eq!(dropped, 0, "{st}");
    let log = d.log_text();
    for reason in [
        "exceeds the maximum",
        "truncated frame",
        "unsupported protocol version 99",
        "no Hello within",
        "stalled inside a frame",
    ] {
        assert!(log.contains(reason), "reason {reason:?} logged");
    }
    let peak_rss = d.rss().0;
    println!(
        "GetStatus (through gpuprofctl): {polls} calls, max latency {max_latency:?}; daemon peak RSS {} MiB; {} records from the good agent",
        peak_rss >> 20,
        sent.values().sum::<u64>()
    );
    // Announced: 1,000 x 4 MiB. Held: what arrived.
    assert!(peak_rss < 1 << 30, "peak RSS {} MiB with stalled full-size frames", peak_rss >> 20);
    assert!(max_latency < Duration::from_secs(5), "GetStatus took {max_latency:?}");
    assert_eq!(d.terminate().unwrap(), 0);
}
