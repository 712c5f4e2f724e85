//! The PC-sampling scheduler: one per GPU, deciding which process may PC-sample it now.
//!
//! CUPTI lets one process PC-sample a GPU at a time (a second gets HARDWARE_BUSY), so the
//! processes of PC-sampling sessions that work on one GPU take turns:
//!
//! - A process is a candidate on a GPU once its session asks for PC sampling there, and is
//!   eligible while it works on that GPU: it reported a CUDA synchronization or kernel launch
//!   on the GPU's context within `active_for` ([`Sched::activity`]). A launcher, a data-loader worker or an
//!   idle notebook kernel never is, and never holds the GPU.
//! - One eligible process holds the GPU as long as it is the only one. When several are, each
//!   turn lasts `turn` and the next goes to the eligible process with the least service per
//!   weight (stride scheduling: service counts turn time divided by the process's weight, its
//!   samples per second in its last turn, which follow the GPU time it uses). A process that
//!   has waited `max_wait` goes first whatever its weight. A newcomer starts level with the
//!   least served, so it neither waits long nor takes many turns in a row.
//! - A turn ends with a revoke; the next begins only when the process reported that it stopped
//!   sampling ([`Sched::stopped`]), left ([`Sched::remove`]), or after `handover_timeout`, so
//!   the next process does not meet HARDWARE_BUSY from the last.
//! - A frozen GPU (paused for an outside profiler) rotates nothing.
//!
//! Pure state driven by a clock passed in (`Instant`s), so tests replay any schedule.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::Key;

/// The scheduler's settings (`[pc]`).
#[derive(Debug, Clone, Copy)]
pub struct SchedConfig {
    pub turn: Duration,
    pub max_wait: Duration,
    pub active_for: Duration,
    pub handover_timeout: Duration,
}

impl SchedConfig {
    pub fn from_config(c: &crate::config::PcConfig) -> SchedConfig {
        SchedConfig {
            turn: c.turn.0,
            max_wait: c.max_wait.0,
            active_for: c.active_for.0,
            handover_timeout: c.handover_timeout.0,
        }
    }
}

/// What the scheduler asks of the hub and the arbiter.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Ask for the lease of `Key` (StartPcSampling once the arbiter grants it).
    Grant(Key),
    /// End `Key`'s turn: release its lease, with this state shown meanwhile.
    Revoke(Key, String),
    /// Show this state for a candidate that does not hold the GPU.
    State(Key, String),
}

#[derive(Debug, Clone)]
struct Cand {
    /// Eligible until then (None: never worked on this GPU).
    active_until: Option<Instant>,
    /// Samples per second in its last turn (None: never held a turn).
    weight: Option<f64>,
    /// Turn time divided by weight, in seconds (stride scheduling's pass).
    pass: f64,
    /// When it last held the GPU or became eligible, for `max_wait`.
    waiting_since: Option<Instant>,
    /// Samples in the current turn, and the time it was sampled (0: not reported).
    samples: u64,
    sampled_ns: u64,
    /// The state last reported for it (to report changes only).
    shown: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Cur {
    Idle,
    Holding {
        key: Key,
        since: Instant,
    },
    /// `from`'s turn was revoked at `since`; the GPU is free once it stopped.
    Handing {
        from: Key,
        since: Instant,
    },
}

#[derive(Debug)]
struct Gpu {
    cands: BTreeMap<Key, Cand>,
    cur: Cur,
}

/// The schedulers of every GPU.
#[derive(Debug)]
pub struct Sched {
    cfg: SchedConfig,
    gpus: BTreeMap<u32, Gpu>,
    /// Candidate → its GPU.
    gpu_of: BTreeMap<Key, u32>,
    /// The GPUs frozen at the last tick (their turns end with the pause, not by time).
    frozen: Vec<u32>,
}

impl Sched {
    pub fn new(cfg: SchedConfig) -> Sched {
        Sched { cfg, gpus: BTreeMap::new(), gpu_of: BTreeMap::new(), frozen: Vec::new() }
    }

    /// `key` wants PC sampling on GPU `gpu` (its session asks for it).
    pub fn add(&mut self, gpu: u32, key: Key) {
        if self.gpu_of.contains_key(&key) {
            return;
        }
        self.gpu_of.insert(key, gpu);
        let g = self.gpus.entry(gpu).or_insert_with(|| Gpu { cands: BTreeMap::new(), cur: Cur::Idle });
        g.cands.insert(
            key,
            Cand {
                active_until: None,
                weight: None,
                pass: 0.0,
                waiting_since: None,
                samples: 0,
                sampled_ns: 0,
                shown: String::new(),
            },
        );
    }

    /// Whether `key` is a candidate.
    pub fn has(&self, key: &Key) -> bool {
        self.gpu_of.contains_key(key)
    }

    /// The GPU of candidate `key`.
    pub fn gpu(&self, key: &Key) -> Option<u32> {
        self.gpu_of.get(key).copied()
    }

    /// `key` left (session stopped, process gone, sampling failed). Its lease, if any, is the
    /// caller's to release; the GPU is free at once.
    pub fn remove(&mut self, key: &Key) {
        let Some(gpu) = self.gpu_of.remove(key) else { return };
        let Some(g) = self.gpus.get_mut(&gpu) else { return };
        g.cands.remove(key);
        match g.cur {
            Cur::Holding { key: k, .. } | Cur::Handing { from: k, .. } if k == *key => g.cur = Cur::Idle,
            _ => {}
        }
        if g.cands.is_empty() && g.cur == Cur::Idle {
            self.gpus.remove(&gpu);
        }
    }

    /// Removes every candidate of `session` (of one process when `proc` is given); returns
    /// those that held their GPU (their leases to release). A holder whose process goes on
    /// (`running`: its session stopped) still has to disable sampling: its GPU waits for its
    /// STOPPED (or the hand-over timeout) before the next turn, as at a turn's end.
    pub fn remove_where(&mut self, session: u64, proc: Option<u64>, running: bool, now: Instant) -> Vec<Key> {
        let keys: Vec<Key> =
            self.gpu_of.keys().filter(|k| k.0 == session && proc.is_none_or(|p| k.1 == p)).copied().collect();
        let mut held = Vec::new();
        for k in keys {
            let holds = self.holder(&k);
            let gpu = self.gpu_of.get(&k).copied();
            self.remove(&k);
            if holds {
                held.push(k);
                if running && let Some(gpu) = gpu {
                    let g = self.gpus.entry(gpu).or_insert_with(|| Gpu { cands: BTreeMap::new(), cur: Cur::Idle });
                    g.cur = Cur::Handing { from: k, since: now };
                }
            }
        }
        held
    }

    /// Whether `key` holds its GPU's turn now.
    pub fn holder(&self, key: &Key) -> bool {
        let Some(g) = self.gpu_of.get(key).and_then(|gpu| self.gpus.get(gpu)) else { return false };
        matches!(g.cur, Cur::Holding { key: k, .. } if k == *key)
    }

    /// `key` worked on its GPU just now (a synchronization on its context, kernels traced).
    /// True when that made it eligible (a tick is due).
    pub fn activity(&mut self, key: &Key, now: Instant) -> bool {
        let active_for = self.cfg.active_for;
        let Some(c) = self.cand(key) else { return false };
        let newly = c.active_until.is_none_or(|t| t <= now);
        if newly {
            c.waiting_since = Some(now);
        }
        c.active_until = Some(now + active_for);
        newly
    }

    /// The candidates of process `proc` on its CUDA device `device`, in every session.
    pub fn of_proc(&self, proc: u64, device: u32) -> Vec<Key> {
        self.gpu_of.keys().filter(|k| k.1 == proc && k.2 == device).copied().collect()
    }

    /// Samples `key` took in `sampled_ns` of sampling (counted toward its weight while it holds
    /// the GPU: samples per sampled second follow the GPU time it uses).
    pub fn samples(&mut self, key: &Key, n: u64, sampled_ns: u64) {
        if let Some(c) = self.cand(key) {
            c.samples += n;
            c.sampled_ns += sampled_ns;
        }
    }

    /// `key` reported that it stopped sampling: a hand-over from it may go on.
    pub fn stopped(&mut self, key: &Key) {
        // Looked for on every GPU: a holder removed with its session is no candidate any more.
        for g in self.gpus.values_mut() {
            if matches!(g.cur, Cur::Handing { from, .. } if from == *key) {
                g.cur = Cur::Idle;
            }
        }
    }

    fn cand(&mut self, key: &Key) -> Option<&mut Cand> {
        let gpu = self.gpu_of.get(key)?;
        self.gpus.get_mut(gpu)?.cands.get_mut(key)
    }

    /// When `tick` has something to do after `now` at the latest (None: nothing scheduled):
    /// the end of a turn that another process waits for, of a hand-over, or of a candidate's
    /// eligibility. Never a time already past, so a caller that sleeps until it does not spin.
    pub fn next_wakeup(&self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut consider = |t: Instant| {
            if t > now {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        for (gpu, g) in &self.gpus {
            match g.cur {
                Cur::Holding { key, since } => {
                    if !self.frozen.contains(gpu) && g.cands.iter().any(|(k, c)| *k != key && eligible(c, now)) {
                        // Due now or in the past: at the next tick, which `now` is not.
                        consider((since + self.cfg.turn).max(now + std::time::Duration::from_millis(1)));
                    }
                }
                Cur::Handing { since, .. } => {
                    consider((since + self.cfg.handover_timeout).max(now + std::time::Duration::from_millis(1)))
                }
                Cur::Idle => {}
            }
            // An eligibility that ended is dealt with by the tick that saw it end.
            for c in g.cands.values() {
                if let Some(t) = c.active_until {
                    consider(t);
                }
            }
        }
        next
    }

    /// Moves every GPU's schedule to `now`. GPUs in `frozen` (paused) end no turn.
    pub fn tick(&mut self, now: Instant, frozen: &[u32]) -> Vec<Action> {
        self.frozen = frozen.to_vec();
        let mut out = Vec::new();
        let cfg = self.cfg;
        for (&gpu, g) in self.gpus.iter_mut() {
            step(gpu, g, &cfg, now, frozen.contains(&gpu), &mut out);
            states(gpu, g, &cfg, now, &mut out);
        }
        self.gpus.retain(|_, g| !(g.cands.is_empty() && g.cur == Cur::Idle));
        out
    }
}

fn eligible(c: &Cand, now: Instant) -> bool {
    c.active_until.is_some_and(|t| t > now)
}

/// The next holder among the eligible candidates but `except`: one that waited `max_wait`
/// first (the longest waiting), else the least pass.
fn pick(g: &Gpu, cfg: &SchedConfig, now: Instant, except: Option<Key>) -> Option<Key> {
    let elig = || g.cands.iter().filter(|(k, c)| Some(**k) != except && eligible(c, now));
    let starved = elig()
        .filter(|(_, c)| c.waiting_since.is_some_and(|t| now.duration_since(t) >= cfg.max_wait))
        .min_by_key(|(_, c)| c.waiting_since);
    if let Some((k, _)) = starved {
        return Some(*k);
    }
    elig().min_by(|a, b| a.1.pass.total_cmp(&b.1.pass)).map(|(k, _)| *k)
}

/// Ends `key`'s turn at `now`: its weight and pass are updated.
fn charge(g: &mut Gpu, key: Key, since: Instant, now: Instant) {
    let held = now.duration_since(since).as_secs_f64();
    let typical = typical_weight(g);
    if let Some(c) = g.cands.get_mut(&key) {
        // Samples per second sampled, or per second held when the agent did not say.
        let over = if c.sampled_ns > 0 { c.sampled_ns as f64 / 1e9 } else { held };
        if over >= 0.005 && (c.samples > 0 || held >= 0.05) {
            c.weight = Some((c.samples as f64 / over).max(1.0));
        }
        c.samples = 0;
        c.sampled_ns = 0;
        c.pass += held / c.weight.or(typical).unwrap_or(1.0);
        c.waiting_since = Some(now);
    }
}

/// The weight of a candidate that never held a turn: the largest known, so that it is sampled
/// soon and measured.
fn typical_weight(g: &Gpu) -> Option<f64> {
    g.cands.values().filter_map(|c| c.weight).reduce(f64::max)
}

/// One GPU's schedule at `now`; a frozen GPU (paused) ends no turn but may begin one, whose
/// lease then waits for the pause like any other.
fn step(gpu: u32, g: &mut Gpu, cfg: &SchedConfig, now: Instant, frozen: bool, out: &mut Vec<Action>) {
    if let Cur::Handing { since, .. } = g.cur
        && now.duration_since(since) >= cfg.handover_timeout
    {
        g.cur = Cur::Idle;
    }
    if let Cur::Holding { key, since } = g.cur
        && !frozen
    {
        let still = g.cands.get(&key).is_some_and(|c| eligible(c, now));
        let turn_over = now.duration_since(since) >= cfg.turn;
        let next = if turn_over || !still { pick(g, cfg, now, Some(key)) } else { None };
        if !still || next.is_some() {
            charge(g, key, since, now);
            let why = if still {
                format!("waiting for its turn (GPU {gpu} is shared by {} processes)", count_eligible(g, now))
            } else {
                format!("not sampled (no CUDA work on GPU {gpu} for {:?})", cfg.active_for)
            };
            if let Some(c) = g.cands.get_mut(&key) {
                c.shown = why.clone();
            }
            out.push(Action::Revoke(key, why));
            g.cur = Cur::Handing { from: key, since: now };
        }
    }
    if g.cur == Cur::Idle
        && let Some(key) = pick(g, cfg, now, None)
    {
        // A newcomer starts level with the least served of the others.
        let floor =
            g.cands.iter().filter(|(k, c)| **k != key && c.weight.is_some()).map(|(_, c)| c.pass).reduce(f64::min);
        if let Some(c) = g.cands.get_mut(&key) {
            if c.weight.is_none()
                && let Some(f) = floor
            {
                c.pass = c.pass.max(f);
            }
            c.samples = 0;
            c.sampled_ns = 0;
            c.shown = "sampling".into();
        }
        out.push(Action::Grant(key));
        g.cur = Cur::Holding { key, since: now };
    }
}

fn count_eligible(g: &Gpu, now: Instant) -> usize {
    g.cands.values().filter(|c| eligible(c, now)).count()
}

/// The states of candidates that do not hold the GPU, when they change.
fn states(gpu: u32, g: &mut Gpu, cfg: &SchedConfig, now: Instant, out: &mut Vec<Action>) {
    let holder = match g.cur {
        Cur::Holding { key, .. } => Some(key),
        _ => None,
    };
    let handing = matches!(g.cur, Cur::Handing { .. });
    let n = count_eligible(g, now);
    for (k, c) in g.cands.iter_mut() {
        if Some(*k) == holder {
            continue;
        }
        let s = match c.active_until {
            None => format!("not sampled (no CUDA work seen on GPU {gpu} yet)"),
            Some(t) if t <= now => format!("not sampled (no CUDA work on GPU {gpu} for {:?})", cfg.active_for),
            Some(_) if handing => format!("waiting for its turn (GPU {gpu} is changing hands)"),
            Some(_) => format!("waiting for its turn (GPU {gpu} is shared by {n} processes)"),
        };
        if c.shown != s {
            c.shown = s.clone();
            out.push(Action::State(*k, s));
        }
    }
}

#[cfg(test)]
#[path = "sched_tests.rs"]
mod tests;
