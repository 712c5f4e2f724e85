//! The arithmetic of comparing a job's ranks, on plain lists (no storage): collectives matched
//! across ranks, the time each rank waited in them, the straggler, step periods and busy time.
//!
//! In a synchronous collective every rank's NCCL kernel ends at about the same time: a rank
//! that arrives early sits inside its kernel until the last one arrives. So for each
//! collective (the i-th NCCL kernel of one name on every rank), a rank waited the latest start
//! among the ranks minus its own start, and the rank that starts last most often is the one
//! the others wait on.

use std::collections::BTreeMap;

/// One NCCL kernel of a rank: its name (any key equal across ranks for the same kernel) and
/// start and end, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nccl {
    pub name: i64,
    pub start: i64,
    pub end: i64,
}

/// One rank to compare: its rank and its NCCL kernels, sorted by start.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub rank: u32,
    pub kernels: &'a [Nccl],
}

/// The rank the others wait on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Index into the members compared.
    pub member: usize,
    /// Collectives it started last in.
    pub last: u64,
    /// What the others waited, in total and the median of one rank in one collective, ns.
    pub others_wait_ns: u64,
    pub median_wait_ns: u64,
    pub evidence: String,
}

/// The ranks compared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Collectives matched across all members.
    pub collectives: u64,
    /// Per member: time waited in the matched collectives, ns.
    pub wait_ns: Vec<u64>,
    /// Per member: matched collectives it started last in.
    pub last: Vec<u64>,
    pub straggler: Option<Verdict>,
    /// Why there is no straggler (empty when there is one).
    pub no_straggler: String,
    /// What was cut short or left out.
    pub notes: Vec<String>,
}

/// Whether a kernel is NCCL's: its name, as shown (demangled) or as reported (an Itanium-mangled
/// `_Z39ncclDevKernel_...` when it was not demangled), starts with `nccl`.
pub fn is_nccl(shown: &str, reported: &str) -> bool {
    fn unmangled_nccl(s: &str) -> bool {
        s.strip_prefix("_Z").is_some_and(|r| r.trim_start_matches(|c: char| c.is_ascii_digit()).starts_with("nccl"))
    }
    shown.starts_with("nccl") || unmangled_nccl(shown) || unmangled_nccl(reported)
}

/// A kernel name as notes show it: without its parameter list.
pub fn short_name(name: &str) -> &str {
    name.split('(').next().unwrap_or(name)
}

/// Compares `members`' collectives. `name_of` gives a kernel name key's text (for notes).
pub fn compare(members: &[Member<'_>], name_of: impl Fn(i64) -> String) -> Comparison {
    let n = members.len();
    let mut out = Comparison { wait_ns: vec![0; n], last: vec![0; n], ..Default::default() };
    if n < 2 {
        out.no_straggler = match n {
            0 => "no ranks to compare".into(),
            _ => format!("one rank (rank {}): nothing to compare it with", members[0].rank),
        };
        return out;
    }
    // Each member's kernels of each name, in order.
    let by_name: Vec<BTreeMap<i64, Vec<Nccl>>> = members
        .iter()
        .map(|m| {
            let mut g: BTreeMap<i64, Vec<Nccl>> = BTreeMap::new();
            for k in m.kernels {
                g.entry(k.name).or_default().push(*k);
            }
            g
        })
        .collect();
    let mut names: Vec<i64> = by_name.iter().flat_map(|g| g.keys().copied()).collect();
    names.sort_unstable();
    names.dedup();
    // Per member, its wait in each matched collective.
    let mut waits: Vec<Vec<u64>> = vec![Vec::new(); n];
    for name in names {
        let lists: Vec<Option<&Vec<Nccl>>> = by_name.iter().map(|g| g.get(&name)).collect();
        let shown = || short_name(&name_of(name)).to_string();
        if lists.iter().any(Option::is_none) {
            let on: Vec<String> =
                members.iter().zip(&lists).filter(|(_, l)| l.is_some()).map(|(m, _)| m.rank.to_string()).collect();
            out.notes.push(format!("{} ran on rank {} only: not compared", shown(), on.join(", ")));
            continue;
        }
        let lists: Vec<&Vec<Nccl>> = lists.into_iter().flatten().collect();
        let common = lists.iter().map(|l| l.len()).min().unwrap_or(0);
        if lists.iter().any(|l| l.len() != common) {
            let counts: Vec<String> =
                members.iter().zip(&lists).map(|(m, l)| format!("rank {} {}", m.rank, l.len())).collect();
            out.notes.push(format!(
                "{}: the ranks ran different numbers ({}); compared the first {common} of each",
                shown(),
                counts.join(", ")
            ));
        }
        for i in 0..common {
            let latest = lists.iter().map(|l| l[i].start).max().unwrap_or(0);
            let at_latest = lists.iter().filter(|l| l[i].start == latest).count();
            for (m, l) in lists.iter().enumerate() {
                let k = l[i];
                // Inside its own kernel: a wait longer than the kernel means the match or the
                // clocks are off, and the kernel's length is all it can have waited.
                let w = (latest - k.start).min(k.end - k.start).max(0) as u64;
                out.wait_ns[m] += w;
                waits[m].push(w);
                // All starting at once: nobody is last.
                if k.start == latest && at_latest < n {
                    out.last[m] += 1;
                }
            }
            out.collectives += 1;
        }
    }
    if out.collectives == 0 {
        out.no_straggler = if members.iter().all(|m| m.kernels.is_empty()) {
            "no NCCL kernels (kernel names starting with nccl): no collectives to compare".into()
        } else {
            "no NCCL kernel ran on every rank: no collectives to compare".into()
        };
        return out;
    }
    // Most often last; of those, the one that waited least.
    let Some(s) = (0..n).max_by(|&a, &b| out.last[a].cmp(&out.last[b]).then(out.wait_ns[b].cmp(&out.wait_ns[a])))
    else {
        return out;
    };
    let (last, total) = (out.last[s], out.collectives);
    if last * 2 < total || last == 0 {
        out.no_straggler = format!(
            "no rank stands out: the one most often last, rank {}, was last in {} of {total} collectives",
            members[s].rank,
            percent(last, total)
        );
        return out;
    }
    let mut others: Vec<u64> =
        waits.iter().enumerate().filter(|(m, _)| *m != s).flat_map(|(_, w)| w).copied().collect();
    let others_wait_ns: u64 = others.iter().sum();
    let median_wait_ns = median(&mut others);
    let evidence = format!(
        "rank {} started last in {} of {total} collectives; the other ranks waited {} in total \
         (median {} per rank and collective)",
        members[s].rank,
        percent(last, total),
        human_ns(others_wait_ns),
        human_ns(median_wait_ns)
    );
    out.straggler = Some(Verdict { member: s, last, others_wait_ns, median_wait_ns, evidence });
    out
}

/// "97 %" (rounded down, so that "100 %" means all).
fn percent(part: u64, whole: u64) -> String {
    format!("{} %", (part * 100).checked_div(whole).unwrap_or(0))
}

/// The median of `v` (the upper one of an even count; 0 when empty). Reorders `v`.
pub fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let mid = v.len() / 2;
    *v.select_nth_unstable(mid).1
}

/// The median period between successive `starts` (sorted) and how many periods there are;
/// None for fewer than 3 starts (a step must repeat to be one).
pub fn median_period(starts: &[i64]) -> Option<(u64, u64)> {
    if starts.len() < 3 {
        return None;
    }
    let mut p: Vec<u64> = starts.windows(2).map(|w| (w[1] - w[0]).max(0) as u64).collect();
    let n = p.len() as u64;
    Some((median(&mut p), n))
}

/// Most launches of one NCCL kernel in a step looked for.
const MAX_PER_STEP: usize = 64;
/// Starts looked at to find how many launches a step has.
const PER_STEP_SAMPLE: usize = 4096;
/// Periods agree when their 10th and 90th percentiles are at most this share of their median apart.
const AGREE: f64 = 0.25;

/// The step period of a kernel launched `k` times a step (DDP's all-reduce per gradient bucket):
/// the smallest `k` whose periods between every k-th start (sorted `starts`) agree, spread at
/// most half as widely as those of any smaller k; their median, and how many steps. Without such a `k`, the plain [`median_period`] (k = 1). None for fewer
/// than 3 starts.
pub fn launch_period(starts: &[i64]) -> Option<(u64, u64, usize)> {
    let (p, n) = median_period(starts)?;
    let sample = &starts[..starts.len().min(PER_STEP_SAMPLE)];
    let periods = |s: &[i64], k: usize| -> Vec<u64> { s.windows(k + 1).map(|w| (w[k] - w[0]).max(0) as u64).collect() };
    // The least spread (ns) seen for a smaller k: a larger k must halve it. Jitter of the starts
    // spreads every k's periods alike (and relative to a longer period, less); launches within
    // a step spread the smaller k's periods by the gaps between them.
    let mut best = u64::MAX;
    // A k is judged on at least 4 steps.
    for k in 1..=MAX_PER_STEP.min(sample.len().saturating_sub(1) / 4).max(1) {
        let mut d = periods(sample, k);
        d.sort_unstable();
        let q = |f: f64| d[((d.len() - 1) as f64 * f).round() as usize];
        let mid = q(0.5);
        if mid == 0 {
            continue;
        }
        let spread = q(0.9) - q(0.1);
        if spread as f64 <= AGREE * mid as f64 && (k == 1 || spread.saturating_mul(2) <= best) {
            let mut all = periods(starts, k);
            return Some((median(&mut all), ((starts.len() - 1) / k) as u64, k));
        }
        best = best.min(spread);
    }
    Some((p, n, 1))
}

/// The group an NVTX range name belongs to for steps: numbered names ("ProfilerStep#12",
/// "step 3") share one ("ProfilerStep#*", "step *").
pub fn step_group(name: &str) -> String {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() < name.len() && !stem.is_empty() { format!("{stem}*") } else { name.to_string() }
}

/// Which range group gives the step time: of those seen at least 3 times, PyTorch's
/// `ProfilerStep#*` if present, else the one covering the most time (an outer range holds the
/// time of the ranges inside it). `groups`: (group, ranges, sum of durations).
pub fn pick_step_group(groups: &[(String, u64, u64)]) -> Option<usize> {
    let repeated = || groups.iter().enumerate().filter(|(_, g)| g.1 >= 3);
    repeated()
        .find(|(_, g)| g.0.starts_with("ProfilerStep"))
        .or_else(|| repeated().max_by(|(_, a), (_, b)| a.2.cmp(&b.2).then(b.0.cmp(&a.0))))
        .map(|(i, _)| i)
}

/// The union of intervals pushed in order of start.
#[derive(Debug, Default, Clone, Copy)]
pub struct Union {
    busy: i64,
    cur: Option<(i64, i64)>,
}

impl Union {
    pub fn push(&mut self, s: i64, e: i64) {
        match &mut self.cur {
            Some((_, ce)) if s <= *ce => *ce = (*ce).max(e),
            Some((cs, ce)) => {
                self.busy += *ce - *cs;
                self.cur = Some((s, e));
            }
            None => self.cur = Some((s, e)),
        }
    }

    /// Busy time so far, ns.
    pub fn total(&self) -> u64 {
        (self.busy + self.cur.map_or(0, |(s, e)| e - s)).max(0) as u64
    }
}

/// Nanoseconds as a short duration ("812 ns", "3.25 ms", "1.50 s").
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    match ns {
        0..1_000 => format!("{ns} ns"),
        1_000..1_000_000 => format!("{:.2} us", v / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} ms", v / 1e6),
        _ => format!("{:.2} s", v / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` collectives of kernel name 1, one every `period` ns from `t0`: each rank starts at
    /// its offset (plus `jitter(i)`), and every rank's kernel ends when the last one started
    /// plus 100 us.
    fn ranks(offsets: &[i64], n: usize, period: i64, jitter: impl Fn(usize, usize) -> i64) -> Vec<Vec<Nccl>> {
        let mut out = vec![Vec::new(); offsets.len()];
        for i in 0..n {
            let t = 1_000_000_000 + i as i64 * period;
            let starts: Vec<i64> = offsets.iter().enumerate().map(|(r, o)| t + o + jitter(i, r)).collect();
            let end = starts.iter().max().unwrap() + 100_000;
            for (r, s) in starts.iter().enumerate() {
                out[r].push(Nccl { name: 1, start: *s, end });
            }
        }
        out
    }

    fn members(lists: &[Vec<Nccl>]) -> Vec<Member<'_>> {
        lists.iter().enumerate().map(|(r, k)| Member { rank: r as u32, kernels: k }).collect()
    }

    fn names(id: i64) -> String {
        format!("ncclDevKernel_AllReduce_Sum_f32_RING_LL_{id}(ncclDevComm*, unsigned long, ncclWork*)")
    }

    #[test]
    fn the_late_rank_is_the_straggler_and_the_others_wait_for_it() {
        // Rank 1 arrives 2 ms late, rank 2 0.5 ms late, in 40 collectives.
        let lists = ranks(&[0, 2_000_000, 500_000], 40, 10_000_000, |_, _| 0);
        let c = compare(&members(&lists), names);
        assert_eq!(c.collectives, 40);
        assert_eq!(c.last, vec![0, 40, 0]);
        assert_eq!(c.wait_ns, vec![40 * 2_000_000, 0, 40 * 1_500_000]);
        let v = c.straggler.clone().expect("a straggler");
        assert_eq!((v.member, v.last), (1, 40));
        assert_eq!(v.others_wait_ns, 40 * 3_500_000);
        assert_eq!(v.median_wait_ns, 2_000_000, "the upper median of 40 x 1.5 ms and 40 x 2 ms");
        assert!(v.evidence.starts_with("rank 1 started last in 100 % of 40 collectives"), "{}", v.evidence);
        assert!(v.evidence.contains("140.00 ms in total"), "{}", v.evidence);
        assert!(c.no_straggler.is_empty() && c.notes.is_empty(), "{c:?}");
    }

    #[test]
    fn mostly_late_is_enough_and_ties_go_to_the_one_that_waited_least() {
        // Rank 0 is late in 3 of 4 collectives, rank 1 in the other.
        let lists = ranks(&[0, 0], 4, 1_000_000, |i, r| if (i == 3) == (r == 1) { 300_000 } else { 0 });
        let c = compare(&members(&lists), names);
        assert_eq!(c.last, vec![3, 1]);
        let v = c.straggler.expect("a straggler");
        assert_eq!(v.member, 0);
        assert!(v.evidence.contains("75 % of 4"), "{}", v.evidence);
        // Two ranks last twice each: the one that waited less (it was late by more).
        let lists = ranks(&[0, 0], 4, 1_000_000, |i, r| match (i % 2, r) {
            (0, 0) => 500_000,
            (1, 1) => 100_000,
            _ => 0,
        });
        let c = compare(&members(&lists), names);
        assert_eq!((c.last.clone(), c.wait_ns.clone()), (vec![2, 2], vec![200_000, 1_000_000]));
        assert_eq!(c.straggler.expect("a straggler").member, 0);
    }

    #[test]
    fn no_straggler_when_none_stands_out_or_nothing_compares() {
        // Each of 4 ranks last in a quarter of the collectives.
        let lists = ranks(&[0, 0, 0, 0], 8, 1_000_000, |i, r| if i % 4 == r { 50_000 } else { 0 });
        let c = compare(&members(&lists), names);
        assert!(c.straggler.is_none());
        assert!(c.no_straggler.starts_with("no rank stands out"), "{}", c.no_straggler);
        assert!(c.no_straggler.contains("25 % of 8"), "{}", c.no_straggler);
        // All at once: nobody is last, nobody waits.
        let lists = ranks(&[7, 7], 5, 1_000_000, |_, _| 0);
        let c = compare(&members(&lists), names);
        assert_eq!((c.last.clone(), c.wait_ns.clone(), c.straggler.is_none()), (vec![0, 0], vec![0, 0], true));
        // One rank.
        let lists = ranks(&[0], 5, 1_000_000, |_, _| 0);
        let c = compare(&members(&lists), names);
        assert_eq!((c.collectives, c.straggler.is_none()), (0, true));
        assert!(c.no_straggler.contains("one rank (rank 0)"), "{}", c.no_straggler);
        // No NCCL kernels.
        let c = compare(&[Member { rank: 0, kernels: &[] }, Member { rank: 1, kernels: &[] }], names);
        assert!(c.no_straggler.starts_with("no NCCL kernels"), "{}", c.no_straggler);
        assert!(compare(&[], names).no_straggler.contains("no ranks"));
    }

    #[test]
    fn different_counts_are_cut_to_the_common_prefix_and_names_matched_apart() {
        let mut lists = ranks(&[0, 1_000_000], 10, 10_000_000, |_, _| 0);
        lists[0].truncate(7);
        // A second collective kind interleaved on both ranks, rank 0 late in it; and a kernel
        // rank 1 alone ran.
        for (r, late) in [(0usize, 400_000i64), (1, 0)] {
            for i in 0..3 {
                let s = 1_005_000_000 + i * 10_000_000 + late;
                lists[r].push(Nccl { name: 2, start: s, end: 1_005_000_000 + i * 10_000_000 + 500_000 });
            }
            lists[r].sort_by_key(|k| k.start);
        }
        lists[1].push(Nccl { name: 3, start: 2_000_000_000, end: 2_000_001_000 });
        let c = compare(&members(&lists), names);
        assert_eq!(c.collectives, 7 + 3);
        assert_eq!(c.last, vec![3, 7]);
        assert_eq!(c.wait_ns, vec![7 * 1_000_000, 3 * 400_000]);
        assert_eq!(c.straggler.expect("a straggler").member, 1);
        assert_eq!(c.notes.len(), 2, "{:?}", c.notes);
        assert!(c.notes[0].contains("rank 0 7, rank 1 10") && c.notes[0].contains("first 7"), "{:?}", c.notes);
        assert!(
            c.notes[1].starts_with("ncclDevKernel_AllReduce_Sum_f32_RING_LL_3 ran on rank 1 only"),
            "{:?}",
            c.notes
        );
    }

    #[test]
    fn nccl_kernels_by_name() {
        assert!(is_nccl("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "_Z39ncclDev"));
        assert!(is_nccl("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", ""));
        assert!(is_nccl("_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", ""));
        assert!(!is_nccl("ampere_sgemm_128x64_tn", ""));
        assert!(!is_nccl(
            "void at::native::elementwise_kernel<128, 2>(int)",
            "_ZN2at6native18elementwise_kernelILi128ELi2EEEviT1_"
        ));
        assert!(!is_nccl("my_nccl_helper(int)", "_Z14my_nccl_helperi"));
    }

    #[test]
    fn a_wait_is_at_most_the_kernel() {
        let a = [Nccl { name: 1, start: 0, end: 1_000 }];
        let b = [Nccl { name: 1, start: 50_000, end: 51_000 }];
        let c = compare(&[Member { rank: 0, kernels: &a }, Member { rank: 1, kernels: &b }], names);
        assert_eq!(c.wait_ns, vec![1_000, 0]);
    }

    #[test]
    fn launches_per_step_are_found() {
        // One launch a step, 10 ms apart with up to 0.3 ms jitter.
        let jitter = |i: i64| (i * 7919) % 300_000;
        let one: Vec<i64> = (0..50).map(|i| i * 10_000_000 + jitter(i)).collect();
        let (p, n, k) = launch_period(&one).expect("a period");
        assert_eq!((n, k), (49, 1));
        assert!((9_700_000..=10_300_000).contains(&p), "{p}");
        // Three a step (gradient buckets at 0, 1 and 3 ms into a 20 ms step).
        let three: Vec<i64> =
            (0..40).flat_map(|s| [0, 1_000_000, 3_000_000].map(|o| s * 20_000_000 + o + jitter(s))).collect();
        let (p, n, k) = launch_period(&three).expect("a period");
        assert_eq!((n, k), (39, 3));
        assert!((19_700_000..=20_300_000).contains(&p), "{p}");
        // One a step with much jitter (10 ms +- 20 %): steps of two would agree better, but not
        // by enough to be taken for two launches a step.
        let noisy: Vec<i64> = (0..60).map(|i| i * 10_000_000 + (i * i * 7919 + i * 104_729) % 4_000_000).collect();
        assert_eq!(launch_period(&noisy).expect("a period").2, 1);
        // No regular pattern: the plain median of successive periods.
        let odd: Vec<i64> = [0, 1, 5, 6, 20, 21, 50].iter().map(|v| v * 1_000_000).collect();
        assert_eq!(launch_period(&odd), Some((median_period(&odd).expect("median").0, 6, 1)));
        assert_eq!(launch_period(&[0, 5]), None);
    }

    #[test]
    fn steps_and_busy_time() {
        assert_eq!(median_period(&[0, 10, 30, 40]), Some((10, 3)));
        assert_eq!(median_period(&[0, 10]), None, "two ranges are not a repeating step");
        assert_eq!(step_group("ProfilerStep#12"), "ProfilerStep#*");
        assert_eq!(step_group("step 3"), "step *");
        assert_eq!(step_group("forward"), "forward");
        assert_eq!(step_group("42"), "42");
        let g = |n: &str, c, t| (n.to_string(), c, t);
        let groups = [g("forward", 30, 900), g("ProfilerStep#*", 10, 500), g("once", 1, 10_000)];
        assert_eq!(pick_step_group(&groups), Some(1), "PyTorch's step ranges first");
        let groups = [g("forward", 30, 900), g("train_step", 10, 1_000), g("once", 2, 10_000)];
        assert_eq!(pick_step_group(&groups), Some(1), "the repeating range covering the most time");
        assert_eq!(pick_step_group(&[g("once", 2, 10)]), None);
        let mut u = Union::default();
        for (s, e) in [(0, 5), (10, 20), (15, 30), (40, 41)] {
            u.push(s, e);
        }
        assert_eq!(u.total(), 5 + 20 + 1);
        assert_eq!(Union::default().total(), 0);
        assert_eq!(
            (human_ns(999), human_ns(750_000), human_ns(310_000_000)),
            ("999 ns".into(), "750.00 us".into(), "310.00 ms".into())
        );
    }
}
