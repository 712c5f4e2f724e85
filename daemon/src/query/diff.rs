//! DiffSummary: what changed between two sides (sessions, ranks or time ranges of a session,
//! or summaries another gpuprofd answered): per kernel, device busy time, copies and NCCL
//! collectives. A side is read as GetSummary reads a session ([`summary`]); the comparison
//! ([`compare`]) is pure. A kernel's change counts only beyond the spread of its own durations
//! ([`NOISE_RULE`]).

use std::collections::{BTreeMap, BTreeSet};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, OptionalExtension};

use super::{Reads, kernels_by_shape, summary};
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

/// How a kernel's change is told from noise, as DiffSummaryResponse.noise_rule says it.
pub const NOISE_RULE: &str = "a kernel is slower or faster when its mean duration moved by more than the larger of \
    either side's standard deviation of its durations and 3 standard errors of the difference of the means \
    (sqrt(sd_a^2/n_a + sd_b^2/n_b)); with one launch a side, by more than 10% of the mean. Within that it is noise: \
    \"launches\" when the launch count moved by more than 3 sqrt(larger count), else \"unchanged\". Kernels \
    only in a are \"removed\", only in b \"added\".";

/// Kernels asked of a side at most (every kernel of any real session).
const ALL: usize = 1_000_000;

/// Which side of a diff, for field names and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    A,
    B,
}

impl Which {
    pub fn name(self) -> &'static str {
        match self {
            Which::A => "a",
            Which::B => "b",
        }
    }

    /// The request field `f` of this side ("a.session_id").
    pub fn field(self, f: &str) -> &'static str {
        const A: [&str; 5] = ["a.session_id", "a.rank", "a.since_ns", "a.until_ns", "a.process_ids"];
        const B: [&str; 5] = ["b.session_id", "b.rank", "b.since_ns", "b.until_ns", "b.process_ids"];
        let names = if self == Which::A { A } else { B };
        names.into_iter().find(|n| n.ends_with(f) && n[2..] == *f).unwrap_or(self.name())
    }
}

/// Checks what every side must hold: something to read, a time range in order.
pub fn check_side(s: &pb::DiffSide, which: Which, given: bool) -> ApiResult<()> {
    let filtered = s.session_id != 0
        || !s.process_ids.is_empty()
        || s.rank.is_some()
        || s.since_ns != 0
        || s.until_ns != 0
        || !s.pod.is_empty()
        || !s.exe.is_empty();
    if given && filtered {
        return Err(ApiError::invalid(
            which.field("session_id"),
            "a side given as read elsewhere (summary, pc) takes none of session_id, process_ids, rank, since_ns, \
             until_ns, pod, exe",
        ));
    }
    if !given && s.session_id == 0 && s.since_ns == 0 {
        return Err(ApiError::invalid(
            which.field("session_id"),
            "give a session, since_ns (the node's always-on PC profile, DiffPcSamples), or the side as another \
             gpuprofd answered it",
        ));
    }
    if s.until_ns != 0 && s.until_ns <= s.since_ns {
        return Err(ApiError::invalid(
            which.field("until_ns"),
            format!("{} is not after since_ns {}", s.until_ns, s.since_ns),
        ));
    }
    if s.session_id == 0 && (s.rank.is_some() || !s.process_ids.is_empty()) {
        return Err(ApiError::invalid(which.field("rank"), "ranks and processes are chosen within a session"));
    }
    Ok(())
}

/// A side's label: the one given, else made from its fields ("session 7 rank 0").
pub fn label(s: &pb::DiffSide) -> String {
    if !s.label.is_empty() {
        return s.label.clone();
    }
    let mut l = if s.session_id == 0 { "always-on profile".to_string() } else { format!("session {}", s.session_id) };
    if let Some(r) = s.rank {
        l.push_str(&format!(" rank {r}"));
    }
    if !s.process_ids.is_empty() {
        let p: Vec<String> = s.process_ids.iter().map(u64::to_string).collect();
        l.push_str(&format!(" process {}", p.join(",")));
    }
    if s.since_ns != 0 || s.until_ns != 0 {
        l.push_str(&format!(" [{}, {})", s.since_ns, s.until_ns));
    }
    l
}

/// Checks that the caller may read the side's session, naming the side in the error.
pub async fn authorize(d: &Reads<'_>, caller: &Caller, s: &pb::DiffSide, which: Which) -> ApiResult<()> {
    d.authorize(caller, s.session_id).await.map_err(|e| match e {
        ApiError::NotFound(m) => ApiError::NotFound(format!("{}: {m}", which.field("session_id"))),
        ApiError::PermissionDenied(m) => ApiError::PermissionDenied(format!("{}: {m}", which.field("session_id"))),
        e => e,
    })
}

/// The note for a session still open, if it is.
pub fn running_note(c: &Connection, session: u64, label: &str) -> rusqlite::Result<Option<String>> {
    let state: Option<String> =
        c.query_row("SELECT state FROM sessions WHERE id = ?1", [session as i64], |r| r.get(0)).optional()?;
    Ok(state
        .filter(|s| matches!(s.as_str(), "pending" | "active" | "stopping"))
        .map(|s| format!("{label} is still running ({s}): compared as far as it has come; its numbers will grow")))
}

/// The process ids a side reads: its process_ids, and the process of its rank.
pub fn side_processes(c: &Connection, s: &pb::DiffSide, which: Which) -> ApiResult<Vec<u64>> {
    let mut out = s.process_ids.clone();
    if let Some(rank) = s.rank {
        let mut stmt = c.prepare(
            "SELECT p.id FROM processes p WHERE p.job_rank = ?2 AND (
               p.id IN (SELECT proc FROM session_processes WHERE session = ?1)
               OR p.id IN (SELECT proc FROM session_rows WHERE session = ?1)) ORDER BY p.id",
        )?;
        let ids: Vec<u64> = stmt
            .query_map([s.session_id as i64, i64::from(rank)], |r| r.get::<_, i64>(0))?
            .map(|r| r.map(|v| v as u64))
            .collect::<rusqlite::Result<_>>()?;
        if ids.is_empty() {
            return Err(ApiError::NotFound(format!(
                "{}: session {} has no process of rank {rank} (gpuprofctl session show {} lists its ranks)",
                which.field("rank"),
                s.session_id,
                s.session_id
            )));
        }
        out.extend(ids);
    }
    Ok(out)
}

/// DiffSummary.
pub async fn diff_summary(
    da: Reads<'_>,
    db: Reads<'_>,
    caller: &Caller,
    req: pb::DiffSummaryRequest,
) -> ApiResult<pb::DiffSummaryResponse> {
    let (a, b) = (req.a.unwrap_or_default(), req.b.unwrap_or_default());
    for (s, which) in [(&a, Which::A), (&b, Which::B)] {
        check_side(s, which, s.summary.is_some())?;
        if s.summary.is_none() && s.session_id == 0 {
            return Err(ApiError::invalid(
                which.field("since_ns"),
                "the node's always-on profile holds PC samples only: compare its time ranges with DiffPcSamples \
                 (gpuprofctl pc diff --since-a ... --since-b ...), or give a session",
            ));
        }
        if s.pc.is_some() || !s.pod.is_empty() || !s.exe.is_empty() {
            return Err(ApiError::invalid(
                which.field("session_id"),
                "pc, pod and exe are for DiffPcSamples (the always-on PC profile); a summary side is a session or \
                 a GetSummary answer",
            ));
        }
        if req.by_shape && s.summary.is_some() {
            return Err(ApiError::invalid(
                "by_shape",
                "launch shapes are read from the rows: both sides must be sessions of this gpuprofd",
            ));
        }
        if s.summary.is_none() {
            let d = if which == Which::A { &da } else { &db };
            authorize(d, caller, s, which).await?;
        }
    }
    da.rollup.catch_up().await?;
    let path = da.db_path.to_path_buf();
    let limit = if req.limit == 0 { usize::MAX } else { req.limit as usize };
    tokio::task::spawn_blocking(move || -> ApiResult<pb::DiffSummaryResponse> {
        let c = crate::store::open_reader(&path)?;
        let mut notes = Vec::new();
        let mut sides = Vec::new();
        for (s, which) in [(&a, Which::A), (&b, Which::B)] {
            let l = label(s);
            let sum = match &s.summary {
                Some(given) => given.clone(),
                None => {
                    notes.extend(running_note(&c, s.session_id, &l)?);
                    let f = pb::RecordFilter {
                        process_ids: side_processes(&c, s, which)?,
                        time_range: (s.since_ns != 0 || s.until_ns != 0)
                            .then_some(pb::TimeRange { start_ns: s.since_ns, end_ns: s.until_ns }),
                        ..Default::default()
                    };
                    let mut sum = summary(&c, s.session_id, &f, ALL)?;
                    if req.by_shape {
                        sum.top_kernels = kernels_by_shape(&c, s.session_id, &f)?;
                    }
                    sum
                }
            };
            sides.push((l, sum));
        }
        let (lb, sb) = sides.pop().unwrap_or_default();
        let (la, sa) = sides.pop().unwrap_or_default();
        let empty =
            |s: &pb::GetSummaryResponse| s.top_kernels.is_empty() && s.copies.is_empty() && s.collectives.is_empty();
        if empty(&sa) && empty(&sb) {
            return Err(ApiError::NotFound(format!(
                "neither {la} nor {lb} has kernel, copy or collective records to compare (a session of preset \"pc\" \
                 has PC samples only: gpuprofctl pc diff compares those)"
            )));
        }
        for (l, s) in [(&la, &sa), (&lb, &sb)] {
            if s.top_kernels.is_empty() {
                notes.push(format!(
                    "{l} has no kernel records: every kernel of the other side shows as added or removed"
                ));
            }
        }
        let mut out = compare(&sa, &sb, limit, &mut notes);
        (out.label_a, out.label_b, out.notes) = (la, lb, notes);
        Ok(out)
    })
    .await?
}

/// One name's kernels on a side, merged across the ids that demangle to it.
#[derive(Debug, Clone, Copy, Default)]
struct Stat {
    n: u64,
    total: u64,
    /// Sum of squared deviations from the mean.
    m2: f64,
}

impl Stat {
    fn of(k: &pb::KernelStat) -> Stat {
        let n = k.count;
        Stat { n, total: k.total_ns, m2: k.stddev_ns * k.stddev_ns * n.saturating_sub(1) as f64 }
    }

    fn mean(&self) -> f64 {
        if self.n == 0 { 0.0 } else { self.total as f64 / self.n as f64 }
    }

    fn sd(&self) -> f64 {
        if self.n < 2 { 0.0 } else { (self.m2 / (self.n - 1) as f64).sqrt() }
    }

    /// Chan et al.'s combination of two groups' moments.
    fn merge(self, o: Stat) -> Stat {
        if self.n == 0 {
            return o;
        }
        let n = self.n + o.n;
        let d = o.mean() - self.mean();
        let m2 = self.m2 + o.m2 + d * d * (self.n as f64 * o.n as f64) / n as f64;
        Stat { n, total: self.total + o.total, m2 }
    }
}

/// The noise a change of the mean must exceed, in ns, per [`NOISE_RULE`].
fn noise(a: Stat, b: Stat) -> f64 {
    if a.n < 2 && b.n < 2 {
        return 0.1 * a.mean();
    }
    let se = (a.sd() * a.sd() / a.n as f64 + b.sd() * b.sd() / b.n as f64).sqrt();
    a.sd().max(b.sd()).max(3.0 * se)
}

/// One kernel's row.
fn kernel_diff(name: &str, mangled: &str, a: Option<Stat>, b: Option<Stat>) -> pb::KernelDiff {
    let (sa, sb) = (a.unwrap_or_default(), b.unwrap_or_default());
    let (noise_ns, change) = match (a, b) {
        (Some(_), None) => (0.0, "removed"),
        (None, _) => (0.0, "added"),
        (Some(x), Some(y)) => {
            let n = noise(x, y);
            let dm = y.mean() - x.mean();
            let launches = x.n.abs_diff(y.n) as f64 > 3.0 * (x.n.max(y.n) as f64).sqrt();
            let change = if dm.abs() > n {
                if dm > 0.0 { "slower" } else { "faster" }
            } else if launches {
                "launches"
            } else {
                "unchanged"
            };
            (n, change)
        }
    };
    pb::KernelDiff {
        name: name.to_string(),
        mangled_name: mangled.to_string(),
        change: change.into(),
        significant: change != "unchanged",
        count_a: sa.n,
        count_b: sb.n,
        total_ns_a: sa.total,
        total_ns_b: sb.total,
        mean_ns_a: sa.mean(),
        mean_ns_b: sb.mean(),
        stddev_ns_a: sa.sd(),
        stddev_ns_b: sb.sd(),
        delta_total_ns: sb.total as i64 - sa.total as i64,
        delta_mean_ns: sb.mean() - sa.mean(),
        noise_ns,
    }
}

/// Per name: its stats and its mangled name.
fn by_name(s: &pb::GetSummaryResponse) -> BTreeMap<String, (Stat, String)> {
    let mut m: BTreeMap<String, (Stat, String)> = BTreeMap::new();
    for k in &s.top_kernels {
        let e = m.entry(k.name.clone()).or_insert((Stat::default(), k.mangled_name.clone()));
        e.0 = e.0.merge(Stat::of(k));
    }
    m
}

/// The comparison of two summaries: kernels (findings first, by the absolute change in GPU time),
/// devices, copies, collectives where both have them; notes for what is on one side only.
pub fn compare(
    a: &pb::GetSummaryResponse,
    b: &pb::GetSummaryResponse,
    limit: usize,
    notes: &mut Vec<String>,
) -> pb::DiffSummaryResponse {
    let (ka, kb) = (by_name(a), by_name(b));
    let names: BTreeSet<&String> = ka.keys().chain(kb.keys()).collect();
    let mut kernels: Vec<pb::KernelDiff> = names
        .into_iter()
        .map(|n| {
            let (x, y) = (ka.get(n), kb.get(n));
            let mangled = x.or(y).map(|v| v.1.as_str()).unwrap_or("");
            kernel_diff(n, mangled, x.map(|v| v.0), y.map(|v| v.0))
        })
        .collect();
    kernels.sort_by(|x, y| {
        y.significant
            .cmp(&x.significant)
            .then(y.delta_total_ns.unsigned_abs().cmp(&x.delta_total_ns.unsigned_abs()))
            .then_with(|| x.name.cmp(&y.name))
    });
    let total_kernels = kernels.len() as u64;
    let findings = kernels.iter().filter(|k| k.significant).count() as u64;
    kernels.truncate(limit);

    let mut devices: BTreeMap<u32, pb::DeviceBusyDiff> = BTreeMap::new();
    for (d, first) in a.device_busy.iter().map(|d| (d, true)).chain(b.device_busy.iter().map(|d| (d, false))) {
        let e =
            devices.entry(d.device_id).or_insert(pb::DeviceBusyDiff { device_id: d.device_id, ..Default::default() });
        if first {
            (e.busy_ns_a, e.span_ns_a) = (e.busy_ns_a + d.busy_ns, e.span_ns_a.max(d.span_ns));
        } else {
            (e.busy_ns_b, e.span_ns_b) = (e.busy_ns_b + d.busy_ns, e.span_ns_b.max(d.span_ns));
        }
        e.delta_busy_ns = e.busy_ns_b as i64 - e.busy_ns_a as i64;
    }

    let mut copies: BTreeMap<String, pb::CopyDiff> = BTreeMap::new();
    for (c, first) in a.copies.iter().map(|c| (c, true)).chain(b.copies.iter().map(|c| (c, false))) {
        let e = copies
            .entry(c.direction.clone())
            .or_insert(pb::CopyDiff { direction: c.direction.clone(), ..Default::default() });
        if first {
            (e.count_a, e.bytes_a, e.total_ns_a, e.bandwidth_gbps_a) = (c.count, c.bytes, c.total_ns, c.bandwidth_gbps);
        } else {
            (e.count_b, e.bytes_b, e.total_ns_b, e.bandwidth_gbps_b) = (c.count, c.bytes, c.total_ns, c.bandwidth_gbps);
        }
    }
    let mut copies: Vec<pb::CopyDiff> = copies.into_values().collect();
    copies
        .sort_by(|x, y| (y.bytes_a.max(y.bytes_b)).cmp(&x.bytes_a.max(x.bytes_b)).then(x.direction.cmp(&y.direction)));

    let ca: BTreeMap<&str, &pb::CollectiveStat> = a.collectives.iter().map(|c| (c.name.as_str(), c)).collect();
    let cb: BTreeMap<&str, &pb::CollectiveStat> = b.collectives.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut collectives = Vec::new();
    for (name, x) in &ca {
        if let Some(y) = cb.get(name) {
            collectives.push(pb::CollectiveDiff {
                name: name.to_string(),
                count_a: x.count,
                count_b: y.count,
                bytes_a: x.bytes,
                bytes_b: y.bytes,
                total_ns_a: x.total_ns,
                total_ns_b: y.total_ns,
            });
        }
    }
    collectives.sort_by(|x, y| {
        (y.total_ns_b as i64 - y.total_ns_a as i64)
            .unsigned_abs()
            .cmp(&(x.total_ns_b as i64 - x.total_ns_a as i64).unsigned_abs())
            .then_with(|| x.name.cmp(&y.name))
    });
    for (side, only, other) in [("a", &ca, &cb), ("b", &cb, &ca)] {
        let one: Vec<String> =
            only.iter().filter(|(n, _)| !other.contains_key(*n)).map(|(n, c)| format!("{n} ×{}", c.count)).collect();
        if !one.is_empty() {
            notes.push(format!("NCCL collectives only in {side}, not compared: {}", one.join(", ")));
        }
    }
    pb::DiffSummaryResponse {
        kernels,
        total_kernels,
        findings,
        kernel_total_ns_a: a.kernel_total_ns,
        kernel_total_ns_b: b.kernel_total_ns,
        devices: devices.into_values().collect(),
        copies,
        collectives,
        noise_rule: NOISE_RULE.into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(name: &str, n: u64, mean: f64, sd: f64) -> pb::KernelStat {
        pb::KernelStat {
            name: name.into(),
            count: n,
            total_ns: (n as f64 * mean) as u64,
            mean_ns: mean as u64,
            stddev_ns: sd,
            ..Default::default()
        }
    }

    #[test]
    fn slowed_added_removed_and_noise_in_order() {
        let a = pb::GetSummaryResponse {
            top_kernels: vec![
                stat("gemm", 100, 100_000.0, 1_000.0),
                stat("old", 40, 50_000.0, 500.0),
                stat("noisy", 100, 100_000.0, 57_000.0),
                stat("more", 100, 1_000.0, 10.0),
            ],
            ..Default::default()
        };
        let b = pb::GetSummaryResponse {
            top_kernels: vec![
                stat("gemm", 100, 200_000.0, 1_000.0),
                stat("new", 50, 100_000.0, 900.0),
                stat("noisy", 100, 110_000.0, 57_000.0),
                stat("more", 200, 1_000.0, 10.0),
            ],
            ..Default::default()
        };
        let mut notes = Vec::new();
        let d = compare(&a, &b, usize::MAX, &mut notes);
        let got: Vec<(&str, &str)> = d.kernels.iter().map(|k| (k.name.as_str(), k.change.as_str())).collect();
        assert_eq!(
            got,
            [("gemm", "slower"), ("new", "added"), ("old", "removed"), ("more", "launches"), ("noisy", "unchanged")]
        );
        assert_eq!((d.findings, d.total_kernels), (4, 5));
        assert_eq!(d.kernels[0].delta_total_ns, 10_000_000);
        assert!((d.kernels[4].noise_ns - 57_000.0).abs() < 1.0, "{:?}", d.kernels[4]);
        assert!(notes.is_empty());
        assert_eq!(compare(&a, &b, 2, &mut notes).kernels.len(), 2);
    }

    #[test]
    fn devices_copies_and_collectives_where_both_have_them() {
        let coll =
            |name: &str, count, total_ns| pb::CollectiveStat { name: name.into(), count, bytes: count * 8, total_ns };
        let a = pb::GetSummaryResponse {
            device_busy: vec![pb::DeviceBusy { device_id: 0, busy_ns: 100, span_ns: 200 }],
            copies: vec![pb::CopyStat {
                direction: "HtoD".into(),
                count: 2,
                bytes: 10,
                total_ns: 5,
                bandwidth_gbps: 2.0,
            }],
            collectives: vec![coll("AllReduce", 10, 1000), coll("Broadcast", 1, 50)],
            ..Default::default()
        };
        let b = pb::GetSummaryResponse {
            device_busy: vec![
                pb::DeviceBusy { device_id: 0, busy_ns: 150, span_ns: 200 },
                pb::DeviceBusy { device_id: 1, busy_ns: 7, span_ns: 9 },
            ],
            copies: vec![pb::CopyStat {
                direction: "DtoH".into(),
                count: 1,
                bytes: 99,
                total_ns: 9,
                bandwidth_gbps: 11.0,
            }],
            collectives: vec![coll("AllReduce", 10, 3000), coll("AllGather", 4, 10)],
            ..Default::default()
        };
        let mut notes = Vec::new();
        let d = compare(&a, &b, usize::MAX, &mut notes);
        let devs: Vec<(u32, u64, u64, i64)> =
            d.devices.iter().map(|x| (x.device_id, x.busy_ns_a, x.busy_ns_b, x.delta_busy_ns)).collect();
        assert_eq!(devs, [(0, 100, 150, 50), (1, 0, 7, 7)]);
        let copies: Vec<(&str, u64, u64)> =
            d.copies.iter().map(|c| (c.direction.as_str(), c.bytes_a, c.bytes_b)).collect();
        assert_eq!(copies, [("DtoH", 0, 99), ("HtoD", 10, 0)]);
        assert_eq!(d.collectives.len(), 1);
        let c = &d.collectives[0];
        assert_eq!(
            (c.name.as_str(), c.count_a, c.count_b, c.total_ns_a, c.total_ns_b),
            ("AllReduce", 10, 10, 1000, 3000)
        );
        assert_eq!(
            notes,
            [
                "NCCL collectives only in a, not compared: Broadcast ×1",
                "NCCL collectives only in b, not compared: AllGather ×4"
            ]
        );
    }

    #[test]
    fn few_launches_need_a_tenth() {
        let x = Stat { n: 1, total: 1000, m2: 0.0 };
        assert_eq!(kernel_diff("k", "", Some(x), Some(Stat { n: 1, total: 1050, m2: 0.0 })).change, "unchanged");
        assert_eq!(kernel_diff("k", "", Some(x), Some(Stat { n: 1, total: 1200, m2: 0.0 })).change, "slower");
    }

    #[test]
    fn merged_moments_match_the_whole() {
        // {1, 3} and {5, 7}: together mean 4, sample sd sqrt(20/3).
        let m = Stat { n: 2, total: 4, m2: 2.0 }.merge(Stat { n: 2, total: 12, m2: 2.0 });
        assert_eq!((m.n, m.total), (4, 16));
        assert!((m.sd() - (20.0f64 / 3.0).sqrt()).abs() < 1e-9);
    }

    #[test]
    fn sides_are_checked() {
        let side =
            |session_id, since_ns, until_ns| pb::DiffSide { session_id, since_ns, until_ns, ..Default::default() };
        assert!(check_side(&side(0, 0, 0), Which::A, false).is_err());
        let e = check_side(&side(3, 10, 5), Which::B, false).unwrap_err().to_string();
        assert!(e.starts_with("b.until_ns: 5 is not after since_ns 10"), "{e}");
        assert!(check_side(&side(3, 0, 0), Which::A, true).is_err(), "a given side takes no session");
        assert!(check_side(&side(3, 0, 0), Which::A, false).is_ok());
        assert_eq!(Which::B.field("rank"), "b.rank");
        assert_eq!(label(&pb::DiffSide { session_id: 7, rank: Some(2), ..Default::default() }), "session 7 rank 2");
    }
}
