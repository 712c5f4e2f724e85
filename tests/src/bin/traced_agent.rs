//! `gpuprof-traced-agent`: one fake injector in its own process that obeys StartTrace and
//! StopTrace (see `gpuprof_testkit::traced_agent`). Prints `process_id N` once connected,
//! then `started S` and `stopped S RECORDS` as sessions come and go; says goodbye and
//! exits when its stdin closes, or after `--seconds`.

use std::io::Read;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};

#[derive(Parser)]
struct Args {
    /// gpuprofd's agent socket.
    #[arg(long, env = "GPUPROF_AGENT_SOCKET", default_value = "/run/gpuprof/agent.sock")]
    socket: PathBuf,
    /// Run this many seconds, then say goodbye and exit, whatever stdin does (without it: until
    /// stdin closes).
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, default_value = "/usr/bin/python3")]
    exe: String,
    #[arg(long, default_value = "/kubepods/pod-1234/abcdef")]
    cgroup: String,
    /// Records per second while tracing.
    #[arg(long, default_value_t = 20_000.0)]
    rate: f64,
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Records per session at most (0: no limit).
    #[arg(long, default_value_t = 0)]
    per_session: u64,
    #[arg(long)]
    displaced: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Move this process into the cgroup directory DIR (write its pid to DIR/cgroup.procs)
    /// before connecting; needs root.
    #[arg(long, value_name = "DIR")]
    join_cgroup: Option<PathBuf>,
    /// Job identity claimed in Hello: launcher ("torchelastic", "slurm", "mpi").
    #[arg(long)]
    job_launcher: Option<String>,
    /// Job identity: the job id (any of the --job-* and rank options sends one).
    #[arg(long)]
    job_id: Option<String>,
    #[arg(long)]
    rank: Option<u32>,
    #[arg(long)]
    local_rank: Option<u32>,
    #[arg(long)]
    world_size: Option<u32>,
    /// Command line claimed in Hello.
    #[arg(last = true)]
    cmdline: Vec<String>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    if let Some(dir) = &a.join_cgroup {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .with_context(|| format!("joining cgroup {}", procs.display()))?;
    }
    let job = (a.job_launcher.is_some() || a.job_id.is_some() || a.rank.is_some()).then(|| {
        gpuprof_proto::agent::JobIdentity {
            launcher: a.job_launcher.unwrap_or_default(),
            job_id: a.job_id.unwrap_or_default(),
            rank: a.rank,
            local_rank: a.local_rank,
            world_size: a.world_size,
            group_rank: None,
            parent_pid: std::os::unix::process::parent_id(),
        }
    });
    let cfg = TracedConfig {
        job,
        exe: a.exe.clone(),
        cmdline: if a.cmdline.is_empty() { vec![a.exe.clone()] } else { a.cmdline },
        cgroup: a.cgroup,
        rate: a.rate,
        batch: a.batch,
        per_session: a.per_session,
        displaced: a.displaced,
        seed: a.seed,
        ..Default::default()
    };
    let agent = TracedAgent::start(&a.socket, cfg)?;
    println!("process_id {}", agent.process_id);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let deadline = a.seconds.map(|s| std::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    if deadline.is_none() {
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            let _ = tx.send(());
        });
    }
    loop {
        if rx.try_recv().is_ok() || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        match agent.events.recv_timeout(Duration::from_millis(20)) {
            Ok(Event::Started(s)) => println!("started {s}"),
            Ok(Event::Stopped(s, n)) => println!("stopped {s} {n}"),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    agent.finish()
}
