//! PC sampling in sessions, end to end without a GPU: a real `gpuprofd`, fake injectors that
//! answer StartPcSampling/StopPcSampling and send PC-sampling states and cubins, and the
//! `gpuprofctl` CLI. Leases: granted at join, preempted by a pause and granted again after it,
//! waiting behind a pause at start, handed back on hardware busy, at stop and at disconnect.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_proto::agent::{CubinChunk, PcSamplingStatus, agent_message::Msg};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::pc_agent::{
    FakePc, PcAgent, PcCommand, ctl_ok, pc_state, show, start_daemon, start_daemon_managing, start_session,
    wait_pc_state,
};

fn holder_kind(d: &TestDaemon, gpu: usize) -> String {
    let r: serde_json::Value = serde_json::from_str(&ctl_ok(d, &["--json", "profile", "--status"])).unwrap();
    r[gpu]["holder"]["holder_kind"].as_str().unwrap_or("").to_string()
}

fn start_cmd(c: PcCommand) -> gpuprof_proto::agent::StartPcSampling {
    match c {
        PcCommand::Start(s) => s,
        other => panic!("expected StartPcSampling, got {other:?}"),
    }
}

fn stop_cmd(c: PcCommand) -> gpuprof_proto::agent::StopPcSampling {
    match c {
        PcCommand::Stop(s) => s,
        other => panic!("expected StopPcSampling, got {other:?}"),
    }
}

#[test]
fn session_options_reach_the_agent_and_the_lease_follows_pause_resume_and_hardware_busy() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(
        &d,
        &[
            "--exe",
            "pcapp",
            "--pc-sampling",
            "--pc-period",
            "12",
            "--pc-stall",
            "smsp__pcsamp_warps_issue_stalled_barrier,stalled_long_scoreboard",
            "--pc-flush-ms",
            "200",
        ],
    );
    let st = start_cmd(a.command(Duration::from_secs(5))?);
    assert_eq!((st.session_id, st.device_id, st.period_log2, st.flush_interval_ms), (id, 0, 12, 200));
    assert_eq!(st.stall_reasons, ["stalled_barrier", "stalled_long_scoreboard"]);
    assert_eq!(wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling"), "sampling");
    assert_eq!(holder_kind(&d, 0), "pc_sampling", "PC sampling preempts the background PM sampler");
    a.state(id, 0, PcSamplingStatus::Sampling, "", 0)?;

    // A pause takes the GPU: StopPcSampling, and the state says why.
    let t = Instant::now();
    ctl_ok(&d, &["profile", "--pause", "--gpu", "0", "--for", "60s", "--reason", "ncu run"]);
    let stop = stop_cmd(a.command(Duration::from_secs(2))?);
    let stop_latency = t.elapsed();
    assert_eq!((stop.session_id, stop.device_id), (id, 0));
    assert!(stop.reason.contains("preempted"), "{stop:?}");
    let s = wait_pc_state(&d, id, a.process_id, 0, |s| s.starts_with("preempted"));
    assert!(s.contains("pause by uid") && s.contains("ncu run"), "{s}");
    // The agent's own STOPPED does not hide why.
    a.state(id, 0, PcSamplingStatus::Stopped, "lease revoked", 0)?;
    std::thread::sleep(Duration::from_millis(200));
    assert!(pc_state(&d, id, a.process_id, 0).0.starts_with("preempted"));
    assert_eq!(holder_kind(&d, 0), "pause");

    // The pause ends: StartPcSampling again, with the same options.
    ctl_ok(&d, &["profile", "--resume", "--gpu", "0"]);
    let again = start_cmd(a.command(Duration::from_secs(2))?);
    assert_eq!(again, st);
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");
    a.state(id, 0, PcSamplingStatus::Healed, "hardware buffer full; re-enabled", 2)?;

    // An outside profiler holds the hardware: shown, and the lease goes back.
    a.state(id, 0, PcSamplingStatus::HardwareBusy, "CUPTI_ERROR_HARDWARE_BUSY (ncu, pid 99)", 0)?;
    let s = wait_pc_state(&d, id, a.process_id, 0, |s| s.starts_with("hardware busy"));
    assert!(s.contains("ncu, pid 99"), "{s}");
    assert_ne!(holder_kind(&d, 0), "pc_sampling");
    assert_eq!(pc_state(&d, id, a.process_id, 0).1["heals"], 2);
    let text = ctl_ok(&d, &["session", "show", &id.to_string()]);
    assert!(text.contains("PC sampling") && text.contains("hardware busy"), "{text}");
    assert!(text.contains("period 2^12 cycles, flush 200 ms"), "{text}");

    ctl_ok(&d, &["session", "stop", &id.to_string()]);
    // Kept for the finished session.
    assert!(pc_state(&d, id, a.process_id, 0).0.starts_with("hardware busy"));
    eprintln!("StopPcSampling {stop_latency:?} after the pause");
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn stop_hands_every_lease_back_and_show_keeps_the_totals() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 2)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    let mut devices: Vec<u32> =
        (0..2).map(|_| start_cmd(a.command(Duration::from_secs(5)).unwrap()).device_id).collect();
    devices.sort();
    assert_eq!(devices, [0, 1]);
    let st = |f: &str, n| FakePc::new(f, 0x40, "smsp__pcsamp_warps_issue_stalled_barrier", n, "", 0);
    a.batch(id, 0, &[st("_Z1kv", 60), st("_Z1jv", 40)], 5)?;
    a.batch(id, 1, &[st("_Z1kv", 10)], 0)?;
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");
    ctl_ok(&d, &["session", "stop", &id.to_string()]);
    let mut stopped: Vec<u32> =
        (0..2).map(|_| stop_cmd(a.command(Duration::from_secs(5)).unwrap()).device_id).collect();
    stopped.sort();
    assert_eq!(stopped, [0, 1]);
    let s = show(&d, id);
    assert_eq!(s["state"], "completed");
    let pcs = &s["processes"][0]["pc_sampling"];
    assert_eq!(pcs[0]["state"], "stopped");
    assert_eq!((pcs[0]["samples"].as_u64(), pcs[0]["dropped"].as_u64()), (Some(105), Some(5)));
    assert_eq!(pcs[1]["samples"], 10);
    assert_eq!((holder_kind(&d, 0), holder_kind(&d, 1)), ("sampler".into(), "sampler".into()));
    a.goodbye()?;
    // The same after a restart, from the database.
    assert_eq!(d.terminate()?, 0);
    let d = start_daemon(dir.path())?;
    assert_eq!(show(&d, id)["processes"][0]["pc_sampling"][0]["samples"], 105);
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn a_pause_at_start_makes_the_lease_wait_and_a_disconnect_hands_it_back() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    ctl_ok(&d, &["profile", "--pause", "--gpu", "0", "--for", "60s", "--reason", "maintenance"]);
    let a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    let s = wait_pc_state(&d, id, a.process_id, 0, |s| s.starts_with("waiting for the lease"));
    assert!(s.starts_with("waiting for the lease (held by pause by uid"), "{s}");
    assert!(s.contains("maintenance"), "{s}");
    assert!(a.try_command(Duration::from_millis(300)).is_none(), "no StartPcSampling while paused");
    // Traced all the same.
    let t = Instant::now();
    while show(&d, id)["processes"][0]["state"] != "tracing" {
        assert!(t.elapsed() < Duration::from_secs(5), "traced without PC sampling: {}", show(&d, id));
        std::thread::sleep(Duration::from_millis(50));
    }
    ctl_ok(&d, &["profile", "--resume", "--gpu", "0"]);
    assert_eq!(start_cmd(a.command(Duration::from_secs(2))?).session_id, id);
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");
    assert_eq!(holder_kind(&d, 0), "pc_sampling");
    a.goodbye()?;
    let s = wait_pc_state(&d, id, a.process_id, 0, |s| s != "sampling");
    assert_eq!(s, "stopped (process left)");
    let t = Instant::now();
    while holder_kind(&d, 0) != "sampler" {
        assert!(t.elapsed() < Duration::from_secs(5), "the lease went back to the PM sampler");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn an_unmanaged_gpu_gets_no_lease_and_a_displaced_process_gives_its_lease_back() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon_managing(dir.path(), "0")?;
    let a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 2)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    assert_eq!(start_cmd(a.command(Duration::from_secs(5))?).device_id, 0);
    let s = wait_pc_state(&d, id, a.process_id, 1, |s| !s.is_empty());
    assert_eq!(s, "no lease (GPU 1 is not managed by this gpuprofd (managed: [0]))");
    assert!(a.try_command(Duration::from_millis(300)).is_none(), "nothing for GPU 1");
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");
    // A process that turns out not traceable (another profiler holds CUPTI) gives the GPU back.
    a.raw(Msg::TraceState(gpuprof_proto::agent::TraceState {
        status: gpuprof_proto::agent::TraceStatus::Displaced as i32,
        session_id: id,
        detail: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED".into(),
    }))?;
    assert_eq!(stop_cmd(a.command(Duration::from_secs(5))?).device_id, 0);
    assert_eq!(wait_pc_state(&d, id, a.process_id, 0, |s| s != "sampling"), "stopped (process displaced)");
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

fn cubins(d: &TestDaemon) -> Vec<(String, i64, Vec<u8>)> {
    let c = rusqlite::Connection::open_with_flags(d.db_path(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut st = c.prepare("SELECT hash, size, data FROM cubins ORDER BY hash").unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).unwrap().collect::<Result<_, _>>().unwrap()
}

#[test]
fn cubins_are_stored_once_and_a_bad_piece_closes_only_its_connection() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let data: Vec<u8> = (0..(2 << 20) + 12345u32).map(|i| (i * 7 % 251) as u8).collect();
    let a1 = PcAgent::connect(&d.agent_socket, "/usr/bin/app1", 1)?;
    let a2 = PcAgent::connect(&d.agent_socket, "/usr/bin/app2", 1)?;
    a1.cubin("00ff00ff00ff00ff", &data, 1 << 20)?;
    a2.cubin("00ff00ff00ff00ff", &data, 700_000)?;
    a2.cubin("0123456789ABCDEF", b"small cubin", 4)?;
    let t = Instant::now();
    let stored = loop {
        let v = cubins(&d);
        if v.len() == 2 {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "cubins stored: {}", v.len());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(stored[0].0, "00ff00ff00ff00ff");
    assert_eq!((stored[0].1, &stored[0].2), (data.len() as i64, &data));
    assert_eq!(stored[1].2, b"small cubin");

    let piece = |hash: &str, size: u64, offset: u64, data: &[u8]| {
        Msg::Cubin(CubinChunk { hash: hash.into(), size, offset, data: data.to_vec() })
    };
    let bad = [
        piece("not-hex-at-all!!", 4, 0, b"abcd"),
        piece("00ff00ff", 4, 0, b"abcd"),
        piece("1111111111111111", 4, 2, b"abcd"),
        piece("2222222222222222", (256 << 20) + 1, 0, b"abcd"),
        // Other PC-sampling messages that break the rules close the connection the same way.
        Msg::PcSamples(gpuprof_proto::agent::PcSampleBatch {
            session_id: 1,
            samples: vec![gpuprof_proto::agent::PcSample { file_id: 999, count: 1, ..Default::default() }],
            ..Default::default()
        }),
        Msg::PcSamplingState(gpuprof_proto::agent::PcSamplingState { session_id: 1, status: 99, ..Default::default() }),
    ];
    for (i, m) in bad.into_iter().enumerate() {
        let b = PcAgent::connect(&d.agent_socket, "/usr/bin/bad", 1)?;
        b.raw(m)?;
        assert!(b.wait_closed(Duration::from_secs(5)), "bad piece {i} closes its connection");
        d.wait_status("protocol error counted", |s| s["protocol_errors"] == i as u64 + 1);
    }
    assert!(!a1.is_closed() && !a2.is_closed(), "other connections are unaffected");
    let log = d.log_text();
    assert!(log.contains("is not 16 hex digits") && log.contains("goes past its size"), "{log}");
    assert!(log.contains("string id 999, which was never defined") && log.contains("unknown PC sampling status 99"));
    assert_eq!(cubins(&d).len(), 2);
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

fn ctl_err(d: &TestDaemon, args: &[&str]) -> (i32, String) {
    let out = d.ctl(args);
    assert!(!out.status.success(), "gpuprofctl {args:?} should fail");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_pc_options_are_refused_with_what_to_change() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    for (args, want) in [
        (vec!["--pc-period", "4"], "collect.pc_sampling_period_log2: 4 is outside 5..31"),
        (vec!["--pc-period", "32"], "outside 5..31"),
        (vec!["--pc-flush-ms", "50"], "collect.pc_flush_interval_ms: 50 ms is outside 100..60000"),
        (vec!["--pc-stall", "long scoreboard"], "is not a stall reason name"),
    ] {
        let mut a = vec!["session", "start", "--all", "--pc-sampling"];
        a.extend(args);
        let (code, err) = ctl_err(&d, &a);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{a:?}: {err}");
    }
    let id = start_session(&d, &["--all"]).to_string();
    let (code, err) = ctl_err(&d, &["pc", "top", &id, "--limit", "10001"]);
    assert!(code == 2 && err.contains("limit: 10001 is above the maximum of 10000"), "{err}");
    let (code, err) = ctl_err(&d, &["pc", "top", &id, "--kernel", "[abc"]);
    assert!(code == 2 && err.contains("kernel"), "{err}");
    let (code, err) = ctl_err(&d, &["pc", "top", "999"]);
    assert_eq!(code, 4, "{err}");
    let out = ctl_ok(&d, &["pc", "top", &id]);
    assert!(out.contains("no PC samples"), "{out}");
    let (_, err) = ctl_err(&d, &["export", &id, "-o", dir.path().join("p.pb.gz").to_str().unwrap_or("")]);
    assert!(err.contains("has no PC samples"), "{err}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn preset_pc_traces_no_activity_and_needs_pc_sampling() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let out = d.ctl(&["session", "start", "--exe", "pcapp", "--preset", "pc"]);
    assert_eq!(out.status.code(), Some(2), "INVALID_ARGUMENT without --pc-sampling");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pc-sampling"), "{}", String::from_utf8_lossy(&out.stderr));
    let a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(&d, &["--exe", "pcapp", "--preset", "pc", "--pc-sampling"]);
    let st = start_cmd(a.command(Duration::from_secs(5))?);
    assert_eq!(st.session_id, id);
    let t = a.last_trace_config().expect("a StartTrace before the lease");
    assert!(t.activity_off && !t.kernels && !t.runtime_api && !t.memcpy, "{t:?}");
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn pc_sampling_stopped_by_an_outside_profiler_asks_again_later() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(&cfg, "[sampler]\nspawn = false\nalways_on = true\ndevices = [0]\npc_busy_retry = \"1s\"\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()])?;
    let a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    start_cmd(a.command(Duration::from_secs(5))?);
    a.state(id, 0, PcSamplingStatus::Sampling, "", 0)?;
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");
    let t = Instant::now();
    a.state(id, 0, PcSamplingStatus::HardwareBusy, "CUPTI_ERROR_HARDWARE_BUSY", 0)?;
    wait_pc_state(&d, id, a.process_id, 0, |s| s.starts_with("hardware busy"));
    // pc_busy_retry later the lease is asked for again and granted: a new start (after the
    // stop that handed the lease back).
    let again = loop {
        match a.command(Duration::from_secs(5))? {
            PcCommand::Start(s) => break s,
            PcCommand::Stop(_) => {}
        }
    };
    assert!(t.elapsed() >= Duration::from_millis(900), "asked again after {:?}", t.elapsed());
    assert_eq!((again.session_id, again.device_id), (id, 0));
    a.state(id, 0, PcSamplingStatus::Sampling, "", 0)?;
    assert_eq!(wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling"), "sampling");
    assert_eq!(holder_kind(&d, 0), "pc_sampling");
    // Once the session stops nothing asks again.
    a.state(id, 0, PcSamplingStatus::HardwareBusy, "CUPTI_ERROR_HARDWARE_BUSY", 0)?;
    wait_pc_state(&d, id, a.process_id, 0, |s| s.starts_with("hardware busy"));
    ctl_ok(&d, &["session", "stop", &id.to_string()]);
    while let Some(c) = a.try_command(Duration::from_millis(1500)) {
        assert!(!matches!(c, PcCommand::Start(_)), "no start after the session stopped: {c:?}");
    }
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
