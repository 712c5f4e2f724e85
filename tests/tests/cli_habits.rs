//! gpuprofctl behaves like the tools around it: quiet exit 0 when a pipe closes early, exit 5
//! with a hint when the socket is closed to the caller, options every command takes under one
//! heading, `--json` documented per command, errors in gpuprof's words, man pages.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};
use gpuprof_testkit::{TestDaemon, bin_path};

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Runs gpuprofctl on `d` with its stdout a pipe that is already closed.
fn with_closed_stdout(d: &TestDaemon, args: &[&str]) -> Output {
    let mut child = Command::new(bin_path("gpuprofctl"))
        .arg("--socket")
        .arg(&d.api_socket)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let per = 20_000;
    let agent = TracedAgent::start(
        &d.agent_socket,
        TracedConfig { per_session: per, rate: 200_000.0, batch: 500, ..Default::default() },
    )
    .unwrap();
    let out = d.ctl(&["session", "start", "--all", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    assert_eq!(agent.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(id));
    let t = std::time::Instant::now();
    while agent.sent_for(id) < per {
        assert!(t.elapsed() < Duration::from_secs(30), "the agent did not send its records");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = d.ctl(&["session", "stop", &id.to_string()]);
    assert!(out.status.success(), "{}", text(&out));

    let id = id.to_string();
    // The same commands with an open stdout print plenty, so the closed pipe is hit.
    let open = d.ctl(&["query", &id, "--kind", "kernel,memcpy,api", "--limit", "0"]);
    assert!(open.status.success() && open.stdout.len() > 100_000, "{}", text(&open));
    for args in [
        vec!["query", &id, "--kind", "kernel,memcpy,api", "--limit", "0"],
        vec!["query", &id, "--kind", "kernel,memcpy,api", "--limit", "0", "--json"],
        vec!["status"],
        vec!["top", &id],
    ] {
        let o = with_closed_stdout(&d, &args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
        assert!(o.stderr.is_empty(), "{args:?} printed to stderr: {}", text(&o));
    }
    agent.finish().unwrap();
}

#[test]
fn generated_text_and_json_into_a_closed_pipe_end_quietly_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let out = d.ctl(&["session", "start", "--exe", "never-runs", "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    // Completions and the man page are generated whole before they are written (clap_complete
    // panicked on its own failed write); each --json command writes one document.
    for args in [
        &["completions", "bash"][..],
        &["completions", "zsh"],
        &["completions", "fish"],
        &["man"],
        &["--help"],
        &["export", "--help"],
        &["status", "--json"],
        &["session", "list", "--json"],
        &["session", "show", "1", "--json"],
        &["procs", "--json"],
        &["devices", "--json"],
        &["profile", "--status", "--json"],
    ] {
        // Run each a few times: before the fix, a panic came in most runs, not all.
        for _ in 0..3 {
            let o = with_closed_stdout(&d, args);
            assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
            assert!(o.stderr.is_empty(), "{args:?} printed to stderr: {}", text(&o));
        }
        // With an open stdout the same command prints something, so the closed pipe was hit.
        let open = d.ctl(args);
        assert!(open.status.success() && !open.stdout.is_empty(), "{args:?}: {}", text(&open));
    }
    // `man` alone prints gpuprofctl(1) itself.
    let page = String::from_utf8(d.ctl(&["man"]).stdout).unwrap();
    assert!(page.contains(".TH") && page.contains("gpuprofctl\\-query(1)"), "{page}");
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn a_socket_closed_to_the_caller_exits_5_with_the_group_hint() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let mut cmd = Command::new(bin_path("gpuprofctl"));
    cmd.arg("--socket").arg(&d.api_socket).arg("status");
    // Root passes any permission check, so as root run the
    // client as `nobody` (the state directory is 0700); otherwise close the socket to us.
    if running_as_root() {
        cmd.uid(65534).gid(65534);
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&d.api_socket, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{}", text(&o));
    assert!(err.contains("permission denied") && err.contains("`gpuprof` group"), "{err}");
    assert!(!err.contains("is it running"), "{err}");
}

/// Whether this test runs as root (from /proc, no libc call needed).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        == Some("0")
}

#[test]
fn help_groups_the_global_options_and_says_what_json_gives() {
    let ctl = |args: &[&str]| Command::new(bin_path("gpuprofctl")).args(args).output().unwrap();
    let o = ctl(&["session", "list", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    let global = help.find("Global options:").unwrap_or_else(|| panic!("no global heading:\n{help}"));
    for flag in ["--socket", "--addr", "--host", "--ca", "--token-file", "--cert", "--key", "--json"] {
        let at = help.find(&format!("{flag} ")).unwrap_or_else(|| panic!("{flag} missing:\n{help}"));
        assert!(at > global, "{flag} is not under the global heading:\n{help}");
        assert_eq!(help.matches(&format!("  {flag} ")).count(), 1, "{flag} listed once:\n{help}");
    }
    assert!(help.contains("--json: one JSON array"), "{help}");
    let query = String::from_utf8_lossy(&ctl(&["query", "--help"]).stdout).into_owned();
    assert!(query.contains("JSON Lines"), "{query}");
    let watch = String::from_utf8_lossy(&ctl(&["pm", "watch", "--help"]).stdout).into_owned();
    assert!(watch.contains("JSON Lines"), "{watch}");
    // Each command's help speaks of what that command does: several hosts at once is trace's.
    for cmd in [&["query", "--help"][..], &["session", "start", "--help"], &["status", "--help"]] {
        let help = String::from_utf8_lossy(&ctl(cmd).stdout).into_owned();
        assert!(help.contains("--host <HOST:PORT>"), "{cmd:?}:\n{help}");
        assert!(!help.contains("trace` only") && !help.contains("several hosts"), "{cmd:?}:\n{help}");
    }
    let trace = String::from_utf8_lossy(&ctl(&["trace", "--help"]).stdout).into_owned();
    assert!(trace.contains("--host repeated") && trace.contains("several hosts"), "{trace}");
}

#[test]
fn errors_are_in_gpuprofs_words() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let o = d.ctl(&["session", "show", "987654"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(err.starts_with("error: ") && err.contains("987654"), "{err}");
    for tonic_words in ["status:", "message:", "details:", "metadata:", "NotFound"] {
        assert!(!err.contains(tonic_words), "{tonic_words:?} in {err}");
    }
    // A daemon that is not there.
    let o = Command::new(bin_path("gpuprofctl"))
        .arg("--socket")
        .arg(dir.path().join("nothing.sock"))
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("cannot connect to gpuprofd") && !err.contains("status:"), "{err}");
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn man_pages_are_generated_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let o = Command::new(bin_path("gpuprofctl")).arg("man").arg("--out-dir").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    for page in ["gpuprofctl.1", "gpuprofctl-session.1", "gpuprofctl-session-start.1", "gpuprofctl-export.1"] {
        let roff = std::fs::read_to_string(out.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(roff.starts_with(".ie") || roff.contains(".TH"), "{page} is not a man page:\n{roff}");
    }
    let main = std::fs::read_to_string(out.join("gpuprofctl.1")).unwrap();
    assert!(main.contains("gpuprofctl\\-query(1)") && main.contains("socket"), "{main}");
    let help = String::from_utf8(Command::new(bin_path("gpuprofctl")).arg("--help").output().unwrap().stdout).unwrap();
    assert!(help.lines().any(|l| l.trim_start().starts_with("man ")), "man is listed in --help:\n{help}");
}
