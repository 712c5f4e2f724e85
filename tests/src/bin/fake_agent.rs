//! `gpuprof-fake-agent`: connects fake CUDA processes to a running gpuprofd and streams
//! realistic records (long mangled kernel names, launch API records joined to kernels by
//! correlation id, copies, sets, syncs, NVTX, several devices and streams) at a chosen rate.
//!
//! Example: gpuprof-fake-agent --socket ./state/agent.sock --agents 4 --records 100000 --rate 50000

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use gpuprof_testkit::{FakeAgent, Mix, Sent};

#[derive(Parser)]
#[command(about = "Stream synthetic CUDA activity records to gpuprofd over the agent protocol")]
struct Args {
    /// gpuprofd's agent socket.
    #[arg(long, default_value = "/run/gpuprof/agent.sock")]
    socket: PathBuf,
    /// Number of fake processes (one connection each).
    #[arg(long, default_value_t = 1)]
    agents: u64,
    /// Records per process.
    #[arg(long, default_value_t = 100_000)]
    records: u64,
    /// Records per second per process (0: as fast as the daemon takes them).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Records per batch frame.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Session id to tag records with (0: none).
    #[arg(long, default_value_t = 0)]
    session: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t0 = std::time::Instant::now();
    let handles: Vec<_> = (0..args.agents)
        .map(|i| {
            let socket = args.socket.clone();
            let (records, batch, rate, session) = (args.records, args.batch, args.rate, args.session);
            std::thread::spawn(move || -> Result<(u64, Sent)> {
                let mut a = FakeAgent::connect(&socket, i + 1, Mix::default())?;
                let sent = a.send_records(records, batch, rate, session)?;
                let id = a.process_id;
                a.goodbye()?;
                Ok((id, sent))
            })
        })
        .collect();
    for h in handles {
        let (id, sent) = h.join().map_err(|_| anyhow::anyhow!("agent thread panicked"))??;
        let detail: Vec<String> = sent.iter().map(|(k, n)| format!("{k}={n}")).collect();
        println!("process {id}: {}", detail.join(" "));
    }
    let total = args.agents * args.records;
    let secs = t0.elapsed().as_secs_f64();
    println!("sent {total} records in {secs:.2} s ({:.0} records/s)", total as f64 / secs);
    Ok(())
}
