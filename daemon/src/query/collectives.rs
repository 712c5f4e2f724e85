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
/// Share of the largest differences between gaps left out of their mean (a stall, a lost record).
const TRIM: f64 = 0.01;

/// How much the gaps between successive starts differ from the gap `k` later: the mean
/// difference, the largest 1 % left out.
fn gap_change(gaps: &[i64], k: usize) -> f64 {
    let mut d: Vec<u64> = gaps.iter().zip(&gaps[k..]).map(|(a, b)| a.abs_diff(*b)).collect();
    d.sort_unstable();
    d.truncate(d.len() - (d.len() as f64 * TRIM) as usize);
    d.iter().sum::<u64>() as f64 / d.len().max(1) as f64
}

/// The step period of a kernel launched `k` times a step (DDP's all-reduce per gradient bucket)
/// from its sorted `starts`, how many steps, and `k`: the smallest `k` whose gaps repeat (each
/// gap differs from the one `k` later at most half as much as from the one any fewer later:
/// the gaps within a step repeat a step later, whatever the gap between steps); where the
/// periods between successive starts agree (most gaps alike), only if the step holds a pause
/// over a quarter of it. The period is the median of those between every k-th start. Without
/// such a `k`, the plain [`median_period`] (k = 1). None for fewer than 3 starts.
///
/// Gaps, not periods: the time between steps (the forward pass, the optimizer, loading data)
/// varies most, and spreads the periods of every `k` alike, the right one's too; jitter of the
/// starts makes the gaps differ alike at any distance.
pub fn launch_period(starts: &[i64]) -> Option<(u64, u64, usize)> {
    let (p, n) = median_period(starts)?;
    let sample = &starts[..starts.len().min(PER_STEP_SAMPLE)];
    let mut d: Vec<u64> = sample.windows(2).map(|w| (w[1] - w[0]).max(0) as u64).collect();
    d.sort_unstable();
    let q = |f: f64| d[((d.len() - 1) as f64 * f).round() as usize];
    let gap = q(0.5);
    let agree = (q(0.9) - q(0.1)) as f64 <= AGREE * gap as f64;
    let gaps: Vec<i64> = sample.windows(2).map(|w| w[1] - w[0]).collect();
    // The least change of the gaps at a smaller distance: the step's must halve it.
    let mut best = f64::MAX;
    // A k is judged on at least 4 steps.
    for k in 1..=MAX_PER_STEP.min(sample.len().saturating_sub(1) / 4) {
        let change = gap_change(&gaps, k);
        if k > 1 && best > 0.0 && change <= best / 2.0 {
            let mut all: Vec<u64> = starts.windows(k + 1).map(|w| (w[k] - w[0]).max(0) as u64).collect();
            let period = median(&mut all);
            // Where most gaps agree, a step of `k` must hold a pause (over a quarter of it)
            // besides its `k` usual gaps: else the gap that repeats is a stall every k-th
            // (logging, a checkpoint), the launches are the steps.
            if agree && (k as u64 * gap) as f64 > (1.0 - AGREE) * period as f64 {
                break;
            }
            return Some((period, ((starts.len() - 1) / k) as u64, k));
        }
        best = best.min(change);
    }
    Some((p, n, 1))
}

/// One NCCL collective of a process as its steps see it: what it is (a name key) and moves,
/// and when it was enqueued, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub name: i64,
    pub bytes: u64,
    pub start: i64,
}

/// A process's step found in its collectives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectiveSteps {
    /// Median step time, ns.
    pub period: u64,
    /// Steps: the collectives looked at over those a step.
    pub steps: u64,
    /// Collectives a step.
    pub per_step: usize,
    /// A step's collectives: name key and how many, the most frequent first.
    pub kinds: Vec<(i64, usize)>,
}

/// Most collectives a step looked for by their sequence.
const MAX_PER_STEP_COLLS: usize = 64;
/// Share of the collectives that must be followed, a step later, by the same (name and bytes).
const REPEATS: f64 = 0.8;
/// Share of mismatches under which a sequence repeats exactly (records lost, a rare extra).
const EXACT: f64 = 0.02;
/// Most leading collectives left out as set-up rather than steps (DDP's broadcast of the
/// parameters and its check of their shapes); at most a quarter of them.
const MAX_SETUP: usize = 64;

/// Collectives `i` not followed `p` later by the same: how many from each `i` on (`n - p + 1` values).
fn mismatches_from(sig: &[(i64, u64)], p: usize) -> Vec<usize> {
    let m = sig.len().saturating_sub(p);
    let mut out = vec![0; m + 1];
    for i in (0..m).rev() {
        out[i] = out[i + 1] + usize::from(sig[i] != sig[i + p]);
    }
    out
}

/// The step of a process from its collectives (sorted by enqueue start), None when nothing
/// repeats at least 3 times:
///
/// 1. The smallest `p` (at most 64) such that, after at most a few set-up collectives, at
///    least 80 % are followed `p` later by the same collective (name and bytes).
/// 2. Where `p` repeats only roughly and a multiple `q` of it exactly (a rare collective breaks
///    the repeat of `p`: 24 equal gradient buckets and a broadcast), `q`, unless the rare
///    collectives take less than half the time of a `p` (a loss all-reduced every 10th step:
///    the `p` are the steps).
/// 3. How many such `p` a step holds, from their times ([`launch_period`] on the starts of
///    every `p`-th): a sequence of one kind, e.g. 4 equal gradient buckets, cannot tell.
///
/// The period: the median over `i` of `start[i + step] - start[i]`.
pub fn collective_steps(list: &[Enqueued]) -> Option<CollectiveSteps> {
    let n = list.len();
    let sig: Vec<(i64, u64)> = list.iter().map(|x| (x.name, x.bytes)).collect();
    let t: Vec<i64> = list.iter().map(|x| x.start).collect();
    let max_setup = MAX_SETUP.min(n / 4);
    // Mismatches after `w` set-up collectives, as a share of the comparisons.
    let share = |m: &[usize], p: usize, w: usize| m[w] as f64 / (n - p - w) as f64;
    let (mut p, w, rough) = (1..=MAX_PER_STEP_COLLS).find_map(|p| {
        if n < 3 * p {
            return None;
        }
        let m = mismatches_from(&sig, p);
        (0..=max_setup)
            .take_while(|w| n - w >= 3 * p)
            .find(|&w| share(&m, p, w) <= 1.0 - REPEATS)
            .map(|w| (p, w, share(&m, p, w)))
    })?;
    let period = |k: usize, w: usize| {
        let mut d: Vec<u64> = (w..n - k).map(|i| (t[i + k] - t[i]).max(0) as u64).collect();
        median(&mut d)
    };
    if rough > EXACT {
        let exact = (2..)
            .map(|j| j * p)
            .take_while(|&q| q <= MAX_PER_STEP_COLLS && n - w >= 3 * q)
            .find(|&q| share(&mismatches_from(&sig, q), q, w) <= EXACT.min(rough / 2.0));
        if let Some(q) = exact {
            // The `p`s in a `q`, counted and in time.
            let (count, held) = ((q / p) as f64, period(q, w) as f64 / period(p, w).max(1) as f64);
            if held >= count - 0.5 {
                p = q;
            }
        }
    }
    let units: Vec<i64> = t[w..].iter().step_by(p).copied().collect();
    let per_step = p * launch_period(&units).map_or(1, |(_, _, k)| k);
    // The set-up ends where a step repeats whole.
    let w = (0..=max_setup)
        .take_while(|i| i + 2 * per_step <= n)
        .find(|&i| sig[i..i + per_step] == sig[i + per_step..i + 2 * per_step])
        .unwrap_or(w);
    let steps = (n - w) / per_step;
    if steps < 3 {
        return None;
    }
    // What a step holds: any `per_step` in a row (of the middle step: the first and last may
    // be set-up and tear-down).
    let mid = w + steps / 2 * per_step;
    let mut kinds: Vec<(i64, usize)> = Vec::new();
    for x in &list[mid..mid + per_step] {
        match kinds.iter_mut().find(|(name, _)| *name == x.name) {
            Some(e) => e.1 += 1,
            None => kinds.push((x.name, 1)),
        }
    }
    // Stable: ties keep the order of the step.
    kinds.sort_by_key(|k| std::cmp::Reverse(k.1));
    Some(CollectiveSteps { period: period(per_step, w), steps: steps as u64, per_step, kinds })
}

/// What a step of collectives is, for `step_name`: "AllReduce ×4, Broadcast (5 collectives a step)".
pub fn collective_step_text(kinds: &[(String, usize)], per_step: usize) -> String {
    let list: Vec<String> =
        kinds.iter().map(|(name, k)| if *k == 1 { name.clone() } else { format!("{name} ×{k}") }).collect();
    let s = if per_step == 1 { "" } else { "s" };
    format!("{} ({per_step} collective{s} a step)", list.join(", "))
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
mod tests;
