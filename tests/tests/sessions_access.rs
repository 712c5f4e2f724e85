//! Access control on the api socket by SO_PEERCRED, with real uids: a user sees and controls
//! only their own sessions and processes, and is told why when refused; members of the
//! admin group and root see everything. Needs root (to run clients as other uids).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use std::time::Duration;

use gpuprof_testkit::traced_agent::{Event, TracedConfig, spawn_process};
use gpuprof_testkit::{TestDaemon, bin_path};

const ALICE: u32 = 23_001;
const BOB: u32 = 23_002;
const CAROL: u32 = 23_003;

fn ctl(d: &TestDaemon, uid: u32, gid: u32, args: &[&str]) -> Output {
    Command::new(bin_path("gpuprofctl"))
        .arg("--socket")
        .arg(&d.api_socket)
        .args(args)
        .uid(uid)
        .gid(gid)
        .output()
        .unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A group from /etc/group that nobody in this test has as primary group.
fn admin_group() -> (String, u32) {
    let groups = std::fs::read_to_string("/etc/group").unwrap();
    groups
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let gid: u32 = f.get(2)?.parse().ok()?;
            (gid > 0 && gid < 1000).then(|| (f[0].to_string(), gid))
        })
        .next()
        .expect("a system group in /etc/group")
}

#[test]
#[ignore = "needs root to run clients as other users; .ci/run runs it as root: cargo test -p gpuprof-testkit --test sessions_access -- --ignored"]
fn users_see_and_control_only_their_own_sessions() {
    assert_eq!(unsafe_geteuid(), 0, "this test runs clients as other users: run it as root");
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (group, gid) = admin_group();
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(&cfg, format!("[api]\nsocket_mode = 0o666\nadmin_group = \"{group}\"\n")).unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    std::fs::set_permissions(dir.path().join("state"), std::fs::Permissions::from_mode(0o755)).unwrap();

    let a = spawn_process(&d.agent_socket, &TracedConfig::default(), Some(ALICE)).unwrap();
    let b = spawn_process(&d.agent_socket, &TracedConfig::default(), Some(BOB)).unwrap();

    // Alice traces her process.
    let s = json(&ctl(&d, ALICE, ALICE, &["session", "start", "--pid", &a.pid.to_string(), "--json"]));
    let id = s["id"].as_u64().unwrap().to_string();
    assert_eq!(s["owner_uid"], ALICE);
    assert_eq!(a.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s["id"].as_u64().unwrap()));

    // Bob can neither see nor stop it, nor read its data, and is told why.
    for args in [
        vec!["session", "show", &id],
        vec!["session", "stop", &id],
        vec!["top", &id],
        vec!["query", &id],
        vec!["export", &id, "-o", "/tmp/gpuprof-access-test-should-not-exist.json"],
    ] {
        let o = ctl(&d, BOB, BOB, &args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(5), "{args:?}: {err}");
        assert!(err.contains(&format!("belongs to uid {ALICE}")), "{args:?}: {err}");
        assert!(err.contains(&group), "the message names the admin group: {err}");
    }
    assert!(!std::path::Path::new("/tmp/gpuprof-access-test-should-not-exist.json").exists());
    assert_eq!(json(&ctl(&d, BOB, BOB, &["session", "list", "--json"])).as_array().unwrap().len(), 0);
    // Nor trace Alice's process.
    let o = ctl(&d, BOB, BOB, &["session", "start", "--pid", &a.pid.to_string()]);
    assert_eq!(o.status.code(), Some(5), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("process {} belongs to uid {ALICE}", a.pid)));
    // "All processes" means all of Bob's.
    let bs = json(&ctl(&d, BOB, BOB, &["session", "start", "--all", "--json"]));
    let procs = bs["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{bs}");
    assert_eq!(procs[0]["process_id"], b.process_id);
    let ps = json(&ctl(&d, BOB, BOB, &["procs", "--json"]));
    assert!(ps.as_array().unwrap().iter().all(|p| p["uid"] == BOB), "{ps}");
    assert_eq!(ps.as_array().unwrap().len(), 1);

    // A member of the admin group (here by primary gid) and root see both sessions.
    for (uid, g) in [(CAROL, gid), (0, 0)] {
        let l = json(&ctl(&d, uid, g, &["session", "list", "--json"]));
        assert_eq!(l.as_array().unwrap().len(), 2, "uid {uid}: {l}");
        assert!(ctl(&d, uid, g, &["session", "show", &id]).status.success());
        assert_eq!(json(&ctl(&d, uid, g, &["procs", "--json"])).as_array().unwrap().len(), 2);
    }
    // Carol without the group is an ordinary user.
    assert_eq!(ctl(&d, CAROL, CAROL, &["session", "show", &id]).status.code(), Some(5));

    // Alice stops her own session; Bob's is untouched.
    let done = json(&ctl(&d, ALICE, ALICE, &["session", "stop", &id, "--json"]));
    assert_eq!(done["state"], "completed");
    let bid = bs["id"].as_u64().unwrap().to_string();
    assert_eq!(json(&ctl(&d, BOB, BOB, &["session", "show", &bid, "--json"]))["state"], "active");
    assert!(ctl(&d, BOB, BOB, &["session", "stop", &bid]).status.success());
    a.finish().unwrap();
    b.finish().unwrap();
}

#[allow(unsafe_code)]
fn unsafe_geteuid() -> u32 {
    // Safety: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
