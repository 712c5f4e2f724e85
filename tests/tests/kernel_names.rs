//! Kernel names are shown demangled, `--mangled` shows them as the driver reported them, and
//! a name filter matches either form.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Kernel records of `query ... --json` (JSON Lines).
fn kernels(d: &TestDaemon, args: &[&str]) -> Vec<serde_json::Value> {
    ok(d.ctl(&[&["query", "--json", "--limit", "0"], args].concat()))
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "kernel")
        .collect()
}

#[test]
fn names_are_demangled_mangled_on_request_and_filters_match_either() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let per = 5_000;
    let agent = TracedAgent::start(
        &d.agent_socket,
        TracedConfig { per_session: per, rate: 200_000.0, batch: 500, ..Default::default() },
    )
    .unwrap();
    let id =
        serde_json::from_str::<serde_json::Value>(&ok(d.ctl(&["session", "start", "--all", "--json"]))).unwrap()["id"]
            .as_u64()
            .unwrap();
    assert_eq!(agent.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(id));
    let t = std::time::Instant::now();
    while agent.sent_for(id) < per {
        assert!(t.elapsed() < Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(20));
    }
    ok(d.ctl(&["session", "stop", &id.to_string()]));
    let id = id.to_string();

    // A mangled name is shown demangled, with the reported form beside it; a name that is not
    // mangled (cuBLAS's) is shown as it is.
    let all = kernels(&d, &[&id]);
    assert!(all.len() > 100, "{}", all.len());
    for k in &all {
        let (name, mangled) = (k["name"].as_str().unwrap(), k["mangled_name"].as_str().unwrap());
        if mangled.is_empty() {
            assert!(!name.starts_with("_Z"), "{k}");
        } else {
            assert!(mangled.starts_with("_Z") && !name.starts_with("_Z") && name.contains('('), "{k}");
        }
    }
    assert!(all.iter().any(|k| k["mangled_name"] == ""), "the generator sends unmangled names too");
    let tiny: Vec<_> = all.iter().filter(|k| k["mangled_name"] == "_Z11tiny_kernelPf").collect();
    assert!(!tiny.is_empty());
    assert!(tiny.iter().all(|k| k["name"] == "tiny_kernel(float*)"));

    // Filters: by the demangled name or the mangled one, the same records.
    let by_demangled = kernels(&d, &[&id, "--name", "tiny_kernel(*"]);
    let by_mangled = kernels(&d, &[&id, "--name", "_Z11tiny_kernel*"]);
    assert_eq!(by_demangled.len(), tiny.len());
    assert_eq!(by_mangled, by_demangled);

    // Tables: demangled by default, as reported with --mangled.
    let table = ok(d.ctl(&["query", &id, "--name", "tiny_kernel*", "--limit", "5"]));
    assert!(table.contains("tiny_kernel(float*)") && !table.contains("_Z11tiny_kernelPf"), "{table}");
    let table = ok(d.ctl(&["query", &id, "--name", "tiny_kernel*", "--limit", "5", "--mangled"]));
    assert!(table.contains("_Z11tiny_kernelPf") && !table.contains("tiny_kernel(float*)"), "{table}");

    // The summary: the same, from the rollups.
    let top: serde_json::Value = serde_json::from_str(&ok(d.ctl(&["top", &id, "--json", "--top", "50"]))).unwrap();
    let top_kernels = top["top_kernels"].as_array().unwrap();
    assert!(top_kernels.iter().any(|k| k["name"] == "tiny_kernel(float*)" && k["mangled_name"] == "_Z11tiny_kernelPf"));
    let top = ok(d.ctl(&["top", &id, "--wide"]));
    assert!(top.contains("at::native::") && !top.contains("_ZN2at6native"), "{top}");
    let top = ok(d.ctl(&["top", &id, "--wide", "--mangled"]));
    assert!(top.contains("_ZN2at6native"), "{top}");
    let filtered: serde_json::Value =
        serde_json::from_str(&ok(d.ctl(&["top", &id, "--json", "--name", "_Z11tiny*"]))).unwrap();
    assert_eq!(filtered["top_kernels"].as_array().unwrap().len(), 1, "{filtered}");
    assert_eq!(filtered["kernel_count"].as_u64().unwrap(), tiny.len() as u64);

    // Both forms are stored.
    let db = rusqlite::Connection::open(d.db_path()).unwrap();
    let stored: String =
        db.query_row("SELECT demangled FROM strings WHERE value = '_Z11tiny_kernelPf'", [], |r| r.get(0)).unwrap();
    assert_eq!(stored, "tiny_kernel(float*)");
    agent.finish().unwrap();
}
