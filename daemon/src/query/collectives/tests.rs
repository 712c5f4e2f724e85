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
    assert!(c.notes[1].starts_with("ncclDevKernel_AllReduce_Sum_f32_RING_LL_3 ran on rank 1 only"), "{:?}", c.notes);
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
    // All at once: no period, and no launches a step.
    assert_eq!(launch_period(&[7; 20]), Some((0, 19, 1)));
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

/// A jitter of at most `share` of `v` either way, the same for the same `seed`.
fn jitter(v: i64, share: f64, seed: &mut u64) -> i64 {
    *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    let unit = (*seed >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    v + (v as f64 * share * unit) as i64
}

/// Starts `gaps` (us, repeating) apart, each gap off by up to `share` of itself (the last of
/// a round, between steps, by up to `last`): `steps` rounds.
fn starts_varied(gaps: &[i64], steps: usize, share: f64, last: f64) -> Vec<i64> {
    let mut seed = 42;
    let mut t = 1_000_000_000;
    let mut out = Vec::new();
    for _ in 0..steps {
        for (i, g) in gaps.iter().enumerate() {
            out.push(t);
            t += jitter(g * 1_000, if i + 1 == gaps.len() { last } else { share }, &mut seed);
        }
    }
    out
}

fn starts_with_gaps(gaps: &[i64], steps: usize, share: f64) -> Vec<i64> {
    starts_varied(gaps, steps, share, share)
}

#[test]
fn a_few_close_launches_and_one_long_gap_a_step_are_one_step() {
    // The DDP run that showed 954 us and 560 us steps: 4 equal all-reduces a step, 3 close
    // together; the gap between steps (forward pass, optimizer) varying most.
    for (gaps, share, last) in [
        ([300, 300, 300, 4_600], 0.05, 0.05),
        ([900, 950, 1_000, 2_600], 0.05, 0.05),
        ([900, 950, 1_000, 2_600], 0.05, 0.5),
        ([560, 560, 560, 3_850], 0.1, 0.4),
        ([300, 300, 300, 4_600], 0.05, 0.3),
    ] {
        let starts = starts_varied(&gaps, 1_800, share, last);
        let (p, n, k) = launch_period(&starts).expect("a period");
        let step: i64 = gaps.iter().sum::<i64>() * 1_000;
        assert_eq!((k, n), (4, (starts.len() as u64 - 1) / 4), "{gaps:?} +-{last}");
        assert!((p as i64 - step).abs() < step / 20, "{gaps:?} +-{last}: {p}");
    }
    // 24 equal buckets and a pause: the gaps mostly agree, the pause is a third of the step.
    let mut gaps = vec![500; 24];
    gaps.push(6_000);
    assert_eq!(launch_period(&starts_with_gaps(&gaps, 200, 0.1)).expect("a period").2, 25);
    // One launch a step and a stall every 20th (logging): the launches are the steps.
    let mut gaps = vec![10_000; 19];
    gaps.push(15_000);
    let (p, _, k) = launch_period(&starts_with_gaps(&gaps, 200, 0.05)).expect("a period");
    assert_eq!(k, 1);
    assert!((9_800_000..=10_200_000).contains(&p), "{p}");
    // One launch a step, its start or its gap off by up to 40 %: no repeat to find.
    let mut seed = 3;
    let jittered: Vec<i64> = (0..4_000).map(|i| i * 10_000_000 + jitter(5_000_000, 0.8, &mut seed)).collect();
    assert_eq!(launch_period(&jittered).expect("a period").2, 1);
    let mut t = 0;
    let walk: Vec<i64> = (0..4_000)
        .map(|_| {
            t += jitter(10_000_000, 0.4, &mut seed);
            t
        })
        .collect();
    assert_eq!(launch_period(&walk).expect("a period").2, 1);
}

const AR: i64 = 1;
const BC: i64 = 2;
const AG: i64 = 3;

/// `steps` times the collectives (name, bytes) of a step, enqueued `gaps` (us, one per
/// collective) apart, with 5 % jitter.
fn enqueued(kinds: &[(i64, u64)], gaps: &[i64], steps: usize) -> Vec<Enqueued> {
    starts_with_gaps(gaps, steps, 0.05)
        .into_iter()
        .zip(kinds.iter().cycle())
        .map(|(start, &(name, bytes))| Enqueued { name, bytes, start })
        .collect()
}

#[test]
fn a_step_of_collectives_is_the_shortest_sequence_that_repeats() {
    const MIB: u64 = 1 << 20;
    // DDP: the buffers' broadcast, then an all-reduce per gradient bucket; 5.53 ms a step.
    let step = [(BC, 8), (AR, 32 * MIB), (AR, 32 * MIB), (AR, 32 * MIB), (AR, 32 * MIB)];
    let gaps = [1_500, 300, 300, 300, 3_130];
    let s = collective_steps(&enqueued(&step, &gaps, 200)).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (5, 200, vec![(AR, 4), (BC, 1)]));
    assert!((5_420_000..=5_640_000).contains(&s.period), "{}", s.period);
    // Buckets of different sizes are told apart.
    let step = [(AR, MIB), (AR, 25 * MIB), (AR, 25 * MIB)];
    let s = collective_steps(&enqueued(&step, &[100, 100, 9_800], 50)).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (3, 50, vec![(AR, 3)]));
    assert!((9_800_000..=10_200_000).contains(&s.period), "{}", s.period);
    // One all-reduce a step.
    let s = collective_steps(&enqueued(&[(AR, MIB)], &[7_000], 30)).expect("steps");
    assert_eq!((s.per_step, s.steps), (1, 30));
    assert!((6_800_000..=7_200_000).contains(&s.period), "{}", s.period);
}

#[test]
fn equal_collectives_are_counted_a_step_by_their_times() {
    // Signatures cannot tell 4 equal buckets a step: the long gap between steps does.
    let s = collective_steps(&enqueued(&[(AR, 1 << 25)], &[300, 300, 300, 4_600], 100)).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (4, 100, vec![(AR, 4)]));
    assert!((5_350_000..=5_650_000).contains(&s.period), "{}", s.period);
    let s = collective_steps(&enqueued(&[(AR, 1 << 25)], &[900, 950, 1_000, 2_600], 100)).expect("steps");
    assert_eq!((s.per_step, s.kinds.clone()), (4, vec![(AR, 4)]));
    assert!((5_300_000..=5_600_000).contains(&s.period), "{}", s.period);
    // Many equal buckets and a broadcast: nearly all of one kind; the broadcast marks the step.
    let mut step = vec![(AR, 1 << 25); 24];
    step.insert(0, (BC, 8));
    let mut gaps = vec![200; 24];
    gaps.push(3_000);
    let s = collective_steps(&enqueued(&step, &gaps, 20)).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (25, 20, vec![(AR, 24), (BC, 1)]));
    // Two small collectives (a logged loss and metrics) every 10th step of two: all repeat
    // every 22 collectives, but the small ones take no time: the step stays two.
    let mut list = Vec::new();
    let mut t = 0;
    for i in 0..100 {
        for (name, bytes, gap) in [(AR, 1 << 25, 500_000), (AG, 1 << 20, 9_500_000)] {
            list.push(Enqueued { name, bytes, start: t });
            t += gap;
        }
        if i % 10 == 9 {
            list.push(Enqueued { name: AR, bytes: 4, start: t - 200_000 });
            list.push(Enqueued { name: AG, bytes: 64, start: t - 100_000 });
        }
    }
    let s = collective_steps(&list).expect("steps");
    assert_eq!((s.per_step, s.period), (2, 10_000_000));
    // An all-reduce a step, an all-gather every 10th: the step stays one all-reduce.
    let list: Vec<Enqueued> = (0..200)
        .map(|i| match i % 11 {
            10 => Enqueued { name: AG, bytes: 64, start: i / 11 * 100_000_000 + 99_000_000 },
            j => Enqueued { name: AR, bytes: 1 << 25, start: i / 11 * 100_000_000 + j * 10_000_000 },
        })
        .collect();
    let s = collective_steps(&list).expect("steps");
    assert_eq!((s.per_step, s.period, s.kinds.clone()), (1, 10_000_000, vec![(AR, 1)]));
    // 24 buckets and a broadcast evenly spaced: the times cannot tell, the broadcast does.
    let mut step = vec![(AR, 1 << 25); 24];
    step.push((BC, 8));
    let s = collective_steps(&enqueued(&step, &[400; 25], 20)).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (25, 20, vec![(AR, 24), (BC, 1)]));
    assert!((9_700_000..=10_300_000).contains(&s.period), "{}", s.period);
}

#[test]
fn set_up_collectives_before_the_steps_are_left_out() {
    // DDP's set-up: its check of the parameters' shapes, their broadcast in 3 buckets.
    let setup = [(AG, 64), (BC, 250 << 20), (BC, 250 << 20), (BC, 40 << 20)];
    let mut list: Vec<Enqueued> =
        setup.iter().enumerate().map(|(i, &(name, bytes))| Enqueued { name, bytes, start: i as i64 * 1_000 }).collect();
    let step = [(BC, 8), (AR, 1 << 25), (AR, 1 << 25), (AR, 1 << 25), (AR, 1 << 25)];
    list.extend(enqueued(&step, &[1_500, 300, 300, 300, 3_130], 10));
    let s = collective_steps(&list).expect("steps");
    assert_eq!((s.per_step, s.steps, s.kinds.clone()), (5, 10, vec![(AR, 4), (BC, 1)]));
    assert!((5_420_000..=5_640_000).contains(&s.period), "{}", s.period);
}

#[test]
fn fewer_than_three_steps_of_collectives_are_no_step() {
    let step = [(BC, 8), (AR, 1 << 25), (AR, 1 << 25), (AR, 1 << 25), (AR, 1 << 25)];
    assert_eq!(collective_steps(&enqueued(&step, &[1_500, 300, 300, 300, 3_130], 2)), None);
    assert_eq!(collective_steps(&enqueued(&[(AR, 8), (AG, 8)], &[100, 900], 2)), None);
    assert_eq!(collective_steps(&[]), None);
    let one = Enqueued { name: AG, bytes: 64, start: 5 };
    assert_eq!(collective_steps(&[one]), None);
    // No order at all.
    let list: Vec<Enqueued> = (0..40).map(|i| Enqueued { name: i, bytes: 8, start: i * 1_000 }).collect();
    assert_eq!(collective_steps(&list), None);
}

#[test]
fn a_step_of_collectives_as_shown() {
    let kinds = [("AllReduce".to_string(), 4), ("Broadcast".to_string(), 1)];
    assert_eq!(collective_step_text(&kinds, 5), "AllReduce ×4, Broadcast (5 collectives a step)");
    assert_eq!(collective_step_text(&kinds[1..], 1), "Broadcast (1 collective a step)");
}
