//! `gpuprofd`: the gpuprof daemon.
// No unsafe code but the one allocator setting in `bound_malloc_arenas`.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuprofd::config::{Config, Overrides};

/// At most two glibc malloc arenas. glibc gives threads that allocate at once arenas of their
/// own (up to 8 per core), each keeping what was freed in it: the export's reader threads and
/// the runtime's workers (more on a bigger node) left the daemon's peak RSS in the export bench
/// at 107-129 MiB; with 4 arenas 89-111, with 2 93-100, with 1 76-77, at the same speed (each
/// thread's small allocations go to its own cache without the arena's lock). `MALLOC_ARENA_MAX`
/// or `GLIBC_TUNABLES` set by the operator win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn bound_malloc_arenas() {
    const ARENAS: libc::c_int = 2;
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() || std::env::var_os("GLIBC_TUNABLES").is_some() {
        return;
    }
    // SAFETY: mallopt only sets a parameter of the allocator; it is called before any other
    // thread exists. Its result (0 for an unknown parameter) needs no handling: the default stays.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn bound_malloc_arenas() {}

#[derive(Parser)]
#[command(name = "gpuprofd", version, about = "gpuprof daemon: always-on GPU profiling service")]
struct Cli {
    /// TOML config file (defaults are built in; see `gpuprofd print-default-config`).
    #[arg(long, env = "GPUPROF_CONFIG")]
    config: Option<PathBuf>,
    /// Put the database (DIR/gpuprof.db) and both sockets (DIR/agent.sock, DIR/api.sock) in DIR.
    #[arg(long, env = "GPUPROF_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Agent socket path (overrides config and --state-dir).
    #[arg(long, env = "GPUPROF_AGENT_SOCKET")]
    agent_socket: Option<PathBuf>,
    /// API socket path (overrides config and --state-dir).
    #[arg(long, env = "GPUPROF_API_SOCKET")]
    api_socket: Option<PathBuf>,
    /// Log filter, e.g. "info" or "gpuprofd=debug".
    #[arg(long, env = "GPUPROF_LOG")]
    log: Option<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Validate a config file; errors name the bad key.
    CheckConfig { file: PathBuf },
    /// Print the built-in default configuration.
    PrintDefaultConfig,
}

fn main() -> ExitCode {
    bound_malloc_arenas();
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::CheckConfig { file }) => {
            let checked = Config::load(Some(&file), &Overrides::default()).and_then(|cfg| {
                // The TLS certificate, key, client CA and token must be usable, not just readable.
                gpuprofd::api::TcpSecurity::load(&cfg.api)?;
                Ok(cfg)
            });
            return match checked {
                Ok(cfg) => match gpuprofd::sampler::check_metrics(&cfg) {
                    Ok(note) => {
                        if !note.is_empty() {
                            println!("{note}");
                        }
                        println!("{}: ok", file.display());
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: invalid config file {}: {e:#}", file.display());
                        ExitCode::from(2)
                    }
                },
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
        Some(Cmd::PrintDefaultConfig) => {
            print!("{}", gpuprofd::config::DEFAULT_TOML);
            return ExitCode::SUCCESS;
        }
        None => {}
    }
    let ov = Overrides {
        state_dir: cli.state_dir,
        log_level: cli.log,
        agent_socket: cli.agent_socket,
        api_socket: cli.api_socket,
    };
    let config = match Config::load(cli.config.as_deref(), &ov) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // The filter sits behind a reload handle: SIGHUP may change `log_level`.
    use tracing_subscriber::prelude::*;
    let (filter, handle) =
        tracing_subscriber::reload::Layer::new(tracing_subscriber::EnvFilter::new(&config.log_level));
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    let set_log: gpuprofd::reload::SetLogFilter = Box::new(move |level: &str| {
        let filter = tracing_subscriber::EnvFilter::try_new(level).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    });
    let source = gpuprofd::reload::Source { file: cli.config.clone(), overrides: ov.clone(), set_log: Some(set_log) };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("gpuprofd").build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(gpuprofd::run(config, source)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
