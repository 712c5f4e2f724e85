//! OTLP metrics export end to end: gpuprofd pushes to a Python OTLP/gRPC receiver built from
//! the opentelemetry-proto package and grpcio (tests/python/otlp_receiver.py) over TLS; the GPU
//! resource carries the PM values, the process resource the agent's pid; when the receiver
//! goes away the exports fail and their points are counted as dropped, and nothing else
//! notices.
//!
//! Needs `python3` with `grpcio`, `protobuf` and `opentelemetry-proto`; when they are not
//! importable the test installs them with pip into the target directory first (and fails if
//! it cannot).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

#[path = "../src/fake_sampler.rs"]
mod fake_sampler;

#[path = "../src/expo.rs"]
mod expo;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fake_sampler::{Command as SamplerCommand, FakeSampler, METRICS, value};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, start_session};
use gpuprof_testkit::traced_agent::{TracedAgent, TracedConfig};
use serde_json::Value;

fn python_with_deps() -> (String, PathBuf) {
    gpuprof_testkit::python::with_packages(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "pydeps-otlp",
        "import grpc, google.protobuf, opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc, opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2_grpc",
        &["grpcio", "protobuf", "opentelemetry-proto"],
    )
}

struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(python: &str, pydeps: &Path, out: &Path, tls: (&Path, &Path)) -> Receiver {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/otlp_receiver.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(out)
            .arg("--tls")
            .args([tls.0, tls.1])
            .env("PYTHONPATH", pydeps)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("receiver said {line:?}"));
        Receiver { child, port, out: out.to_path_buf() }
    }

    /// A receiver serving TLS with a fresh self-signed certificate for localhost (written to
    /// `dir`); the certificate's file, for the daemon's `ca_file`.
    fn start_tls(dir: &Path) -> (Receiver, PathBuf) {
        let (python, pydeps) = python_with_deps();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert_file, key_file) = (dir.join("collector.pem"), dir.join("collector.key"));
        std::fs::write(&cert_file, cert.cert.pem()).unwrap();
        std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
        (Receiver::start(&python, &pydeps, &dir.join("received.jsonl"), (&cert_file, &key_file)), cert_file)
    }

    /// The requests received so far.
    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn stop(mut self) {
        drop(self.child.stdin.take());
        self.child.wait().unwrap();
    }
}

/// `attributes` (OTLP JSON) as a map of key → string or integer text.
fn attrs(v: &Value) -> std::collections::BTreeMap<String, String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|kv| {
                    let val = &kv["value"];
                    let text = val["stringValue"].as_str().or(val["intValue"].as_str()).unwrap_or_default();
                    (kv["key"].as_str().unwrap().to_string(), text.to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn scrape(port: u16) -> String {
    expo::scrape(port).expect("scraping /metrics")
}

fn counter(text: &str, name: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[test]
fn exports_to_a_collector_and_counts_drops_when_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (rx, cert_file) = Receiver::start_tls(dir.path());

    let prom = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[sampler]\nspawn = false\nalways_on = true\ndevices = [0]\n[prometheus]\nlisten = \"127.0.0.1:{prom}\"\n\
             [otlp]\nendpoint = \"https://localhost:{}\"\nca_file = \"{}\"\ninterval = \"1s\"\ntimeout = \"2s\"\n",
            rx.port,
            cert_file.display()
        ),
    )
    .unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    let s = FakeSampler::connect(&d.agent_socket, 0).unwrap();
    assert!(matches!(s.command(Duration::from_secs(5)).unwrap(), SamplerCommand::Start { .. }));
    s.wait_sampling(true, Duration::from_secs(2)).unwrap();
    s.send_samples(10).unwrap();
    let agent = TracedAgent::start(&d.agent_socket, TracedConfig::default()).unwrap();

    // Wait for an export that has both the GPU's PM values and the process.
    let want_value = value(1, 9);
    let t = Instant::now();
    let (gpu, proc_res) = loop {
        let reqs = rx.requests();
        let found = reqs.iter().rev().find_map(|r| {
            let rms = r["resourceMetrics"].as_array()?;
            let gpu = rms.iter().find(|rm| attrs(&rm["resource"]["attributes"]).contains_key("gpu.index"))?;
            let pm = &gpu["scopeMetrics"][0]["metrics"][0];
            let has_value = pm["gauge"]["dataPoints"].as_array()?.iter().any(|p| {
                attrs(&p["attributes"]).get("metric").map(String::as_str) == Some(METRICS[1])
                    && p["asDouble"].as_f64() == Some(want_value)
            });
            let proc_res =
                rms.iter().find(|rm| rm["scopeMetrics"][0]["metrics"][0]["name"] == "gpuprof.process.tracing")?;
            has_value.then(|| (gpu.clone(), proc_res.clone()))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(t.elapsed() < Duration::from_secs(15), "no export with PM values in {reqs:#?}\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string();
    let ga = attrs(&gpu["resource"]["attributes"]);
    assert_eq!(ga["host.name"], host);
    assert_eq!(ga["service.name"], "gpuprofd");
    assert_eq!(ga["hw.type"], "gpu");
    assert_eq!(ga["gpu.index"], "0");
    let pa = attrs(&proc_res["resource"]["attributes"]);
    assert_eq!(pa["host.name"], host);
    let point = &proc_res["scopeMetrics"][0]["metrics"][0]["gauge"]["dataPoints"][0];
    assert_eq!(attrs(&point["attributes"])["process.pid"], std::process::id().to_string());
    let sent = counter(&scrape(prom), "gpuprof_otlp_points_sent_total");
    assert!(sent > 0, "{}", scrape(prom));

    // The collector goes away: exports fail, their points are counted, the daemon goes on.
    rx.stop();
    let t = Instant::now();
    while counter(&scrape(prom), "gpuprof_otlp_failed_exports_total") < 2 {
        assert!(t.elapsed() < Duration::from_secs(15), "{}", scrape(prom));
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = scrape(prom);
    assert!(counter(&text, "gpuprof_otlp_points_dropped_total") >= 2 * 3, "{text}");
    s.send_samples(5).unwrap();
    let st = d.status().unwrap();
    assert_eq!(st["connected_agents"], 2, "{st}");
    assert!(d.log_text().contains("OTLP export failed"), "{}", d.log_text());
    agent.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}

#[test]
fn pc_samples_reach_the_collector_as_profiles() {
    let dir = tempfile::tempdir().unwrap();
    let (rx, cert_file) = Receiver::start_tls(dir.path());
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[sampler]\nspawn = false\nalways_on = true\ndevices = [0]\n\
             [otlp]\nendpoint = \"https://localhost:{}\"\nca_file = \"{}\"\ninterval = \"1s\"\ntimeout = \"2s\"\nprofiles = true\n",
            rx.port,
            cert_file.display()
        ),
    )
    .unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1).unwrap();
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    assert!(matches!(a.command(Duration::from_secs(5)).unwrap(), PcCommand::Start(_)));
    a.batch(
        id,
        0,
        &[
            FakePc::new(
                "_Z6gatherPKiPfi",
                0x40,
                "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
                60,
                "/src/k.cu",
                15,
            ),
            FakePc::new("_Z6gatherPKiPfi", 0x40, "smsp__pcsamp_warps_issue_stalled_selected", 7, "/src/k.cu", 15),
        ],
        0,
    )
    .unwrap();
    a.batch(
        id,
        0,
        &[FakePc::new(
            "_Z6gatherPKiPfi",
            0x40,
            "smsp__pcsamp_warps_issue_stalled_long_scoreboard",
            40,
            "/src/k.cu",
            15,
        )],
        0,
    )
    .unwrap();

    // The profiles of every export so far, until they hold all 107 samples.
    let t = Instant::now();
    let (dict, profiles, resource) = loop {
        let reqs: Vec<Value> = rx.requests().into_iter().filter_map(|r| r.get("profiles").cloned()).collect();
        let total: i64 = reqs
            .iter()
            .flat_map(|r| r["resourceProfiles"].as_array().cloned().unwrap_or_default())
            .flat_map(|rp| rp["scopeProfiles"][0]["profiles"].as_array().cloned().unwrap_or_default())
            .flat_map(|p| p["samples"].as_array().cloned().unwrap_or_default())
            .map(|s| s["values"][0].as_str().and_then(|v| v.parse::<i64>().ok()).unwrap_or(0))
            .sum();
        if total == 107 && reqs.len() == 1 {
            let r = &reqs[0];
            let rp = &r["resourceProfiles"][0];
            break (r["dictionary"].clone(), rp["scopeProfiles"][0]["profiles"].clone(), rp["resource"].clone());
        }
        assert!(total <= 107, "samples sent twice: {reqs:#?}");
        assert!(t.elapsed() < Duration::from_secs(15), "profiles so far: {reqs:#?}\n{}", d.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    let strings: Vec<String> =
        dict["stringTable"].as_array().unwrap().iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect();
    let st = |v: &Value| strings[v.as_i64().unwrap_or(0) as usize].clone();
    let p = &profiles[0];
    assert_eq!(
        (st(&p["sampleType"]["typeStrindex"]), st(&p["sampleType"]["unitStrindex"])),
        ("pc_samples".into(), "count".into())
    );
    let mut by_stall = std::collections::BTreeMap::new();
    for s in p["samples"].as_array().unwrap() {
        let stack = &dict["stackTable"][s["stackIndex"].as_u64().unwrap() as usize];
        let loc = &dict["locationTable"][stack["locationIndices"][0].as_u64().unwrap() as usize];
        assert_eq!(loc["address"].as_str(), Some("64"), "the PC offset");
        let line = &loc["lines"][0];
        assert_eq!(line["line"].as_str(), Some("15"));
        let f = &dict["functionTable"][line["functionIndex"].as_u64().unwrap() as usize];
        assert_eq!(st(&f["nameStrindex"]), "gather(int const*, float*, int)");
        assert_eq!(st(&f["systemNameStrindex"]), "_Z6gatherPKiPfi");
        assert_eq!(st(&f["filenameStrindex"]), "/src/k.cu");
        let attr = &dict["attributeTable"][s["attributeIndices"][0].as_u64().unwrap() as usize];
        assert_eq!(st(&attr["keyStrindex"]), "gpu.pc.stall_reason");
        let v: i64 = s["values"][0].as_str().unwrap().parse().unwrap();
        *by_stall.entry(attr["value"]["stringValue"].as_str().unwrap().to_string()).or_insert(0) += v;
    }
    assert_eq!(by_stall.get("stalled_long_scoreboard"), Some(&100), "{by_stall:?}");
    assert_eq!(by_stall.get("stalled_selected"), Some(&7), "{by_stall:?}");
    let ra = attrs(&resource["attributes"]);
    assert_eq!(ra["process.pid"], std::process::id().to_string());
    assert_eq!(ra["process.executable.name"], "pcapp");
    rx.stop();
    assert_eq!(d.terminate().unwrap(), 0);
}
