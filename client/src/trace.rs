//! `gpuprofctl trace`: a session started, waited for (its duration, record limit or Ctrl-C),
//! then its summary, PC samples, a job's ranks compared, and the trace file.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use gpuprofctl::{Client, pb};

use crate::output::{print_summary, session_json, session_line, summary_json};
use crate::sessions::{CollectArgs, TargetArgs};

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub targets: TargetArgs,
    #[command(flatten)]
    pub collect: CollectArgs,
    /// Kernels to list in the summary.
    #[arg(long, default_value_t = 10)]
    pub top: u32,
    /// Also write the trace to this file, in the format its name says: .json, .json.gz (Chrome
    /// JSON), .pftrace (Perfetto), .sqlite, .pb.gz (pprof); with several --host, their traces
    /// merged into one (Chrome JSON or Perfetto).
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<std::path::PathBuf>,
}

/// `trace`: start a session, wait for its end (duration, record limit, or Ctrl-C), print the summary.
pub async fn trace(c: &mut Client, args: TraceArgs, json: bool) -> Result<()> {
    // The trace file's format, from its name (checked before anything starts).
    let out_format = match &args.output {
        None => None,
        Some(p) => match crate::export::format_of(p)? {
            crate::export::Format::Parquet | crate::export::Format::Svg => {
                return Err(crate::output::Usage(format!(
                    "-o {}: trace writes one file: Chrome JSON (.json, .json.gz), Perfetto (.pftrace), SQLite \
                     (.sqlite) or pprof (.pb.gz); use `gpuprofctl export` afterwards for Parquet or SVG",
                    p.display()
                ))
                .into());
            }
            f => f.wire(),
        },
    };
    let req = args.collect.request(args.targets.to_pb()?)?;
    let s = c.start_session(req).await?.into_inner();
    let id = s.id;
    if !json {
        let how = match args.collect.duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until Ctrl-C".into(),
        };
        eprintln!(
            "tracing session {id} {how} ({} process{} now; matching processes that start later join)",
            s.processes.len(),
            if s.processes.len() == 1 { "" } else { "es" }
        );
    }
    let mut interrupted = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let final_session = loop {
        tokio::select! {
            r = &mut ctrl_c => {
                r.context("waiting for Ctrl-C")?;
                interrupted = true;
                break c.stop_session(pb::StopSessionRequest { session_id: id }).await?.into_inner();
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                let s = c.get_session(pb::GetSessionRequest { session_id: id }).await?.into_inner();
                let st = pb::SessionState::try_from(s.state).unwrap_or_default();
                if matches!(st, pb::SessionState::Completed | pb::SessionState::Failed | pb::SessionState::Interrupted) {
                    break s;
                }
            }
        }
    };
    let summary =
        c.get_summary(pb::GetSummaryRequest { session_id: id, filter: None, top: args.top }).await?.into_inner();
    let pc = match args.collect.pc_sampling {
        true => Some(crate::pc::query(c, id, crate::pc::By::Function, None, 5).await?),
        false => None,
    };
    // A job traced by its id: its ranks compared, as `job top` shows them. A job whose ranks
    // cannot be compared (none connected, say) says why instead.
    let job = match &args.targets.job {
        Some(j) => Some(c.get_job_summary(pb::GetJobSummaryRequest { session_id: id, job_id: j.clone() }).await),
        None => None,
    };
    if json {
        let mut v = serde_json::json!({"session": session_json(&final_session), "summary": summary_json(&summary)});
        if let Some(pc) = &pc {
            v["pc_top"] = crate::pc::top_json(id, crate::pc::By::Function, pc);
        }
        match &job {
            Some(Ok(s)) => v["job"] = crate::job::summary_json(s.get_ref()),
            Some(Err(e)) => v["job_error"] = e.message().into(),
            None => {}
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if interrupted {
            eprintln!();
        }
        println!("{}", session_line(&final_session));
        for p in final_session.processes.iter().filter(|p| p.displaced || p.state == "failed" || p.dropped > 0) {
            println!(
                "  pid {}: {}{}",
                p.pid,
                p.state,
                if p.dropped > 0 { format!(", {} records dropped", p.dropped) } else { String::new() }
            );
        }
        print_summary(&summary, 80, false);
        match &job {
            Some(Ok(s)) => {
                println!();
                crate::job::print(s.get_ref());
            }
            Some(Err(e)) => println!("\njob: not compared: {}", e.message()),
            None => {}
        }
        if let Some(pc) = &pc {
            println!();
            println!("{} (gpuprofctl pc top {id} --by line: the source lines)", crate::pc::totals_text(pc));
            if pc.total_samples > 0 {
                println!("{}", crate::pc::top_text(pc, crate::pc::By::Function, 60));
            }
            for p in &final_session.processes {
                for d in p.pc_sampling.iter().filter(|d| d.samples == 0) {
                    println!("  pid {} GPU {}: no PC samples: {}", p.pid, d.device, d.state);
                }
            }
        }
    }
    if let (Some(path), Some(format)) = (&args.output, out_format) {
        let data = crate::records::export_bytes(c, id, format).await?;
        crate::outfile::write_file(path, &data)?;
    }
    if pb::SessionState::try_from(final_session.state) == Ok(pb::SessionState::Failed) {
        bail!("session {id} failed: {}", final_session.stop_reason);
    }
    Ok(())
}
