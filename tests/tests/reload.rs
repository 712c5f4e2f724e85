//! SIGHUP: a running gpuprofd reads its configuration again, applies what can change while
//! running (here `[retention]`: a finished session expires under the new age), logs what
//! changed and what needs a restart, ignores a file that does not load, and keeps serving;
//! SIGTERM still drains and exits 0.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};

fn wait_for(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sighup_applies_retention_changes_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpuprofd.toml");
    std::fs::write(&config, "[retention]\ninterval = \"100ms\"\nsessions_max_age = \"14d\"\n").unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", config.to_str().unwrap()]).unwrap();

    // A finished session, young enough to be kept under the first settings.
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig { per_session: 1_000, ..Default::default() }).unwrap();
    let out = d.ctl(&["session", "start", "--all", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["id"].as_u64().unwrap();
    assert_eq!(agent.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(id));
    wait_for("records", Duration::from_secs(20), || agent.sent_for(id) >= 1_000);
    let id = id.to_string();
    assert!(d.ctl(&["session", "stop", &id]).status.success());
    std::thread::sleep(Duration::from_millis(1500));
    assert!(d.ctl(&["session", "show", &id]).status.success(), "kept under sessions_max_age = 14d");

    // Reload: retention and the size cap apply at once, [ingest] needs a restart.
    std::fs::write(
        &config,
        "[retention]\ninterval = \"100ms\"\nsessions_max_age = \"1s\"\n[ingest]\nqueue_messages = 17\n\
         [storage]\nmax_database_mib = 4096\n",
    )
    .unwrap();
    d.hangup();
    wait_for("the session expires under the reloaded age", Duration::from_secs(20), || {
        d.ctl(&["session", "show", &id]).status.code() == Some(4)
    });
    assert!(d.status().unwrap()["expired_sessions"].as_u64().unwrap() >= 1);
    let log = d.log_text();
    assert!(log.contains("SIGHUP: configuration reloaded") && log.contains("sessions_max_age"), "{log}");
    assert!(log.contains("storage.max_database_mib 0 -> 4096"), "{log}");
    assert!(log.contains("only take effect when gpuprofd restarts") && log.contains("[ingest]"), "{log}");

    // A file that does not load changes nothing, and the daemon goes on.
    std::fs::write(&config, "[retention]\nsessions_max_age = \"soon\"\n").unwrap();
    d.hangup();
    wait_for("the refusal is logged", Duration::from_secs(10), || {
        d.log_text().contains("SIGHUP: configuration not reloaded")
    });
    assert!(d.ctl(&["status"]).status.success());
    agent.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0, "SIGTERM still drains and exits 0");
}
