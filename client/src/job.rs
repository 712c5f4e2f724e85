//! `gpuprofctl job top`: the ranks of a distributed job in a session compared, and the
//! straggler the others wait on.

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuprofctl::{Client, pb};
use serde_json::{Value, json};

use crate::output::{Usage, human_ns, table};

#[derive(Subcommand, Debug)]
pub enum JobCmd {
    /// Compare a job's ranks in a session: step time, GPU busy share, time in NCCL kernels,
    /// time waiting in collectives, and the straggler (the rank the others wait on).
    #[command(after_help = "Step time comes from a repeating NVTX range (PyTorch's ProfilerStep#N, or any range \
                            seen at least 3 times), else from the period of the rank's most frequent NCCL kernel; \
                            the SOURCE column says which. A rank waits in a collective from its own NCCL kernel's \
                            start until the last rank's starts.\n\
                            --json: one JSON object.")]
    Top(TopArgs),
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Session id.
    pub session: u64,
    /// The job to compare (its id as `procs` shows it); needed when the session holds ranks of
    /// several jobs.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
}

pub async fn job(c: &mut Client, cmd: JobCmd, json: bool) -> Result<()> {
    match cmd {
        JobCmd::Top(a) => top(c, a, json).await,
    }
}

async fn top(c: &mut Client, a: TopArgs, json: bool) -> Result<()> {
    if a.job.as_deref() == Some("") {
        anyhow::bail!(Usage("--job: the job id is empty".into()));
    }
    let req = pb::GetJobSummaryRequest { session_id: a.session, job_id: a.job.unwrap_or_default() };
    let s = c.get_job_summary(req).await?.into_inner();
    if json {
        println!("{}", serde_json::to_string_pretty(&summary_json(&s))?);
    } else {
        print(&s);
    }
    Ok(())
}

fn rank_json(r: &pb::RankSummary) -> Value {
    json!({
        "process_id": r.process_id, "pid": r.pid, "rank": r.rank, "device_ids": r.device_ids,
        "start_ns": r.start_ns, "end_ns": r.end_ns, "kernel_count": r.kernel_count,
        "step_ns": r.step_ns, "step_source": r.step_source, "step_name": r.step_name, "steps": r.steps,
        "busy_ns": r.busy_ns, "busy_share": r.busy_share, "nccl_count": r.nccl_count, "nccl_ns": r.nccl_ns,
        "wait_ns": r.wait_ns, "last_count": r.last_count,
        "collectives": r.collectives.iter().map(|c| json!({"name": c.name, "count": c.count, "bytes": c.bytes}))
            .collect::<Vec<_>>(),
    })
}

pub fn summary_json(s: &pb::JobSummary) -> Value {
    json!({
        "session_id": s.session_id,
        "job_id": s.job_id,
        "ranks": s.ranks.iter().map(rank_json).collect::<Vec<_>>(),
        "collectives": s.collectives,
        "matched_by": s.matched_by,
        "straggler": s.straggler.as_ref().map(|v| json!({
            "rank": v.rank, "process_id": v.process_id, "last_count": v.last_count, "collectives": v.collectives,
            "others_wait_ns": v.others_wait_ns, "median_wait_ns": v.median_wait_ns, "evidence": v.evidence,
        })),
        "no_straggler": s.no_straggler,
        "notes": s.notes,
    })
}

/// A share of a whole as a percentage ("-" without a whole).
fn pct(part: u64, whole: u64) -> String {
    if whole == 0 { "-".into() } else { format!("{:.1}%", part as f64 * 100.0 / whole as f64) }
}

pub fn print(s: &pb::JobSummary) {
    let job = if s.job_id.is_empty() { "(no job id)" } else { s.job_id.as_str() };
    let by = if s.matched_by.is_empty() { String::new() } else { format!(" (matched by {})", s.matched_by) };
    println!("session {}  job {job}  {} collectives compared{by}", s.session_id, s.collectives);
    let reported = s.ranks.iter().any(|r| !r.collectives.is_empty());
    let rows: Vec<Vec<String>> = s
        .ranks
        .iter()
        .map(|r| {
            let span = r.end_ns.saturating_sub(r.start_ns);
            let straggler = s.straggler.as_ref().is_some_and(|v| v.process_id == r.process_id);
            vec![
                r.rank.map_or("-".into(), |v| v.to_string()) + if straggler { " *" } else { "" },
                r.process_id.to_string(),
                r.pid.to_string(),
                r.device_ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
                if r.step_ns > 0 { human_ns(r.step_ns) } else { "-".into() },
                if r.step_source.is_empty() { "-".into() } else { r.step_source.clone() },
                if r.kernel_count > 0 { format!("{:.1}%", r.busy_share * 100.0) } else { "-".into() },
                human_ns(r.nccl_ns),
                pct(r.nccl_ns, span),
                if r.rank.is_some() { human_ns(r.wait_ns) } else { "-".into() },
                if r.rank.is_some() { r.last_count.to_string() } else { "-".into() },
                r.collectives.iter().map(|c| c.count).sum::<u64>().to_string(),
            ]
        })
        .collect();
    let mut head =
        vec![">RANK", ">PROC", ">PID", "DEVICE", ">STEP", "SOURCE", ">BUSY", ">NCCL", ">NCCL%", ">WAIT", ">LAST"];
    // COLLS: the collectives NCCL reported (only where it loaded the profiler plugin).
    let rows: Vec<Vec<String>> = if reported {
        head.push(">COLLS");
        rows
    } else {
        rows.into_iter()
            .map(|mut r| {
                r.pop();
                r
            })
            .collect()
    };
    table(&head, &rows);
    println!();
    match &s.straggler {
        Some(v) => println!("straggler: {}", v.evidence),
        None => println!("no straggler: {}", s.no_straggler),
    }
    let steps: Vec<String> = s
        .ranks
        .iter()
        .filter(|r| !r.step_name.is_empty())
        .map(|r| format!("{} {:?}", r.step_source, r.step_name))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !steps.is_empty() {
        println!("step time from: {}", steps.join(", "));
    }
    for r in s.ranks.iter().filter(|r| !r.collectives.is_empty()) {
        let list: Vec<String> = r
            .collectives
            .iter()
            .map(|c| format!("{} {} ({})", c.name, c.count, crate::output::human_bytes(c.bytes)))
            .collect();
        let who = r.rank.map_or(format!("process {}", r.process_id), |k| format!("rank {k}"));
        println!("collectives of {who}: {}", list.join(", "));
    }
    for n in &s.notes {
        println!("note: {n}");
    }
}
