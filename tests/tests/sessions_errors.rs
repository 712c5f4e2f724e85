//! Sessions across a daemon restart, errors and their gRPC codes and exit codes, displaced
//! processes, delayed starts and filtered queries.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::mix_tables;
use std::time::{Duration, Instant};

use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};
use gpuprofctl::pb;
use tonic::Code;
use tonic::transport::Channel;

type Client = GpuprofClient<Channel>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn all() -> Vec<pb::Target> {
    vec![pb::Target { target: Some(pb::target::Target::All(true)) }]
}

fn state(s: &pb::Session) -> pb::SessionState {
    pb::SessionState::try_from(s.state).unwrap()
}

async fn get(c: &mut Client, id: u64) -> pb::Session {
    c.get_session(pb::GetSessionRequest { session_id: id }).await.unwrap().into_inner()
}

fn restart_leaves_interrupted(kill: bool) {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig { rate: 20_000.0, ..Default::default() }).unwrap();
    let first = rt();
    let id = first.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let s = c
            .start_session(pb::StartSessionRequest { targets: all(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(agent.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s.id));
        // Wait until some records are committed.
        let t = Instant::now();
        while get(&mut c, s.id).await.records < 2_000 {
            assert!(t.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.id
    });
    // The client's connection lives on this runtime: close it before stopping the daemon,
    // whose graceful shutdown waits for open API connections.
    drop(first);
    if kill {
        d.kill9();
    } else {
        assert_eq!(d.terminate().unwrap(), 0);
    }
    drop(agent);
    let d = TestDaemon::start(dir.path()).unwrap();
    rt().block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let s = get(&mut c, id).await;
        assert_eq!(state(&s), pb::SessionState::Interrupted, "{s:?}");
        assert!(s.stop_reason.contains("gpuprofd stopped"), "{}", s.stop_reason);
        assert!(s.stopped_at_ns > 0);
        assert!(s.records >= 2_000, "{}", s.records);
        let db = rusqlite::Connection::open(d.db_path()).unwrap();
        let stored: i64 = mix_tables()
            .iter()
            .map(|t| {
                db.query_row(&format!("SELECT count(*) FROM {t} WHERE session = ?1"), [id as i64], |r| {
                    r.get::<_, i64>(0)
                })
                .unwrap()
            })
            .sum();
        assert_eq!(s.records, stored as u64);
        // Its data is readable: summary and records.
        let sum =
            c.get_summary(pb::GetSummaryRequest { session_id: id, filter: None, top: 5 }).await.unwrap().into_inner();
        assert!(sum.kernel_count > 0);
        let mut st = c
            .query_records(pb::QueryRecordsRequest { session_id: id, kinds: vec![], filter: None, limit: 0 })
            .await
            .unwrap()
            .into_inner();
        let mut n = 0;
        while let Some(m) = st.message().await.unwrap() {
            n += m.kernels.len() as u64;
        }
        assert_eq!(n, sum.kernel_count);
        // Stopping it is refused: it is over.
        let e = c.stop_session(pb::StopSessionRequest { session_id: id }).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
    });
}

#[test]
fn sigkill_mid_session_leaves_it_interrupted_with_data() {
    restart_leaves_interrupted(true);
}

#[test]
fn sigterm_mid_session_leaves_it_interrupted_with_data() {
    restart_leaves_interrupted(false);
}

#[test]
fn invalid_arguments_and_unknown_ids() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        use pb::target::Target as T;
        let t = |x: T| vec![pb::Target { target: Some(x) }];
        let bad: Vec<(pb::StartSessionRequest, &str)> = vec![
            (pb::StartSessionRequest::default(), "targets"),
            (pb::StartSessionRequest { targets: vec![pb::Target { target: None }], ..Default::default() }, "targets"),
            (pb::StartSessionRequest { targets: t(T::Pid(0)), ..Default::default() }, "targets.pid"),
            (pb::StartSessionRequest { targets: t(T::ExePattern("[abc".into())), ..Default::default() }, "exe_pattern"),
            (
                pb::StartSessionRequest { targets: t(T::ExeName("/usr/bin/python3".into())), ..Default::default() },
                "exe_name",
            ),
            (pb::StartSessionRequest { targets: t(T::All(false)), ..Default::default() }, "targets.all"),
            (
                pb::StartSessionRequest {
                    targets: all(),
                    collect: Some(pb::CollectOptions { preset: "everything".into(), ..Default::default() }),
                    ..Default::default()
                },
                "collect.preset",
            ),
            (
                pb::StartSessionRequest {
                    targets: all(),
                    collect: Some(pb::CollectOptions { pc_sampling_period_log2: 40, ..Default::default() }),
                    ..Default::default()
                },
                "pc_sampling_period_log2",
            ),
            (pb::StartSessionRequest { targets: all(), start_at_ns: u64::MAX, ..Default::default() }, "start_at_ns"),
        ];
        for (req, field) in bad {
            let e = c.start_session(req.clone()).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{req:?}: {e:?}");
            assert!(e.message().contains(field), "{field}: {}", e.message());
        }
        // A pid that does not exist.
        let e = c
            .start_session(pb::StartSessionRequest { targets: t(T::Pid(0x3fff_fff0)), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        // Unknown ids.
        for id in [1, 999] {
            let e = c.get_session(pb::GetSessionRequest { session_id: id }).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            assert!(e.message().contains(&format!("no session {id}")), "{}", e.message());
            let e = c.stop_session(pb::StopSessionRequest { session_id: id }).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            let e = c.get_summary(pb::GetSummaryRequest { session_id: id, ..Default::default() }).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
            let e = c.export_trace(pb::ExportTraceRequest { session_id: id, ..Default::default() }).await.unwrap_err();
            assert_eq!(e.code(), Code::NotFound);
        }
        let e = c.get_session(pb::GetSessionRequest { session_id: 0 }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        // Bad query arguments on an existing session.
        let s = c
            .start_session(pb::StartSessionRequest { targets: all(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let e = c
            .query_records(pb::QueryRecordsRequest {
                session_id: s.id,
                kinds: vec!["bogus".into()],
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(e.message().starts_with("kinds:"), "{}", e.message());
        let e = c
            .get_summary(pb::GetSummaryRequest {
                session_id: s.id,
                filter: Some(pb::RecordFilter {
                    time_range: Some(pb::TimeRange { start_ns: 10, end_ns: 5 }),
                    ..Default::default()
                }),
                top: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e =
            c.get_summary(pb::GetSummaryRequest { session_id: s.id, filter: None, top: 100_000 }).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        let e = c
            .list_sessions(pb::ListSessionsRequest { page_token: "nonsense".into(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap();
        // Paging and filters of ListSessions.
        for i in 0..4 {
            let s = c
                .start_session(pb::StartSessionRequest {
                    name: format!("page-{i}"),
                    targets: all(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner();
            if i % 2 == 0 {
                c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap();
            }
        }
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let r = c
                .list_sessions(pb::ListSessionsRequest { page_size: 2, page_token: token, ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            assert!(r.sessions.len() <= 2);
            seen.extend(r.sessions.iter().map(|s| s.id));
            token = r.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(seen, vec![s.id + 4, s.id + 3, s.id + 2, s.id + 1, s.id], "newest first, each once");
        let r = c
            .list_sessions(pb::ListSessionsRequest {
                states: vec![pb::SessionState::Active as i32],
                name_contains: "page-".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = r.sessions.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["page-3", "page-1"]);
    });
    // The CLI turns codes into exit codes: 2 bad arguments, 4 not found, 6 wrong state.
    let out = d.ctl(&["session", "show", "77"]);
    assert_eq!(out.status.code(), Some(4), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session 77"));
    let out = d.ctl(&["session", "start", "--pattern", "[x"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let out = d.ctl(&["session", "start"]);
    assert_eq!(out.status.code(), Some(2));
    let out = d.ctl(&["session", "stop", "1"]);
    assert_eq!(out.status.code(), Some(6), "{}", String::from_utf8_lossy(&out.stderr));
    // No daemon: 3.
    let out = std::process::Command::new(gpuprof_testkit::bin_path("gpuprofctl"))
        .args(["--socket", "/nonexistent/api.sock", "session", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn displaced_processes_pending_starts_and_filtered_queries() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let tracer =
        TracedAgent::start(&d.agent_socket, TracedConfig { per_session: 4_000, ..Default::default() }).unwrap();
    let displaced = TracedAgent::start(
        &d.agent_socket,
        TracedConfig { displaced: true, exe: "/usr/bin/python3.12".into(), ..Default::default() },
    )
    .unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        // Starts 300 ms from now.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        let s = c
            .start_session(pb::StartSessionRequest {
                targets: vec![pb::Target { target: Some(pb::target::Target::ExePattern("/usr/bin/python3*".into())) }],
                start_at_ns: now + 300_000_000,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(state(&s), pb::SessionState::Pending);
        assert!(s.processes.is_empty());
        let ev = tracer.wait_event(Duration::from_secs(10)).unwrap();
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
        assert_eq!(ev, Event::Started(s.id));
        assert!(started >= now + 300_000_000, "started {} ms early", (now + 300_000_000 - started) / 1_000_000);
        assert_eq!(displaced.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s.id));
        let t = Instant::now();
        while tracer.sent_for(s.id) < 4_000 {
            assert!(t.elapsed() < Duration::from_secs(20));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let s = c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap().into_inner();
        assert_eq!(state(&s), pb::SessionState::Completed);
        assert_eq!(s.records, 4_000);
        let dp = s.processes.iter().find(|p| p.process_id == displaced.process_id).unwrap();
        assert!(dp.displaced && dp.state == "displaced", "{dp:?}");
        assert_eq!(dp.records, 0);
        let tp = s.processes.iter().find(|p| p.process_id == tracer.process_id).unwrap();
        assert!(!tp.displaced && tp.records == 4_000, "{tp:?}");

        // Filtered queries agree with the database.
        let db = rusqlite::Connection::open(d.db_path()).unwrap();
        let q = |sql: &str| db.query_row(sql, [s.id as i64], |r| r.get::<_, i64>(0)).unwrap() as u64;
        let total_kernels = q("SELECT count(*) FROM kernel WHERE session = ?1");
        let collect = |m: &mut Vec<pb::KernelRow>, r: pb::QueryRecordsResponse| m.extend(r.kernels);
        let mut rows = Vec::new();
        let mut st = c
            .query_records(pb::QueryRecordsRequest {
                session_id: s.id,
                kinds: vec!["kernel".into()],
                filter: Some(pb::RecordFilter {
                    device_ids: vec![1],
                    name_pattern: "*gemm*".into(),
                    ..Default::default()
                }),
                limit: 0,
            })
            .await
            .unwrap()
            .into_inner();
        while let Some(m) = st.message().await.unwrap() {
            collect(&mut rows, m);
        }
        let want = q("SELECT count(*) FROM kernel k JOIN strings s ON s.id = k.name
                      WHERE k.session = ?1 AND k.dev = 1 AND s.value GLOB '*gemm*'");
        assert_eq!(rows.len() as u64, want);
        assert!(want > 0 && want < total_kernels);
        assert!(rows.iter().all(|k| k.device_id == 1 && k.name.contains("gemm") && k.end_ns >= k.start_ns));
        // Time range: the middle of the session.
        let (lo, hi) = (rows[rows.len() / 4].start_ns, rows[3 * rows.len() / 4].start_ns);
        let sum = c
            .get_summary(pb::GetSummaryRequest {
                session_id: s.id,
                filter: Some(pb::RecordFilter {
                    device_ids: vec![1],
                    name_pattern: "*gemm*".into(),
                    time_range: Some(pb::TimeRange { start_ns: lo, end_ns: hi }),
                    ..Default::default()
                }),
                top: 0,
            })
            .await
            .unwrap()
            .into_inner();
        let in_range = rows.iter().filter(|k| k.end_ns >= lo && k.start_ns < hi).count() as u64;
        assert_eq!(sum.kernel_count, in_range);
        // Unfiltered summary (rollup) equals an exact computation from the rows.
        let sum =
            c.get_summary(pb::GetSummaryRequest { session_id: s.id, filter: None, top: 3 }).await.unwrap().into_inner();
        assert_eq!(sum.kernel_count, total_kernels);
        let k = &sum.top_kernels[0];
        let (n, tot, mn, mx): (i64, i64, i64, i64) = db
            .query_row(
                "SELECT count(*), sum(dur), min(dur), max(dur) FROM kernel k JOIN strings s ON s.id = k.name
                 WHERE k.session = ?1 AND coalesce(s.demangled, s.value) = ?2",
                rusqlite::params![s.id as i64, k.name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .unwrap();
        assert_eq!((k.count, k.total_ns, k.min_ns, k.max_ns), (n as u64, tot as u64, mn as u64, mx as u64));
        let mut durs: Vec<i64> = db
            .prepare(
                "SELECT dur FROM kernel k JOIN strings s ON s.id = k.name
                 WHERE k.session = ?1 AND coalesce(s.demangled, s.value) = ?2",
            )
            .unwrap()
            .query_map(rusqlite::params![s.id as i64, k.name], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        durs.sort();
        let p50 = durs[(durs.len() as f64 * 0.5).ceil() as usize - 1] as f64;
        assert!((k.p50_ns as f64 - p50).abs() <= p50 * 0.04, "p50 {} vs exact {p50}", k.p50_ns);
        // Copies and API calls are there, with names.
        assert!(sum.copies.iter().any(|c| c.direction == "HtoD" && c.bytes > 0));
        assert!(sum.api_calls.iter().any(|a| a.name == "cudaLaunchKernel" && a.domain == "runtime"));
        assert!(!sum.device_busy.is_empty() && sum.device_busy.iter().all(|b| b.busy_ns <= b.span_ns && b.busy_ns > 0));
    });
    tracer.finish().unwrap();
    displaced.finish().unwrap();
}
