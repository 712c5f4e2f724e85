//! `gpuprofctl pc diff A B`: what changed in the PC samples of two sessions, two ranks of one, or
//! two time ranges of the node's always-on profile (DiffPcSamples), per function, source line
//! or stall reason, as shares of each side's samples. A side with `--host-a`/`--host-b` is read
//! from that gpuprofd (its QueryPcSamples answer) and handed to this one's DiffPcSamples.

use anyhow::{Context, Result};
use clap::Args;
use gpuprofctl::{Remote, pb};
use serde_json::{Value, json};

use crate::diff::{Side, Sides, connect_host, rank_processes};
use crate::output::{By, short_stall};
use crate::output::{Usage, shorten, table_text};
use gpuprofctl::Client;

pub const AFTER_HELP: &str = "Rows are compared as shares of each side's samples, so runs of different length \
compare. How a change is told from noise: a side's samples are taken as draws, so a share p of N samples varies by \
sqrt(p(1-p)/N); a row is \"more\" or \"less\" only when its share moved by more than 3 standard errors of the \
difference (3 sqrt(p_a(1-p_a)/N_a + p_b(1-p_b)/N_b)), \"added\"/\"removed\" when on one side only, else \
\"unchanged\". Findings come first, by the absolute change of share.\n\
Without sessions, --since-a/--since-b (and --until-a/--until-b) read time ranges of the node's always-on profile \
([pc] always_on, kept per minute), e.g. this hour against the same hour yesterday: \
`gpuprofctl pc diff --since-a 25h --until-a 24h --since-b 1h --pod 'trainer-*'`.\n\
--json: one JSON object: labels, totals, rows with both sides' samples and shares, notes and the noise rule.";

#[derive(Args, Debug)]
pub struct PcDiffArgs {
    #[command(flatten)]
    pub sides: Sides,
    /// What a row is (PC offsets differ between builds: function, line or stall).
    #[arg(long, value_enum, default_value = "function")]
    pub by: By,
    /// Only functions whose name (demangled or mangled) matches this glob.
    #[arg(long, value_name = "GLOB")]
    pub kernel: Option<String>,
    /// The always-on profile: only processes of pods whose name, namespace/name or UID matches
    /// this glob (both sides).
    #[arg(long, value_name = "GLOB")]
    pub pod: Option<String>,
    /// The always-on profile: only processes whose executable (path or base name) matches this
    /// glob (both sides).
    #[arg(long, value_name = "GLOB")]
    pub exe: Option<String>,
    /// Rows at most, findings first (up to 10000).
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Draw a differential flame graph into this SVG file (function, line or stall frames; a's
    /// samples scaled to b's total; `-`: stdout).
    #[arg(short, long, value_name = "FILE.svg")]
    pub output: Option<std::path::PathBuf>,
}

fn group(by: By) -> Result<pb::PcGroupBy> {
    Ok(match by {
        By::Function => pb::PcGroupBy::Function,
        By::Line => pb::PcGroupBy::Line,
        By::Stall => pb::PcGroupBy::Stall,
        By::Pc => {
            return Err(
                Usage("--by pc: PC offsets differ between builds; diff by function, line or stall".into()).into()
            );
        }
    })
}

/// A side for DiffPcSamples: read from its host when it has one.
async fn pc_side(template: &Remote, s: &Side, a: &PcDiffArgs, by: pb::PcGroupBy) -> Result<pb::DiffSide> {
    let always_on = s.session == 0;
    let Some(host) = &s.host else {
        let mut side = s.to_pb();
        if always_on {
            (side.pod, side.exe) = (a.pod.clone().unwrap_or_default(), a.exe.clone().unwrap_or_default());
        }
        return Ok(side);
    };
    if always_on && s.until != 0 {
        return Err(
            Usage(format!("{}: another node's always-on profile is read up to now: drop --until", s.label())).into()
        );
    }
    let mut c = connect_host(template, host).await?;
    if !always_on && s.rank.is_some() {
        return Err(Usage(format!(
            "{}: a rank of another node's session is not read for a PC diff; run the diff on that node",
            s.label()
        ))
        .into());
    }
    if !always_on {
        // The session must exist there (and the rank, if any) before its samples mean anything.
        rank_processes(&mut c, s).await?;
    }
    let pc = c
        .query_pc_samples(pb::QueryPcSamplesRequest {
            session_id: s.session,
            group_by: by as i32,
            kernel: a.kernel.clone().unwrap_or_default(),
            limit: crate::flame::MAX_ROWS,
            since_ns: if always_on { s.since } else { 0 },
            pod: if always_on { a.pod.clone().unwrap_or_default() } else { String::new() },
            exe: if always_on { a.exe.clone().unwrap_or_default() } else { String::new() },
        })
        .await
        .with_context(|| format!("reading {}", s.label()))?
        .into_inner();
    Ok(pb::DiffSide { pc: Some(pc), label: s.label(), ..Default::default() })
}

pub async fn diff(c: &mut Client, template: &Remote, a: PcDiffArgs, json: bool) -> Result<()> {
    let (sa, sb) = a.sides.sides(true)?;
    let by = group(a.by)?;
    if (a.pod.is_some() || a.exe.is_some()) && sa.session != 0 && sb.session != 0 {
        return Err(
            Usage("--pod and --exe choose processes of the always-on profile (--since-a/--since-b)".into()).into()
        );
    }
    let req = pb::DiffPcSamplesRequest {
        a: Some(pc_side(template, &sa, &a, by).await?),
        b: Some(pc_side(template, &sb, &a, by).await?),
        group_by: by as i32,
        kernel: a.kernel.clone().unwrap_or_default(),
        limit: if a.output.is_some() { crate::flame::MAX_ROWS } else { a.limit },
    };
    let r = c.diff_pc_samples(req).await?.into_inner();
    if let Some(path) = &a.output {
        let svg = crate::diff_flame::pc_svg(&r)?;
        crate::outfile::write_file(path, &svg)?;
        if path.as_os_str() != "-" && !json {
            println!("wrote {} ({} → {})", path.display(), r.label_a, r.label_b);
        }
    }
    let to_stdout = a.output.as_ref().is_some_and(|p| p.as_os_str() == "-");
    if json && to_stdout {
        // The SVG went to stdout.
        eprintln!("{}", serde_json::to_string_pretty(&diff_json(&r))?);
    } else if json {
        println!("{}", serde_json::to_string_pretty(&diff_json(&r))?);
    } else if a.output.as_ref().is_none_or(|p| p.as_os_str() != "-") {
        print!("{}", diff_text(&r, a.by, a.limit as usize));
    }
    Ok(())
}

fn row_name(r: &pb::PcRowDiff, by: By) -> String {
    match by {
        By::Stall => short_stall(&r.stall_reason).to_string(),
        By::Line => {
            let at = match (r.file.as_str(), r.line) {
                ("", 0) => "-".to_string(),
                (f, l) => format!("{f}:{l}"),
            };
            format!("{}  {at}", shorten(&r.function_name, 50))
        }
        By::Function | By::Pc => shorten(&r.function_name, 70),
    }
}

/// DiffPcSamples as text.
pub fn diff_text(r: &pb::DiffPcSamplesResponse, by: By, limit: usize) -> String {
    let mut out = format!(
        "a: {} ({} PC samples)\nb: {} ({} PC samples)\n{} of {} rows changed beyond their sampling noise\n",
        r.label_a, r.total_samples_a, r.label_b, r.total_samples_b, r.findings, r.total_rows
    );
    let pp = |x: f64| format!("{:.1}", x * 100.0);
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .take(limit)
        .map(|x| {
            vec![
                x.change.clone(),
                format!("{:+.1}", x.delta_share * 100.0),
                pp(x.share_a),
                pp(x.share_b),
                x.samples_a.to_string(),
                x.samples_b.to_string(),
                pp(x.noise_share),
                row_name(x, by),
            ]
        })
        .collect();
    let what = match by {
        By::Stall => "STALL REASON",
        By::Line => "FUNCTION  FILE:LINE",
        By::Function | By::Pc => "FUNCTION",
    };
    out.push_str(&table_text(&["CHANGE", ">Δ PTS", ">A %", ">B %", ">A N", ">B N", ">NOISE", what], &rows));
    out.push('\n');
    if r.total_rows > rows.len() as u64 {
        out.push_str(&format!("({} of {} rows; --limit shows more)\n", rows.len(), r.total_rows));
    }
    for n in &r.notes {
        out.push_str(&format!("note: {n}\n"));
    }
    out
}

/// DiffPcSamples as JSON.
pub fn diff_json(r: &pb::DiffPcSamplesResponse) -> Value {
    json!({
        "a": r.label_a,
        "b": r.label_b,
        "total_samples_a": r.total_samples_a,
        "total_samples_b": r.total_samples_b,
        "findings": r.findings,
        "total_rows": r.total_rows,
        "rows": r.rows.iter().map(|x| json!({
            "function": x.function_name, "file": x.file, "line": x.line,
            "stall_reason": if x.stall_reason.is_empty() { "" } else { short_stall(&x.stall_reason) },
            "samples_a": x.samples_a, "samples_b": x.samples_b, "share_a": x.share_a, "share_b": x.share_b,
            "delta_share": x.delta_share, "noise_share": x.noise_share, "change": x.change,
            "significant": x.significant,
        })).collect::<Vec<_>>(),
        "notes": r.notes,
        "noise_rule": r.noise_rule,
    })
}
