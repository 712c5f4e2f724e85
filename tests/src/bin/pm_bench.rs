//! PM stream benchmark: gpuprofd's CPU and memory while a (fake) sampler streams 1 kHz PM
//! samples, first with no subscriber, then with 100 `StreamPmSamples` subscribers (each on its
//! own connection, every sample, no downsampling). Prints the figures and their ratio.
//!
//! `cargo run --release -p gpuprof-testkit --bin gpuprof-pm-bench [-- --seconds 20 --subscribers 100]`

#[path = "../fake_sampler.rs"]
mod fake_sampler;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use fake_sampler::{Command, FakeSampler};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::daemon::proc_rss;
use gpuprofctl::pb;

#[derive(Parser)]
struct Args {
    /// Seconds of streaming per phase.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Subscribers in the second phase.
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    /// Sample rate (Hz) of the fake sampler.
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
}

/// utime + stime of a process in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = s.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of /proc/PID/stat: 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

struct Phase {
    cpu_pct: f64,
    rss_mb: f64,
    samples_sent: u64,
    received_min: u64,
    received_max: u64,
}

fn run_phase(d: &TestDaemon, s: &FakeSampler, rt: &tokio::runtime::Runtime, args: &Args, subs: usize) -> Result<Phase> {
    let counts: Vec<Arc<AtomicU64>> = (0..subs).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let sock = d.api_socket.clone();
    let tasks = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in &counts {
            let mut client = gpuprofctl::connect(&sock).await?;
            let mut stream = client
                .stream_pm_samples(pb::StreamPmSamplesRequest {
                    devices: vec![0],
                    metrics: vec![],
                    downsample_ms: 0,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let _client = client;
                while let Ok(Some(m)) = stream.message().await {
                    if matches!(m.event, Some(pb::stream_pm_samples_response::Event::Sample(_))) {
                        c.fetch_add(1, Relaxed);
                    }
                }
            }));
        }
        Ok::<_, anyhow::Error>(tasks)
    })?;
    let pid = d.pid();
    let before = s.next.load(Relaxed);
    let cpu0 = cpu_seconds(pid);
    let t = Instant::now();
    let total = (args.rate * args.seconds as f64) as u64;
    s.stream(total, (args.rate / 20.0).max(1.0) as u64, args.rate)?;
    // Let subscribers drain.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts.iter().any(|c| c.load(Relaxed) < total) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall = t.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid) - cpu0;
    let (_, rss) = proc_rss(pid);
    for t in tasks {
        t.abort();
    }
    let received: Vec<u64> = counts.iter().map(|c| c.load(Relaxed)).collect();
    Ok(Phase {
        cpu_pct: cpu / wall * 100.0,
        rss_mb: rss as f64 / 1048576.0,
        samples_sent: s.next.load(Relaxed) - before,
        received_min: received.iter().copied().min().unwrap_or(0),
        received_max: received.iter().copied().max().unwrap_or(0),
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(&cfg, "log_level = \"warn\"\n[sampler]\nspawn = false\nalways_on = true\ndevices = [0]\n")?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap_or_default()])?;
    let s = FakeSampler::connect(&d.agent_socket, 0)?;
    anyhow::ensure!(matches!(s.command(Duration::from_secs(5))?, Command::Start { .. }), "sampler not started");
    s.wait_sampling(true, Duration::from_secs(2))?;
    let (_, idle_rss) = proc_rss(d.pid());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;

    let base = run_phase(&d, &s, &rt, &args, 0)?;
    let with = run_phase(&d, &s, &rt, &args, args.subscribers)?;
    let (peak, _) = proc_rss(d.pid());
    let values = fake_sampler::METRICS.len();
    println!("gpuprofd PM stream benchmark: {} Hz × {values} metrics, {} s per phase", args.rate, args.seconds);
    println!(
        "  no subscriber:      daemon CPU {:6.2} % of a core, RSS {:6.1} MiB ({} samples stored)",
        base.cpu_pct, base.rss_mb, base.samples_sent
    );
    println!(
        "  {:>3} subscribers:    daemon CPU {:6.2} % of a core, RSS {:6.1} MiB; each subscriber got {}..{} of {} samples",
        args.subscribers, with.cpu_pct, with.rss_mb, with.received_min, with.received_max, with.samples_sent
    );
    println!(
        "  daemon RSS idle {:.1} MiB, peak {:.1} MiB; CPU per subscriber {:.3} % of a core; CPU ratio {:.1}×",
        idle_rss as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        (with.cpu_pct - base.cpu_pct) / args.subscribers.max(1) as f64,
        with.cpu_pct / base.cpu_pct.max(0.01)
    );
    s.goodbye()?;
    d.terminate()?;
    Ok(())
}
