//! Always-on device metrics without a GPU: a real `gpuprofd` reading a scripted NVML
//! (`metrics.fake_nvml`): inventory, streams with their source, storage averaged over
//! `metrics.store_interval`, configuration limits, the daemon without a driver, and the
//! Prometheus exposition.
// A test fails by panicking: an unwrap is a failed test with its cause printed.
#![allow(clippy::unwrap_used)]

#[path = "../src/expo.rs"]
mod expo;
#[path = "../src/fake_sampler.rs"]
mod fake_sampler;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_testkit::TestDaemon;

const H100: &str = "GPU-11111111-2222-3333-4444-555555555555";
const A100: &str = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";

/// GPU 0 an H100 with GPM (SM activity alternating 40 and 60 %), GPU 1 without GPM.
fn script(dir: &Path) -> String {
    let p = dir.join("nvml.json");
    let text = format!(
        r#"{{"driver_version": "580.159.04", "cuda_version": "13.0", "devices": [
  {{"index": 0, "uuid": "{H100}", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:1B:00.0",
    "memory_total_bytes": 85520809984, "mig_mode": "disabled", "power_limit_watts": 700,
    "compute_major": 9, "compute_minor": 0, "gpm_supported": true,
    "nvml": [{{"gpu_utilization_percent": 100, "power_usage_watts": 650, "sm_clock_hertz": 1.98e9,
               "memory_used_bytes": 1073741824, "ecc_errors_corrected_total": 3}}],
    "gpm": [{{"sm_active_percent": 40, "pcie_tx_bytes_per_second": 1048576}},
            {{"sm_active_percent": 60, "pcie_tx_bytes_per_second": 1048576}}]}},
  {{"index": 1, "uuid": "{A100}", "name": "NVIDIA A100-SXM4-80GB", "pci_bus_id": "00000000:C1:00.0",
    "memory_total_bytes": 85899345920, "mig_mode": "enabled", "power_limit_watts": 400,
    "compute_major": 8, "compute_minor": 0,
    "nvml": [{{"gpu_utilization_percent": 0, "power_usage_watts": 60}}]}}]}}"#
    );
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn start(dir: &Path, extra: &str) -> TestDaemon {
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[metrics]\nfake_nvml = \"{}\"\ninterval = \"100ms\"\nstore_interval = \"1s\"\n[sampler]\nspawn = false\n{extra}",
            script(dir)
        ),
    )
    .unwrap();
    TestDaemon::start_with(&dir.join("state"), &["--config", cfg.to_str().unwrap()]).unwrap()
}

fn ctl_ok(d: &TestDaemon, args: &[&str]) -> String {
    let out = d.ctl(args);
    assert!(out.status.success(), "gpuprofctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn devices_come_from_nvml_by_uuid() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "");
    let v: serde_json::Value = serde_json::from_str(&ctl_ok(&d, &["--json", "devices"]))?;
    let devs = v.as_array().unwrap();
    assert_eq!(devs.len(), 2, "{v}");
    assert_eq!(devs[0]["uuid"], H100);
    assert_eq!(devs[0]["index"], 0);
    assert_eq!(devs[0]["pci_bus_id"], "0000:1b:00.0");
    assert_eq!(devs[0]["compute_capability"], "9.0");
    assert_eq!(devs[0]["gpm_supported"], true);
    assert_eq!(devs[0]["power_limit_watts"], 700.0);
    assert_eq!(devs[0]["driver_version"], "580.159.04");
    assert_eq!(devs[0]["cuda_version"], "13.0");
    assert_eq!(devs[0]["origin"], "nvml");
    assert_eq!(devs[0]["global_memory_bytes"], 85520809984u64);
    // On demand: nothing holds the performance monitor.
    assert_eq!(devs[0]["monitor_state"], "free");
    assert_eq!(devs[1]["mig_mode"], "enabled");
    assert_eq!(devs[1]["gpm_supported"], false);
    let table = ctl_ok(&d, &["devices"]);
    assert!(table.contains("driver 580.159.04, CUDA 13.0"), "{table}");
    assert!(table.contains(H100) && table.contains("700 W"), "{table}");
    let st = d.status()?;
    assert_eq!(st["gpu_count"], 2, "{st}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn streams_carry_their_source_and_filter_by_it() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "");
    let out = ctl_ok(&d, &["--json", "pm", "watch", "--downsample", "0", "--count", "12"]);
    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let has = |src: &str, dev: u64| lines.iter().any(|l| l["source"] == src && l["device"] == dev);
    assert!(has("nvml", 0) && has("nvml", 1) && has("gpm", 0), "{out}");
    assert!(!has("gpm", 1), "GPU 1 has no GPM: {out}");
    let gpm = lines.iter().find(|l| l["source"] == "gpm").unwrap();
    let v = gpm["values"]["sm_active_percent"].as_f64().unwrap();
    assert!(v == 40.0 || v == 60.0, "{gpm}");
    let span = gpm["end_ns"].as_u64().unwrap() - gpm["start_ns"].as_u64().unwrap();
    assert!((50_000_000..400_000_000).contains(&span), "a GPM window spans one interval: {span} ns");
    // Only GPM, averaged over 1 s: the alternating 40/60 reads 50.
    let out = ctl_ok(&d, &["--json", "pm", "watch", "--source", "gpm", "--downsample", "1s", "--count", "2"]);
    for l in out.lines() {
        let l: serde_json::Value = serde_json::from_str(l)?;
        assert_eq!(l["source"], "gpm", "{l}");
        let v = l["values"]["sm_active_percent"].as_f64().unwrap();
        assert!((45.0..=55.0).contains(&v), "{l}");
    }
    let out = d.ctl(&["pm", "watch", "--source", "nvml", "--rate", "1khz"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--source cupti"));
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn readings_are_stored_averaged_per_store_interval_by_uuid() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start(dir.path(), "");
    std::thread::sleep(Duration::from_millis(3300));
    let db = d.db_path();
    assert_eq!(d.terminate()?, 0);
    let c = rusqlite::Connection::open(db)?;
    let rows: Vec<(i64, f64, String)> = c
        .prepare(
            "SELECT s.dur, s.value, d.uuid FROM pm_sample s JOIN pm_metrics m ON m.id = s.metric
             JOIN devices d ON d.id = s.device WHERE m.name = 'sm_active_percent' ORDER BY s.ts",
        )?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    // ~30 readings at 100 ms, stored as ~3 one-second rows.
    assert!((2..=4).contains(&rows.len()), "{rows:?}");
    for (dur, v, uuid) in &rows {
        assert_eq!(uuid, H100);
        assert!((900_000_000..=1_150_000_000).contains(dur), "{rows:?}");
        assert!((45.0..=55.0).contains(v), "the mean of 40 and 60: {rows:?}");
    }
    let ecc: f64 = c.query_row(
        "SELECT s.value FROM pm_sample s JOIN pm_metrics m ON m.id = s.metric WHERE m.name = 'ecc_errors_corrected_total' LIMIT 1",
        [],
        |r| r.get(0),
    )?;
    assert_eq!(ecc, 3.0, "counters keep their value");
    Ok(())
}

#[test]
fn the_interval_has_a_100ms_floor() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key) in [
        ("[metrics]\ninterval = \"10ms\"\n", "metrics.interval"),
        ("[metrics]\ninterval = \"1s\"\nstore_interval = \"100ms\"\n", "metrics.store_interval"),
        ("[sampler]\nlease_ttl = \"10ms\"\n", "sampler.lease_ttl"),
    ] {
        let p = dir.path().join("c.toml");
        std::fs::write(&p, text).unwrap();
        let out = std::process::Command::new(gpuprof_testkit::bin_path("gpuprofd"))
            .args(["check-config", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn without_a_driver_the_daemon_runs_and_gpu_commands_fail_at_once() -> Result<()> {
    for (name, extra) in [
        ("real", "[metrics]\nnvml_library = \"/nonexistent/libnvidia-ml.so.1\"\n"),
        ("script", "[metrics]\nfake_nvml = \"SCRIPT\"\n"),
    ] {
        let dir = tempfile::tempdir()?;
        let script = dir.path().join("missing.json");
        std::fs::write(&script, r#"{"missing": "test: no driver"}"#)?;
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            format!("[sampler]\nspawn = false\n{}", extra.replace("SCRIPT", script.to_str().unwrap())),
        )?;
        let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()])?;
        assert!(d.log_text().contains("no NVIDIA driver found"), "{name}: {}", d.log_text());
        if !Path::new("/proc/driver/nvidia/gpus").exists() {
            let st = d.status()?;
            let note = st["gpu_note"].as_str().unwrap();
            assert!(note.contains("no NVIDIA driver found (") && note.contains("libnvidia-ml.so.1"), "{st}");
            let devices = ctl_ok(&d, &["devices"]);
            assert!(devices.contains("no GPUs: no NVIDIA driver found"), "{devices}");
            for args in [&["pm", "watch"][..], &["pm", "watch", "--source", "cupti"], &["profile", "--pause"]] {
                let t = Instant::now();
                let out = d.ctl(args);
                assert!(!out.status.success(), "{args:?}");
                assert!(t.elapsed() < Duration::from_secs(10), "{args:?} took {:?}", t.elapsed());
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(err.contains("no NVIDIA driver found"), "{name} {args:?}: {err}");
            }
        }
        assert_eq!(d.terminate()?, 0);
    }
    Ok(())
}

#[test]
fn prometheus_speaks_the_dcgm_exporter_shape() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let port = 20000 + (std::process::id() % 20000) as u16 + 7;
    let d = start(dir.path(), &format!("[prometheus]\nlisten = \"127.0.0.1:{port}\"\n"));
    let want = format!(
        "gpuprof_gpu_sm_active_percent{{gpu=\"0\",UUID=\"{H100}\",pci_bus_id=\"0000:1b:00.0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\""
    );
    let t = Instant::now();
    let mut text = expo::scrape(port)?;
    while !text.contains(&want) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        text = expo::scrape(port)?;
    }
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains(&want), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    expo::check(body).map_err(|e| anyhow::anyhow!("{e}\n{body}"))?;
    for family in [
        "# TYPE gpuprof_gpu_power_usage_watts gauge",
        "# TYPE gpuprof_gpu_sm_clock_hertz gauge",
        "# TYPE gpuprof_gpu_ecc_errors_corrected_total counter",
        "# TYPE gpuprof_gpu_pcie_tx_bytes_per_second gauge",
        "# TYPE gpuprof_build_info gauge",
        "gpuprof_gpu_cupti_sampling{gpu=\"0\"",
    ] {
        assert!(body.contains(family), "missing {family:?}:\n{body}");
    }
    assert!(body.contains("driver_version=\"580.159.04\""), "{body}");
    // promtool itself, on every machine: it may only object to DCGM exporter's label names.
    expo::promtool_accepts(body).map_err(|e| anyhow::anyhow!("{e}\n{body}"))?;
    assert!(
        !expo::expected_findings(body).is_empty(),
        "the GPU series carry modelName, which promtool's lint reports: {body}"
    );
    assert!(expo::scrape_path(port, "/other")?.starts_with("HTTP/1.1 404"));
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
