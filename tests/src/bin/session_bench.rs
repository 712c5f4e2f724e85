//! `gpuprof-session-bench`: session, summary and export figures, measured in one run
//! against a release `gpuprofd` in a temporary state directory.
//!
//! 1. StartSession → first record stored, for an agent already connected (it starts
//!    sending on StartTrace), p50/p99 over `--runs` sessions (target p99 < 50 ms).
//! 2. Top kernels over `--kernels` stored kernel rows of one session (target < 300 ms),
//!    from the rollup, next to the same summary computed by scanning the rows.
//! 3. ExportTrace throughput in events/s (Chrome JSON, SQLite, Parquet and Perfetto) over
//!    `--export-records` records of the default mix; then `gpuprofctl export` of the same
//!    session to a `.json` and a `.json.gz` file (the gzip is the client's), timed from the
//!    command's start to its exit.
//!
//! Run: cargo run --release -p gpuprof-testkit --bin gpuprof-session-bench
//! (`-- --only export`: that measurement alone).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpuprof_proto::api::gpuprof_client::GpuprofClient;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};
use gpuprof_testkit::{FakeAgent, Mix, TestDaemon};
use gpuprofctl::pb;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// Sessions for the latency measurement.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Kernel rows in the session of the top-kernels measurement.
    #[arg(long, default_value_t = 10_000_000)]
    kernels: u64,
    /// Records in the session of the export measurement.
    #[arg(long, default_value_t = 1_000_000)]
    export_records: u64,
    /// Keep the state directory here instead of a temporary one.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Only this measurement.
    #[arg(long, value_enum)]
    only: Option<Only>,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
enum Only {
    Latency,
    TopKernels,
    Export,
}

type Client = GpuprofClient<Channel>;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn all() -> Vec<pb::Target> {
    vec![pb::Target { target: Some(pb::target::Target::All(true)) }]
}

fn exe(name: &str) -> Vec<pb::Target> {
    vec![pb::Target { target: Some(pb::target::Target::ExeName(name.into())) }]
}

async fn latency(d: &TestDaemon, c: &mut Client, runs: usize) -> Result<()> {
    let agent = TracedAgent::start(
        &d.agent_socket,
        TracedConfig { rate: 10_000.0, batch: 50, mix: Mix { kernel: 1, ..zero_mix() }, ..Default::default() },
    )?;
    let db = rusqlite::Connection::open_with_flags(d.db_path(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let last: i64 = db.query_row("SELECT coalesce(max(rowid), 0) FROM kernel", [], |r| r.get(0))?;
        let t = Instant::now();
        let s = c.start_session(pb::StartSessionRequest { targets: all(), ..Default::default() }).await?.into_inner();
        loop {
            let hit: i64 = db.query_row(
                "SELECT count(*) FROM (SELECT 1 FROM kernel WHERE rowid > ?1 AND session = ?2 LIMIT 1)",
                rusqlite::params![last, s.id as i64],
                |r| r.get(0),
            )?;
            if hit > 0 {
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                bail!("no record of session {} stored after 10 s", s.id);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        c.stop_session(pb::StopSessionRequest { session_id: s.id }).await?;
        while let Ok(e) = agent.wait_event(Duration::from_millis(1)) {
            if matches!(e, Event::Stopped(..)) {
                break;
            }
        }
    }
    let (p50, p99, max) = (pct(&mut ms, 0.5), pct(&mut ms, 0.99), pct(&mut ms, 1.0));
    println!("start→first record stored ({runs} sessions, agent already connected):");
    println!("  p50 {p50:.2} ms   p99 {p99:.2} ms   max {max:.2} ms   (target p99 < 50 ms)");
    agent.finish()?;
    Ok(())
}

fn zero_mix() -> Mix {
    Mix { kernel: 0, api: 0, memcpy: 0, memset: 0, sync: 0, marker: 0, overhead: 0, external_correlation: 0 }
}

/// Fills a session of `exe` processes with `total` records of `mix` from 4 fake agents.
async fn fill(d: &TestDaemon, c: &mut Client, exe_name: &str, total: u64, mix: Mix) -> Result<(u64, f64)> {
    let mut agents = Vec::new();
    for i in 0..4u64 {
        agents.push(FakeAgent::connect(&d.agent_socket, 100 + i, mix)?);
    }
    // FakeAgent says it is /usr/bin/python3: the session targets that name.
    let s =
        c.start_session(pb::StartSessionRequest { targets: exe(exe_name), ..Default::default() }).await?.into_inner();
    let per = total / 4;
    let t = Instant::now();
    let handles: Vec<_> = agents
        .into_iter()
        .map(|mut a| {
            let id = s.id;
            std::thread::spawn(move || -> Result<()> {
                a.send_records(per, 2000, 0.0, id)?;
                a.goodbye()
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("agent thread panicked"))??;
    }
    // Stored: wait until everything queued is committed.
    loop {
        let st: serde_json::Value = d.status()?;
        if st["ingest_queue_depth"].as_u64() == Some(0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = t.elapsed().as_secs_f64();
    c.stop_session(pb::StopSessionRequest { session_id: s.id }).await?;
    Ok((s.id, secs))
}

async fn top_kernels(d: &TestDaemon, c: &mut Client, kernels: u64) -> Result<()> {
    println!("top kernels over {kernels} kernel rows of one session:");
    let (id, secs) = fill(d, c, "python3", kernels, Mix { kernel: 1, ..zero_mix() }).await?;
    println!("  ingest: {:.1} s ({:.0} records/s)", secs, kernels as f64 / secs);
    // The first summary brings the rollup up to date (normally done every second while the
    // session runs); then summaries read only the rollup.
    let t = Instant::now();
    let s = c.get_summary(pb::GetSummaryRequest { session_id: id, filter: None, top: 20 }).await?.into_inner();
    let first = t.elapsed().as_secs_f64() * 1e3;
    if s.kernel_count != kernels {
        bail!("summary counted {} kernels, expected {kernels}", s.kernel_count);
    }
    let mut warm = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let s = c.get_summary(pb::GetSummaryRequest { session_id: id, filter: None, top: 20 }).await?.into_inner();
        warm.push(t.elapsed().as_secs_f64() * 1e3);
        if s.top_kernels.len() != 8 {
            bail!("expected 8 distinct kernels, got {}", s.top_kernels.len());
        }
    }
    // The same summary by scanning the rows (a time range forces the scan path).
    let t = Instant::now();
    let scan = c
        .get_summary(pb::GetSummaryRequest {
            session_id: id,
            filter: Some(pb::RecordFilter {
                time_range: Some(pb::TimeRange { start_ns: 1, end_ns: u64::MAX / 2 }),
                ..Default::default()
            }),
            top: 20,
        })
        .await?
        .into_inner();
    let scan_ms = t.elapsed().as_secs_f64() * 1e3;
    if scan.kernel_count != kernels || scan.top_kernels[0].total_ns != s.top_kernels[0].total_ns {
        bail!("scan and rollup disagree");
    }
    let (p50, max) = (pct(&mut warm, 0.5), pct(&mut warm, 1.0));
    println!("  GetSummary (rollup): p50 {p50:.2} ms, max {max:.2} ms over 20 calls   (target < 300 ms)");
    println!("  first GetSummary after ingest (includes the rollup pass over all rows): {first:.0} ms");
    println!("  same summary by scanning the rows: {scan_ms:.0} ms   (rollup is {:.0}× faster)", scan_ms / p50);
    let dbsize = std::fs::metadata(d.db_path())?.len()
        + std::fs::metadata(d.db_path().with_extension("db-wal")).map(|m| m.len()).unwrap_or(0);
    println!("  database: {:.1} MiB", dbsize as f64 / (1 << 20) as f64);
    Ok(())
}

async fn export(d: &TestDaemon, c: &mut Client, records: u64) -> Result<()> {
    println!("export of a session of {records} records (default mix):");
    // The previous session is over, so a new one on the same name holds only these records.
    let (id, _) = fill(d, c, "python3", records, Mix::default()).await?;
    for (name, format) in [
        ("Chrome JSON", pb::ExportFormat::ChromeJson),
        ("Chrome JSON gzipped", pb::ExportFormat::ChromeJsonGz),
        ("SQLite", pb::ExportFormat::Sqlite),
        ("Parquet", pb::ExportFormat::Parquet),
        ("Perfetto", pb::ExportFormat::Perfetto),
    ] {
        let t = Instant::now();
        let mut st = c
            .export_trace(pb::ExportTraceRequest { session_id: id, format: format as i32, ..Default::default() })
            .await?
            .into_inner();
        let (mut bytes, mut events) = (0u64, 0u64);
        while let Some(m) = st.message().await? {
            bytes += m.data.len() as u64;
            events = events.max(m.events_written);
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "  {name}: {events} events, {:.1} MiB in {secs:.2} s = {:.0} events/s ({:.0} MiB/s)",
            bytes as f64 / (1 << 20) as f64,
            events as f64 / secs,
            bytes as f64 / (1 << 20) as f64 / secs
        );
    }
    let dir = tempfile::tempdir()?;
    for name in ["trace.json", "trace.json.gz"] {
        let path = dir.path().join(name);
        let t = Instant::now();
        let out = d.ctl(&["export", &id.to_string(), "-o", path.to_str().context("path")?, "--json"]);
        let secs = t.elapsed().as_secs_f64();
        if !out.status.success() {
            bail!("gpuprofctl export -o {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let said: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let events = said["events"].as_u64().context("events")?;
        let bytes = std::fs::metadata(&path)?.len();
        println!(
            "  gpuprofctl -o {name}: {events} events, {:.1} MiB in {secs:.2} s = {:.0} events/s",
            bytes as f64 / (1 << 20) as f64,
            events as f64 / secs
        );
        std::fs::remove_file(&path)?;
    }
    Ok(())
}

fn main() -> Result<()> {
    let a = Args::parse();
    let tmp = tempfile::tempdir()?;
    let dir = a.state_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    let d = TestDaemon::start(&dir).context("starting gpuprofd")?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await?;
        let rss = |what: &str| {
            let (peak, now) = d.rss();
            println!(
                "  gpuprofd RSS after {what}: {:.0} MiB (peak so far {:.0} MiB)",
                now as f64 / 1048576.0,
                peak as f64 / 1048576.0
            );
        };
        let run = |m: Only| a.only.is_none_or(|o| o == m);
        if run(Only::Latency) {
            latency(&d, &mut c, a.runs).await?;
            rss("the latency runs");
        }
        if run(Only::TopKernels) {
            top_kernels(&d, &mut c, a.kernels).await?;
            rss("the top-kernels runs");
        }
        if run(Only::Export) {
            export(&d, &mut c, a.export_records).await?;
            rss("the exports");
        }
        anyhow::Ok(())
    })?;
    drop(rt);
    let (peak, _) = d.rss();
    println!("gpuprofd peak RSS: {:.0} MiB", peak as f64 / (1 << 20) as f64);
    d.terminate()?;
    Ok(())
}
