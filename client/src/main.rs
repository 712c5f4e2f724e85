//! `gpuprofctl`: command-line client of gpuprofd.
#![forbid(unsafe_code)]

mod diff;
mod diff_flame;
mod export;
mod flame;
mod fleet;
mod fleet_perfetto;
mod job;
mod outfile;
mod output;
mod pc;
mod pc_diff;
mod profile;
mod records;
mod sessions;
mod trace;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use gpuprofctl::{DEFAULT_API_SOCKET, Remote, Target, connect_to, pb};

/// The help heading of the options every command takes.
const GLOBAL: &str = "Global options";

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
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_API_SOCKET", default_value = DEFAULT_API_SOCKET)]
    socket: PathBuf,
    /// A remote gpuprofd, https://HOST:PORT (its `[api] tcp_listen`), instead of --socket.
    /// Needs --token-file, or --cert and --key.
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_ADDR", value_name = "URL")]
    addr: Option<String>,
    /// A remote gpuprofd as HOST:PORT (https://HOST:PORT, like --addr), with the same TLS and
    /// credentials (--ca, --token-file, --cert).
    #[arg(long = "host", global = true, help_heading = GLOBAL, value_name = "HOST:PORT", conflicts_with = "addr")]
    hosts: Vec<String>,
    /// CA certificate (PEM) that signed the server's certificate (default: the system's roots).
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_CA_FILE", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// File holding the node's bearer token (the server's `api.token_file`).
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Client certificate (PEM) for mTLS; with --key.
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_CERT_FILE", value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, global = true, help_heading = GLOBAL, env = "GPUPROF_KEY_FILE", value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Print JSON instead of text: one document, or JSON Lines (one object per line) where a
    /// command streams; each command's help says which.
    #[arg(long, global = true, help_heading = GLOBAL)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Daemon status: version, uptime, agents, records per kind, database size.
    #[command(after_help = "--json: one JSON object.")]
    Status,
    /// GPU performance-monitor reservations: --pause (free GPUs for Nsight Compute or DCGM),
    /// --resume, --status.
    #[command(after_help = "--json: one JSON document (the reservations, or what was paused or resumed).")]
    Profile(profile::ProfileArgs),
    /// Live PM samples.
    #[command(subcommand)]
    Pm(profile::PmCmd),
    /// PC samples of a session: where kernels stall, by function, source line, stall reason
    /// or PC.
    #[command(subcommand)]
    Pc(pc::PcCmd),
    /// GPUs known to gpuprofd.
    #[command(after_help = "--json: one JSON array, an object per GPU.")]
    Devices,
    /// Processes connected to gpuprofd (yours only, unless root or in the admin group).
    #[command(after_help = "--json: one JSON array, an object per process.")]
    Procs(sessions::ProcsArgs),
    /// Profiling sessions: start, stop, list, show.
    #[command(subcommand)]
    Session(sessions::SessionCmd),
    /// Trace processes (--pid, --exe, --all, ...) for --duration, then print the top kernels.
    #[command(after_help = "--host repeated (--host H1:PORT --host H2:PORT): trace on several hosts at once, one \
                            session per host started together, with -o one merged Chrome trace; TLS and \
                            credentials apply to every host.\n\
                            --json: one JSON object, the session and its summary.")]
    Trace(Box<trace::TraceArgs>),
    /// Distributed jobs: `job top SESSION` compares a job's ranks and names the straggler.
    #[command(subcommand)]
    Job(job::JobCmd),
    /// A session's summary: top kernels, device busy time, copies, API calls.
    #[command(after_help = "--json: one JSON object.")]
    Top(records::TopArgs),
    /// A session's records, filtered.
    #[command(after_help = "--json: JSON Lines, one object per record as they stream, each with its \"kind\".")]
    Query(records::QueryArgs),
    /// What changed between two sessions, two ranks of one, or two time ranges of one: per
    /// kernel (changes within a kernel's own noise marked so), device busy time, copies, NCCL
    /// collectives; `-o diff.svg` draws a differential flame graph.
    #[command(after_help = diff::AFTER_HELP)]
    Diff(Box<diff::DiffArgs>),
    /// Write a session to a file: Chrome trace JSON (.json, .json.gz), Perfetto trace
    /// (.pftrace), SQLite (.sqlite), its PC samples as pprof (.pb.gz) or as a flame graph
    /// (.svg); `-o -` writes to stdout. `--format parquet -o DIR` writes one Parquet file per
    /// record kind into DIR.
    #[command(after_help = "--json: one JSON object saying what was written (on stderr with `-o -`).")]
    Export(export::ExportArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Man pages: gpuprofctl(1) on stdout (`gpuprofctl man | man -l -`), or with --out-dir every
    /// page (gpuprofctl.1, gpuprofctl-session-start.1, ...) written into a directory.
    Man {
        /// Where to write every page (created if missing).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// Exit codes: see [`output::exit_code`] (0 ok, 1 failed, 2 usage, 3 unreachable, 4 not found,
/// 5 permission denied, 6 wrong state).
const EXIT_FAILED: u8 = output::EXIT_FAILED;

fn main() -> ExitCode {
    quiet_when_stdout_closes();
    let cli = Cli::parse();
    match &cli.cmd {
        Cmd::Completions { shell } => {
            // Generated into memory first: clap_complete panics when its own write fails, as
            // it does when `| head` has closed stdout.
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "gpuprofctl", &mut script);
            return print_generated(&script, "the completion script");
        }
        Cmd::Man { out_dir: None } => {
            let mut page = Vec::new();
            return match clap_mangen::Man::new(Cli::command()).render(&mut page) {
                Ok(()) => print_generated(&page, "the man page"),
                Err(e) => {
                    eprintln!("error: rendering the man page: {e}");
                    ExitCode::from(EXIT_FAILED)
                }
            };
        }
        Cmd::Man { out_dir: Some(out_dir) } => {
            let written =
                std::fs::create_dir_all(out_dir).and_then(|()| clap_mangen::generate_to(Cli::command(), out_dir));
            return match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: writing man pages into {}: {e}", out_dir.display());
                    ExitCode::from(EXIT_FAILED)
                }
            };
        }
        _ => {}
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
        // `gpuprofctl query 7 | head`: the reader has what it wanted.
        Err(e) if output::is_closed_stdout(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", output::describe(&e));
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

/// Writes generated text to stdout: exit 0 when the reader has gone (`| head -1`), 1 when the
/// write failed otherwise.
fn print_generated(text: &[u8], what: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing {what} to stdout: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `gpuprofctl ... | head` closes stdout early: a print to it then fails with EPIPE (Rust
/// ignores SIGPIPE), which `println!` turns into a panic. Exit 0 quietly instead, as `cat`
/// does; errors returned from writes are handled in `main`.
fn quiet_when_stdout_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg =
            payload.downcast_ref::<String>().map(String::as_str).or_else(|| payload.downcast_ref::<&str>().copied());
        if msg.is_some_and(|m| m.starts_with("failed printing to stdout") && m.contains("Broken pipe")) {
            std::process::exit(0);
        }
        default(info)
    }));
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
        return fleet::trace(clients, *a, cli.json).await;
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
        Cmd::Pc(c) => pc::pc(&mut client, c, cli.json, &remote(String::new())).await?,
        Cmd::Devices => sessions::devices(&mut client, cli.json).await?,
        Cmd::Procs(a) => sessions::procs(&mut client, a, cli.json).await?,
        Cmd::Session(c) => sessions::session(&mut client, c, cli.json).await?,
        Cmd::Trace(a) => trace::trace(&mut client, *a, cli.json).await?,
        Cmd::Job(c) => job::job(&mut client, c, cli.json).await?,
        Cmd::Top(a) => records::top(&mut client, a, cli.json).await?,
        Cmd::Query(a) => records::query(&mut client, a, cli.json).await?,
        Cmd::Export(a) => export::export(&mut client, a, cli.json).await?,
        Cmd::Diff(a) => diff::diff(&mut client, &remote(String::new()), *a, cli.json).await?,
        Cmd::Completions { .. } | Cmd::Man { .. } => {}
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
    match (s.gpu_count, s.gpu_note.as_str()) {
        (n, "") => println!("GPUs               {n}"),
        (0, note) => println!("GPUs               none: {note}"),
        (n, note) => println!("GPUs               {n} ({note})"),
    }
    if !s.storage_error.is_empty() {
        println!("STORAGE ERROR      {}", s.storage_error);
    }
    if s.cupti_dropped > 0 {
        println!("CUPTI dropped      {} records (buffers full in traced processes)", s.cupti_dropped);
    }
    print!("{}", status_records(s));
}

/// The records table of `status`, after a blank line; a line saying there are none instead of
/// an empty table.
fn status_records(s: &pb::GetStatusResponse) -> String {
    let rows: Vec<Vec<String>> = s
        .records
        .iter()
        .filter(|r| r.ingested > 0 || r.dropped > 0)
        .map(|r| vec![r.kind.clone(), r.ingested.to_string(), r.dropped.to_string()])
        .collect();
    if rows.is_empty() {
        return "records            none since gpuprofd started\n".into();
    }
    format!("\n{}\n", output::table_text(&["KIND", ">INGESTED", ">DROPPED"], &rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_has_no_empty_table() {
        let mut s = pb::GetStatusResponse {
            records: vec![pb::RecordKindCount { kind: "kernel".into(), ingested: 0, dropped: 0 }],
            ..Default::default()
        };
        assert_eq!(status_records(&s), "records            none since gpuprofd started\n");
        s.records[0].ingested = 12;
        assert_eq!(status_records(&s), "\nKIND    INGESTED  DROPPED\nkernel        12        0\n");
    }

    #[test]
    fn man_is_listed_and_export_names_every_format() {
        let help = Cli::command().render_help().to_string();
        assert!(help.lines().any(|l| l.trim_start().starts_with("man ")), "{help}");
        let export = Cli::command().find_subcommand("export").map(|c| c.get_about().map(|a| a.to_string()));
        let about = export.flatten().unwrap_or_default();
        for ending in [".json", ".json.gz", ".pftrace", ".sqlite", ".pb.gz", ".svg", "parquet"] {
            assert!(about.contains(ending), "{ending} in {about:?}");
        }
    }
}
