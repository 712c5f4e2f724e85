//! The Grafana dashboard in `deploy/grafana/`: well-formed (JSON, the data source variable used
//! by every panel and query, the host, GPU and pod variables, panel ids and positions), and
//! every metric its queries and variables read is served by a real `gpuprofd` (scripted NVML,
//! a CUDA process traced and PC-sampled), whose scrape promtool checks.
// A test fails by panicking: an unwrap is a failed test with its cause printed.
#![allow(clippy::unwrap_used)]

#[path = "../src/expo.rs"]
mod expo;
#[path = "../src/promql.rs"]
mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use gpuprof_testkit::pc_agent::{PcAgent, start_daemon_config, start_session, wait_pc_state};
use serde_json::Value;

fn dashboard() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/gpuprof.json");
    let text = std::fs::read_to_string(&p).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every panel, those inside collapsed rows included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// (panel title, expression) of every query.
fn expressions(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((p["title"].as_str().unwrap_or_default().to_string(), t["expr"].as_str().unwrap().to_string()));
        }
    }
    out
}

fn variable_query(v: &Value) -> &str {
    v["query"].as_str().or_else(|| v["query"]["query"].as_str()).unwrap()
}

/// Metric name → the panels or variables that read it.
fn metrics_read(d: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (title, e) in expressions(d) {
        for m in promql::metric_names(&e).unwrap_or_else(|err| panic!("{title}: {err}: {e}")) {
            out.entry(m).or_default().insert(title.clone());
        }
    }
    for v in d["templating"]["list"].as_array().unwrap().iter().filter(|v| v["type"] == "query") {
        let q = variable_query(v);
        for m in promql::variable_metric_names(q).unwrap_or_else(|err| panic!("variable {}: {err}", v["name"])) {
            out.entry(m).or_default().insert(format!("${}", v["name"].as_str().unwrap()));
        }
    }
    out
}

#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()) && d["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(d["schemaVersion"].as_u64().unwrap() >= 36, "a Grafana 10 dashboard");
    assert!(d.get("__inputs").is_none(), "the data source is a variable, not an import input");
    let vars = d["templating"]["list"].as_array().unwrap();
    let names: Vec<&str> = vars.iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["datasource", "host", "gpu", "pod"]);
    assert_eq!((&vars[0]["type"], &vars[0]["query"]), (&Value::from("datasource"), &Value::from("prometheus")));
    let ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    for (v, label) in vars[1..].iter().zip(["Hostname", "gpu", "pod"]) {
        assert_eq!(v["type"], "query", "{v}");
        assert_eq!(v["datasource"], ds, "{v}");
        let q = variable_query(v);
        assert!(q.starts_with("label_values(") && q.ends_with(&format!(", {label})")), "{q}");
        assert_eq!(
            (&v["includeAll"], &v["multi"], &v["allValue"]),
            (&Value::from(true), &Value::from(true), &Value::from(".*"))
        );
    }
    let defined: BTreeSet<&str> = names.iter().copied().collect();
    let builtin = ["__rate_interval", "__range", "__interval"];
    let (mut ids, mut queries) = (BTreeSet::new(), 0);
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap();
        assert!(ids.insert(p["id"].as_u64().unwrap()), "panel id twice: {title}");
        let g = &p["gridPos"];
        let (x, w, h) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap(), g["h"].as_u64().unwrap());
        assert!(x + w <= 24 && w > 0 && h > 0 && g["y"].is_u64(), "{title}: {g}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"], ds, "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert_eq!(t["datasource"], ds, "{title}");
            assert!(refs.insert(t["refId"].as_str().unwrap()), "{title}: refId twice");
            let e = t["expr"].as_str().unwrap();
            queries += 1;
            // Every $variable is defined or Grafana's own.
            for part in e.split('$').skip(1) {
                let v: String =
                    part.trim_start_matches('{').chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                assert!(defined.contains(v.as_str()) || builtin.contains(&v.as_str()), "{title}: ${v} in {e}");
            }
            // Per-GPU queries filter by all three variables.
            if e.contains("gpuprof_gpu_") {
                for f in ["Hostname=~\"$host\"", "gpu=~\"$gpu\"", "pod=~\"$pod\""] {
                    assert!(e.contains(f), "{title}: {e} lacks {f}");
                }
            }
        }
    }
    assert!(queries >= 40, "{queries} queries");
    // The subjects it must show, by what they read.
    let read = metrics_read(&d);
    for m in [
        "gpu_sm_active_percent",
        "gpu_tensor_active_percent",
        "gpu_fp64_active_percent",
        "gpu_fp32_active_percent",
        "gpu_fp16_active_percent",
        "gpu_dram_active_percent",
        "gpu_pcie_tx_bytes_per_second",
        "gpu_pcie_rx_bytes_per_second",
        "gpu_nvlink_tx_bytes_per_second",
        "gpu_nvlink_rx_bytes_per_second",
        "gpu_power_usage_watts",
        "gpu_sm_clock_hertz",
        "gpu_memory_clock_hertz",
        "gpu_temperature_celsius",
        "gpu_clocks_event_reasons",
        "gpu_xid_errors_total",
        "gpu_ecc_errors_uncorrected_total",
        "process_tracing",
        "process_pc_sampling",
        "build_info",
        "records_ingested_total",
    ] {
        assert!(read.contains_key(&format!("gpuprof_{m}")), "the dashboard does not show gpuprof_{m}");
    }
}

/// promtool parses every query (Grafana's variables replaced by values they can take), as
/// recording rules.
#[test]
fn promtool_parses_every_query() {
    let d = dashboard();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let mut queries: Vec<String> = expressions(&d).into_iter().map(|(_, e)| e).collect();
    queries.push("gpuprof_gpu_power_usage_watts{Hostname=~\"$host\"}".into());
    for (i, e) in queries.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$__range", "1h")
            .replace("$__interval", "1m")
            .replace("$host", ".*")
            .replace("$gpu", ".*")
            .replace("$pod", ".*");
        assert!(!e.contains('$'), "a variable left in {e}");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("rules.yml");
    std::fs::write(&p, &rules).unwrap();
    let out = std::process::Command::new(expo::promtool_path())
        .args(["check", "rules", p.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| panic!("cannot run promtool ({e}); see expo::promtool"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check rules: {text}\n{rules}");
    assert!(text.contains(&format!("{} rules found", queries.len())), "{text}");
}

/// A scripted NVML in which GPU 0 reports every NVML and GPM metric gpuprofd knows.
fn script(dir: &Path) -> String {
    let nvml = r#"{"gpu_utilization_percent": 97, "memory_copy_utilization_percent": 40,
        "memory_used_bytes": 1073741824, "memory_total_bytes": 85520809984, "power_usage_watts": 650,
        "power_limit_watts": 700, "sm_clock_hertz": 1.98e9, "memory_clock_hertz": 2.6e9,
        "temperature_celsius": 61, "clocks_event_reasons": 4, "ecc_errors_corrected_total": 3,
        "ecc_errors_uncorrected_total": 0, "xid_errors_total": 1, "xid_last": 79}"#;
    let gpm = r#"{"graphics_active_percent": 80, "sm_active_percent": 75, "sm_occupancy_percent": 30,
        "tensor_active_percent": 55, "fp64_active_percent": 0, "fp32_active_percent": 12,
        "fp16_active_percent": 3, "dram_active_percent": 44, "pcie_tx_bytes_per_second": 1048576,
        "pcie_rx_bytes_per_second": 2097152, "nvlink_tx_bytes_per_second": 1e9, "nvlink_rx_bytes_per_second": 1e9}"#;
    let p = dir.join("nvml.json");
    let text = format!(
        r#"{{"driver_version": "580.159.04", "cuda_version": "13.0", "devices": [
  {{"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
    "pci_bus_id": "00000000:1B:00.0", "memory_total_bytes": 85520809984, "mig_mode": "disabled",
    "power_limit_watts": 700, "compute_major": 9, "compute_minor": 0, "gpm_supported": true,
    "nvml": [{nvml}], "gpm": [{gpm}]}}]}}"#
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// The scrape's body once it has a sample of every family in `want`; the families never seen.
fn scrape_until(port: u16, want: &BTreeSet<String>) -> (String, Vec<String>) {
    let t = Instant::now();
    loop {
        let text = expo::scrape(port).unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        let sampled: BTreeSet<&str> = body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap())
            .collect();
        let missing: Vec<String> = want.iter().filter(|m| !sampled.contains(m.as_str())).cloned().collect();
        if missing.is_empty() || t.elapsed() > Duration::from_secs(10) {
            return (body, missing);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_metric_the_dashboard_reads_is_served() {
    let read = metrics_read(&dashboard());
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let extra = format!(
        "[metrics]\nfake_nvml = \"{}\"\ninterval = \"100ms\"\n[prometheus]\nlisten = \"127.0.0.1:{port}\"\n",
        script(dir.path())
    );
    let d = start_daemon_config(dir.path(), "0", &extra).unwrap();
    // A CUDA process that a session traces and PC-samples on its GPU 0.
    let job = Some(gpuprof_testkit::fake_agent::torchrun_job("run-7", Some(3), 8));
    let a = PcAgent::connect_job(&d.agent_socket, "/usr/bin/trainer", 1, job).unwrap();
    let id = start_session(&d, &["--exe", "trainer", "--pc-sampling"]);
    wait_pc_state(&d, id, a.process_id, 0, |s| s == "sampling");

    let want: BTreeSet<String> = read.keys().cloned().collect();
    let (body, missing) = scrape_until(port, &want);
    let missing: Vec<String> = missing.iter().map(|m| format!("{m} (read by {:?})", read[m])).collect();
    assert!(missing.is_empty(), "the dashboard reads metrics gpuprofd does not serve: {missing:#?}\n{body}");
    expo::check(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    expo::promtool_accepts(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    // The process series say what the process does.
    let line =
        |prefix: &str| body.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("{prefix}: {body}"));
    let tracing = line("gpuprof_process_tracing{");
    assert!(tracing.contains("exe=\"trainer\"") && tracing.ends_with(" 1"), "{tracing}");
    assert!(tracing.contains("job_id=\"run-7\",rank=\"3\""), "the process's rank: {tracing}");
    let pc = line("gpuprof_process_pc_sampling{");
    assert!(pc.contains("exe=\"trainer\",device=\"0\",UUID=\"GPU-fake") && pc.ends_with(" 1"), "{pc}");
    // The rank owns GPU 0: its series say so.
    let power = line("gpuprof_gpu_power_usage_watts{gpu=\"0\"");
    assert!(power.contains(",job_id=\"run-7\",rank=\"3\""), "one rank on the GPU: {power}");
    let reasons = line("gpuprof_gpu_clocks_event_reasons{");
    assert!(reasons.ends_with(" 4"), "the SW power cap bit the dashboard decodes: {reasons}");
    assert_eq!(d.terminate().unwrap(), 0);
}
