//! `gpuprofctl`: command-line client of gpuprofd.
#![forbid(unsafe_code)]

mod fleet;
mod output;
mod profile;
mod records;
mod sessions;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use gpuprofctl::{DEFAULT_API_SOCKET, Remote, Target, connect_to, pb};

#[derive(Parser)]
#[command(
    name = "gpuprofctl",
    version,
    about = "Control and query gpuprofd",
    after_help = "Exit codes: 0 ok, 1 failed, 2 bad usage or arguments, 3 gpuprofd unreachable or shutting down, \
                  4 not found, 5 permission denied, 6 not possible in the current state."
)]
struct Cli {
    /// gpuprofd's API socket.
    #[arg(long, global = true, env = "GPUPROF_API_SOCKET", default_value = DEFAULT_API_SOCKET)]
    socket: PathBuf,
    /// A remote gpuprofd, https://HOST:PORT (its `[api] tcp_listen`), instead of --socket.
    /// Needs --token-file, or --cert and --key.
    #[arg(long, global = true, env = "GPUPROF_ADDR", value_name = "URL")]
    addr: Option<String>,
    /// A remote gpuprofd as HOST:PORT (https://HOST:PORT, like --addr). Repeat it to trace on
    /// several hosts at once (`trace` only): one session per host, started together, and with
    /// -o one merged Chrome trace. TLS and credentials (--ca, --token-file, --cert) apply to all.
    #[arg(long = "host", global = true, value_name = "HOST:PORT", conflicts_with = "addr")]
    hosts: Vec<String>,
    /// CA certificate (PEM) that signed the server's certificate (default: the system's roots).
    #[arg(long, global = true, env = "GPUPROF_CA_FILE", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// File holding the node's bearer token (the server's `api.token_file`).
    #[arg(long, global = true, env = "GPUPROF_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS; with --key.
    #[arg(long, global = true, env = "GPUPROF_CERT_FILE", value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, global = true, env = "GPUPROF_KEY_FILE", value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Daemon status: version, uptime, agents, records per kind, database size.
    Status,
    /// GPU performance-monitor reservations: --pause (free GPUs for Nsight Compute or DCGM),
    /// --resume, --status.
    Profile(profile::ProfileArgs),
    /// Live PM samples.
    #[command(subcommand)]
    Pm(profile::PmCmd),
    /// GPUs known to gpuprofd.
    Devices,
    /// Processes connected to gpuprofd (yours only, unless root or in the admin group).
    Procs(sessions::ProcsArgs),
    /// Profiling sessions: start, stop, list, show.
    #[command(subcommand)]
    Session(sessions::SessionCmd),
    /// Trace processes (--pid, --exe, --all, ...) for --duration, then print the top kernels.
    Trace(sessions::TraceArgs),
    /// A session's summary: top kernels, device busy time, copies, API calls.
    Top(records::TopArgs),
    /// A session's records, filtered.
    Query(records::QueryArgs),
    /// Write a session to a Chrome trace JSON (Perfetto UI) or SQLite file.
    Export(records::ExportArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

/// Exit codes: see [`output::exit_code`] (0 ok, 1 failed, 2 usage, 3 unreachable, 4 not found,
/// 5 permission denied, 6 wrong state).
const EXIT_FAILED: u8 = output::EXIT_FAILED;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::Completions { shell } = &cli.cmd {
        clap_complete::generate(*shell, &mut Cli::command(), "gpuprofctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let remote_with_cert = (cli.addr.is_some() || !cli.hosts.is_empty()) && cli.cert.is_some();
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if remote_with_cert && connection_dropped(&e) {
                eprintln!(
                    "hint: gpuprofd closes TLS connections whose client certificate it does not trust; \
                     --cert must be signed by the CA in the server's api.client_ca_file"
                );
            }
            ExitCode::from(output::exit_code(&e))
        }
    }
}

/// Whether a call failed because the connection went away (as when the server rejects the
/// client certificate after the TLS handshake), not with an answer from gpuprofd.
fn connection_dropped(e: &anyhow::Error) -> bool {
    e.downcast_ref::<tonic::Status>()
        .is_some_and(|s| matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unavailable | tonic::Code::Unknown))
}

async fn run(cli: Cli) -> Result<()> {
    let remote = |addr: String| Remote {
        addr,
        ca: cli.ca.clone(),
        token_file: cli.token_file.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
    };
    if cli.hosts.len() > 1 {
        let Cmd::Trace(a) = cli.cmd else {
            anyhow::bail!(output::Usage("--host more than once works with trace only".into()));
        };
        let mut clients = Vec::new();
        for h in &cli.hosts {
            let c = connect_to(&Target::Remote(remote(format!("https://{h}")))).await.with_context(|| h.clone())?;
            clients.push((h.clone(), c));
        }
        return fleet::trace(clients, a, cli.json).await;
    }
    let target = match (cli.hosts.first(), cli.addr.clone()) {
        (Some(h), _) => Target::Remote(remote(format!("https://{h}"))),
        (None, Some(addr)) => Target::Remote(remote(addr)),
        (None, None) => Target::Socket(cli.socket.clone()),
    };
    let mut client = connect_to(&target).await?;
    match cli.cmd {
        Cmd::Status => {
            let s = client.get_status(pb::GetStatusRequest {}).await?.into_inner();
            if cli.json {
                println!("{}", serde_json::to_string_pretty(&status_json(&s))?);
            } else {
                print_status(&s);
            }
        }
        Cmd::Profile(a) => profile::profile(&mut client, a, cli.json).await?,
        Cmd::Pm(c) => profile::pm(&mut client, c, cli.json).await?,
        Cmd::Devices => sessions::devices(&mut client, cli.json).await?,
        Cmd::Procs(a) => sessions::procs(&mut client, a, cli.json).await?,
        Cmd::Session(c) => sessions::session(&mut client, c, cli.json).await?,
        Cmd::Trace(a) => sessions::trace(&mut client, a, cli.json).await?,
        Cmd::Top(a) => records::top(&mut client, a, cli.json).await?,
        Cmd::Query(a) => records::query(&mut client, a, cli.json).await?,
        Cmd::Export(a) => records::export(&mut client, a, cli.json).await?,
        Cmd::Completions { .. } => {}
    }
    Ok(())
}

fn status_json(s: &pb::GetStatusResponse) -> serde_json::Value {
    let records: serde_json::Map<String, serde_json::Value> = s
        .records
        .iter()
        .map(|r| (r.kind.clone(), serde_json::json!({"ingested": r.ingested, "dropped": r.dropped})))
        .collect();
    serde_json::json!({
        "version": s.version,
        "uptime_seconds": s.uptime_seconds,
        "connected_agents": s.connected_agents,
        "records": records,
        "database_bytes": s.database_bytes,
        "database_path": s.database_path,
        "ingest_queue_depth": s.ingest_queue_depth,
        "gpu_count": s.gpu_count,
        "gpu_note": s.gpu_note,
        "protocol_errors": s.protocol_errors,
        "active_sessions": s.active_sessions,
        "storage_error": s.storage_error,
        "expired_sessions": s.expired_sessions,
        "expired_records": s.expired_records,
        "cupti_dropped": s.cupti_dropped,
    })
}

fn print_status(s: &pb::GetStatusResponse) {
    println!("gpuprofd {}  up {}s", s.version, s.uptime_seconds);
    println!("agents connected   {}", s.connected_agents);
    println!("active sessions    {}", s.active_sessions);
    println!("database           {} ({})", s.database_path, output::human_bytes(s.database_bytes));
    if s.expired_sessions > 0 || s.expired_records > 0 {
        println!("expired            {} sessions, {} records (retention)", s.expired_sessions, s.expired_records);
    }
    println!("ingest queue       {} records", s.ingest_queue_depth);
    println!("protocol errors    {}", s.protocol_errors);
    println!(
        "GPUs               {}{}",
        s.gpu_count,
        if s.gpu_note.is_empty() { String::new() } else { format!(" ({})", s.gpu_note) }
    );
    if !s.storage_error.is_empty() {
        println!("STORAGE ERROR      {}", s.storage_error);
    }
    if s.cupti_dropped > 0 {
        println!("CUPTI dropped      {} records (buffers full in traced processes)", s.cupti_dropped);
    }
    println!();
    println!("{:<22} {:>14} {:>10}", "KIND", "INGESTED", "DROPPED");
    for r in s.records.iter().filter(|r| r.ingested > 0 || r.dropped > 0) {
        println!("{:<22} {:>14} {:>10}", r.kind, r.ingested, r.dropped);
    }
}
