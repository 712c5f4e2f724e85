//! `gpuprofctl diff A B`: what changed between two sessions, two ranks of one session or two
//! time ranges of a session (DiffSummary), on this gpuprofd or, with `--host-a`/`--host-b`, a
//! side read from another (its GetSummary answer handed to this one's DiffSummary). `-o FILE.svg`
//! draws the kernels' GPU time as a differential flame graph (inferno's `differential`). The
//! sides' arguments ([`Sides`]) are shared with `pc diff`.

use anyhow::{Context, Result};
use clap::Args;
use gpuprofctl::{Remote, Target, connect_to, pb};
use serde_json::{Value, json};

use crate::output::{Usage, human_bytes, human_ns, shorten};
use gpuprofctl::Client;

pub const AFTER_HELP: &str = "How a change is told from noise: a kernel is slower or faster only when its mean \
duration moved by more than the larger of either side's standard deviation of its durations and 3 standard errors \
of the difference of the means; with one launch a side, by more than 10%. Within that it is \"unchanged\" (or \
\"launches\" when only its launch count moved, by more than 3 sqrt(count)). Standard deviations come from the \
kernel rollup's duration buckets (exact from the rows when --since/--until choose a time range).\n\
Kernels are matched by demangled name; findings come first, by the absolute change in GPU time.\n\
Examples: `gpuprofctl diff 7 8` (two runs), `gpuprofctl diff 7 --rank-a 0 --rank-b 3` (two ranks of a job), \
`gpuprofctl diff 7 8 --host-b node2:7443` (session 8 of another node), `gpuprofctl diff 7 8 -o diff.svg`.\n\
--json: one JSON object: labels, kernels, devices, copies, collectives, notes and the noise rule.";

/// Kernels asked of another gpuprofd for its side (GetSummary's most).
const REMOTE_TOP: u32 = 1000;

/// A time given on the command line: a duration ago (`2h`, `90m`) or an RFC 3339 time, as ns
/// since the Unix epoch.
pub fn parse_time(s: &str) -> Result<u64, String> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(crate::output::now_ns().saturating_sub(d.as_nanos() as u64).max(1));
    }
    humantime::parse_rfc3339_weak(s)
        .map_err(|_| format!("{s:?} is neither a duration ago (1h, 30m) nor a time (2026-01-31T14:00:00Z)"))?
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .map_err(|_| format!("{s:?} is before 1970"))
}

/// The two sides of a diff.
#[derive(Args, Debug, Clone)]
pub struct Sides {
    /// Side a, the baseline: a session id.
    pub a: Option<u64>,
    /// Side b: a session id (default: a's, for two ranks or time ranges of one session).
    pub b: Option<u64>,
    /// Only this rank of side a's job.
    #[arg(long, value_name = "RANK")]
    pub rank_a: Option<u32>,
    /// Only this rank of side b's job.
    #[arg(long, value_name = "RANK")]
    pub rank_b: Option<u32>,
    /// Read side a from this gpuprofd (HOST:PORT, with the same TLS and credentials as --host).
    #[arg(long, value_name = "HOST:PORT")]
    pub host_a: Option<String>,
    /// Read side b from this gpuprofd.
    #[arg(long, value_name = "HOST:PORT")]
    pub host_b: Option<String>,
    /// Side a from this time: a duration ago (1h) or an RFC 3339 time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since_a: Option<u64>,
    /// Side a until this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until_a: Option<u64>,
    /// Side b from this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub since_b: Option<u64>,
    /// Side b until this time.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    pub until_b: Option<u64>,
}

/// One side as asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    pub session: u64,
    pub rank: Option<u32>,
    pub host: Option<String>,
    pub since: u64,
    pub until: u64,
}

impl Side {
    /// What to call it ("session 7 rank 0", "node2:7443 session 8").
    pub fn label(&self) -> String {
        let mut l = match &self.host {
            Some(h) => format!("{h} "),
            None => String::new(),
        };
        l.push_str(&if self.session == 0 {
            "always-on profile".to_string()
        } else {
            format!("session {}", self.session)
        });
        if let Some(r) = self.rank {
            l.push_str(&format!(" rank {r}"));
        }
        if self.since != 0 || self.until != 0 {
            let t = |ns: u64| if ns == 0 { "…".to_string() } else { crate::output::wall(ns) };
            l.push_str(&format!(" [{} – {}]", t(self.since), t(self.until)));
        }
        l
    }

    /// The side for the request, with its filters (a side read elsewhere is filled in later).
    pub fn to_pb(&self) -> pb::DiffSide {
        pb::DiffSide {
            session_id: self.session,
            rank: self.rank,
            since_ns: self.since,
            until_ns: self.until,
            label: self.label(),
            ..Default::default()
        }
    }
}

impl Sides {
    /// Both sides, checked: each names a session or (with `always_on`) a time range; b defaults
    /// to a's session; the two must differ.
    pub fn sides(&self, always_on: bool) -> Result<(Side, Side)> {
        let a = Side {
            session: self.a.unwrap_or(0),
            rank: self.rank_a,
            host: self.host_a.clone(),
            since: self.since_a.unwrap_or(0),
            until: self.until_a.unwrap_or(0),
        };
        let b = Side {
            session: self.b.or(self.a).unwrap_or(0),
            rank: self.rank_b,
            host: self.host_b.clone().or_else(|| if self.b.is_none() { self.host_a.clone() } else { None }),
            since: self.since_b.unwrap_or(0),
            until: self.until_b.unwrap_or(0),
        };
        for (s, n) in [(&a, "a"), (&b, "b")] {
            if s.session == 0 && (!always_on || s.since == 0) {
                let what = if always_on {
                    format!("a session, or --since-{n} for the always-on profile")
                } else {
                    "a session (the always-on profile holds PC samples only: `gpuprofctl pc diff --since-a ...`)"
                        .to_string()
                };
                return Err(Usage(format!("side {n}: give {what}")).into());
            }
        }
        if a == b {
            return Err(Usage(
                "the two sides are the same: give B, or tell them apart with --rank-a/--rank-b or --since-a/--since-b"
                    .into(),
            )
            .into());
        }
        Ok((a, b))
    }
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// Kernel rows shown at most, findings first (0: all; --json has them all).
    #[arg(long, default_value_t = 30)]
    pub limit: u32,
    /// Match kernels by name and launch shape (grid and block) instead of by name alone (both
    /// sides on the gpuprofd asked).
    #[arg(long)]
    pub by_shape: bool,
    /// Draw the kernels' GPU time as a differential flame graph into this SVG file (red: more time
    /// in b, blue: less; `-`: stdout).
    #[arg(short, long, value_name = "FILE.svg")]
    pub output: Option<std::path::PathBuf>,
}

/// Connects to another gpuprofd with the global TLS settings.
pub async fn connect_host(template: &Remote, host: &str) -> Result<Client> {
    let r = Remote { addr: format!("https://{host}"), ..template.clone() };
    connect_to(&Target::Remote(r)).await.with_context(|| host.to_string())
}

/// The process ids of `rank` in a remote session (for a side read elsewhere).
pub async fn rank_processes(c: &mut Client, s: &Side) -> Result<Vec<u64>> {
    let Some(rank) = s.rank else { return Ok(Vec::new()) };
    let session = c.get_session(pb::GetSessionRequest { session_id: s.session }).await?.into_inner();
    let ids: Vec<u64> = session.processes.iter().filter(|p| p.rank == Some(rank)).map(|p| p.process_id).collect();
    if ids.is_empty() {
        anyhow::bail!("{}: the session has no process of rank {rank}", s.label());
    }
    Ok(ids)
}

/// A side for DiffSummary: read from its host when it has one.
async fn summary_side(template: &Remote, s: &Side) -> Result<pb::DiffSide> {
    let Some(host) = &s.host else { return Ok(s.to_pb()) };
    let mut c = connect_host(template, host).await?;
    let filter = pb::RecordFilter {
        process_ids: rank_processes(&mut c, s).await?,
        time_range: (s.since != 0 || s.until != 0).then_some(pb::TimeRange { start_ns: s.since, end_ns: s.until }),
        ..Default::default()
    };
    let summary = c
        .get_summary(pb::GetSummaryRequest { session_id: s.session, filter: Some(filter), top: REMOTE_TOP })
        .await
        .with_context(|| format!("reading {}", s.label()))?
        .into_inner();
    Ok(pb::DiffSide { summary: Some(summary), label: s.label(), ..Default::default() })
}

pub async fn diff(c: &mut Client, template: &Remote, a: DiffArgs, json: bool) -> Result<()> {
    let (sa, sb) = a.sides.sides(false)?;
    if let Some(p) = &a.output
        && p.as_os_str() != "-"
        && p.extension().is_none_or(|e| e != "svg")
    {
        return Err(Usage(format!("-o {}: a diff is drawn as SVG (diff.svg)", p.display())).into());
    }
    let req = pb::DiffSummaryRequest {
        a: Some(summary_side(template, &sa).await?),
        b: Some(summary_side(template, &sb).await?),
        limit: 0,
        by_shape: a.by_shape,
    };
    let r = c.diff_summary(req).await?.into_inner();
    if let Some(path) = &a.output {
        let svg = crate::diff_flame::kernels_svg(&r)?;
        crate::outfile::write_file(path, &svg)?;
        if path.as_os_str() != "-" && !json {
            println!("wrote {} ({} → {})", path.display(), r.label_a, r.label_b);
        }
    }
    let limit = if a.limit == 0 { usize::MAX } else { a.limit as usize };
    let to_stdout = a.output.as_ref().is_some_and(|p| p.as_os_str() == "-");
    if json && to_stdout {
        // The SVG went to stdout.
        eprintln!("{}", serde_json::to_string_pretty(&diff_json(&r))?);
    } else if json {
        println!("{}", serde_json::to_string_pretty(&diff_json(&r))?);
    } else if a.output.as_ref().is_none_or(|p| p.as_os_str() != "-") {
        print!("{}", diff_text(&r, limit));
    }
    Ok(())
}

/// A signed duration ("+1.20 ms", "-812 ns").
pub fn signed_ns(d: i64) -> String {
    let sign = if d < 0 { "-" } else { "+" };
    format!("{sign}{}", human_ns(d.unsigned_abs()))
}

fn mean(ns: f64, n: u64) -> String {
    if n == 0 { "-".into() } else { human_ns(ns.round() as u64) }
}

/// DiffSummary as text.
pub fn diff_text(r: &pb::DiffSummaryResponse, limit: usize) -> String {
    let mut out = String::new();
    out.push_str(&format!("a: {}\nb: {}\n", r.label_a, r.label_b));
    out.push_str(&format!(
        "kernels: {} → {} ({}); {} of {} kernels changed beyond their noise\n",
        human_ns(r.kernel_total_ns_a),
        human_ns(r.kernel_total_ns_b),
        signed_ns(r.kernel_total_ns_b as i64 - r.kernel_total_ns_a as i64),
        r.findings,
        r.total_kernels
    ));
    let rows: Vec<Vec<String>> = r
        .kernels
        .iter()
        .take(limit)
        .map(|k| {
            vec![
                k.change.clone(),
                signed_ns(k.delta_total_ns),
                human_ns(k.total_ns_a),
                human_ns(k.total_ns_b),
                k.count_a.to_string(),
                k.count_b.to_string(),
                mean(k.mean_ns_a, k.count_a),
                mean(k.mean_ns_b, k.count_b),
                if k.count_a == 0 || k.count_b == 0 { "-".into() } else { human_ns(k.noise_ns.round() as u64) },
                shorten(&k.name, 60),
            ]
        })
        .collect();
    out.push_str(&crate::output::table_text(
        &["CHANGE", ">Δ TIME", ">A TIME", ">B TIME", ">A N", ">B N", ">A MEAN", ">B MEAN", ">NOISE", "KERNEL"],
        &rows,
    ));
    out.push('\n');
    if r.kernels.len() > limit {
        out.push_str(&format!("({} of {} kernels; --limit shows more)\n", limit, r.kernels.len()));
    }
    if !r.devices.is_empty() {
        let rows: Vec<Vec<String>> = r
            .devices
            .iter()
            .map(|d| {
                vec![
                    d.device_id.to_string(),
                    human_ns(d.busy_ns_a),
                    human_ns(d.busy_ns_b),
                    signed_ns(d.delta_busy_ns),
                    human_ns(d.span_ns_a),
                    human_ns(d.span_ns_b),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&crate::output::table_text(
            &[">DEVICE", ">A BUSY", ">B BUSY", ">Δ BUSY", ">A SPAN", ">B SPAN"],
            &rows,
        ));
        out.push('\n');
    }
    if !r.copies.is_empty() {
        let rows: Vec<Vec<String>> = r
            .copies
            .iter()
            .map(|c| {
                vec![
                    c.direction.clone(),
                    c.count_a.to_string(),
                    c.count_b.to_string(),
                    human_bytes(c.bytes_a),
                    human_bytes(c.bytes_b),
                    format!("{:.2}", c.bandwidth_gbps_a),
                    format!("{:.2}", c.bandwidth_gbps_b),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&crate::output::table_text(
            &["COPY", ">A N", ">B N", ">A BYTES", ">B BYTES", ">A GB/s", ">B GB/s"],
            &rows,
        ));
        out.push('\n');
    }
    if !r.collectives.is_empty() {
        let rows: Vec<Vec<String>> = r
            .collectives
            .iter()
            .map(|c| {
                vec![
                    c.name.clone(),
                    c.count_a.to_string(),
                    c.count_b.to_string(),
                    human_bytes(c.bytes_a),
                    human_bytes(c.bytes_b),
                    human_ns(c.total_ns_a),
                    human_ns(c.total_ns_b),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&crate::output::table_text(
            &["COLLECTIVE", ">A N", ">B N", ">A BYTES", ">B BYTES", ">A TIME", ">B TIME"],
            &rows,
        ));
        out.push('\n');
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// DiffSummary as JSON.
pub fn diff_json(r: &pb::DiffSummaryResponse) -> Value {
    json!({
        "a": r.label_a,
        "b": r.label_b,
        "kernel_total_ns_a": r.kernel_total_ns_a,
        "kernel_total_ns_b": r.kernel_total_ns_b,
        "findings": r.findings,
        "total_kernels": r.total_kernels,
        "kernels": r.kernels.iter().map(|k| json!({
            "name": k.name, "mangled_name": k.mangled_name, "change": k.change, "significant": k.significant,
            "count_a": k.count_a, "count_b": k.count_b, "total_ns_a": k.total_ns_a, "total_ns_b": k.total_ns_b,
            "mean_ns_a": k.mean_ns_a, "mean_ns_b": k.mean_ns_b, "stddev_ns_a": k.stddev_ns_a,
            "stddev_ns_b": k.stddev_ns_b, "delta_total_ns": k.delta_total_ns, "delta_mean_ns": k.delta_mean_ns,
            "noise_ns": k.noise_ns,
        })).collect::<Vec<_>>(),
        "devices": r.devices.iter().map(|d| json!({
            "device_id": d.device_id, "busy_ns_a": d.busy_ns_a, "busy_ns_b": d.busy_ns_b,
            "span_ns_a": d.span_ns_a, "span_ns_b": d.span_ns_b, "delta_busy_ns": d.delta_busy_ns,
        })).collect::<Vec<_>>(),
        "copies": r.copies.iter().map(|c| json!({
            "direction": c.direction, "count_a": c.count_a, "count_b": c.count_b, "bytes_a": c.bytes_a,
            "bytes_b": c.bytes_b, "total_ns_a": c.total_ns_a, "total_ns_b": c.total_ns_b,
            "bandwidth_gbps_a": c.bandwidth_gbps_a, "bandwidth_gbps_b": c.bandwidth_gbps_b,
        })).collect::<Vec<_>>(),
        "collectives": r.collectives.iter().map(|c| json!({
            "name": c.name, "count_a": c.count_a, "count_b": c.count_b, "bytes_a": c.bytes_a, "bytes_b": c.bytes_b,
            "total_ns_a": c.total_ns_a, "total_ns_b": c.total_ns_b,
        })).collect::<Vec<_>>(),
        "notes": r.notes,
        "noise_rule": r.noise_rule,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_and_sides() {
        let now = crate::output::now_ns();
        let t = parse_time("1h").unwrap();
        assert!(now - t >= Duration::from_secs(3600).as_nanos() as u64 - 1_000_000_000);
        assert_eq!(parse_time("1970-01-01T00:00:01Z").unwrap(), 1_000_000_000);
        assert!(parse_time("yesterday-ish").is_err());
        let mut s = Sides {
            a: Some(7),
            b: None,
            rank_a: Some(0),
            rank_b: Some(3),
            host_a: None,
            host_b: None,
            since_a: None,
            until_a: None,
            since_b: None,
            until_b: None,
        };
        let (a, b) = s.sides(false).unwrap();
        assert_eq!(
            (a.session, b.session, a.label(), b.label()),
            (7, 7, "session 7 rank 0".into(), "session 7 rank 3".into())
        );
        s.rank_b = Some(0);
        assert!(s.sides(false).unwrap_err().to_string().contains("the two sides are the same"));
        s.a = None;
        assert!(s.sides(false).unwrap_err().to_string().contains("side a: give a session"));
        s.since_a = Some(5);
        s.since_b = Some(9);
        let (a, b) = s.sides(true).unwrap();
        assert_eq!((a.session, a.since, b.since), (0, 5, 9));
    }
}
