//! `gpuprofctl --host A --host B trace`: two real gpuprofd (TLS and a token on TCP, like two
//! nodes), a traced agent on each; one command traces both, summarizes each, and writes one
//! Chrome trace with both hosts' processes.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};
use gpuprof_testkit::{TestDaemon, bin_path};
use serde_json::Value;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn node(dir: &Path, name: &str, port: u16) -> TestDaemon {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "[sampler]\nspawn = false\n[api]\ntcp_listen = \"127.0.0.1:{port}\"\ntls_cert_file = \"{0}/server.pem\"\n\
             tls_key_file = \"{0}/server.key\"\ntoken_file = \"{0}/token\"\n",
            dir.display()
        ),
    )
    .unwrap();
    TestDaemon::start_with(&dir.join(name), &["--config", cfg.to_str().unwrap()]).unwrap()
}

#[test]
fn one_trace_over_two_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()]).unwrap();
    std::fs::write(dir.path().join("server.pem"), cert.cert.pem()).unwrap();
    std::fs::write(dir.path().join("server.key"), cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.path().join("token"), "5b0e1c9a7d3f42e8a6c1b9d0e7f3a2c4\n").unwrap();
    let (p1, p2) = (free_port(), free_port());
    let (d1, d2) = (node(dir.path(), "a", p1), node(dir.path(), "b", p2));
    let cfg = |exe: &str| TracedConfig { exe: exe.into(), rate: 5000.0, ..Default::default() };
    let a1 = TracedAgent::start(&d1.agent_socket, cfg("/usr/bin/trainer-a")).unwrap();
    let a2 = TracedAgent::start(&d2.agent_socket, cfg("/usr/bin/trainer-b")).unwrap();
    let merged = dir.path().join("merged.json");
    let (h1, h2) = (format!("127.0.0.1:{p1}"), format!("127.0.0.1:{p2}"));
    let out = Command::new(bin_path("gpuprofctl"))
        .args(["--host", &h1, "--host", &h2, "--ca"])
        .arg(dir.path().join("server.pem"))
        .arg("--token-file")
        .arg(dir.path().join("token"))
        .args(["--json", "trace", "--all", "--duration", "1s", "-o"])
        .arg(&merged)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}\n{}\n{}", d1.log_text(), d2.log_text());
    let per_host: Value = serde_json::from_slice(&out.stdout).unwrap();
    let per_host = per_host.as_array().unwrap();
    assert_eq!(per_host.len(), 2);
    for (h, r) in [&h1, &h2].iter().zip(per_host) {
        assert_eq!(r["host"], **h);
        assert_eq!(r["session"]["state"], "completed", "{r}");
        assert!(r["session"]["records"].as_u64().unwrap() > 0, "{r}");
    }
    // Both sessions were asked to start at the same instant of the caller's clock, each in its
    // own host's clock; both daemons run on this machine, so their clocks agree to well within
    // a round trip.
    let at_callers =
        |r: &Value| r["session"]["start_at_ns"].as_u64().unwrap() as i64 - r["clock_offset_ns"].as_i64().unwrap();
    assert_eq!(at_callers(&per_host[0]), at_callers(&per_host[1]));
    for r in per_host {
        assert!(r["clock_offset_ns"].as_i64().unwrap().abs() < 100_000_000, "{r}");
    }

    let m: Value = serde_json::from_slice(&std::fs::read(&merged).unwrap()).unwrap();
    assert_eq!(m["otherData"]["gpuprof_hosts"].as_array().unwrap().len(), 2);
    let ev = m["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = ev
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert!(names.iter().any(|n| n.starts_with(&format!("{h1} · ")) && n.contains("trainer-a")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with(&format!("{h2} · ")) && n.contains("trainer-b")), "{names:?}");
    // Each host's processes have pids of their own.
    let pids_of = |host: &str| -> std::collections::BTreeSet<i64> {
        ev.iter()
            .filter(|e| e["name"] == "process_name" && e["args"]["name"].as_str().unwrap().starts_with(host))
            .map(|e| e["pid"].as_i64().unwrap())
            .collect()
    };
    assert!(pids_of(&h1).is_disjoint(&pids_of(&h2)));
    let kernels = ev.iter().filter(|e| e["cat"] == "kernel").count() as u64;
    let recorded: u64 = per_host.iter().map(|r| r["summary"]["kernel_count"].as_u64().unwrap()).sum();
    assert!(recorded > 0, "{per_host:?}");
    assert_eq!(kernels, recorded, "every kernel of both sessions in the merged trace");
    let traced = |out: &std::path::Path| {
        Command::new(bin_path("gpuprofctl"))
            .args(["--host", &h1, "--host", &h2, "--ca"])
            .arg(dir.path().join("server.pem"))
            .arg("--token-file")
            .arg(dir.path().join("token"))
            .args(["trace", "--all", "--duration", "1s", "-o"])
            .arg(out)
            .output()
            .unwrap()
    };
    // The same as one Perfetto trace: each host's process tracks apart, named after it.
    let pftrace = dir.path().join("merged.pftrace");
    let out = traced(&pftrace);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let t = <gpuprof_proto::perfetto::Trace as prost::Message>::decode(std::fs::read(&pftrace).unwrap().as_slice())
        .unwrap();
    let procs: Vec<(i32, String)> = t
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(gpuprof_proto::perfetto::trace_packet::Data::TrackDescriptor(d)) => d.process.clone(),
            _ => None,
        })
        .map(|p| (p.pid.unwrap_or(0), p.process_name.unwrap_or_default()))
        .collect();
    let of = |h: &str| {
        procs.iter().filter(|(_, n)| n.starts_with(&format!("{h} · "))).map(|(pid, _)| *pid).collect::<Vec<_>>()
    };
    assert!(!of(&h1).is_empty() && !of(&h2).is_empty(), "{procs:?}");
    assert!(of(&h1).iter().all(|p| !of(&h2).contains(p)), "{procs:?}");
    let seqs: std::collections::BTreeSet<_> = t.packet.iter().map(|p| p.trusted_packet_sequence_id).collect();
    assert_eq!(seqs.len(), 2, "a packet sequence per host");

    // SQLite is not merged: refused before any session starts.
    let sessions_of = |d: &TestDaemon| {
        String::from_utf8_lossy(&d.ctl(&["--json", "session", "list"]).stdout).matches("\"id\"").count()
    };
    let before = (sessions_of(&d1), sessions_of(&d2));
    assert!(before.0 > 0 && before.1 > 0, "the traced sessions are listed");
    let out = traced(&dir.path().join("merged.sqlite"));
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Perfetto (.pftrace"));
    assert_eq!((sessions_of(&d1), sessions_of(&d2)), before, "no session started");
    a1.finish().unwrap();
    a2.finish().unwrap();
    assert_eq!(d1.terminate().unwrap(), 0);
    assert_eq!(d2.terminate().unwrap(), 0);
}
