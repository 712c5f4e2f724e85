use super::*;

const MS: Duration = Duration::from_millis(1);

fn cfg() -> SchedConfig {
    SchedConfig { turn: 1000 * MS, max_wait: 4000 * MS, active_for: 3000 * MS, handover_timeout: 2000 * MS }
}

/// A simulated GPU: processes with a GPU-time rate (samples per second while they hold it),
/// reporting activity every 500 ms while `working`, stopping 30 ms after a revoke.
struct Sim {
    s: Sched,
    t0: Instant,
    now: Instant,
    /// key → (samples/s, working, held time)
    procs: BTreeMap<Key, (u64, bool, Duration)>,
    stopping: Vec<(Key, Instant)>,
    grants: Vec<(Duration, Key)>,
    /// Longest time between two turns of each process (while working).
    gaps: BTreeMap<Key, Duration>,
    last_turn: BTreeMap<Key, Instant>,
    /// Grants while another process had not stopped yet (a HARDWARE_BUSY in real life).
    overlaps: u32,
}

impl Sim {
    fn new() -> Sim {
        let t0 = Instant::now();
        Sim {
            s: Sched::new(cfg()),
            t0,
            now: t0,
            procs: BTreeMap::new(),
            stopping: Vec::new(),
            grants: Vec::new(),
            gaps: BTreeMap::new(),
            last_turn: BTreeMap::new(),
            overlaps: 0,
        }
    }

    fn add(&mut self, key: Key, rate: u64, working: bool) {
        self.s.add(0, key);
        self.procs.insert(key, (rate, working, Duration::ZERO));
    }

    fn holder(&self) -> Option<Key> {
        self.procs.keys().copied().find(|k| self.s.holder(k))
    }

    fn run(&mut self, dur: Duration) -> Vec<Action> {
        let mut all = Vec::new();
        let end = self.now + dur;
        while self.now < end {
            self.now += 10 * MS;
            let now = self.now;
            let since = now.duration_since(self.t0).as_millis();
            if since.is_multiple_of(500) {
                for (k, (_, working, _)) in &self.procs {
                    if *working {
                        self.s.activity(k, now);
                    }
                }
            }
            if let Some(h) = self.holder()
                && let Some(p) = self.procs.get_mut(&h)
            {
                p.2 += 10 * MS;
                self.s.samples(&h, p.0 / 100, 0);
            }
            let due: Vec<Key> = self.stopping.iter().filter(|(_, t)| *t <= now).map(|(k, _)| *k).collect();
            self.stopping.retain(|(_, t)| *t > now);
            for k in due {
                self.s.stopped(&k);
            }
            for a in self.s.tick(now, &[]) {
                match &a {
                    Action::Grant(k) => {
                        if !self.stopping.is_empty() {
                            self.overlaps += 1;
                        }
                        self.grants.push((now.duration_since(self.t0), *k));
                        if let Some(prev) = self.last_turn.get(k) {
                            let gap = now.duration_since(*prev);
                            let g = self.gaps.entry(*k).or_default();
                            *g = (*g).max(gap);
                        }
                    }
                    Action::Revoke(k, _) => {
                        self.stopping.push((*k, now + 30 * MS));
                        self.last_turn.insert(*k, now);
                    }
                    Action::State(..) => {}
                }
                all.push(a);
            }
        }
        all
    }

    fn held(&self, k: Key) -> Duration {
        self.procs[&k].2
    }
}

const A: Key = (1, 10, 0);
const B: Key = (1, 11, 0);
const C: Key = (1, 12, 0);
const LAUNCHER: Key = (1, 9, 0);

#[test]
fn a_launcher_that_never_works_on_the_gpu_never_holds_it() {
    let mut sim = Sim::new();
    sim.add(LAUNCHER, 0, false);
    sim.add(A, 1_000_000, true);
    let acts = sim.run(10_000 * MS);
    assert!(sim.grants.iter().all(|(_, k)| *k == A), "only the worker is granted: {:?}", sim.grants);
    assert_eq!(sim.grants.len(), 1, "a lone worker keeps the GPU: {:?}", sim.grants);
    assert!(sim.held(A) >= 9_400 * MS, "held {:?}", sim.held(A));
    let shown: Vec<&String> = acts
        .iter()
        .filter_map(|a| if let Action::State(k, s) = a { (*k == LAUNCHER).then_some(s) } else { None })
        .collect();
    assert_eq!(shown.last().map(|s| s.as_str()), Some("not sampled (no CUDA work seen on GPU 0 yet)"));
}

#[test]
fn processes_sharing_a_gpu_take_turns_in_proportion_to_their_gpu_time() {
    let mut sim = Sim::new();
    sim.add(A, 3_000_000, true);
    sim.add(B, 1_000_000, true);
    sim.run(60_000 * MS);
    let (a, b) = (sim.held(A).as_secs_f64(), sim.held(B).as_secs_f64());
    let ratio = a / b;
    assert!((2.0..=4.0).contains(&ratio), "A uses 3x B's GPU time; turns {a:.1}s vs {b:.1}s (ratio {ratio:.2})");
    assert!(a + b >= 55.0, "the GPU is sampled nearly all the time: {:.1}s of 60", a + b);
    assert_eq!(sim.overlaps, 0, "a turn starts only once the last holder stopped");
    for k in [A, B] {
        assert!(
            sim.gaps.get(&k).copied().unwrap_or_default() <= 4_200 * MS,
            "{k:?} waited {:?} (max_wait and a hand-over)",
            sim.gaps.get(&k)
        );
    }
}

#[test]
fn each_process_gets_a_turn_within_max_wait_however_small_its_share() {
    let mut sim = Sim::new();
    sim.add(A, 10_000_000, true);
    sim.add(B, 10_000_000, true);
    sim.add(C, 1_000, true);
    sim.run(40_000 * MS);
    let turns_c = sim.grants.iter().filter(|(_, k)| *k == C).count();
    assert!(turns_c >= 7, "C (1000x less GPU time) still gets a turn at least every 4 s: {turns_c} turns");
    assert!(sim.gaps[&C] <= 5_100 * MS, "C waited {:?}", sim.gaps[&C]);
}

#[test]
fn a_process_that_exits_holding_the_gpu_hands_it_over_at_once() {
    let mut sim = Sim::new();
    sim.add(A, 1_000_000, true);
    sim.add(B, 1_000_000, true);
    sim.run(600 * MS);
    let h = sim.holder().expect("someone holds the GPU");
    let other = if h == A { B } else { A };
    sim.s.remove(&h);
    sim.procs.remove(&h);
    let acts = sim.s.tick(sim.now, &[]);
    assert!(acts.contains(&Action::Grant(other)), "the other process is granted in the same tick: {acts:?}");
}

#[test]
fn a_holder_that_stops_working_gives_the_gpu_back() {
    let mut sim = Sim::new();
    sim.add(A, 1_000_000, true);
    sim.add(B, 1_000_000, false);
    sim.run(1_000 * MS);
    assert!(sim.s.holder(&A));
    sim.procs.get_mut(&A).unwrap().1 = false;
    let acts = sim.run(3_600 * MS);
    assert!(
        acts.iter().any(|a| matches!(a, Action::Revoke(k, why) if *k == A && why.starts_with("not sampled"))),
        "{acts:?}"
    );
    assert_eq!(sim.holder(), None);
    // It works again: it gets the GPU back within a report.
    sim.procs.get_mut(&A).unwrap().1 = true;
    sim.run(600 * MS);
    assert!(sim.s.holder(&A));
}

#[test]
fn a_holder_that_never_confirms_its_stop_delays_the_next_by_the_handover_timeout() {
    let mut s = Sched::new(cfg());
    let t0 = Instant::now();
    s.add(0, A);
    s.add(0, B);
    s.activity(&A, t0);
    s.activity(&B, t0);
    let first = s.tick(t0, &[]);
    let Some(Action::Grant(h)) = first.iter().find(|a| matches!(a, Action::Grant(_))).cloned() else {
        panic!("{first:?}")
    };
    s.activity(&A, t0 + 900 * MS);
    s.activity(&B, t0 + 900 * MS);
    let at_turn = s.tick(t0 + 1000 * MS, &[]);
    assert!(at_turn.iter().any(|a| matches!(a, Action::Revoke(k, _) if *k == h)), "{at_turn:?}");
    assert!(!at_turn.iter().any(|a| matches!(a, Action::Grant(_))), "no grant before the stop: {at_turn:?}");
    s.activity(&A, t0 + 2500 * MS);
    s.activity(&B, t0 + 2500 * MS);
    assert!(!s.tick(t0 + 2900 * MS, &[]).iter().any(|a| matches!(a, Action::Grant(_))));
    let later = s.tick(t0 + 3000 * MS, &[]);
    assert!(later.iter().any(|a| matches!(a, Action::Grant(k) if *k != h)), "after 2 s: {later:?}");
    assert_eq!(s.next_wakeup(t0 + 3000 * MS), Some(t0 + 4000 * MS), "the next turn's end");
    // Nothing already past: a holder alone waits for no turn's end, only for its eligibility.
    s.remove(&h);
    let t = t0 + 4500 * MS;
    s.tick(t, &[]);
    let next = s.next_wakeup(t);
    assert!(next.is_some_and(|n| n > t), "{next:?} after {t:?}");
    assert_eq!(s.next_wakeup(t0 + 60_000 * MS), None, "nobody eligible, nothing to do");
}

#[test]
fn a_paused_gpu_rotates_nothing_and_sessions_leave_cleanly() {
    let mut s = Sched::new(cfg());
    let t0 = Instant::now();
    for k in [A, B] {
        s.add(0, k);
        s.activity(&k, t0);
    }
    s.add(1, (1, 10, 1));
    assert!(s.tick(t0, &[]).iter().any(|a| matches!(a, Action::Grant(_))));
    for k in [A, B] {
        s.activity(&k, t0 + 2000 * MS);
    }
    let frozen = s.tick(t0 + 2500 * MS, &[0]);
    assert!(!frozen.iter().any(|a| matches!(a, Action::Revoke(..) | Action::Grant(_))), "{frozen:?}");
    assert_eq!(s.next_wakeup(t0 + 2500 * MS), Some(t0 + 5000 * MS), "paused: only the eligibilities' ends");
    let held = s.remove_where(1, Some(if s.holder(&A) { 10 } else { 11 }), false, t0 + 2500 * MS);
    assert_eq!(held.len(), 1, "the holder's lease is the caller's to release");
    assert_eq!(s.remove_where(1, None, true, t0 + 2500 * MS).len(), 0, "the other is granted only at the next tick");
    assert!(!s.has(&A) && !s.has(&B) && s.gpu(&(1, 10, 1)).is_none());
}

#[test]
fn a_stopped_session_s_holder_disables_before_another_session_gets_the_gpu() {
    let mut s = Sched::new(cfg());
    let t0 = Instant::now();
    let (a, b) = ((1, 10, 0), (2, 20, 0));
    for k in [a, b] {
        s.add(0, k);
        s.activity(&k, t0);
    }
    let first = s.tick(t0, &[]);
    assert_eq!(first.iter().filter(|x| matches!(x, Action::Grant(_))).count(), 1, "{first:?}");
    let holder = if s.holder(&a) { a } else { b };
    let other = if holder == a { b } else { a };
    // The holder's session stops: its process still has to disable sampling.
    assert_eq!(s.remove_where(holder.0, None, true, t0 + 100 * MS), vec![holder]);
    s.activity(&other, t0 + 200 * MS);
    assert!(!s.tick(t0 + 200 * MS, &[]).iter().any(|x| matches!(x, Action::Grant(_))), "not before its STOPPED");
    s.stopped(&holder);
    assert!(s.tick(t0 + 300 * MS, &[]).contains(&Action::Grant(other)), "right after it");
}
