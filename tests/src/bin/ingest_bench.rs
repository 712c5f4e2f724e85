//! Ingest benchmark: 8 fake agents into a real gpuprofd versus a plain rusqlite loop
//! inserting the same rows one INSERT per row. Prints records/s of both, their ratio,
//! bytes per record on disk, and the daemon's RSS idle and at peak.
//!
//! Run: cargo run --release -p gpuprof-testkit --bin gpuprof-ingest-bench [-- --records-per-agent N]

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use gpuprof_proto::agent::{AgentMessage, RecordBatch, agent_message::Msg};
use gpuprof_proto::frame::encode_frame;
use gpuprof_testkit::{FakeAgent, Mix, RecordGen, TestDaemon};
use rusqlite::{Connection, OpenFlags, params};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 8)]
    agents: u64,
    #[arg(long, default_value_t = 1_000_000)]
    records_per_agent: u64,
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Keep the state directory (and the plain loop's database) here instead of a temporary one.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
}

const TABLES: &[&str] = &["kernel", "memcpy", "memset", "api", "sync", "overhead", "marker", "external_correlation"];

fn main() -> Result<()> {
    let args = Args::parse();
    let total = args.agents * args.records_per_agent;
    let tmp = tempfile::tempdir()?;
    let dir = args.state_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());

    // ---- gpuprofd end to end
    let d = TestDaemon::start(&dir)?;
    std::thread::sleep(Duration::from_millis(300));
    let (_, idle_rss) = d.rss();
    // Agents pre-encode their frames so the benchmark measures the daemon, not the generator.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(args.agents as usize + 1));
    let handles: Vec<_> = (0..args.agents)
        .map(|i| {
            let socket = d.agent_socket.clone();
            let barrier = barrier.clone();
            let per = args.records_per_agent;
            let batch = args.batch;
            std::thread::spawn(move || -> Result<()> {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default())?;
                let frames = encode_batches(&mut a.generator, per, batch);
                barrier.wait();
                for f in &frames {
                    a.send_raw(f)?;
                }
                a.flush()?;
                a.goodbye()
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    let reader = Connection::open_with_flags(d.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let mut peak_rss = 0;
    loop {
        let n = committed(&reader)?;
        peak_rss = peak_rss.max(d.rss().1);
        if n >= total {
            break;
        }
        if t0.elapsed() > Duration::from_secs(600) {
            anyhow::bail!("only {n} of {total} records after 600 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let secs = t0.elapsed().as_secs_f64();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("agent thread panicked"))??;
    }
    let (hwm, _) = d.rss();
    peak_rss = peak_rss.max(hwm);
    drop(reader);
    let db_path = d.db_path();
    let code = d.terminate()?;
    anyhow::ensure!(code == 0, "gpuprofd exited with {code}");
    let daemon_bytes = std::fs::metadata(&db_path)?.len();
    let daemon_rate = total as f64 / secs;

    // ---- plain rusqlite loop, same rows, one INSERT per row
    let plain_path = dir.join("plain.db");
    let (plain_secs, plain_bytes) = plain_loop(&plain_path, &args)?;
    let plain_rate = total as f64 / plain_secs;

    println!("records: {total} ({} agents x {}), batch {}", args.agents, args.records_per_agent, args.batch);
    println!("gpuprofd end to end      : {:>12.0} records/s  ({secs:.2} s)", daemon_rate);
    println!("plain rusqlite loop      : {:>12.0} records/s  ({plain_secs:.2} s)", plain_rate);
    println!("ratio gpuprofd / plain   : {:>12.2}", daemon_rate / plain_rate);
    println!("bytes per record gpuprofd: {:>12.1}", daemon_bytes as f64 / total as f64);
    println!("bytes per record plain   : {:>12.1}", plain_bytes as f64 / total as f64);
    println!("gpuprofd RSS idle        : {:>12.1} MB", idle_rss as f64 / 1e6);
    println!("gpuprofd RSS peak        : {:>12.1} MB", peak_rss as f64 / 1e6);
    Ok(())
}

fn encode_batches(g: &mut RecordGen, per: u64, batch: usize) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut done = 0;
    while done < per {
        let n = batch.min((per - done) as usize);
        let mut b = RecordBatch::default();
        g.fill(&mut b, n);
        let mut buf = Vec::new();
        encode_frame(&AgentMessage { msg: Some(Msg::Records(b)) }, &mut buf);
        frames.push(buf);
        done += n as u64;
    }
    frames
}

/// Rows committed so far (rowids are dense in a fresh database). Read from the `_data`
/// tables the record views are over (max(rowid) of a view is a scan), else the tables.
fn committed(db: &Connection) -> Result<u64> {
    let mut n = 0u64;
    for t in TABLES {
        let m: i64 = db
            .query_row(&format!("SELECT coalesce(max(rowid), 0) FROM {t}_data"), [], |r| r.get(0))
            .or_else(|_| db.query_row(&format!("SELECT coalesce(max(rowid), 0) FROM {t}"), [], |r| r.get(0)))?;
        n += m as u64;
    }
    Ok(n)
}

/// The straightforward way: absolute timestamps, one prepared INSERT per row, commits every 10k rows.
fn plain_loop(path: &std::path::Path, args: &Args) -> Result<(f64, u64)> {
    let mut batches = Vec::new();
    for i in 0..args.agents {
        let mut g = RecordGen::new(i + 1, Mix::default());
        g.kernel_name_ids = (1..=8).collect();
        g.marker_name_ids = (9..=13).collect();
        let mut done = 0;
        while done < args.records_per_agent {
            let n = args.batch.min((args.records_per_agent - done) as usize);
            let mut b = RecordBatch::default();
            g.fill(&mut b, n);
            batches.push((i as i64, b));
            done += n as u64;
        }
    }
    let mut c = Connection::open(path)?;
    c.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
         CREATE TABLE kernel(proc, dev, ctx, stream, corr, name, start_ns, end_ns, gx, gy, gz, bx, by, bz, regs, ssmem, dsmem);
         CREATE TABLE api(proc, domain, cbid, corr, tid, start_ns, end_ns, ret);
         CREATE TABLE memcpy(proc, dev, ctx, stream, corr, start_ns, end_ns, bytes, kind, src_kind, dst_kind);
         CREATE TABLE memset(proc, dev, ctx, stream, corr, start_ns, end_ns, bytes, value);
         CREATE TABLE sync(proc, type, ctx, stream, corr, start_ns, end_ns);
         CREATE TABLE overhead(proc, kind, obj_kind, obj_id, start_ns, end_ns);
         CREATE TABLE marker(proc, id, name, domain, tid, start_ns, end_ns);
         CREATE TABLE external_correlation(proc, ext_kind, ext_id, corr);",
    )?;
    let t0 = Instant::now();
    let mut rows = 0;
    let mut tx = c.transaction()?;
    for (p, b) in &batches {
        for k in &b.kernels {
            tx.prepare_cached("INSERT INTO kernel VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")?.execute(params![
                p,
                k.device_id,
                k.context_id,
                k.stream_id,
                k.correlation_id,
                k.name_id,
                k.start_ns as i64,
                k.end_ns as i64,
                k.grid_x,
                k.grid_y,
                k.grid_z,
                k.block_x,
                k.block_y,
                k.block_z,
                k.registers_per_thread,
                k.static_shared_bytes,
                k.dynamic_shared_bytes
            ])?;
        }
        for a in &b.api_calls {
            tx.prepare_cached("INSERT INTO api VALUES (?,?,?,?,?,?,?,?)")?.execute(params![
                p,
                a.domain,
                a.cbid,
                a.correlation_id,
                a.thread_id,
                a.start_ns as i64,
                a.end_ns as i64,
                a.return_value
            ])?;
        }
        for m in &b.memcpys {
            tx.prepare_cached("INSERT INTO memcpy VALUES (?,?,?,?,?,?,?,?,?,?,?)")?.execute(params![
                p,
                m.device_id,
                m.context_id,
                m.stream_id,
                m.correlation_id,
                m.start_ns as i64,
                m.end_ns as i64,
                m.bytes as i64,
                m.copy_kind,
                m.src_kind,
                m.dst_kind
            ])?;
        }
        for m in &b.memsets {
            tx.prepare_cached("INSERT INTO memset VALUES (?,?,?,?,?,?,?,?,?)")?.execute(params![
                p,
                m.device_id,
                m.context_id,
                m.stream_id,
                m.correlation_id,
                m.start_ns as i64,
                m.end_ns as i64,
                m.bytes as i64,
                m.value
            ])?;
        }
        for s in &b.syncs {
            tx.prepare_cached("INSERT INTO sync VALUES (?,?,?,?,?,?,?)")?.execute(params![
                p,
                s.sync_type,
                s.context_id,
                s.stream_id,
                s.correlation_id,
                s.start_ns as i64,
                s.end_ns as i64
            ])?;
        }
        for o in &b.overheads {
            tx.prepare_cached("INSERT INTO overhead VALUES (?,?,?,?,?,?)")?.execute(params![
                p,
                o.overhead_kind,
                o.object_kind,
                o.object_id as i64,
                o.start_ns as i64,
                o.end_ns as i64
            ])?;
        }
        for m in &b.markers {
            tx.prepare_cached("INSERT INTO marker VALUES (?,?,?,?,?,?,?)")?.execute(params![
                p,
                m.id as i64,
                m.name_id,
                m.domain_id,
                m.thread_id,
                m.start_ns as i64,
                m.end_ns as i64
            ])?;
        }
        for x in &b.external_correlations {
            tx.prepare_cached("INSERT INTO external_correlation VALUES (?,?,?,?)")?.execute(params![
                p,
                x.external_kind,
                x.external_id as i64,
                x.correlation_id
            ])?;
        }
        rows += b.kernels.len() + b.api_calls.len() + b.memcpys.len() + b.memsets.len();
        if rows >= 10_000 {
            tx.commit()?;
            tx = c.transaction()?;
            rows = 0;
        }
    }
    tx.commit()?;
    let secs = t0.elapsed().as_secs_f64();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")?;
    drop(c);
    Ok((secs, std::fs::metadata(path)?.len()))
}
