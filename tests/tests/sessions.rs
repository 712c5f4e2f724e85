//! Sessions end to end: real gpuprofd, traced fake agents obeying StartTrace/StopTrace,
//! the gRPC API and gpuprofctl as a process.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::kinds::mix_tables;
use std::time::{Duration, Instant};

use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{AgentProcess, Event, TracedAgent, TracedConfig, spawn_process};
use gpuprofctl::pb;
use tonic::transport::Channel;

type Client = GpuprofClient<Channel>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

async fn client(d: &TestDaemon) -> Client {
    gpuprofctl::connect(&d.api_socket).await.unwrap()
}

fn target(t: pb::target::Target) -> pb::Target {
    pb::Target { target: Some(t) }
}

fn start_req(targets: Vec<pb::Target>) -> pb::StartSessionRequest {
    pb::StartSessionRequest { targets, ..Default::default() }
}

fn state(s: &pb::Session) -> pb::SessionState {
    pb::SessionState::try_from(s.state).unwrap()
}

async fn wait_state(c: &mut Client, id: u64, want: pb::SessionState, timeout: Duration) -> pb::Session {
    let t = Instant::now();
    loop {
        let s = c.get_session(pb::GetSessionRequest { session_id: id }).await.unwrap().into_inner();
        if state(&s) == want {
            return s;
        }
        assert!(t.elapsed() < timeout, "session {id} still {:?} after {timeout:?}: {s:?}", state(&s));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of a session in the database, per process (all record tables).
fn db_rows(d: &TestDaemon, session: u64) -> std::collections::BTreeMap<u64, u64> {
    let c = rusqlite::Connection::open(d.db_path()).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for t in mix_tables() {
        let mut st = c.prepare(&format!("SELECT proc, count(*) FROM {t} WHERE session = ?1 GROUP BY proc")).unwrap();
        let rows =
            st.query_map([session as i64], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))).unwrap();
        for r in rows {
            let (p, n) = r.unwrap();
            *out.entry(p).or_default() += n;
        }
    }
    out
}

fn cfg(exe: &str, args: &[&str]) -> TracedConfig {
    let mut cmdline = vec![exe.rsplit('/').next().unwrap().to_string()];
    cmdline.extend(args.iter().map(|s| s.to_string()));
    TracedConfig { exe: exe.into(), cmdline, ..Default::default() }
}

fn stopped(a: &AgentProcess, session: u64) -> u64 {
    loop {
        match a.wait_event(Duration::from_secs(10)).unwrap() {
            Event::Stopped(s, n) if s == session => return n,
            _ => {}
        }
    }
}

#[test]
fn trace_command_prints_top_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let agents: Vec<TracedAgent> = (0..2)
        .map(|i| {
            TracedAgent::start(&d.agent_socket, TracedConfig { seed: i + 1, per_session: 3_000, ..Default::default() })
                .unwrap()
        })
        .collect();
    let out = d.ctl(&["trace", "--all", "--duration", "1s", "--json", "--top", "5"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stderr), d.log_text());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &v["session"];
    let id = s["id"].as_u64().unwrap();
    assert_eq!(s["state"], "completed", "{v}");
    assert_eq!(s["stop_reason"], "duration reached");
    let procs = s["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{v}");
    let mut kernels = 0;
    for a in &agents {
        let p = procs.iter().find(|p| p["process_id"] == a.process_id).unwrap();
        assert_eq!(p["records"].as_u64().unwrap(), a.sent_for(id), "{p}");
        assert_eq!(p["records"].as_u64().unwrap(), 3_000);
        assert_eq!(p["state"], "stopped");
        assert_eq!(p["detail"], "detached: finalized", "how the agent left CUPTI is kept: {p}");
        kernels += a.sent.lock().unwrap()[&id].get("kernel").copied().unwrap_or(0);
    }
    assert_eq!(s["records"].as_u64().unwrap(), 6_000);
    assert_eq!(v["summary"]["kernel_count"].as_u64().unwrap(), kernels);
    let top = v["summary"]["top_kernels"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    assert!(top.windows(2).all(|w| w[0]["total_ns"].as_u64() >= w[1]["total_ns"].as_u64()));
    let sum: u64 = top.iter().map(|k| k["count"].as_u64().unwrap()).sum();
    assert!(sum <= kernels && sum > 0);
    let total: u64 = top.iter().map(|k| k["total_ns"].as_u64().unwrap()).sum();
    assert!(total <= v["summary"]["kernel_total_ns"].as_u64().unwrap() && total > 0);
    // The table form prints the kernels too.
    let out = d.ctl(&["top", &id.to_string()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("kernels: {kernels},")), "{text}");
    assert!(text.contains("sm90_xmma_gemm") || text.contains("_ZN2at6native"), "{text}");
    for a in agents {
        a.finish().unwrap();
    }
}

/// Two matching processes, one that does not match, a third matching one joining late;
/// explicit stop; per-process counts equal what each agent sent and what the database holds.
#[test]
fn session_over_processes_with_late_join_and_explicit_stop() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let a = spawn_process(&d.agent_socket, &cfg("/usr/bin/python3", &["train.py"]), None).unwrap();
    let b = spawn_process(&d.agent_socket, &cfg("/opt/conda/bin/python3", &["-m", "serve"]), None).unwrap();
    let other = spawn_process(&d.agent_socket, &cfg("/usr/bin/ffmpeg", &["-i", "x"]), None).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        let s = c
            .start_session(pb::StartSessionRequest {
                name: "late-join".into(),
                targets: vec![target(pb::target::Target::ExeName("python3".into()))],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(state(&s), pb::SessionState::Active);
        let mut joined: Vec<u64> = s.processes.iter().map(|p| p.process_id).collect();
        joined.sort();
        assert_eq!(joined, vec![a.process_id, b.process_id]);
        assert!(matches!(a.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(x) if x == s.id));
        // A matching process starts later and joins.
        let late = spawn_process(&d.agent_socket, &cfg("/usr/bin/python3", &["eval.py"]), None).unwrap();
        assert!(matches!(late.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(x) if x == s.id));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let s2 = c.get_session(pb::GetSessionRequest { session_id: s.id }).await.unwrap().into_inner();
        assert_eq!(s2.processes.len(), 3, "{s2:?}");
        assert!(s2.processes.iter().all(|p| p.process_id != other.process_id));
        let stopped_s = c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap().into_inner();
        assert_eq!(state(&stopped_s), pb::SessionState::Completed, "{stopped_s:?}");
        assert_eq!(stopped_s.stop_reason, "stopped by user");
        assert!(stopped_s.stopped_at_ns >= stopped_s.started_at_ns && stopped_s.started_at_ns > 0);
        let sent: Vec<(u64, u64)> = [&a, &b, &late].iter().map(|p| (p.process_id, stopped(p, s.id))).collect();
        let rows = db_rows(&d, s.id);
        for (pid, n) in &sent {
            assert!(*n > 0, "process {pid} sent nothing");
            let sp = stopped_s.processes.iter().find(|p| p.process_id == *pid).unwrap();
            assert_eq!(sp.records, *n, "{sp:?}");
            assert_eq!(rows.get(pid).copied().unwrap_or(0), *n);
            assert_eq!(sp.state, "stopped");
        }
        assert_eq!(stopped_s.records, sent.iter().map(|x| x.1).sum::<u64>());
        assert!(!rows.contains_key(&other.process_id));
        // Stopping again is refused; the session is listed.
        let e = c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        let l = c.list_sessions(pb::ListSessionsRequest::default()).await.unwrap().into_inner();
        assert_eq!(l.sessions.len(), 1);
        assert_eq!(l.sessions[0].name, "late-join");
        late.finish().unwrap();
    });
    for p in [a, b, other] {
        p.finish().unwrap();
    }
}

#[test]
fn duration_and_record_limit_stop_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig { rate: 50_000.0, ..Default::default() }).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        // Duration.
        let t = Instant::now();
        let s = c
            .start_session(pb::StartSessionRequest {
                duration_ms: 400,
                ..start_req(vec![target(pb::target::Target::All(true))])
            })
            .await
            .unwrap()
            .into_inner();
        let done = wait_state(&mut c, s.id, pb::SessionState::Completed, Duration::from_secs(10)).await;
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(5), "{took:?}");
        assert_eq!(done.stop_reason, "duration reached");
        assert_eq!(done.records, agent.sent_for(s.id));
        assert!(done.records > 1000);
        // Record limit.
        let s = c
            .start_session(pb::StartSessionRequest {
                max_records: 5_000,
                ..start_req(vec![target(pb::target::Target::All(true))])
            })
            .await
            .unwrap()
            .into_inner();
        let done = wait_state(&mut c, s.id, pb::SessionState::Completed, Duration::from_secs(10)).await;
        assert_eq!(done.stop_reason, "record limit reached");
        assert!(done.records >= 5_000, "{}", done.records);
        // Records arriving between the limit and the stop: a few batches at most.
        assert!(done.records < 5_000 + 5_000, "{}", done.records);
        assert_eq!(done.records, agent.sent_for(s.id));
        assert_eq!(db_rows(&d, s.id).values().sum::<u64>(), done.records);
    });
    agent.finish().unwrap();
}

/// A process asked to trace shows as "starting" until its agent confirms, then "tracing".
#[test]
fn member_is_starting_until_the_agent_confirms() {
    use gpuprof_proto::agent as wire;
    use gpuprof_testkit::fake_agent::FakeAgent;
    use gpuprof_testkit::records::Mix;
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 7, Mix::default()).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        let pid = a.process_id;
        let member_state = |s: &pb::Session| s.processes.iter().find(|p| p.process_id == pid).map(|p| p.state.clone());
        let s = c.start_session(start_req(vec![target(pb::target::Target::All(true))])).await.unwrap().into_inner();
        let s = wait_state(&mut c, s.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        assert_eq!(member_state(&s).as_deref(), Some("starting"), "{s:?}");
        // The agent gets StartTrace and confirms.
        let t = Instant::now();
        loop {
            let m = a.recv(Duration::from_secs(5)).unwrap();
            if matches!(m.msg, Some(wire::daemon_message::Msg::StartTrace(_))) {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "no StartTrace");
        }
        a.send(wire::agent_message::Msg::TraceState(wire::TraceState {
            status: wire::TraceStatus::Tracing as i32,
            session_id: s.id,
            detail: String::new(),
        }))
        .unwrap();
        a.flush().unwrap();
        let t = Instant::now();
        loop {
            let s = c.get_session(pb::GetSessionRequest { session_id: s.id }).await.unwrap().into_inner();
            if member_state(&s).as_deref() == Some("tracing") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "still {:?}", member_state(&s));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// A process whose stop left its detach from CUPTI pending reports the outcome after the
/// session ended: the member's detail says how it ended, its state stays "stopped"; another
/// process cannot rewrite it, nor can a non-detach detail.
#[test]
fn a_detach_finished_after_the_session_updates_the_members_detail() {
    use gpuprof_proto::agent as wire;
    use gpuprof_testkit::fake_agent::FakeAgent;
    use gpuprof_testkit::records::Mix;
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(dir.path()).unwrap();
    let mut a = FakeAgent::connect(&d.agent_socket, 7, Mix::default()).unwrap();
    let state = |a: &mut FakeAgent, session_id: u64, status: wire::TraceStatus, detail: &str| {
        a.send(wire::agent_message::Msg::TraceState(wire::TraceState {
            status: status as i32,
            session_id,
            detail: detail.into(),
        }))
        .unwrap();
        a.flush().unwrap();
    };
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        let pid = a.process_id;
        let member = |s: &pb::Session| s.processes.iter().find(|p| p.process_id == pid).cloned().unwrap();
        let s = c.start_session(start_req(vec![target(pb::target::Target::All(true))])).await.unwrap().into_inner();
        wait_state(&mut c, s.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        state(&mut a, s.id, wire::TraceStatus::Tracing, "");
        c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap();
        state(&mut a, s.id, wire::TraceStatus::Idle, "detached: finalize pending (at the next CUDA synchronization)");
        wait_state(&mut c, s.id, pb::SessionState::Completed, Duration::from_secs(10)).await;
        // The idle report reaches the daemon while the session stops, or (on a starved machine)
        // after its stop timeout ended it, as a late detach outcome: the detail is the same.
        let t = Instant::now();
        let before = loop {
            let s = c.get_session(pb::GetSessionRequest { session_id: s.id }).await.unwrap().into_inner();
            let m = member(&s);
            if m.detail == "detached: finalize pending (at the next CUDA synchronization)" {
                break m;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "pending detach not reported: {s:?}\n{}", d.log_text());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // Not a detach outcome, or from a process that was not in the session: nothing changes.
        let mut other = FakeAgent::connect(&d.agent_socket, 8, Mix::default()).unwrap();
        state(&mut a, s.id, wire::TraceStatus::Idle, "something else");
        state(&mut other, s.id, wire::TraceStatus::Idle, "detached: not finalized (test)");
        state(&mut a, s.id, wire::TraceStatus::Idle, "detached: finalized");
        let t = Instant::now();
        loop {
            let s = c.get_session(pb::GetSessionRequest { session_id: s.id }).await.unwrap().into_inner();
            let m = member(&s);
            if m.detail == "detached: finalized" {
                assert_eq!(m.state, before.state, "a late detach outcome changes the detail only");
                assert_eq!(s.processes.len(), 1, "{s:?}");
                break;
            }
            assert_eq!(m.detail, "detached: finalize pending (at the next CUDA synchronization)");
            assert!(t.elapsed() < Duration::from_secs(5), "detail not updated: {m:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// A daemon in `dir` with `agent` as its `[agent]` settings, started over a hint file (`* all`)
/// left by an earlier daemon; the hint's path.
fn daemon_over_a_stale_hint(dir: &std::path::Path, agent: &str) -> (TestDaemon, std::path::PathBuf) {
    let stale = gpuprof_proto::hint::hint_path(&dir.join("agent.sock"));
    std::fs::write(&stale, "* all\n").unwrap();
    let cfg = dir.join("cfg.toml");
    std::fs::write(&cfg, format!("[agent]\n{agent}\n")).unwrap();
    (TestDaemon::start_with(dir, &["--config", cfg.to_str().unwrap()]).unwrap(), stale)
}

/// The new-process hint next to the agent socket lists the targets of the active sessions that
/// record runtime API calls, and as PC lines those of PC-sampling sessions; it follows sessions
/// starting and stopping, and does not outlive them (nor a daemon that did not remove it).
#[test]
fn new_process_hint_follows_active_sessions() {
    use gpuprof_proto::hint;
    let dir = tempfile::tempdir().unwrap();
    let (d, stale) = daemon_over_a_stale_hint(dir.path(), "api_from_start = true\nlate_attach_hook = false");
    let path = hint::hint_path(&d.agent_socket);
    assert_eq!(path, stale);
    assert!(!path.exists(), "a hint left from before the daemon started is removed");
    let python = hint::Me { pid: 1234, uid: 1000, exe: "/usr/bin/python3".into(), ..Default::default() };
    let trainer = hint::Me {
        pid: 1236,
        uid: 1000,
        exe: "/opt/app/bin/runner".into(),
        cmdline: vec!["runner".into(), "train_llm.yaml".into()],
        ..Default::default()
    };
    let other = hint::Me { pid: 1235, uid: 1000, exe: "/opt/app/server".into(), ..Default::default() };
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        use pb::target::Target as T;
        let mut req = start_req(vec![target(T::ExeName("python3".into())), target(T::ExePattern("*train*".into()))]);
        req.collect = Some(pb::CollectOptions { preset: "default".into(), ..Default::default() });
        let api = c.start_session(req).await.unwrap().into_inner();
        wait_state(&mut c, api.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        let text = std::fs::read_to_string(&path).expect("hint written while a default-preset session is active");
        assert_eq!(text, "* exe_name python3\n* exe_pattern *train*\n");
        assert!(hint::covers(&text, &python) && hint::covers(&text, &trainer) && !hint::covers(&text, &other));

        let mut req = start_req(vec![target(T::All(true))]);
        req.collect = Some(pb::CollectOptions { preset: "kernels".into(), ..Default::default() });
        let kernels = c.start_session(req).await.unwrap().into_inner();
        wait_state(&mut c, kernels.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "* exe_name python3\n* exe_pattern *train*\n",
            "a kernels-only session records no API calls: not published"
        );

        let mut req = start_req(vec![target(T::ExeName("python3".into()))]);
        req.collect = Some(pb::CollectOptions { preset: "pc".into(), pc_sampling: true, ..Default::default() });
        let pc = c.start_session(req).await.unwrap().into_inner();
        wait_state(&mut c, pc.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text, "* exe_name python3\n* exe_pattern *train*\n* pc:exe_name python3\n",
            "a PC-sampling session's targets as PC lines (module loads kept from the start)"
        );
        assert!(hint::asks_pc(&text, &python) && !hint::asks_pc(&text, &trainer));
        c.stop_session(pb::StopSessionRequest { session_id: pc.id }).await.unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "* exe_name python3\n* exe_pattern *train*\n");

        c.stop_session(pb::StopSessionRequest { session_id: api.id }).await.unwrap();
        assert!(!path.exists(), "no active session records API calls: the hint is gone");
        c.stop_session(pb::StopSessionRequest { session_id: kernels.id }).await.unwrap();
    });
}

/// With `agent.late_attach_hook` the hint asks every process to hook the runtime's API
/// callbacks, while no session is active too; the hook line covers no process;
/// the targets of active sessions are added and removed beside it; the daemon removes the file
/// when it stops.
#[test]
fn the_hint_asks_for_the_runtime_hook_when_configured() {
    use gpuprof_proto::hint;
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = daemon_over_a_stale_hint(dir.path(), "late_attach_hook = true");
    let path = hint::hint_path(&d.agent_socket);
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    let wait_for = |want: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while read() != want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(read(), want);
    };
    wait_for("* hook_runtime\n");
    let text = read();
    let x = hint::Me { pid: 1, uid: 0, exe: "/bin/x".into(), ..Default::default() };
    assert!(hint::asks_hook(&text, &x));
    assert!(!hint::covers(&text, &x));
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        let mut req = start_req(vec![target(pb::target::Target::ExeName("trainer".into()))]);
        req.collect = Some(pb::CollectOptions { preset: "default".into(), ..Default::default() });
        let s = c.start_session(req).await.unwrap().into_inner();
        wait_state(&mut c, s.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        wait_for("* hook_runtime\n* exe_name trainer\n");
        c.stop_session(pb::StopSessionRequest { session_id: s.id }).await.unwrap();
    });
    wait_for("* hook_runtime\n");
    assert_eq!(d.terminate().unwrap(), 0);
    assert!(!path.exists(), "the daemon removes the hint when it stops");
}

/// With `agent.api_from_start = false` and `agent.late_attach_hook = false` no hint is published
/// for a session without PC sampling (a PC-sampling session's PC lines are, whatever these say).
#[test]
fn no_new_process_hint_when_switched_off() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg.toml");
    std::fs::write(&cfg, "[agent]\napi_from_start = false\nlate_attach_hook = false\n").unwrap();
    let d = TestDaemon::start_with(dir.path(), &["--config", cfg.to_str().unwrap()]).unwrap();
    let rt = rt();
    rt.block_on(async {
        let mut c = client(&d).await;
        let s = c.start_session(start_req(vec![target(pb::target::Target::All(true))])).await.unwrap().into_inner();
        wait_state(&mut c, s.id, pb::SessionState::Active, Duration::from_secs(5)).await;
        assert!(!gpuprof_proto::hint::hint_path(&d.agent_socket).exists());
    });
}

/// With `agent.late_attach_hook_for` the hint asks only the processes matching one of its
/// entries to hook the runtime, while no session is active too.
#[test]
fn the_hint_asks_matching_processes_for_the_runtime_hook() {
    use gpuprof_proto::hint;
    let dir = tempfile::tempdir().unwrap();
    let (d, _) = daemon_over_a_stale_hint(
        dir.path(),
        "api_from_start = false\nlate_attach_hook_for = [\"exe_pattern:*train*.py\", \"cgroup:kubepods\"]",
    );
    let path = hint::hint_path(&d.agent_socket);
    let want = "* hook:exe_pattern *train*.py\n* hook:cgroup kubepods\n";
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&path).unwrap_or_default() != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(text, want);
    let job = hint::Me {
        exe: "/usr/bin/python3".into(),
        cmdline: vec!["python3".into(), "train_gpt.py".into()],
        ..Default::default()
    };
    let pod =
        hint::Me { exe: "/opt/app/serve".into(), cgroup: "/kubepods/burstable/pod1/c1".into(), ..Default::default() };
    let other = hint::Me {
        exe: "/usr/bin/python3".into(),
        cmdline: vec!["python3".into(), "eval.py".into()],
        ..Default::default()
    };
    assert!(hint::asks_hook(&text, &job) && hint::asks_hook(&text, &pod));
    assert!(!hint::asks_hook(&text, &other), "matches no entry");
    assert!(!hint::covers(&text, &job), "no session awaits it");
    assert_eq!(d.terminate().unwrap(), 0);
    assert!(!path.exists(), "the daemon removes the hint when it stops");
}
