//! Ingest benchmark: 8 fake agents into a real gpuprofd versus a plain rusqlite loop
//! inserting the same rows one INSERT per row. Prints records/s of both, their ratio,
//! bytes per record on disk, and the daemon's RSS idle and at peak.
//!
//! With `--retention-secs N`, a retention benchmark instead: the agents send at
//! `--rate-per-agent` records/s each (default 20k: 8 GPUs traced at 20k records/s) for N
//! seconds into sessions that end every `--session-secs`, with `retention.database_max_size`
//! at `--cap-mib`. Prints the database's size over time, bytes per stored record, the hours
//! of that rate that fit in 20 GiB, and whether retention kept the database under its cap.
//!
//! Run: cargo run --release -p gpuprof-testkit --bin gpuprof-ingest-bench [-- --records-per-agent N]
//!      [--process-age-secs S: the agents' processes S seconds old, as an always-on node's are]
//!      cargo run --release -p gpuprof-testkit --bin gpuprof-ingest-bench -- --retention-secs 180

use gpuprof_testkit::kinds::mix_tables;
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
    /// Each agent's records start this many seconds after it connected (a process that has run
    /// that long: its starts are that far from its base).
    #[arg(long, default_value_t = 0)]
    process_age_secs: u64,
    /// Track ids start at this number, as on a node that has run a while: ids are never
    /// reused, and a busy stream starts a track row every 4.3 s of its records (about 20,000 a
    /// day). 0: a new database's (1).
    #[arg(long, default_value_t = 0)]
    first_track_id: i64,
    /// Record rowids start at this number in every record table, as on a node that has run a
    /// while: retention deletes the oldest rows while new ones take the next rowid above the
    /// newest, so rowids only grow (2^28, a 5-byte varint, is about 70 minutes of 8 GPUs' kernels at
    /// 20k records/s each; 2^35, 6 bytes, about 6 days). 0: a new database's (1).
    #[arg(long, default_value_t = 0)]
    first_rowid: i64,
    /// Keep the state directory (and the plain loop's database) here instead of a temporary one.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Run the retention benchmark for this many seconds instead (0: the ingest comparison).
    #[arg(long, default_value_t = 0)]
    retention_secs: u64,
    /// Retention benchmark: records per second each agent sends.
    #[arg(long, default_value_t = 20_000)]
    rate_per_agent: u64,
    /// Retention benchmark: `retention.database_max_size`, MiB.
    #[arg(long, default_value_t = 256)]
    cap_mib: u64,
    /// Retention benchmark: a session ends (and the next begins) this often.
    #[arg(long, default_value_t = 10)]
    session_secs: u64,
    /// Retention benchmark: `retention.interval`, seconds.
    #[arg(long, default_value_t = 2)]
    retention_interval_secs: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.retention_secs > 0 {
        return retention(&args);
    }
    let total = args.agents * args.records_per_agent;
    let tmp = tempfile::tempdir()?;
    let dir = args.state_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());

    // ---- gpuprofd end to end
    let d = TestDaemon::start(&dir)?;
    std::thread::sleep(Duration::from_millis(300));
    let (_, idle_rss) = d.rss();
    if args.first_track_id > 1 {
        let c = Connection::open(d.db_path())?;
        c.busy_timeout(Duration::from_secs(5))?;
        let seq = args.first_track_id - 1;
        if c.execute("UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'tracks'", [seq])? == 0 {
            c.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('tracks', ?1)", [seq])?;
        }
    }
    if args.first_rowid > 1 {
        // One row per record table at the rowid before the first (its track does not exist, so
        // no view shows it); the daemon's rows follow it.
        let c = Connection::open(d.db_path())?;
        c.busy_timeout(Duration::from_secs(5))?;
        for t in mix_tables() {
            let cols: Vec<String> = c
                .prepare(&format!("SELECT name FROM pragma_table_info('{t}_data')"))?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let zeros = vec!["0"; cols.len()].join(", ");
            c.execute(
                &format!("INSERT INTO {t}_data(rowid, {}) VALUES (?1, {zeros})", cols.join(", ")),
                [args.first_rowid - 1],
            )?;
        }
    }
    // Agents pre-encode their frames so the benchmark measures the daemon, not the generator.
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(args.agents as usize + 1));
    let handles: Vec<_> = (0..args.agents)
        .map(|i| {
            let socket = d.agent_socket.clone();
            let barrier = barrier.clone();
            let per = args.records_per_agent;
            let batch = args.batch;
            let age_ns = args.process_age_secs * 1_000_000_000;
            std::thread::spawn(move || -> Result<()> {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default())?;
                a.generator.advance(age_ns);
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
    // Records committed, as gpuprofd counts them after each commit (a row holds one or two
    // records: migration 0012).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut api = rt.block_on(gpuprofctl::connect(&d.api_socket))?;
    let mut committed = || -> Result<u64> {
        let st = rt.block_on(api.get_status(gpuprofctl::pb::GetStatusRequest {}))?.into_inner();
        Ok(st.records.iter().map(|k| k.ingested).sum())
    };
    barrier.wait();
    let t0 = Instant::now();
    let mut peak_rss = 0;
    loop {
        let n = committed()?;
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
    let reader = Connection::open_with_flags(d.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let stored = records(&reader)?;
    anyhow::ensure!(stored == total, "{stored} records in the record views, {total} sent");
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

/// The records in the record views.
fn records(db: &Connection) -> Result<u64> {
    let mut n = 0u64;
    for t in mix_tables() {
        n += db.query_row(&format!("SELECT count(*) FROM {t}"), [], |r| r.get::<_, i64>(0))? as u64;
    }
    Ok(n)
}

/// The straightforward way: absolute timestamps, one prepared INSERT per row, commits every 10k rows.
fn plain_loop(path: &std::path::Path, args: &Args) -> Result<(f64, u64)> {
    let mut batches = Vec::new();
    for i in 0..args.agents {
        let mut g = RecordGen::new(i + 1, Mix::default());
        g.advance(args.process_age_secs * 1_000_000_000);
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

/// Database pages in use (free pages not counted), the WAL's size, and the records stored
/// (as far as the rollup has counted them).
fn stored(db: &Connection, wal: &std::path::Path) -> Result<(u64, u64, u64)> {
    let q = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0));
    let used = (q("PRAGMA page_count")? - q("PRAGMA freelist_count")?) * q("PRAGMA page_size")?;
    let wal = std::fs::metadata(wal).map(|m| m.len()).unwrap_or(0);
    let rows = q("SELECT coalesce(sum(n), 0) FROM session_rows")?;
    Ok((used as u64, wal, rows as u64))
}

fn retention(args: &Args) -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    use gpuprofctl::pb;

    let tmp = tempfile::tempdir()?;
    let dir = args.state_dir.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[retention]\ninterval = \"{}s\"\ndatabase_max_size = \"{}MiB\"\n",
            args.retention_interval_secs, args.cap_mib
        ),
    )?;
    let cfg_arg = cfg.to_string_lossy().into_owned();
    let d = TestDaemon::start_with(&dir, &["--config", &cfg_arg])?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut c = rt.block_on(gpuprofctl::connect(&d.api_socket))?;
    // FakeAgent says it is /usr/bin/python3: every session targets that name.
    let start = |c: &mut gpuprofctl::pb::gpuprof_client::GpuprofClient<tonic::transport::Channel>| -> Result<u64> {
        let targets = vec![pb::Target { target: Some(pb::target::Target::ExeName("python3".into())) }];
        Ok(rt.block_on(c.start_session(pb::StartSessionRequest { targets, ..Default::default() }))?.into_inner().id)
    };
    let session = Arc::new(AtomicU64::new(start(&mut c)?));
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..args.agents)
        .map(|i| {
            let (socket, session, stop, sent) = (d.agent_socket.clone(), session.clone(), stop.clone(), sent.clone());
            let (rate, batch) = (args.rate_per_agent as f64, args.batch);
            std::thread::spawn(move || -> Result<()> {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default())?;
                let t0 = Instant::now();
                let mut done = 0u64;
                let mut buf = Vec::new();
                while !stop.load(Relaxed) {
                    let mut b = RecordBatch { session_id: session.load(Relaxed), ..Default::default() };
                    a.generator.fill(&mut b, batch);
                    buf.clear();
                    encode_frame(&AgentMessage { msg: Some(Msg::Records(b)) }, &mut buf);
                    a.send_raw(&buf)?;
                    a.flush()?;
                    done += batch as u64;
                    sent.fetch_add(batch as u64, Relaxed);
                    if let Some(wait) = Duration::from_secs_f64(done as f64 / rate).checked_sub(t0.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
                a.goodbye()
            })
        })
        .collect();
    let reader = Connection::open_with_flags(d.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let wal = d.db_path().with_extension("db-wal");
    let cap = args.cap_mib << 20;
    let t0 = Instant::now();
    let (mut next_session, mut next_print) = (args.session_secs, 0u64);
    let (mut max_size, mut over, mut samples, mut expired_at) = (0u64, 0u64, 0u64, None);
    let mut bpr = 0.0;
    println!(
        "retention: {} agents x {} records/s, sessions of {} s, cap {} MiB, retention every {} s",
        args.agents, args.rate_per_agent, args.session_secs, args.cap_mib, args.retention_interval_secs
    );
    println!(
        "{:>6} {:>12} {:>12} {:>11} {:>10} {:>8} {:>9}",
        "t s", "sent", "stored", "db+wal MiB", "B/record", "expired", "sessions"
    );
    while t0.elapsed() < Duration::from_secs(args.retention_secs) {
        std::thread::sleep(Duration::from_millis(500));
        let t = t0.elapsed().as_secs();
        if t >= next_session {
            let old = session.load(Relaxed);
            session.store(start(&mut c)?, Relaxed);
            rt.block_on(c.stop_session(pb::StopSessionRequest { session_id: old }))?;
            next_session += args.session_secs;
        }
        let (used, wal_bytes, rows) = stored(&reader, &wal)?;
        // What retention holds under the cap: pages in use plus the WAL.
        let size = used + wal_bytes;
        let st = d.status()?;
        let expired = st["expired_sessions"].as_u64().unwrap_or(0);
        if expired > 0 && expired_at.is_none() {
            expired_at = Some(t);
        }
        // Once retention has had its first go, the size must stay under the cap.
        if expired_at.is_some() {
            samples += 1;
            max_size = max_size.max(size);
            if size > cap {
                over += 1;
            }
        } else if rows > 0 {
            bpr = used as f64 / rows as f64;
        }
        if t >= next_print {
            println!(
                "{t:>6} {:>12} {rows:>12} {:>11.1} {:>10.1} {expired:>8} {:>9}",
                sent.load(Relaxed),
                size as f64 / (1 << 20) as f64,
                used as f64 / rows.max(1) as f64,
                st["active_sessions"].as_u64().unwrap_or(0)
            );
            next_print = t + 10;
        }
    }
    stop.store(true, Relaxed);
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("agent thread panicked"))??;
    }
    let secs = t0.elapsed().as_secs_f64();
    let rate = sent.load(Relaxed) as f64 / secs;
    let target = (args.agents * args.rate_per_agent) as f64;
    let st = d.status()?;
    println!("records sent: {} in {secs:.0} s = {rate:.0} records/s (target {target:.0})", sent.load(Relaxed));
    println!("bytes per stored record (pages in use, before the first deletion): {bpr:.1}");
    println!(
        "hours of {target:.0} records/s that fit in 20 GiB: {:.1}",
        (20u64 << 30) as f64 / (bpr * target) / 3600.0
    );
    println!(
        "retention: {} sessions and {} records deleted; after its first deletion the database was over the {} MiB cap in {over} of {samples} samples, at most {:.1} MiB",
        st["expired_sessions"].as_u64().unwrap_or(0),
        st["expired_records"].as_u64().unwrap_or(0),
        args.cap_mib,
        max_size as f64 / (1 << 20) as f64
    );
    println!(
        "dropped by the daemon: {}",
        st["records"]
            .as_array()
            .map(|v| v.iter().map(|k| k["dropped_by_daemon"].as_u64().unwrap_or(0)).sum::<u64>())
            .unwrap_or(0)
    );
    drop(reader);
    d.terminate()?;
    Ok(())
}
