//! The node's always-on PC profile (`[pc] always_on`) end to end without a GPU: a real
//! `gpuprofd` that starts the profile itself, fake injectors that work on GPUs (or not), PC
//! samples rolled up and read back with `gpuprofctl pc top --since`, and a session that takes
//! a process from the profile and gives it back when it ends.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_proto::agent::{PcMode, PcSamplingStatus};
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, ctl_ok, show, start_daemon_config, start_session};
use serde_json::Value;

const CONFIG: &str = "[pc]\nalways_on = true\nturn = \"300ms\"\nmax_wait = \"1s\"\nactive_for = \"1s\"\n";
const STALL: &str = "smsp__pcsamp_warps_issue_stalled_long_scoreboard";

/// Answers `a`'s commands until a StartPcSampling of `session` on `device` arrives (10 s at
/// most): starts are acknowledged (SAMPLING), stops confirmed (STOPPED). Returns the start.
fn until_started(a: &PcAgent, session: impl Fn(u64) -> bool, device: u32) -> gpuprof_proto::agent::StartPcSampling {
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(10), "no StartPcSampling on device {device}");
        match a.try_command(Duration::from_millis(20)) {
            Some(PcCommand::Start(s)) => {
                a.state(s.session_id, s.device_id, PcSamplingStatus::Sampling, "", 0).unwrap();
                if session(s.session_id) && s.device_id == device {
                    return s;
                }
            }
            Some(PcCommand::Stop(s)) => {
                a.state(s.session_id, s.device_id, PcSamplingStatus::Stopped, "lease revoked", 0).unwrap();
            }
            None => {}
        }
    }
}

fn top(d: &gpuprof_testkit::TestDaemon, args: &[&str]) -> Value {
    let mut a = vec!["--json", "pc", "top"];
    a.extend_from_slice(args);
    serde_json::from_str(&ctl_ok(d, &a)).unwrap()
}

fn members(d: &gpuprof_testkit::TestDaemon, session: u64) -> Vec<u64> {
    show(d, session)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] != "stopped" && p["state"] != "exited")
        .map(|p| p["process_id"].as_u64().unwrap())
        .collect()
}

#[test]
fn the_always_on_profile_samples_every_gpu_process_and_yields_to_sessions() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon_config(dir.path(), "0, 1", CONFIG)?;
    let mut trainer = PcAgent::connect(&d.agent_socket, "/opt/app/trainer", 1)?;
    trainer.work_on(&[0]);
    let mut server = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 2)?;
    server.work_on(&[1]);
    let launcher = PcAgent::connect(&d.agent_socket, "/usr/bin/launcher", 2)?;
    launcher.work_on(&[]);

    // Without any session started by a user, both working processes are sampled, in windows.
    let s0 = until_started(&trainer, |_| true, 0);
    let node = s0.session_id;
    assert_eq!(s0.mode, PcMode::Windows as i32, "{s0:?}");
    let s1 = until_started(&server, |s| s == node, 1);
    assert_eq!(s1.mode, PcMode::Windows as i32);
    let list = ctl_ok(&d, &["session", "list"]);
    assert!(list.contains("always-on PC profile"), "{list}");
    // The profile puts no PC line in the new-process hint: its `all` would have every CUDA
    // process keep its cubins from cuInit on.
    let hint = std::fs::read_to_string(gpuprof_proto::hint::hint_path(&d.agent_socket)).unwrap_or_default();
    assert!(!hint.contains("pc:"), "{hint}");
    let cfg = trainer.last_trace_config().unwrap();
    assert!(cfg.activity_off && !cfg.kernels, "PC samples only: {cfg:?}");
    // The launcher never touched a GPU: it is in the profile but never sampled.
    assert!(launcher.try_command(Duration::from_millis(300)).is_none());

    trainer.batch(node, 0, &[FakePc::new("_Z6gatherPfS_", 0x40, STALL, 500, "pc_kernel.cu", 15)], 3)?;
    server.batch(node, 1, &[FakePc::new("_Z4axpyPf", 0x80, "smsp__pcsamp_warps_issue_selected", 100, "", 0)], 0)?;
    let t = Instant::now();
    let all = loop {
        let v = top(&d, &["--since", "10m", "--by", "line"]);
        if v["total_samples"] == 600 || t.elapsed() > Duration::from_secs(10) {
            break v;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(all["total_samples"], 600, "{all}");
    assert_eq!(all["dropped_samples"], 3, "{all}");
    let hot = &all["rows"][0];
    assert_eq!(
        (hot["function"].as_str(), hot["file"].as_str(), hot["line"].as_u64()),
        (Some("gather(float*, float*)"), Some("pc_kernel.cu"), Some(15)),
        "{all}"
    );
    // Filters: by executable, by pod (these processes are in none), by function.
    assert_eq!(top(&d, &["--since", "10m", "--exe", "trainer"])["total_samples"], 500);
    assert_eq!(top(&d, &["--since", "10m", "--exe", "/usr/bin/pyth*"])["total_samples"], 100);
    assert_eq!(top(&d, &["--since", "10m", "--pod", "web-*"])["total_samples"], 0);
    assert_eq!(top(&d, &["--since", "10m", "--kernel", "axpy*"])["total_samples"], 100);
    let text = ctl_ok(&d, &["pc", "top", "--since", "1h"]);
    assert!(text.contains("always-on profile, last 1h") && text.contains("gather"), "{text}");
    // ... and as a flame graph: function, line, stall reason.
    let svg_path = dir.path().join("node.svg");
    ctl_ok(&d, &["pc", "top", "--since", "1h", "--svg", svg_path.to_str().unwrap()]);
    let svg = std::fs::read_to_string(&svg_path)?;
    assert!(svg.starts_with("<?xml") && svg.contains("600 PC samples"), "{}", &svg[..svg.len().min(300)]);
    for frame in ["gather(float*, float*)", "pc_kernel.cu:15", "stalled_long_scoreboard", "axpy(float*)"] {
        assert!(svg.contains(frame), "{frame} missing from the flame graph");
    }
    // Wrong combinations are refused with a reason.
    let out = d.ctl(&["pc", "top", &node.to_string(), "--since", "1h"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
    let out = d.ctl(&["pc", "top", "--pod", "x"]);
    assert!(!out.status.success(), "--pod needs --since");

    // A session that wants the trainer takes it from the profile ...
    assert!(members(&d, node).contains(&trainer.process_id));
    let user = start_session(&d, &["--exe", "trainer", "--pc-sampling"]);
    assert_ne!(user, node);
    let s = until_started(&trainer, |s| s == user, 0);
    assert_eq!(s.session_id, user);
    assert!(!members(&d, node).contains(&trainer.process_id), "{}", show(&d, node));
    assert!(members(&d, node).contains(&server.process_id), "the others stay");
    trainer.batch(user, 0, &[FakePc::new("_Z6gatherPfS_", 0x40, STALL, 70, "pc_kernel.cu", 15)], 0)?;
    // ... its samples are the session's, not the profile's ...
    let t = Instant::now();
    while top(&d, &[&user.to_string()])["total_samples"] != 70 {
        assert!(t.elapsed() < Duration::from_secs(10), "the session's samples never showed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(top(&d, &["--since", "10m"])["total_samples"], 600);
    // ... and gives it back when it ends.
    ctl_ok(&d, &["session", "stop", &user.to_string()]);
    let back = until_started(&trainer, |s| s == node, 0);
    assert_eq!(back.session_id, node);
    assert!(members(&d, node).contains(&trainer.process_id));

    // A process that exits is forgotten by the profile (it lives for weeks).
    server.goodbye()?;
    let t = Instant::now();
    while show(&d, node)["processes"].as_array().unwrap().iter().any(|p| p["process_id"] == server.process_id) {
        assert!(t.elapsed() < Duration::from_secs(10), "{}", show(&d, node));
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn without_always_on_no_process_is_traced_until_a_session_asks() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon_config(dir.path(), "0", "")?;
    let a = PcAgent::connect(&d.agent_socket, "/opt/app/trainer", 1)?;
    std::thread::sleep(Duration::from_millis(1500));
    assert!(a.last_trace_config().is_none(), "no StartTrace without a session");
    assert!(a.try_command(Duration::from_millis(100)).is_none());
    let v = top(&d, &["--since", "1h"]);
    assert_eq!(v["total_samples"], 0);
    let text = ctl_ok(&d, &["pc", "top", "--since", "1h"]);
    assert!(text.contains("is [pc] always_on set"), "{text}");
    Ok(())
}

#[test]
fn a_pid_target_covers_the_processes_a_launcher_started() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon_config(dir.path(), "0", "")?;
    let rank = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 1)?;
    // The fake agents run in this test's process: its parent stands for their launcher.
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", std::process::id()))?;
    let parent: u32 = stat.rsplit_once(')').unwrap().1.split_whitespace().nth(1).unwrap().parse()?;
    let id = start_session(&d, &["--pid", &parent.to_string(), "--pc-sampling"]);
    let s = until_started(&rank, |s| s == id, 0);
    assert_eq!(s.session_id, id);
    assert_eq!(members(&d, id), [rank.process_id]);
    Ok(())
}
