//! What gpuprofd says when it starts: the schema's migrations as one line (none when the
//! database is current), one sentence when there is no NVIDIA driver, and one line saying
//! where it listens with the `export` that points gpuprofctl and traced processes there; and
//! `gpuprofctl status` of a daemon that has received nothing: no empty table.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use gpuprof_testkit::TestDaemon;

/// The daemon's log once it holds the ready line (the API answers a moment before the line is
/// written), waiting up to 30 s.
fn log_when_ready(d: &TestDaemon) -> String {
    let t0 = std::time::Instant::now();
    loop {
        let log = d.log_text();
        if log.contains(" ready: ") || t0.elapsed() > std::time::Duration::from_secs(30) {
            return log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The log's lines up to and including the ready line (shutdown's come after it).
fn start_lines(log: &str) -> Vec<String> {
    let lines: Vec<String> = log.lines().map(str::to_string).collect();
    let ready = lines.iter().position(|l| l.contains(" ready: ")).unwrap_or_else(|| panic!("no ready line:\n{log}"));
    lines[..=ready].to_vec()
}

#[test]
fn start_up_says_three_things_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("gpuprofd.toml");
    // A library that is not there: the machine's own driver (if any) cannot change the outcome.
    std::fs::write(&config, "[metrics]\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n").unwrap();
    let args = ["--config", config.to_str().unwrap()];
    let d = TestDaemon::start_logged(&state, &args, &[], &dir.path().join("first.log")).unwrap();
    let log = log_when_ready(&d);
    let lines = start_lines(&log);
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations")).unwrap().count();
    assert!(migrations >= 16);
    let schema: Vec<_> = lines.iter().filter(|l| l.contains("schema")).collect();
    assert_eq!(schema.len(), 1, "{log}");
    assert!(schema[0].ends_with(&format!("database schema created (version {migrations})")), "{log}");
    let driver: Vec<_> = lines.iter().filter(|l| l.contains("NVIDIA driver")).collect();
    assert_eq!(driver.len(), 1, "the missing driver said once:\n{log}");
    assert!(driver[0].contains("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1: "), "{log}");
    assert!(!log.contains("libloading"), "{log}");
    let ready = lines.last().unwrap();
    let want = format!(
        "export GPUPROF_API_SOCKET={} GPUPROF_AGENT_SOCKET={}",
        d.api_socket.display(),
        d.agent_socket.display()
    );
    assert!(ready.ends_with(&want), "{ready}");
    assert!(ready.contains(&format!("API on {}", d.api_socket.display())), "{ready}");
    assert_eq!(lines.len(), 3, "migrations, driver, ready:\n{log}");

    // The export line works as printed: gpuprofctl reaches the daemon through it alone.
    let o = std::process::Command::new(gpuprof_testkit::bin_path("gpuprofctl"))
        .arg("status")
        .env("GPUPROF_API_SOCKET", &d.api_socket)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{status}{}", String::from_utf8_lossy(&o.stderr));
    assert!(!status.contains("KIND") && status.contains("records            none"), "no empty table:\n{status}");
    assert!(status.contains("GPUs               none: no NVIDIA driver found ("), "{status}");
    assert_eq!(d.terminate().unwrap(), 0);

    // Again on the same database: its schema is current, nothing to say about it.
    let d = TestDaemon::start_logged(&state, &args, &[], &dir.path().join("second.log")).unwrap();
    let log = log_when_ready(&d);
    let lines = start_lines(&log);
    assert!(!lines.iter().any(|l| l.contains("schema")), "{log}");
    assert_eq!(lines.len(), 2, "driver, ready:\n{log}");
    assert_eq!(d.terminate().unwrap(), 0);
}
