//! Soak: a real gpuprofd under everything at once for a while — producers streaming records,
//! a fake PM sampler and a fake PC-sampling process, PM and PC stream subscribers, queries and
//! exports in a loop, sessions starting and stopping — sampling the daemon's RSS, open file
//! descriptors and threads every second. Prints the figures and exits non-zero when a target is
//! missed: RSS at most `--max-rss-mib` (256) and flat over the last half (at most 10 % above
//! its value at half time), no fd or thread growth between the first and the last quarter,
//! every record sent stored (the load is under capacity), every subscriber still receiving.
//!
//! `cargo run --release -p gpuprof-testkit --bin gpuprof-soak [-- --seconds 600]`

#[path = "../fake_sampler.rs"]
mod fake_sampler;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use fake_sampler::{Command, FakeSampler};
use gpuprof_testkit::daemon::proc_rss;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand};
use gpuprof_testkit::{FakeAgent, Mix, TestDaemon};
use gpuprofctl::pb;

#[derive(Parser)]
struct Args {
    /// How long the load runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Record producers (fake injectors), each its own connection and thread.
    #[arg(long, default_value_t = 64)]
    producers: u64,
    /// Records per second per producer.
    #[arg(long, default_value_t = 500.0)]
    rate: f64,
    /// Stream subscribers, half on PM samples and half on PC samples.
    #[arg(long, default_value_t = 100)]
    subscribers: usize,
    /// The RSS bound, MiB.
    #[arg(long, default_value_t = 256)]
    max_rss_mib: u64,
}

fn count_dir(path: String) -> u64 {
    std::fs::read_dir(path).map(|d| d.count() as u64).unwrap_or(0)
}

fn threads(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("Threads:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// One second's reading of the daemon.
#[derive(Clone, Copy, Debug)]
struct Reading {
    rss: u64,
    fds: u64,
    threads: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        "log_level = \"warn\"\n[sampler]\nspawn = false\nalways_on = true\ndevices = [0, 1]\nstream_queue = 4096\n",
    )?;
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap_or_default()])?;
    let pid = d.pid();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;

    // A fake PM sampler on GPU 1 (the background sampler lease), sampling at 200 Hz throughout.
    let sampler = FakeSampler::connect(&d.agent_socket, 1)?;
    ensure!(matches!(sampler.command(Duration::from_secs(5))?, Command::Start { .. }), "sampler not started");
    sampler.wait_sampling(true, Duration::from_secs(2))?;
    let pm_rate = 200.0;
    let pm_total = (pm_rate * args.seconds as f64) as u64;
    let pm_thread = std::thread::spawn(move || -> Result<FakeSampler> {
        sampler.stream(pm_total, 10, pm_rate)?;
        Ok(sampler)
    });

    // A fake process with PC sampling on GPU 0 in a session, sending a PC batch every 100 ms.
    let mut pc = PcAgent::connect(&d.agent_socket, "/usr/bin/soakpc", 1)?;
    let pc_session = session_start(&d, &["--exe", "soakpc", "--pc-sampling", "--preset", "kernels"])?;
    let granted = pc.command(Duration::from_secs(5))?;
    ensure!(matches!(granted, PcCommand::Start(_)), "no PC-sampling lease: {granted:?}");

    // Subscribers.
    let pm_counts: Vec<Arc<AtomicU64>> = (0..args.subscribers / 2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let pc_counts: Vec<Arc<AtomicU64>> =
        (0..args.subscribers - args.subscribers / 2).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let sock = d.api_socket.clone();
    let tasks = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in &pm_counts {
            let mut client = gpuprofctl::connect(&sock).await?;
            let mut s = client
                .stream_pm_samples(pb::StreamPmSamplesRequest { devices: vec![1], ..Default::default() })
                .await?
                .into_inner();
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let _client = client;
                while let Ok(Some(_)) = s.message().await {
                    c.fetch_add(1, Relaxed);
                }
            }));
        }
        for c in &pc_counts {
            let mut client = gpuprofctl::connect(&sock).await?;
            let mut s = client
                .stream_pc_samples(pb::StreamPcSamplesRequest { session_id: pc_session, ..Default::default() })
                .await?
                .into_inner();
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                let _client = client;
                while let Ok(Some(_)) = s.message().await {
                    c.fetch_add(1, Relaxed);
                }
            }));
        }
        Ok::<_, anyhow::Error>(tasks)
    })?;

    // Producers: records outside sessions at `rate` each.
    let total_per = (args.rate * args.seconds as f64) as u64;
    let producers: Vec<_> = (0..args.producers)
        .map(|i| {
            let socket = d.agent_socket.clone();
            std::thread::spawn(move || -> Result<u64> {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default()).context("producer connect")?;
                let sent = a.send_records(total_per, 100, args.rate, 0).with_context(|| format!("producer {i}"))?;
                a.goodbye().with_context(|| format!("producer {i} goodbye"))?;
                Ok(sent.values().sum())
            })
        })
        .collect();

    // Queries, exports and short sessions in a loop; PC batches; readings every second.
    let t0 = Instant::now();
    let mut readings: Vec<Reading> = Vec::new();
    let (mut queries, mut exports, mut sessions, mut batches) = (0u64, 0u64, 0u64, 0u64);
    let mut next_reading = Instant::now();
    let frames = [
        FakePc::new("_Z6gatherPKiPfi", 0x40, "smsp__pcsamp_warps_issue_stalled_long_scoreboard", 90, "/src/k.cu", 15),
        FakePc::new("_Z9fma_chainPfi", 0x80, "smsp__pcsamp_warps_issue_stalled_wait", 10, "/src/k.cu", 25),
    ];
    while t0.elapsed() < Duration::from_secs(args.seconds) {
        if let Err(e) = pc.batch(pc_session, 0, &frames, 0) {
            println!("{}", d.log_text().lines().rev().take(20).collect::<Vec<_>>().join("\n"));
            return Err(e.context("PC batch"));
        }
        batches += 1;
        if batches % 10 == 0 {
            let o = d.ctl(&["--json", "pc", "top", &pc_session.to_string(), "--by", "line"]);
            ensure!(o.status.success(), "pc top failed: {}", String::from_utf8_lossy(&o.stderr));
            queries += 1;
            let s = session_start(&d, &["--exe", "nothing-runs-this", "--duration", "300ms", "--name", "soak"])?;
            sessions += 1;
            let o = d.ctl(&["export", &s.to_string(), "-o", "-"]);
            ensure!(o.status.success(), "export failed: {}", String::from_utf8_lossy(&o.stderr));
            exports += 1;
            let o = d.ctl(&["--json", "status"]);
            ensure!(o.status.success(), "status failed");
            queries += 1;
        }
        if Instant::now() >= next_reading {
            let (_, rss) = proc_rss(pid);
            readings.push(Reading { rss, fds: count_dir(format!("/proc/{pid}/fd")), threads: threads(pid) });
            next_reading += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let elapsed = t0.elapsed().as_secs_f64();

    let mut sent = 0u64;
    for p in producers {
        match p.join().map_err(|_| anyhow::anyhow!("a producer panicked"))? {
            Ok(n) => sent += n,
            Err(e) => {
                println!("{}", d.log_text().lines().rev().take(20).collect::<Vec<_>>().join("\n"));
                return Err(e);
            }
        }
    }
    let sampler = match pm_thread.join().map_err(|_| anyhow::anyhow!("the sampler panicked"))? {
        Ok(s) => s,
        Err(e) => {
            println!("{}", d.log_text().lines().rev().take(20).collect::<Vec<_>>().join("\n"));
            return Err(e.context("PM sampler"));
        }
    };
    let _ = session_stop(&d, pc_session);

    // Every record sent is stored, or counted as dropped.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut stored, mut dropped);
    loop {
        let st = d.status()?;
        let tables = gpuprof_testkit::kinds::mix_tables();
        let of = |field: &str| -> u64 { tables.iter().map(|t| st["records"][t][field].as_u64().unwrap_or(0)).sum() };
        (stored, dropped) = (of("ingested"), of("dropped"));
        if stored + dropped >= sent || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let pm_got: Vec<u64> = pm_counts.iter().map(|c| c.load(Relaxed)).collect();
    let pc_got: Vec<u64> = pc_counts.iter().map(|c| c.load(Relaxed)).collect();
    for t in tasks {
        t.abort();
    }
    let peak = proc_rss(pid).0;
    // Either may already be closed by the daemon at this point; what matters was measured.
    let _ = pc.goodbye();
    let _ = sampler.goodbye();
    let log = d.log_text();
    let problems: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    d.terminate().context("stopping gpuprofd")?;

    // ---- report
    let mib = |b: u64| b as f64 / 1048576.0;
    let n = readings.len().max(1);
    let half = readings[(n / 2).min(n - 1)];
    let last_half_max = readings[n / 2..].iter().map(|r| r.rss).max().unwrap_or(0);
    let quarter =
        |r: &[Reading]| (r.iter().map(|x| x.fds).max().unwrap_or(0), r.iter().map(|x| x.threads).max().unwrap_or(0));
    let (fds_q1, thr_q1) = quarter(&readings[..(n / 4).max(1)]);
    let (fds_q4, thr_q4) = quarter(&readings[n - (n / 4).max(1)..]);
    println!(
        "gpuprofd soak: {elapsed:.0} s; {} producers × {} records/s, PM sampler {pm_rate} Hz, PC batches every 100 ms, \
         {} PM + {} PC subscribers",
        args.producers,
        args.rate,
        pm_counts.len(),
        pc_counts.len()
    );
    println!(
        "  records sent {sent}, stored {stored}, dropped {dropped}; {queries} queries/status, {exports} exports, \
         {sessions} sessions, {batches} PC batches"
    );
    println!(
        "  subscribers received: PM {}..{} messages, PC {}..{} messages",
        pm_got.iter().min().unwrap_or(&0),
        pm_got.iter().max().unwrap_or(&0),
        pc_got.iter().min().unwrap_or(&0),
        pc_got.iter().max().unwrap_or(&0)
    );
    println!(
        "  RSS: at half time {:.1} MiB, max over the last half {:.1} MiB, peak {:.1} MiB (bound {} MiB)",
        mib(half.rss),
        mib(last_half_max),
        mib(peak),
        args.max_rss_mib
    );
    let step = (n / 10).max(1);
    let series: Vec<String> = readings.iter().step_by(step).map(|r| format!("{:.0}", mib(r.rss))).collect();
    println!("  RSS every {step} s (MiB): {}", series.join(" "));
    println!("  fds: first quarter max {fds_q1}, last quarter max {fds_q4}; threads: {thr_q1} → {thr_q4}");
    println!("  daemon warnings and errors: {}", problems.len());
    for l in problems.iter().take(10) {
        println!("    {l}");
    }
    let mut failed = Vec::new();
    if peak > args.max_rss_mib << 20 {
        failed.push(format!("peak RSS {:.1} MiB above {} MiB", mib(peak), args.max_rss_mib));
    }
    if last_half_max as f64 > half.rss as f64 * 1.10 {
        failed.push(format!("RSS grew over the last half: {:.1} → {:.1} MiB", mib(half.rss), mib(last_half_max)));
    }
    if fds_q4 > fds_q1 + 4 {
        failed.push(format!("open fds grew: {fds_q1} → {fds_q4}"));
    }
    if thr_q4 > thr_q1 + 2 {
        failed.push(format!("threads grew: {thr_q1} → {thr_q4}"));
    }
    if stored + dropped < sent {
        failed.push(format!("{} records neither stored nor counted as dropped", sent - stored - dropped));
    }
    if dropped > 0 {
        failed.push(format!("{dropped} records dropped under a load below capacity"));
    }
    if pm_got.iter().chain(&pc_got).any(|&c| c == 0) {
        failed.push("a subscriber received nothing".into());
    }
    if failed.is_empty() {
        println!("soak: all targets met");
        Ok(())
    } else {
        for f in &failed {
            println!("soak: MISSED {f}");
        }
        anyhow::bail!("{} soak target(s) missed", failed.len())
    }
}

fn session_start(d: &TestDaemon, args: &[&str]) -> Result<u64> {
    let mut a = vec!["--json", "session", "start"];
    a.extend_from_slice(args);
    let o = d.ctl(&a);
    ensure!(o.status.success(), "session start failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    v["id"].as_u64().context("no session id")
}

fn session_stop(d: &TestDaemon, id: u64) -> Result<()> {
    let o = d.ctl(&["session", "stop", &id.to_string()]);
    ensure!(o.status.success(), "session stop failed: {}", String::from_utf8_lossy(&o.stderr));
    Ok(())
}
