//! CUPTI PM sampling on demand (`sampler.always_on = false`, the default): the sampler
//! samples only while a `pm watch --source cupti` holds a lease, at the fastest rate asked
//! for; a pause preempts it; the last watcher leaving stops it. A fake sampler on the real
//! agent protocol stands in for `gpuprof-sampler`.
// A test fails by panicking: an unwrap is a failed test with its cause printed.
#![allow(clippy::unwrap_used)]

#[path = "../src/fake_sampler.rs"]
mod fake_sampler;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command as Proc, Stdio};
use std::time::Duration;

use anyhow::Result;
use fake_sampler::{Command, FakeSampler};
use gpuprof_testkit::{TestDaemon, bin_path};

/// A `gpuprofctl pm watch` child, killed and reaped when dropped.
struct Watch(Child);

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn watch(d: &TestDaemon, args: &[&str]) -> Watch {
    let child = Proc::new(bin_path("gpuprofctl"))
        .arg("--socket")
        .arg(&d.api_socket)
        .args(["--json", "pm", "watch", "--gpu", "0", "--downsample", "0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Watch(child)
}

fn next_start(s: &FakeSampler) -> u64 {
    loop {
        match s.command(Duration::from_secs(5)).expect("a command") {
            Command::Start { interval_ns, .. } => return interval_ns,
            Command::Stop { .. } => {}
        }
    }
}

fn next_stop(s: &FakeSampler) -> String {
    loop {
        match s.command(Duration::from_secs(5)).expect("a command") {
            Command::Stop { reason } => return reason,
            Command::Start { .. } => {}
        }
    }
}

#[test]
fn pm_watch_source_cupti_holds_the_sampler_while_it_runs() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[sampler]\nspawn = false\ndevices = [0]\nlease_ttl = \"2s\"\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()])?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    // Nobody asked: the sampler stays idle and the monitor free.
    assert_eq!(s.commands_within(Duration::from_millis(800)), vec![]);
    let st = d.ctl(&["--json", "profile", "--status"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout)?;
    assert!(v[0]["holder"].is_null(), "{v}");

    // A bounded watch at 1 kHz: start, samples with their source, stop when it exits.
    let mut w = watch(&d, &["--source", "cupti", "--rate", "1khz", "--count", "5"]);
    assert_eq!(next_start(&s), 1_000_000);
    s.wait_sampling(true, Duration::from_secs(2))?;
    s.send_samples(5)?;
    let mut text = String::new();
    w.0.stdout.take().unwrap().read_to_string(&mut text)?;
    assert!(w.0.wait()?.success());
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5);
    assert!(lines.iter().all(|l| l["source"] == "cupti_pm"), "{lines:?}");
    let why = next_stop(&s);
    assert!(why.contains("on demand"), "released when its last user went: {why}");
    s.wait_sampling(false, Duration::from_secs(2))?;

    // Two watchers: the faster rate wins; a pause preempts; the lease outlives its TTL while
    // they stay (renewed); the rate falls back when the fast one leaves; the last one stops it.
    let fast = watch(&d, &["--source", "cupti", "--rate", "10khz"]);
    assert_eq!(next_start(&s), 100_000);
    let mut slow = watch(&d, &["--source", "cupti", "--rate", "1khz"]);
    assert_eq!(s.commands_within(Duration::from_millis(500)), vec![], "the faster rate stays");
    let out = d.ctl(&["profile", "--pause", "--gpu", "0", "--reason", "ncu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    next_stop(&s);
    let mut marker = String::new();
    BufReader::new(slow.0.stdout.as_mut().unwrap()).read_line(&mut marker)?;
    assert!(marker.contains("\"paused\":true") && marker.contains("ncu"), "{marker}");
    std::thread::sleep(Duration::from_secs(3)); // longer than lease_ttl
    assert!(d.ctl(&["profile", "--resume", "--gpu", "0"]).status.success());
    assert_eq!(next_start(&s), 100_000, "the lease was renewed while paused");
    drop(fast);
    assert_eq!(next_start(&s), 1_000_000, "back to the remaining watcher's rate");
    drop(slow);
    next_stop(&s);

    // Limits.
    let out = d.ctl(&["pm", "watch", "--source", "cupti", "--rate", "20khz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("10 kHz"));
    let out = d.ctl(&["pm", "watch", "--gpu", "3", "--source", "cupti"]);
    assert!(!out.status.success());
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn a_session_with_pm_rate_holds_the_sampler_while_it_is_active() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[sampler]\nspawn = false\ndevices = [0]\nlease_ttl = \"2s\"\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()])?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    assert_eq!(s.commands_within(Duration::from_millis(500)), vec![]);

    let out = d.ctl(&["--json", "session", "start", "--all", "--pm-rate", "2khz", "--name", "pm"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let id = v["id"].as_u64().unwrap().to_string();
    assert_eq!(next_start(&s), 500_000, "sampling at the session's rate");
    s.wait_sampling(true, Duration::from_secs(2))?;
    let show = d.ctl(&["session", "show", &id]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("CUPTI PM sampling at 2000 Hz"), "{text}");
    let st = d.ctl(&["--json", "profile", "--status"]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout)?;
    assert!(v[0]["holder"].to_string().contains(&format!("session {id}")), "{v}");
    // Longer than lease_ttl: the session renews its hold.
    assert_eq!(s.commands_within(Duration::from_secs(3)), vec![], "held while the session is active");

    assert!(d.ctl(&["session", "stop", &id]).status.success());
    let why = next_stop(&s);
    assert!(why.contains("on demand") || why.contains("last user"), "{why}");
    s.wait_sampling(false, Duration::from_secs(2))?;

    // Out of range: the CLI refuses it (the daemon's own INVALID_ARGUMENT is a unit test).
    let out = d.ctl(&["session", "start", "--all", "--pm-rate", "20khz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("10 kHz"));
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn a_session_with_pm_rate_needs_the_sampler() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[sampler]\nenabled = false\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()])?;
    let out = d.ctl(&["session", "start", "--all", "--pm-rate", "1khz"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pm_sampling_rate_hz") && err.contains("enabled = false"), "{err}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
