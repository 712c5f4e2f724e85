//! `gpuprofctl pc top|watch`: where a session's kernels stall, from its PC samples; and the
//! PC parts of `session show` and `trace`.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};
use gpuprofctl::pb;
use serde_json::{Value, json};

use gpuprofctl::Client;

use crate::output::{short_stall, shorten, table, table_text};

#[derive(Subcommand, Debug)]
pub enum PcCmd {
    /// The hottest functions, source lines, stall reasons or PCs of a session, or of the node's
    /// always-on profile with --since, each with its top stall reasons.
    #[command(after_help = "Without a session, --since reads the node's always-on PC profile ([pc] always_on in \
gpuprofd's configuration), kept per minute: e.g. `gpuprofctl pc top --since 1h --pod 'trainer-*'`.\n\
--json: one JSON object: totals and rows, hottest first, each with its stall reasons.")]
    Top(TopArgs),
    /// A live top of a running session's PC samples, as its processes send them (redrawn
    /// every second on a terminal, a table a second otherwise).
    #[command(after_help = "--json: JSON Lines, one object per batch received (its rows, period and drops).")]
    Watch(WatchArgs),
    /// What changed in the PC samples of two sessions, two ranks of one, or two time ranges of
    /// the always-on profile, per function, line or stall reason, as shares of each side's samples.
    #[command(after_help = crate::pc_diff::AFTER_HELP)]
    Diff(Box<crate::pc_diff::PcDiffArgs>),
}

pub use crate::output::By;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Session id (none: the node's always-on profile, with --since).
    #[arg(required_unless_present = "since")]
    pub session: Option<u64>,
    /// The node's always-on profile over this last period, e.g. 1h, 30m (per minute).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "session")]
    pub since: Option<std::time::Duration>,
    /// With --since: only processes of pods whose name, namespace/name or UID matches this glob.
    #[arg(long, value_name = "GLOB", requires = "since")]
    pub pod: Option<String>,
    /// With --since: only processes whose executable (path or base name) matches this glob.
    #[arg(long, value_name = "GLOB", requires = "since")]
    pub exe: Option<String>,
    /// With --since: draw the profile as a flame graph into this SVG file instead (function,
    /// source line, stall reason; `-`: stdout), as `export --format svg` draws a session's.
    #[arg(long, value_name = "FILE", requires = "since")]
    pub svg: Option<std::path::PathBuf>,
    /// What a row is.
    #[arg(long, value_enum, default_value = "function")]
    pub by: By,
    /// Only functions whose name (demangled or mangled) matches this glob, e.g. '*gemm*'.
    #[arg(long, value_name = "GLOB")]
    pub kernel: Option<String>,
    /// Rows at most (up to 10000).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Session id.
    pub session: u64,
    /// Only functions whose name (demangled or mangled) matches this glob.
    #[arg(long, value_name = "GLOB")]
    pub kernel: Option<String>,
    /// Functions shown.
    #[arg(long, default_value_t = 15)]
    pub limit: usize,
}

/// `remote`: the TLS settings and credentials for the other gpuprofds a `pc diff` side names.
pub async fn pc(c: &mut Client, cmd: PcCmd, json: bool, remote: &gpuprofctl::Remote) -> Result<()> {
    match cmd {
        PcCmd::Top(a) => top(c, a, json).await,
        PcCmd::Watch(a) => watch(c, a, json).await,
        PcCmd::Diff(a) => crate::pc_diff::diff(c, remote, *a, json).await,
    }
}

fn group(by: By) -> pb::PcGroupBy {
    match by {
        By::Function => pb::PcGroupBy::Function,
        By::Line => pb::PcGroupBy::Line,
        By::Stall => pb::PcGroupBy::Stall,
        By::Pc => pb::PcGroupBy::Pc,
    }
}

fn pct(n: u64, total: u64) -> f64 {
    if total == 0 { 0.0 } else { n as f64 * 100.0 / total as f64 }
}

fn file_line(file: &str, line: u32) -> String {
    match (file, line) {
        ("", 0) => "-".into(),
        ("", l) => format!("?:{l}"),
        (f, 0) => f.to_string(),
        (f, l) => format!("{f}:{l}"),
    }
}

/// The top three stall reasons of a row with their share of it.
fn stalls_text(stalls: &[pb::StallCount], samples: u64) -> String {
    stalls
        .iter()
        .take(3)
        .map(|s| format!("{} {:.0}%", short_stall(&s.reason), pct(s.count, samples)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The table of QueryPcSamples rows.
pub fn top_text(r: &pb::QueryPcSamplesResponse, by: By, width: usize) -> String {
    let total = r.total_samples;
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            let (n, p) = (row.samples.to_string(), format!("{:.1}", pct(row.samples, total)));
            match by {
                By::Stall => vec![n, p, short_stall(&row.stall_reason).to_string()],
                By::Pc => vec![
                    n,
                    p,
                    format!("{:#x}", row.pc_offset),
                    shorten(&row.function_name, width),
                    file_line(&row.file, row.line),
                    stalls_text(&row.stalls, row.samples),
                ],
                By::Function | By::Line => vec![
                    n,
                    p,
                    shorten(&row.function_name, width),
                    file_line(&row.file, row.line),
                    stalls_text(&row.stalls, row.samples),
                ],
            }
        })
        .collect();
    match by {
        By::Stall => table_text(&[">SAMPLES", ">%", "STALL REASON"], &rows),
        By::Pc => table_text(&[">SAMPLES", ">%", ">PC", "FUNCTION", "FILE:LINE", "TOP STALLS"], &rows),
        By::Function => table_text(&[">SAMPLES", ">%", "FUNCTION", "HOTTEST LINE", "TOP STALLS"], &rows),
        By::Line => table_text(&[">SAMPLES", ">%", "FUNCTION", "FILE:LINE", "TOP STALLS"], &rows),
    }
}

fn by_name(by: By) -> &'static str {
    match by {
        By::Function => "function",
        By::Line => "line",
        By::Stall => "stall",
        By::Pc => "pc",
    }
}

pub fn top_json(session: u64, by: By, r: &pb::QueryPcSamplesResponse) -> Value {
    let total = r.total_samples;
    json!({
        "session": session,
        "by": by_name(by),
        "total_samples": total,
        "dropped_samples": r.dropped_samples,
        "total_rows": r.total_rows,
        "rows": r.rows.iter().map(|row| json!({
            "function": row.function_name,
            "mangled_name": row.mangled_name,
            "file": row.file,
            "line": row.line,
            "pc_offset": row.pc_offset,
            "stall_reason": if row.stall_reason.is_empty() { "" } else { short_stall(&row.stall_reason) },
            "samples": row.samples,
            "percent": pct(row.samples, total),
            "stalls": row.stalls.iter().map(|s| json!({
                "reason": short_stall(&s.reason), "count": s.count, "percent": pct(s.count, row.samples),
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// QueryPcSamples for a session.
pub async fn query(
    c: &mut Client,
    session: u64,
    by: By,
    kernel: Option<String>,
    limit: u32,
) -> Result<pb::QueryPcSamplesResponse> {
    Ok(c.query_pc_samples(pb::QueryPcSamplesRequest {
        session_id: session,
        group_by: group(by) as i32,
        kernel: kernel.unwrap_or_default(),
        limit,
        ..Default::default()
    })
    .await?
    .into_inner())
}

/// The header line of a top: samples, drops.
pub fn totals_text(r: &pb::QueryPcSamplesResponse) -> String {
    let drops = if r.dropped_samples > 0 {
        format!(", {} lost ({:.2}%)", r.dropped_samples, pct(r.dropped_samples, r.total_samples + r.dropped_samples))
    } else {
        String::new()
    };
    format!("{} PC samples{drops}", r.total_samples)
}

async fn top(c: &mut Client, a: TopArgs, json: bool) -> Result<()> {
    let Some(session) = a.session else { return node_top(c, a, json).await };
    let r = query(c, session, a.by, a.kernel, a.limit).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&top_json(session, a.by, &r))?);
        return Ok(());
    }
    let (why, counted) = not_sampled(c, session).await;
    if r.total_samples == 0 {
        println!("session {}: no PC samples (was it started with --pc-sampling? see gpuprofctl session show)", session);
        for l in why {
            println!("  {l}");
        }
        return Ok(());
    }
    println!("session {}: {}", session, totals_text(&r));
    if let Some(l) = without_rows(r.total_samples, counted) {
        println!("  {l}");
    }
    for l in why {
        println!("  {l}");
    }
    print_rows(&r, a.by);
    Ok(())
}

/// A top's rows, and how many more `--limit` would show.
fn print_rows(r: &pb::QueryPcSamplesResponse, by: By) {
    println!("{}", top_text(r, by, 70));
    if r.total_rows > r.rows.len() as u64 {
        println!("({} of {} rows; --limit shows more)", r.rows.len(), r.total_rows);
    }
}

/// `pc top --since`: the node's always-on profile.
async fn node_top(c: &mut Client, a: TopArgs, json: bool) -> Result<()> {
    let since = a.since.unwrap_or_default();
    let since_ns = crate::output::now_ns().saturating_sub(since.as_nanos() as u64).max(1);
    let (by, limit) = if a.svg.is_some() { (By::Line, crate::flame::MAX_ROWS) } else { (a.by, a.limit) };
    let r = c
        .query_pc_samples(pb::QueryPcSamplesRequest {
            group_by: group(by) as i32,
            kernel: a.kernel.unwrap_or_default(),
            limit,
            since_ns,
            pod: a.pod.clone().unwrap_or_default(),
            exe: a.exe.clone().unwrap_or_default(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let what = format!("always-on profile, last {}", humantime::format_duration(since));
    if let Some(path) = &a.svg {
        if r.total_samples == 0 {
            return Err(crate::output::WrongState(format!(
                "{what}: no PC samples to draw (is [pc] always_on set in gpuprofd's configuration?)"
            ))
            .into());
        }
        let svg =
            crate::flame::svg(&format!("gpuprof {what}: {} PC samples", r.total_samples), &crate::flame::folded(&r))?;
        crate::outfile::write_file(path, &svg)?;
        if path.as_os_str() != "-" {
            println!("wrote {} ({} PC samples)", path.display(), r.total_samples);
        }
        return Ok(());
    }
    if json {
        let mut v = top_json(0, a.by, &r);
        v["since_ns"] = json!(since_ns);
        v["pod"] = json!(a.pod);
        v["exe"] = json!(a.exe);
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if r.total_samples == 0 {
        println!("{what}: no PC samples (is [pc] always_on set in gpuprofd's configuration?)");
        return Ok(());
    }
    println!("{what}: {}", totals_text(&r));
    print_rows(&r, a.by);
    Ok(())
}

/// Why the session's processes are not sampled now, one line per (process, device) that is
/// not ("pid 4242 device 1: not sampled (no CUDA work seen on GPU 1 yet)", "pid 4243 (rank 3)
/// device 1: ...", "pid 4200 (launcher) device 0: ..."); none when the session cannot be read.
/// Why the session's processes are not sampled, one line each, and the samples CUPTI counted
/// on them (`session show`'s figures).
async fn not_sampled(c: &mut Client, session: u64) -> (Vec<String>, u64) {
    let Ok(s) = c.get_session(pb::GetSessionRequest { session_id: session }).await else { return (Vec::new(), 0) };
    let s = s.into_inner();
    let mut out = Vec::new();
    let mut counted = 0;
    for p in &s.processes {
        for d in &p.pc_sampling {
            counted += d.samples;
            if d.state != "sampling" && !d.state.starts_with("stopped") {
                let who = match (p.rank, p.role.as_str()) {
                    (Some(r), _) => format!(" (rank {r})"),
                    (None, "launcher") => " (launcher)".to_string(),
                    _ => String::new(),
                };
                out.push(format!("pid {}{who} device {}: {}", p.pid, d.device, d.state));
            }
        }
    }
    (out, counted)
}

/// When CUPTI counted more samples than the rows hold: how many have no row, and why they can't.
fn without_rows(in_rows: u64, counted: u64) -> Option<String> {
    // A live session's rows lag its counts by a flush; only a gap of over 1 % is worth a line.
    (counted > in_rows && counted - in_rows > counted / 100).then(|| {
        format!(
            "CUPTI counted {counted} samples; {} ({:.1}%) have no row: samples of non-user kernels, of \
             instructions with no selected stall reason, and hardware drops",
            counted - in_rows,
            pct(counted - in_rows, counted)
        )
    })
}

/// A function's samples and its samples per stall reason.
type FunctionCounts = (u64, HashMap<String, u64>);

/// Per function: samples and samples per stall reason.
#[derive(Default)]
struct Live {
    functions: HashMap<String, FunctionCounts>,
    total: u64,
    dropped: u64,
    batches: u64,
}

impl Live {
    fn add(&mut self, m: &pb::StreamPcSamplesResponse) {
        self.batches += 1;
        self.dropped += m.dropped_samples;
        for r in &m.samples {
            let e = self.functions.entry(r.function_name.clone()).or_default();
            e.0 += r.count;
            *e.1.entry(r.stall_reason.clone()).or_default() += r.count;
            self.total += r.count;
        }
    }

    fn text(&self, session: u64, limit: usize) -> String {
        let mut f: Vec<(&String, &FunctionCounts)> = self.functions.iter().collect();
        f.sort_by(|a, b| b.1.0.cmp(&a.1.0).then_with(|| a.0.cmp(b.0)));
        let rows: Vec<Vec<String>> = f
            .iter()
            .take(limit)
            .map(|(name, (n, stalls))| {
                let mut s: Vec<pb::StallCount> =
                    stalls.iter().map(|(r, c)| pb::StallCount { reason: r.clone(), count: *c }).collect();
                s.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
                vec![n.to_string(), format!("{:.1}", pct(*n, self.total)), shorten(name, 70), stalls_text(&s, *n)]
            })
            .collect();
        format!(
            "session {session}: {} PC samples in {} batches{}\n{}",
            self.total,
            self.batches,
            if self.dropped > 0 { format!(", {} lost", self.dropped) } else { String::new() },
            table_text(&[">SAMPLES", ">%", "FUNCTION", "TOP STALLS"], &rows)
        )
    }
}

fn batch_json(m: &pb::StreamPcSamplesResponse) -> Value {
    json!({
        "start_ns": m.start_ns,
        "end_ns": m.end_ns,
        "dropped_samples": m.dropped_samples,
        "samples": m.samples.iter().map(|r| json!({
            "process_id": r.process_id, "device": r.device, "function": r.function_name,
            "mangled_name": r.mangled_name, "pc_offset": r.pc_offset, "file": r.file, "line": r.line,
            "stall_reason": short_stall(&r.stall_reason), "count": r.count,
        })).collect::<Vec<_>>(),
    })
}

async fn watch(c: &mut Client, a: WatchArgs, json: bool) -> Result<()> {
    let mut stream = c
        .stream_pc_samples(pb::StreamPcSamplesRequest { session_id: a.session, kernel: a.kernel.unwrap_or_default() })
        .await?
        .into_inner();
    let tty = std::io::stdout().is_terminal();
    let mut live = Live::default();
    let mut dirty = false;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            _ = &mut ctrl_c => break,
            m = stream.message() => match m? {
                Some(m) => {
                    if json {
                        println!("{}", batch_json(&m));
                    }
                    live.add(&m);
                    dirty = true;
                }
                None => break,
            },
            _ = tick.tick() => {
                if dirty && !json {
                    if tty {
                        print!("\x1b[H\x1b[2J");
                    } else {
                        println!();
                    }
                    println!("{}", live.text(a.session, a.limit));
                    dirty = false;
                }
            }
        }
    }
    if !json && (dirty || live.batches == 0) {
        println!("{}", live.text(a.session, a.limit));
    }
    Ok(())
}

/// `session show`: each process's PC sampling per device.
pub fn print_session_pc(s: &pb::Session) {
    let rows: Vec<Vec<String>> = s
        .processes
        .iter()
        .flat_map(|p| {
            p.pc_sampling.iter().map(move |d| {
                vec![
                    p.process_id.to_string(),
                    p.pid.to_string(),
                    d.device.to_string(),
                    d.samples.to_string(),
                    d.dropped.to_string(),
                    d.heals.to_string(),
                    d.state.clone(),
                ]
            })
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    println!();
    println!("PC sampling");
    table(&[">ID", ">PID", ">DEVICE", ">SAMPLES", ">LOST", ">HEALS", "STATE"], &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_names_and_locations_read_well() {
        assert_eq!(short_stall("smsp__pcsamp_warps_issue_stalled_barrier"), "stalled_barrier");
        assert_eq!(short_stall(""), "unknown");
        assert_eq!(file_line("k.cu", 7), "k.cu:7");
        assert_eq!(file_line("", 0), "-");
        let s = vec![
            pb::StallCount { reason: "smsp__pcsamp_warps_issue_stalled_long_scoreboard".into(), count: 75 },
            pb::StallCount { reason: "selected".into(), count: 25 },
        ];
        assert_eq!(stalls_text(&s, 100), "stalled_long_scoreboard 75%, selected 25%");
    }

    #[test]
    fn samples_without_rows_are_said_only_when_they_matter() {
        assert_eq!(without_rows(1000, 1000), None);
        assert_eq!(without_rows(1000, 1005), None, "within 1 %: a flush behind");
        assert_eq!(without_rows(1000, 900), None);
        let l = without_rows(93_128, 762_393).expect("a gap of 88 %");
        assert!(l.starts_with("CUPTI counted 762393 samples; 669265 (87.8%) have no row"), "{l}");
    }
}
