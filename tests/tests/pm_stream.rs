//! PM streams and the arbiter end to end: a real `gpuprofd`, fake samplers on the real agent
//! protocol, gRPC subscribers and the `gpuprofctl` CLI.

#[path = "../src/fake_sampler.rs"]
mod fake_sampler;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use fake_sampler::{Command, FakeSampler, METRICS, value};
use gpuprof_testkit::TestDaemon;
use gpuprofctl::pb;
use pb::stream_pm_samples_response::Event;

/// A daemon that manages GPUs 0 and 1 without starting sampler children.
fn start_daemon(dir: &Path, extra: &str) -> Result<TestDaemon> {
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[sampler]\nspawn = false\nalways_on = true\ndevices = [0, 1]\ninterval = \"1ms\"\nstream_queue = 2000\n\
             [arbiter]\nexternal_retry_initial = \"1s\"\nexternal_retry_max = \"8s\"\n{extra}"
        ),
    )?;
    TestDaemon::start_with(&dir.join("state"), &["--config", cfg.to_str().unwrap_or_default()])
}

/// The tests here are timing-sensitive and one of them loads both cores: run them one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A client whose HTTP/2 windows are small (64 KiB), so a stream it does not read backs up
/// to the server quickly instead of filling megabytes of client buffers first.
async fn connect_small_window(
    sock: &Path,
) -> Result<gpuprof_proto::api::gpuprof_client::GpuprofClient<tonic::transport::Channel>> {
    let path = sock.to_path_buf();
    let ch = tonic::transport::Endpoint::try_from("http://gpuprofd.local")?
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    Ok(gpuprof_proto::api::gpuprof_client::GpuprofClient::new(ch))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

fn ctl_ok(d: &TestDaemon, args: &[&str]) -> String {
    let out = d.ctl(args);
    assert!(
        out.status.success(),
        "gpuprofctl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn reservations(d: &TestDaemon) -> serde_json::Value {
    serde_json::from_str(&ctl_ok(d, &["--json", "profile", "--status"])).expect("json")
}

#[test]
fn hundred_subscribers_get_every_sample_and_a_slow_one_is_dropped() -> Result<()> {
    let _serial = serial();
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path(), "")?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    assert!(s.process_id > 0);
    assert!(matches!(s.command(Duration::from_secs(5))?, Command::Start { interval_ns: 1_000_000, .. }));
    s.wait_sampling(true, Duration::from_secs(2))?;

    const N: u64 = 4000;
    let rt = rt();
    let sock = d.api_socket.clone();
    // Samples each reader has read: the stream is paced so that no reader that keeps reading
    // falls a queue behind, however slow this machine is (the bound under test is the slow one's).
    let progress: std::sync::Arc<Vec<std::sync::atomic::AtomicU64>> =
        std::sync::Arc::new((0..100).map(|_| std::sync::atomic::AtomicU64::new(0)).collect());
    let (readers, slow) = rt.block_on(async {
        let mut readers = Vec::new();
        for i in 0..100 {
            let progress = progress.clone();
            // Each subscriber on its own connection, like separate clients.
            let mut c = gpuprofctl::connect(&sock).await?;
            let metrics = if i % 2 == 0 { vec![] } else { vec![METRICS[1].to_string()] };
            let mut stream = c
                .stream_pm_samples(pb::StreamPmSamplesRequest {
                    devices: vec![0],
                    metrics,
                    downsample_ms: 0,
                    ..Default::default()
                })
                .await?
                .into_inner();
            readers.push(tokio::spawn(async move {
                let mut k = 0u64;
                while k < N {
                    let Some(m) = stream.message().await? else { anyhow::bail!("stream ended after {k} samples") };
                    let Some(Event::Sample(p)) = m.event else { continue };
                    // Every sample, in order, with the right values.
                    let (idx, want) = if i % 2 == 0 { (0, METRICS.len()) } else { (1, 1) };
                    anyhow::ensure!(p.values.len() == want, "subscriber {i}: {} values", p.values.len());
                    anyhow::ensure!(
                        p.values[0].value == value(idx, k),
                        "subscriber {i}: sample {k} has {:?}",
                        p.values[0]
                    );
                    k += 1;
                    progress[i].store(k, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<_, anyhow::Error>(k)
            }));
        }
        // The slow one never reads.
        let mut c = connect_small_window(&sock).await?;
        let slow = c
            .stream_pm_samples(pb::StreamPmSamplesRequest {
                devices: vec![],
                metrics: vec![],
                downsample_ms: 0,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok::<_, anyhow::Error>((readers, (c, slow)))
    })?;

    let t = Instant::now();
    // 1 kHz in chunks of 500; before each chunk every reader is at most 1000 behind (the
    // queue holds 2000).
    for sent in (0..N).step_by(500) {
        let waited = Instant::now();
        while progress.iter().any(|p| p.load(std::sync::atomic::Ordering::Relaxed) + 1000 < sent) {
            anyhow::ensure!(waited.elapsed() < Duration::from_secs(60), "readers stalled before sample {sent}");
            std::thread::sleep(Duration::from_millis(5));
        }
        s.stream(500, 50, 1000.0)?;
    }
    let sent_in = t.elapsed();
    let counts = rt.block_on(async {
        let mut v = Vec::new();
        for r in readers {
            v.push(tokio::time::timeout(Duration::from_secs(30), r).await??);
        }
        Ok::<_, anyhow::Error>(v)
    })?;
    for (i, c) in counts.into_iter().enumerate() {
        assert_eq!(c?, N, "subscriber {i}");
    }
    // The slow subscriber got what fit in its queue, then an explicit RESOURCE_EXHAUSTED.
    let (_c, mut slow) = slow;
    let (got, err) = rt.block_on(gpuprof_testkit::read_to_end(&mut slow, Duration::from_secs(10)));
    let err = err.expect("the slow subscriber's stream must end with an error");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(got < N, "slow subscriber got {got} of {N}");
    assert!(d.log_text().contains("dropping a slow PM stream subscriber"));
    // The daemon still serves.
    let st = d.status()?;
    assert_eq!(st["gpu_count"], 2);
    eprintln!("100 subscribers got all {N} samples sent in {sent_in:?}; the slow one got {got} then {}", err.message());
    s.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn pause_resume_expiry_markers_and_persistence() -> Result<()> {
    let _serial = serial();
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path(), "")?;
    let s0 = FakeSampler::connect(&d.agent_socket, 0)?;
    let s1 = FakeSampler::connect(&d.agent_socket, 1)?;
    assert!(matches!(s0.command(Duration::from_secs(5))?, Command::Start { .. }));
    assert!(matches!(s1.command(Duration::from_secs(5))?, Command::Start { .. }));

    let rt = rt();
    let sock = d.api_socket.clone();
    let mut sub = rt.block_on(async {
        let mut c = gpuprofctl::connect(&sock).await?;
        let s = c
            .stream_pm_samples(pb::StreamPmSamplesRequest {
                devices: vec![0],
                metrics: vec![],
                downsample_ms: 0,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok::<_, anyhow::Error>((c, s))
    })?;
    s0.send_samples(10)?;

    // Pause GPU 0: its sampler is stopped within a second, GPU 1 keeps sampling.
    let t = Instant::now();
    let out = ctl_ok(&d, &["profile", "--pause", "--gpu", "0", "--for", "2s", "--reason", "ncu run"]);
    assert!(out.contains("GPU 0 paused"), "{out}");
    assert!(matches!(s0.command(Duration::from_secs(1))?, Command::Stop { .. }));
    let stop_latency = t.elapsed();
    assert!(s1.commands_within(Duration::from_millis(200)).is_empty());
    let r = reservations(&d);
    assert_eq!(r[0]["holder"]["holder_kind"], "pause");
    assert_eq!(r[0]["holder"]["reason"], "ncu run");
    assert_eq!(r[0]["waiting"][0]["holder_kind"], "sampler");
    assert_eq!(r[1]["holder"]["holder_kind"], "sampler");

    // Subscribers see the samples, then an explicit paused marker, then (after the 2 s
    // expiry) a resumed marker.
    let events = rt.block_on(async {
        let (_c, s) = &mut sub;
        let mut ev = Vec::new();
        while ev.len() < 12 {
            match tokio::time::timeout(Duration::from_secs(5), s.message()).await {
                Ok(Ok(Some(m))) => ev.push(m.event),
                _ => break,
            }
        }
        ev
    });
    let samples = events.iter().filter(|e| matches!(e, Some(Event::Sample(_)))).count();
    assert_eq!(samples, 10);
    let markers: Vec<&pb::PmPaused> =
        events.iter().filter_map(|e| if let Some(Event::Paused(p)) = e { Some(p) } else { None }).collect();
    assert_eq!(markers.len(), 2, "{events:?}");
    assert!(!markers[0].resumed && markers[0].reason == "ncu run" && markers[0].holder.starts_with("uid "));
    assert!(markers[1].resumed);
    // Expiry gave the hardware back to the sampler.
    assert!(matches!(s0.command(Duration::from_secs(1))?, Command::Start { .. }));
    let expire_after = t.elapsed();
    // Not before the 2 s are up; the upper bound only says that it did expire.
    assert!(expire_after >= Duration::from_secs(2) && expire_after < Duration::from_secs(10), "{expire_after:?}");

    // Pause both, resume both with the CLI.
    ctl_ok(&d, &["profile", "--pause", "--all"]);
    assert!(matches!(s0.command(Duration::from_secs(1))?, Command::Stop { .. }));
    assert!(matches!(s1.command(Duration::from_secs(1))?, Command::Stop { .. }));
    let r = reservations(&d);
    let left = r[0]["holder"]["expires_at_ns"].as_u64().unwrap_or(0) / 1_000_000_000;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    assert!((295..=301).contains(&(left - now)), "default pause is 300 s, got {}", left - now);
    let out = ctl_ok(&d, &["profile", "--resume"]);
    assert!(out.contains("resumed GPU 0, 1"), "{out}");
    assert!(matches!(s0.command(Duration::from_secs(1))?, Command::Start { .. }));
    assert!(matches!(s1.command(Duration::from_secs(1))?, Command::Start { .. }));

    // A pause survives a restart: the reconnecting sampler is not started.
    ctl_ok(&d, &["profile", "--pause", "--gpu", "1", "--for", "10m", "--reason", "maintenance"]);
    assert!(matches!(s1.command(Duration::from_secs(1))?, Command::Stop { .. }));
    let lease = reservations(&d)[1]["holder"]["lease_id"].clone();
    drop(sub);
    drop((s0, s1));
    assert_eq!(d.terminate()?, 0);
    let d = start_daemon(dir.path(), "")?;
    let s0 = FakeSampler::connect(&d.agent_socket, 0)?;
    let s1 = FakeSampler::connect(&d.agent_socket, 1)?;
    assert!(matches!(s0.command(Duration::from_secs(5))?, Command::Start { .. }));
    let cmds = s1.commands_within(Duration::from_millis(1500));
    assert!(!cmds.iter().any(|c| matches!(c, Command::Start { .. })), "paused GPU 1 was started after a restart");
    let r = reservations(&d);
    assert_eq!(r[1]["holder"]["holder_kind"], "pause");
    assert_eq!(r[1]["holder"]["lease_id"], lease);
    assert_eq!(r[1]["holder"]["reason"], "maintenance");
    let st = d.status()?;
    assert!(st["gpu_note"].as_str().unwrap_or_default().contains("paused"), "{st}");
    ctl_ok(&d, &["profile", "--resume", "--gpu", "1"]);
    assert!(matches!(s1.command(Duration::from_secs(1))?, Command::Start { .. }));

    // Every grant, revoke, expiry, pause and resume is in the audit table. The rows are
    // written after the commands are sent (by the writer, in order), so the last resume's rows
    // may land a moment after the sampler saw its start: wait for them.
    let db = rusqlite::Connection::open(d.db_path())?;
    let count = |e: &str| -> i64 {
        db.query_row("SELECT COUNT(*) FROM audit WHERE event = ?1", [e], |r| r.get(0)).unwrap_or(0)
    };
    let all_there = || {
        count("pause") >= 4
            && count("resume") >= 3
            && count("expire") >= 1
            && count("grant") >= 8
            && count("revoke") >= 4
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !all_there() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let counts: Vec<(&str, i64)> =
        ["pause", "resume", "expire", "grant", "revoke"].iter().map(|e| (*e, count(e))).collect();
    assert!(all_there(), "audit rows missing after 10 s: {counts:?}");
    eprintln!("pause → sampler stopped in {stop_latency:?}; --for 2s expired after {expire_after:?}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn outside_holder_is_retried_with_backoff() -> Result<()> {
    let _serial = serial();
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path(), "")?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    s.set_busy(true);
    let t = Instant::now();
    assert!(matches!(s.command(Duration::from_secs(5))?, Command::Start { .. }));
    let marked = Instant::now();
    let mut r = reservations(&d);
    while r[0]["held_externally"] != true && marked.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(50));
        r = reservations(&d);
    }
    assert_eq!(r[0]["held_externally"], true, "{r}");
    assert_eq!(r[0]["holder"]["holder_kind"], "external");
    // Retries at about 1 s and 3 s (1 + 2): backoff, no spinning.
    let mut starts = Vec::new();
    let end = t + Duration::from_millis(3600);
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match s.command(left) {
            Ok(c) => starts.push((t.elapsed(), c)),
            Err(_) => break,
        }
    }
    assert!((1..=2).contains(&starts.len()), "{starts:?}");
    assert!(starts[0].0 >= Duration::from_millis(900), "first retry after {:?}", starts[0].0);
    if let [a, b] = &starts[..] {
        assert!(b.0 - a.0 >= Duration::from_millis(1800), "second retry {:?} after the first", b.0 - a.0);
    }
    // The outside tool goes away: the next retry (4 s later) succeeds.
    s.set_busy(false);
    assert!(matches!(s.command(Duration::from_secs(6))?, Command::Start { .. }));
    s.wait_sampling(true, Duration::from_secs(1))?;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(reservations(&d)[0]["held_externally"], false);
    let db = rusqlite::Connection::open(d.db_path())?;
    let ext: i64 = db.query_row("SELECT COUNT(*) FROM audit WHERE event = 'external'", [], |r| r.get(0))?;
    assert_eq!(ext, 2, "one row when marked, one when cleared");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn no_gpu_daemon_says_so_and_refuses_pause() -> Result<()> {
    let _serial = serial();
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[sampler]\nspawn = false\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap_or_default()])?;
    let st = d.status()?;
    // This CI machine has no NVIDIA driver.
    if !Path::new("/proc/driver/nvidia/gpus").exists() {
        assert_eq!(st["gpu_count"], 0);
        assert!(st["gpu_note"].as_str().unwrap_or_default().contains("no NVIDIA driver found"), "{st}");
        let out = d.ctl(&["profile", "--pause"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("manages no GPU") && err.contains("no NVIDIA driver found"), "{err}");
        // `pm watch` used to wait forever here; it fails at once, saying why.
        let t = Instant::now();
        let out = d.ctl(&["pm", "watch"]);
        assert!(!out.status.success());
        assert!(t.elapsed() < Duration::from_secs(10));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no NVIDIA driver found") && err.contains("libnvidia-ml.so.1"), "{err}");
    }
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn prometheus_endpoint_serves_latest_values_and_counters() -> Result<()> {
    let _serial = serial();
    use std::io::{Read, Write};
    let dir = tempfile::tempdir()?;
    // A port unlikely to be taken; the endpoint is off by default.
    let port = 20000 + (std::process::id() % 20000) as u16;
    let d = start_daemon(dir.path(), &format!("[prometheus]\nlisten = \"127.0.0.1:{port}\"\n"))?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    assert!(matches!(s.command(Duration::from_secs(5))?, Command::Start { .. }));
    s.wait_sampling(true, Duration::from_secs(2))?;
    s.send_samples(25)?;
    let scrape = || -> Result<String> {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
        let mut body = String::new();
        c.read_to_string(&mut body)?;
        Ok(body)
    };
    let t = Instant::now();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")?.trim().to_string();
    let labels = |gpu: u32| format!("gpu=\"{gpu}\",UUID=\"\",pci_bus_id=\"\",modelName=\"\",Hostname=\"{host}\"");
    let want = format!("gpuprof_pm_percent{{{},metric=\"{}\"}} {}", labels(0), METRICS[1], value(1, 24));
    let mut text = scrape()?;
    while !text.contains(&want) && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        text = scrape()?;
    }
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.contains(&want), "{text}");
    for line in [
        format!("gpuprof_pm_samples_total{{{}}} 25", labels(0)),
        format!("gpuprof_gpu_paused{{{}}} 0", labels(0)),
        format!("gpuprof_gpu_paused{{{}}} 0", labels(1)),
        "gpuprof_connected_agents 1".to_string(),
        "# TYPE gpuprof_records_ingested_total counter".to_string(),
    ] {
        assert!(text.contains(&line), "missing {line:?} in\n{text}");
    }
    ctl_ok(&d, &["profile", "--pause", "--gpu", "1"]);
    assert!(scrape()?.contains(&format!("gpuprof_gpu_paused{{{}}} 1", labels(1))));
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port))?;
    c.write_all(b"GET /other HTTP/1.1\r\n\r\n")?;
    let mut body = String::new();
    c.read_to_string(&mut body)?;
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
