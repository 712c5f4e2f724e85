//! DiffPcSamples: what changed in the PC samples of two sides (sessions, ranks of a session,
//! time ranges of the node's always-on profile, or rows another gpuprofd answered), per
//! function, source line or stall reason, as shares of each side's samples so that runs of
//! different length compare. A share's change counts only beyond its sampling noise
//! ([`PC_NOISE_RULE`]).

use std::collections::{BTreeMap, BTreeSet};

use gpuprof_proto::api as pb;

use super::Reads;
use super::diff::{Which, authorize, check_side, label, running_note, side_processes};
use super::pc::{NodeFilter, check_glob, group, node_rows_until, pc_rows_of};
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

/// How a share's change is told from noise, as DiffPcSamplesResponse.noise_rule says it.
pub const PC_NOISE_RULE: &str = "each side's samples are taken as draws: a row's share p of a side's N samples varies \
    by sqrt(p(1-p)/N) from run to run; a row is \"more\" or \"less\" when its share moved by more than 3 standard \
    errors of the difference (3 sqrt(p_a(1-p_a)/N_a + p_b(1-p_b)/N_b)), \"added\" or \"removed\" when it is on one \
    side only, and else \"unchanged\" (a row on one side only but within the noise is listed, not counted).";

/// What a row is matched by across the sides.
type Key = (String, String, u32, String);

fn key(r: &pb::PcProfileRow, by: pb::PcGroupBy) -> Key {
    match by {
        pb::PcGroupBy::Line => (r.function_name.clone(), r.file.clone(), r.line, String::new()),
        pb::PcGroupBy::Stall => (String::new(), String::new(), 0, r.stall_reason.clone()),
        _ => (r.function_name.clone(), String::new(), 0, String::new()),
    }
}

/// DiffPcSamples.
pub async fn diff_pc_samples(
    da: Reads<'_>,
    db: Reads<'_>,
    caller: &Caller,
    req: pb::DiffPcSamplesRequest,
) -> ApiResult<pb::DiffPcSamplesResponse> {
    let limit = super::pc::row_limit(req.limit)?;
    let by = match pb::PcGroupBy::try_from(req.group_by) {
        Ok(pb::PcGroupBy::Unspecified | pb::PcGroupBy::Function) => pb::PcGroupBy::Function,
        Ok(b @ (pb::PcGroupBy::Line | pb::PcGroupBy::Stall)) => b,
        _ => {
            return Err(ApiError::invalid(
                "group_by",
                format!(
                    "{}: a PC diff is by function, line or stall reason (PC offsets differ between builds)",
                    req.group_by
                ),
            ));
        }
    };
    check_glob("kernel", &req.kernel)?;
    let (a, b) = (req.a.unwrap_or_default(), req.b.unwrap_or_default());
    let now = crate::clock::now_ns();
    for (s, which) in [(&a, Which::A), (&b, Which::B)] {
        check_side(s, which, s.pc.is_some())?;
        if s.summary.is_some() {
            return Err(ApiError::invalid(
                which.field("session_id"),
                "summary is for DiffSummary; a PC side read elsewhere goes in pc",
            ));
        }
        if s.pc.is_some() {
            continue;
        }
        if s.session_id != 0 {
            if s.since_ns != 0 || s.until_ns != 0 || !s.pod.is_empty() || !s.exe.is_empty() {
                return Err(ApiError::invalid(
                    which.field("since_ns"),
                    "a session's PC samples are not kept by time: since_ns, until_ns, pod and exe choose time ranges \
                     of the node's always-on profile (session_id 0); use rank or process_ids within a session",
                ));
            }
            let d = if which == Which::A { &da } else { &db };
            authorize(d, caller, s, which).await?;
        } else {
            if s.since_ns > now {
                return Err(ApiError::invalid(
                    which.field("since_ns"),
                    "in the future (it is ns since the Unix epoch)",
                ));
            }
            check_glob("pod", &s.pod)?;
            check_glob("exe", &s.exe)?;
            caller.require_authenticated()?;
        }
    }
    // Rollups of the always-on profile are written by the writer: what it holds goes first.
    let _ = da.writer.flush().await;
    let path = da.db_path.to_path_buf();
    let uid = (!caller.admin).then_some(caller.uid);
    tokio::task::spawn_blocking(move || -> ApiResult<pb::DiffPcSamplesResponse> {
        let c = crate::store::open_reader(&path)?;
        let mut notes = Vec::new();
        let mut sides = Vec::new();
        for (s, which) in [(&a, Which::A), (&b, Which::B)] {
            let l = label(s);
            let r = match &s.pc {
                Some(given) => given.clone(),
                None if s.session_id != 0 => {
                    notes.extend(running_note(&c, s.session_id, &l)?);
                    let rows = pc_rows_of(&c, s.session_id, &side_processes(&c, s, which)?, &req.kernel)?;
                    let total_samples = rows.iter().map(|r| r.count).sum();
                    let (rows, total_rows) = group(&rows, by, usize::MAX);
                    pb::QueryPcSamplesResponse { rows, total_samples, total_rows, dropped_samples: 0 }
                }
                None => {
                    let f = NodeFilter { pod: s.pod.clone(), exe: s.exe.clone(), uid };
                    let minute = |ns: u64| (ns / 1_000_000_000 / 60 * 60) as i64;
                    let until = if s.until_ns == 0 { i64::MAX } else { minute(s.until_ns + 59_999_999_999) };
                    let (rows, _) = node_rows_until(&c, minute(s.since_ns), until, &f, &req.kernel)?;
                    let total_samples = rows.iter().map(|r| r.count).sum();
                    let (rows, total_rows) = group(&rows, by, usize::MAX);
                    pb::QueryPcSamplesResponse { rows, total_samples, total_rows, dropped_samples: 0 }
                }
            };
            sides.push((l, r));
        }
        let (lb, rb) = sides.pop().unwrap_or_default();
        let (la, ra) = sides.pop().unwrap_or_default();
        let filtered =
            if req.kernel.is_empty() { String::new() } else { format!(" of functions matching {:?}", req.kernel) };
        if ra.total_samples == 0 && rb.total_samples == 0 {
            return Err(ApiError::NotFound(format!(
                "neither {la} nor {lb} has PC samples{filtered} to compare (sessions need --pc-sampling; the \
                 always-on profile needs [pc] always_on in gpuprofd's configuration)"
            )));
        }
        for (l, r) in [(&la, &ra), (&lb, &rb)] {
            if r.total_samples == 0 {
                notes.push(format!(
                    "{l} has no PC samples{filtered}: every row of the other side shows as added or removed"
                ));
            }
        }
        let mut out = compare_pc(&ra, &rb, by, limit);
        (out.label_a, out.label_b, out.notes) = (la, lb, notes);
        Ok(out)
    })
    .await?
}

/// The comparison of two sides' rows (grouped alike): findings first, by the absolute change of
/// share.
pub fn compare_pc(
    a: &pb::QueryPcSamplesResponse,
    b: &pb::QueryPcSamplesResponse,
    by: pb::PcGroupBy,
    limit: usize,
) -> pb::DiffPcSamplesResponse {
    let sum = |r: &pb::QueryPcSamplesResponse| {
        let mut m: BTreeMap<Key, u64> = BTreeMap::new();
        for row in &r.rows {
            *m.entry(key(row, by)).or_default() += row.samples;
        }
        m
    };
    let (ma, mb) = (sum(a), sum(b));
    let (na, nb) = (a.total_samples as f64, b.total_samples as f64);
    let share = |n: u64, total: f64| if total > 0.0 { n as f64 / total } else { 0.0 };
    let keys: BTreeSet<&Key> = ma.keys().chain(mb.keys()).collect();
    let mut rows: Vec<pb::PcRowDiff> = keys
        .into_iter()
        .map(|k| {
            let (sa, sb) = (ma.get(k).copied().unwrap_or(0), mb.get(k).copied().unwrap_or(0));
            let (pa, pb_) = (share(sa, na), share(sb, nb));
            let var = |p: f64, n: f64| if n > 0.0 { p * (1.0 - p) / n } else { 0.0 };
            let noise_share = 3.0 * (var(pa, na) + var(pb_, nb)).sqrt();
            let d = pb_ - pa;
            let significant = d.abs() > noise_share;
            let change = match (sa, sb) {
                (_, 0) if sa > 0 => "removed",
                (0, _) => "added",
                _ if !significant => "unchanged",
                _ if d > 0.0 => "more",
                _ => "less",
            };
            pb::PcRowDiff {
                function_name: k.0.clone(),
                file: k.1.clone(),
                line: k.2,
                stall_reason: k.3.clone(),
                samples_a: sa,
                samples_b: sb,
                share_a: pa,
                share_b: pb_,
                delta_share: d,
                noise_share,
                change: change.into(),
                significant,
            }
        })
        .collect();
    rows.sort_by(|x, y| {
        y.significant.cmp(&x.significant).then(y.delta_share.abs().total_cmp(&x.delta_share.abs())).then_with(|| {
            (&x.function_name, &x.file, x.line, &x.stall_reason).cmp(&(
                &y.function_name,
                &y.file,
                y.line,
                &y.stall_reason,
            ))
        })
    });
    let total_rows = rows.len() as u64;
    let findings = rows.iter().filter(|r| r.significant).count() as u64;
    rows.truncate(limit);
    pb::DiffPcSamplesResponse {
        total_samples_a: a.total_samples,
        total_samples_b: b.total_samples,
        rows,
        total_rows,
        findings,
        noise_rule: PC_NOISE_RULE.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(rows: &[(&str, u64)]) -> pb::QueryPcSamplesResponse {
        pb::QueryPcSamplesResponse {
            rows: rows
                .iter()
                .map(|(f, n)| pb::PcProfileRow { function_name: f.to_string(), samples: *n, ..Default::default() })
                .collect(),
            total_samples: rows.iter().map(|r| r.1).sum(),
            ..Default::default()
        }
    }

    #[test]
    fn shares_compare_with_their_sampling_noise() {
        // a: 1000 samples, b: 1005; "noisy" keeps about 60 % of each.
        let a = side(&[("gemm", 150), ("old", 250), ("noisy", 600)]);
        let b = side(&[("gemm", 300), ("new", 100), ("noisy", 605)]);
        let d = compare_pc(&a, &b, pb::PcGroupBy::Function, 20);
        let got: Vec<(&str, &str, bool)> =
            d.rows.iter().map(|r| (r.function_name.as_str(), r.change.as_str(), r.significant)).collect();
        assert_eq!(
            got,
            [("old", "removed", true), ("gemm", "more", true), ("new", "added", true), ("noisy", "unchanged", false)]
        );
        assert_eq!((d.findings, d.total_rows, d.total_samples_a, d.total_samples_b), (3, 4, 1000, 1005));
        assert!((d.rows[1].share_a - 0.15).abs() < 1e-9 && (d.rows[1].share_b - 300.0 / 1005.0).abs() < 1e-9);
        // One sample on one side only is within the noise: listed, not a finding.
        let d = compare_pc(&side(&[("k", 999), ("rare", 1)]), &side(&[("k", 1000)]), pb::PcGroupBy::Function, 20);
        assert_eq!((d.findings, d.rows[1].change.as_str(), d.rows[1].significant), (0, "removed", false));
    }
}
