//! `gpuprofctl --host A --host B --host C trace`: three real gpuprofd (TLS and a token on TCP,
//! like three nodes), a traced agent on each; one command traces all, summarizes each, and
//! writes one Chrome or Perfetto trace with every host's processes.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};
use gpuprof_testkit::{TestDaemon, bin_path};
use serde_json::Value;

fn free_port() -> u16 {
    gpuprof_testkit::tls_node::free_port().unwrap()
}

fn node(dir: &Path, name: &str, port: u16) -> TestDaemon {
    gpuprof_testkit::tls_node::start_node(dir, name, port).unwrap()
}

/// The server certificate and key (for 127.0.0.1) and the token the nodes share, in `dir`.
fn tls_and_token(dir: &Path) {
    gpuprof_testkit::tls_node::write_tls_and_token(dir).unwrap()
}

#[test]
fn one_trace_over_three_hosts() {
    let dir = tempfile::tempdir().unwrap();
    tls_and_token(dir.path());
    let names = ["a", "b", "c"];
    let ports: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let daemons: Vec<TestDaemon> = names.iter().zip(&ports).map(|(n, p)| node(dir.path(), n, *p)).collect();
    let cfg = |exe: String| TracedConfig { exe, rate: 5000.0, ..Default::default() };
    let agents: Vec<TracedAgent> = names
        .iter()
        .zip(&daemons)
        .map(|(n, d)| TracedAgent::start(&d.agent_socket, cfg(format!("/usr/bin/trainer-{n}"))).unwrap())
        .collect();
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let logs = || daemons.iter().map(|d| d.log_text()).collect::<Vec<_>>().join("\n");
    let gpuprofctl = |args: &[&str], out: &Path| {
        let mut c = Command::new(bin_path("gpuprofctl"));
        for h in &hosts {
            c.args(["--host", h]);
        }
        c.arg("--ca").arg(dir.path().join("server.pem")).arg("--token-file").arg(dir.path().join("token"));
        c.args(args).args(["trace", "--all", "--duration", "1s", "-o"]).arg(out).output().unwrap()
    };
    let merged = dir.path().join("merged.json");
    let out = gpuprofctl(&["--json"], &merged);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}\n{}", logs());
    let per_host: Value = serde_json::from_slice(&out.stdout).unwrap();
    let per_host = per_host.as_array().unwrap();
    assert_eq!(per_host.len(), 3);
    for (h, r) in hosts.iter().zip(per_host) {
        assert_eq!(r["host"], *h);
        assert_eq!(r["session"]["state"], "completed", "{r}");
        assert!(r["session"]["records"].as_u64().unwrap() > 0, "{r}");
    }
    // The sessions were asked to start at the same instant of the caller's clock, each in its
    // own host's clock; the daemons run on this machine, so their clocks agree to well within a
    // round trip.
    let at_callers =
        |r: &Value| r["session"]["start_at_ns"].as_u64().unwrap() as i64 - r["clock_offset_ns"].as_i64().unwrap();
    for r in per_host {
        assert_eq!(at_callers(r), at_callers(&per_host[0]));
        assert!(r["clock_offset_ns"].as_i64().unwrap().abs() < 100_000_000, "{r}");
        // The error bound: half a round trip over the local socket, well under a second.
        assert!(r["clock_error_ns"].as_u64().unwrap() < 1_000_000_000, "{r}");
    }

    let m: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    assert_eq!(m["otherData"]["gpuprof_hosts"].as_array().unwrap().len(), 3);
    for h in m["otherData"]["gpuprof_hosts"].as_array().unwrap() {
        assert!(h["clock_error_ns"].is_u64() && h["clock_offset_ns"].is_i64(), "{h}");
    }
    let ev = m["traceEvents"].as_array().unwrap();
    let procs: Vec<&str> = ev
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    // Each host's processes are named after it and have pids of their own.
    let pids_of = |host: &str| -> std::collections::BTreeSet<i64> {
        ev.iter()
            .filter(|e| e["name"] == "process_name" && e["args"]["name"].as_str().unwrap().starts_with(host))
            .map(|e| e["pid"].as_i64().unwrap())
            .collect()
    };
    for (i, (h, n)) in hosts.iter().zip(names).enumerate() {
        let trainer = format!("trainer-{n}");
        assert!(procs.iter().any(|p| p.starts_with(&format!("{h} · ")) && p.contains(&trainer)), "{procs:?}");
        for other in &hosts[i + 1..] {
            assert!(pids_of(h).is_disjoint(&pids_of(other)));
        }
    }
    let kernels = ev.iter().filter(|e| e["cat"] == "kernel").count() as u64;
    let recorded: u64 = per_host.iter().map(|r| r["summary"]["kernel_count"].as_u64().unwrap()).sum();
    assert!(recorded > 0, "{per_host:?}");
    assert_eq!(kernels, recorded, "every kernel of every session in the merged trace");

    // The same as one Perfetto trace: each host's process tracks apart, named after it.
    let pftrace = dir.path().join("merged.pftrace");
    let out = gpuprofctl(&[], &pftrace);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = <gpuprof_proto::perfetto::Trace as prost::Message>::decode(std::fs::read(&pftrace).unwrap().as_slice())
        .unwrap();
    let tracks: Vec<(i32, String)> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(gpuprof_proto::perfetto::trace_packet::Data::TrackDescriptor(d)) => d.process.clone(),
            _ => None,
        })
        .map(|p| (p.pid.unwrap_or(0), p.process_name.unwrap_or_default()))
        .collect();
    // Each host's clock offset and error bound, as an instant on the clock-alignment track.
    let clock: Vec<String> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(gpuprof_proto::perfetto::trace_packet::Data::TrackEvent(e)) if e.track_uuid == Some(u64::MAX) => {
                e.name.clone()
            }
            _ => None,
        })
        .collect();
    assert_eq!(clock.len(), hosts.len(), "{clock:?}");
    for (h, c) in hosts.iter().zip(&clock) {
        assert!(c.starts_with(&format!("{h}: clock ")) && c.contains(" ms ± ") && c.ends_with(" µs"), "{c}");
    }
    let of = |h: &str| {
        tracks.iter().filter(|(_, n)| n.starts_with(&format!("{h} · "))).map(|(pid, _)| *pid).collect::<Vec<_>>()
    };
    for (i, h) in hosts.iter().enumerate() {
        assert!(!of(h).is_empty(), "{tracks:?}");
        for other in &hosts[i + 1..] {
            assert!(of(h).iter().all(|p| !of(other).contains(p)), "{tracks:?}");
        }
    }
    let seqs: std::collections::BTreeSet<_> = t.packet.iter().map(|p| p.trusted_packet_sequence_id).collect();
    assert_eq!(seqs.len(), 4, "a packet sequence per host, and one for the clock alignment");

    // SQLite is not merged: refused before any session starts.
    let sessions_of = |d: &TestDaemon| {
        String::from_utf8_lossy(&d.ctl(&["--json", "session", "list"]).stdout).matches("\"id\"").count()
    };
    let before: Vec<usize> = daemons.iter().map(sessions_of).collect();
    assert!(before.iter().all(|n| *n > 0), "the traced sessions are listed");
    let out = gpuprofctl(&[], &dir.path().join("merged.sqlite"));
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Perfetto (.pftrace"));
    assert_eq!(daemons.iter().map(sessions_of).collect::<Vec<_>>(), before, "no session started");
    for a in agents {
        a.finish().unwrap();
    }
    for d in daemons {
        assert_eq!(d.terminate().unwrap(), 0);
    }
}

/// A host that is unreachable for a moment during the trace (its daemon killed and started
/// again) does not end the command: the polls that fail are retried, and the restarted daemon
/// reports the session it lost as interrupted.
#[test]
fn a_host_unreachable_for_a_moment_does_not_end_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    tls_and_token(dir.path());
    let ports = [free_port(), free_port()];
    let a = node(dir.path(), "a", ports[0]);
    let b = node(dir.path(), "b", ports[1]);
    let mut c = Command::new(bin_path("gpuprofctl"));
    for p in ports {
        c.args(["--host", &format!("127.0.0.1:{p}")]);
    }
    c.arg("--ca").arg(dir.path().join("server.pem")).arg("--token-file").arg(dir.path().join("token"));
    c.args(["--json", "trace", "--all", "--duration", "4s"]);
    let child = c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Sessions start a second after the command; kill b while they run, then start it again
    // on the same port and state directory.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    b.kill9();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let b = node(dir.path(), "b", ports[1]);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}\n{}\n{}", a.log_text(), b.log_text());
    let per_host: Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<&str> =
        per_host.as_array().unwrap().iter().map(|r| r["session"]["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["completed", "interrupted"], "{per_host}");
    assert_eq!(a.terminate().unwrap(), 0);
    assert_eq!(b.terminate().unwrap(), 0);
}
