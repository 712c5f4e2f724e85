//! Continuous PC sampling, the live side: the state of PC sampling in each (session, process,
//! device), the lease each holds, the per-session broadcast that pushes batches to
//! `StreamPcSamples` subscribers, and the cubins already stored.
//!
//! Who writes what: the sessions supervisor asks the arbiter for a lease per device of a
//! process it traces ([`PcHub::request`]), the arbiter driver reports grants, queueing and
//! preemption ([`PcHub::granted`], [`PcHub::queued`], [`PcHub::revoked`]) and reads the
//! options to send with `StartPcSampling` ([`PcHub::start_message`]), agent connections report
//! the agent's own states and batches ([`PcHub::agent_state`], [`PcHub::add_batch`],
//! [`PcHub::publish`]). The hub uses no module that uses it (only the leaves, `demangle` and
//! `ingest`'s batch totals), so all of them can.
//!
//! Lock order: the sessions lock, then the hub's, then the arbiter's core. The driver never
//! holds the arbiter's lock while calling in here.

pub mod cubin;
pub mod lookup;
pub mod names;
pub mod sched;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;
use tokio::sync::broadcast;

/// The stall-reason prefix CUPTI puts on every reason's name.
pub const STALL_PREFIX: &str = "smsp__pcsamp_warps_issue_";

/// A (session, process, CUDA device ordinal in the process).
pub type Key = (u64, u64, u32);

/// PC sampling on one device of one process in one session.
#[derive(Debug, Clone, Default)]
pub struct DevState {
    /// "waiting for the lease (...)", "sampling", "preempted (...)", "no lease (...)",
    /// "failed (...)", "hardware busy (...)", "stopped (...)".
    pub state: String,
    /// Samples taken and lost (from the batches received).
    pub samples: u64,
    pub dropped: u64,
    /// Heals of a stuck hardware buffer, over every start.
    pub heals: u32,
    /// The heal count the agent last reported (it counts from each start).
    reported_heals: u32,
    /// The lease while it is requested or held.
    pub lease: Option<u64>,
    /// The lease holds the device now (granted, not preempted since).
    granted: bool,
    /// Since when the device has been stopped by HARDWARE_BUSY (asked again later).
    busy_since: Option<std::time::Instant>,
    /// What `StartPcSampling` carries for this device.
    start: wire::StartPcSampling,
}

impl DevState {
    pub fn to_pb(&self, device: u32) -> pb::PcSamplingDevice {
        pb::PcSamplingDevice {
            device,
            state: self.state.clone(),
            samples: self.samples,
            dropped: self.dropped,
            heals: self.heals,
        }
    }
}

/// A batch as pushed to stream subscribers.
#[derive(Debug)]
pub struct Push {
    pub response: pb::StreamPcSamplesResponse,
}

#[derive(Default)]
struct Inner {
    devices: BTreeMap<Key, DevState>,
    leases: HashMap<u64, Key>,
}

/// A lease to hand back to the arbiter (after the hub's lock is released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub lease: u64,
    pub reason: String,
}

/// The hub, one per daemon (`Daemon::pc`).
pub struct PcHub {
    inner: Mutex<Inner>,
    /// Which process PC-samples each GPU now (taken alone or after `inner`, never before).
    sched: Mutex<sched::Sched>,
    streams: Mutex<HashMap<u64, broadcast::Sender<Arc<Push>>>>,
    cubins: Mutex<HashSet<String>>,
    /// Cubins that processes found in none of their mapped files (see [`lookup`]).
    pub nowhere: Arc<lookup::Nowhere>,
    /// Ring size of each session's stream (`sampler.stream_queue`).
    queue: usize,
    /// Stream subscribers now, and dropped for being slow since start.
    pub subscribers: AtomicU64,
    pub dropped_subscribers: AtomicU64,
}

impl PcHub {
    pub fn new(queue: usize, sched: sched::SchedConfig) -> PcHub {
        PcHub {
            inner: Mutex::default(),
            sched: Mutex::new(sched::Sched::new(sched)),
            streams: Mutex::default(),
            cubins: Mutex::default(),
            nowhere: Arc::default(),
            queue: queue.max(16),
            subscribers: AtomicU64::new(0),
            dropped_subscribers: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sched(&self) -> MutexGuard<'_, sched::Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts tracking `key`, which wants PC sampling on the daemon's GPU `gpu`: its GPU's
    /// scheduler asks for the lease when it is `key`'s turn ([`Self::schedule`]).
    pub fn track(&self, key: Key, gpu: u32, start: wire::StartPcSampling) {
        let mut g = self.lock();
        if g.devices.get(&key).is_some_and(|s| s.lease.is_some()) {
            return;
        }
        let e = g.devices.entry(key).or_default();
        e.start = start;
        e.state = format!("not sampled (no CUDA work seen on GPU {gpu} yet)");
        self.sched().add(gpu, key);
    }

    /// Process `proc` worked on its CUDA devices `devices` just now. True when that made one
    /// of its candidates eligible for a turn (the scheduler should run).
    pub fn activity(&self, proc: u64, devices: impl IntoIterator<Item = u32>, now: Instant) -> bool {
        let mut s = self.sched();
        let mut newly = false;
        for dev in devices {
            for key in s.of_proc(proc, dev) {
                newly |= s.activity(&key, now);
            }
        }
        newly
    }

    /// Moves the schedulers to `now` (GPUs in `frozen` rotate nothing): the states of those
    /// waiting are set here; the leases to ask for and to release are returned.
    pub fn schedule(&self, now: Instant, frozen: &[u32]) -> (Vec<Key>, Vec<Release>) {
        let mut g = self.lock();
        let actions = self.sched().tick(now, frozen);
        let (mut grant, mut release) = (Vec::new(), Vec::new());
        for a in actions {
            match a {
                sched::Action::Grant(key) => grant.push(key),
                sched::Action::Revoke(key, state) => {
                    if let Some(s) = g.devices.get_mut(&key) {
                        s.granted = false;
                        s.state = state.clone();
                        if let Some(l) = s.lease.take() {
                            release.push(Release { lease: l, reason: format!("turn over: {state}") });
                        }
                    }
                }
                sched::Action::State(key, state) => {
                    if let Some(s) = g.devices.get_mut(&key)
                        && s.lease.is_none()
                    {
                        s.state = state;
                    }
                }
            }
        }
        for r in &release {
            g.leases.remove(&r.lease);
        }
        (grant, release)
    }

    /// When the schedulers have something to do next at the latest.
    pub fn next_schedule(&self) -> Option<Instant> {
        self.sched().next_wakeup(Instant::now())
    }

    /// What `StartPcSampling` carries for `key` (None: not tracked).
    pub fn start_of(&self, key: &Key) -> Option<wire::StartPcSampling> {
        self.lock().devices.get(key).map(|s| s.start.clone())
    }

    /// Starts tracking `key`: `ask` requests the lease (called under the hub's lock, so the
    /// arbiter driver cannot report on the lease before it is known here) and returns its id,
    /// or why there is none.
    pub fn request(&self, key: Key, start: wire::StartPcSampling, ask: impl FnOnce() -> Result<u64, String>) {
        let mut g = self.lock();
        if g.devices.get(&key).is_some_and(|s| s.lease.is_some()) {
            return;
        }
        let e = g.devices.entry(key).or_default();
        e.start = start;
        e.state = "waiting for the lease".into();
        match ask() {
            Ok(lease) => {
                // The grant may have been reported already (it waited for this lock).
                e.lease = Some(lease);
                g.leases.insert(lease, key);
            }
            Err(why) => e.state = format!("no lease ({why})"),
        }
    }

    fn by_lease(&self, g: &mut Inner, lease: u64) -> Option<Key> {
        g.leases.get(&lease).copied()
    }

    /// What to send with `StartPcSampling` for a granted lease (None: not a lease of ours).
    pub fn start_message(&self, lease: u64) -> Option<wire::StartPcSampling> {
        let mut g = self.lock();
        let key = self.by_lease(&mut g, lease)?;
        g.devices.get(&key).map(|s| s.start.clone())
    }

    /// The lease was granted: StartPcSampling goes out.
    pub fn granted(&self, lease: u64) {
        let mut g = self.lock();
        if let Some(key) = self.by_lease(&mut g, lease)
            && let Some(s) = g.devices.get_mut(&key)
        {
            s.state = "sampling".into();
            s.reported_heals = 0;
            s.granted = true;
        }
    }

    /// The lease waits behind `holder` ("pause by uid 0: maintenance").
    pub fn queued(&self, lease: u64, holder: &str) {
        self.set_by_lease(lease, format!("waiting for the lease (held by {holder})"));
    }

    /// A higher-priority holder took the device (`why`: "pause by uid 0: maintenance").
    pub fn revoked(&self, lease: u64, why: &str) {
        self.set_by_lease(lease, format!("preempted ({why})"));
    }

    /// A state of a lease that does not hold the device.
    fn set_by_lease(&self, lease: u64, state: String) {
        let mut g = self.lock();
        if let Some(key) = self.by_lease(&mut g, lease)
            && let Some(s) = g.devices.get_mut(&key)
        {
            s.state = state;
            s.granted = false;
        }
    }

    /// A `PcSamplingState` from agent connection `proc`. Returns the lease to release when
    /// sampling failed or an outside tool holds the hardware; an error names a status this
    /// daemon does not know (a protocol error).
    pub fn agent_state(&self, proc: u64, m: &wire::PcSamplingState) -> Result<Option<Release>, String> {
        let status = wire::PcSamplingStatus::try_from(m.status)
            .ok()
            .filter(|s| *s != wire::PcSamplingStatus::Unspecified)
            .ok_or_else(|| format!("unknown PC sampling status {}", m.status))?;
        let mut g = self.lock();
        let key = (m.session_id, proc, m.device_id);
        let Some(s) = g.devices.get_mut(&key) else {
            // Not (or no longer) a session's device: a late report, nothing to show it on;
            // but a stop confirmed after its session or process was forgotten still ends the
            // GPU's hand-over.
            if status == wire::PcSamplingStatus::Stopped {
                self.sched().stopped(&key);
            }
            return Ok(None);
        };
        if m.heals >= s.reported_heals {
            s.heals += m.heals - s.reported_heals;
        } else {
            s.heals += m.heals;
        }
        s.reported_heals = m.heals;
        let detail = if m.detail.is_empty() { String::new() } else { format!(" ({})", m.detail) };
        use wire::PcSamplingStatus as S;
        let release = match status {
            S::Sampling | S::Healed => {
                // A report that crossed a preemption on the way keeps the preemption shown.
                if s.granted {
                    s.state = "sampling".into();
                }
                None
            }
            S::Stopped => {
                self.sched().stopped(&key);
                // Our own reasons (preempted, stopped, no lease) say more than the agent's.
                if s.state == "sampling" {
                    s.state = format!("stopped{detail}");
                }
                None
            }
            S::Failed => {
                s.granted = false;
                s.state = format!("failed{detail}");
                s.lease.take().map(|l| Release { lease: l, reason: format!("PC sampling failed{detail}") })
            }
            S::HardwareBusy => {
                let who = if m.detail.is_empty() {
                    "another profiler holds the performance monitor".to_string()
                } else {
                    m.detail.clone()
                };
                s.granted = false;
                s.state = format!("hardware busy ({who})");
                s.busy_since = Some(std::time::Instant::now());
                s.lease.take().map(|l| Release { lease: l, reason: format!("hardware busy: {who}") })
            }
            S::Unspecified => None,
        };
        if matches!(status, S::Failed | S::HardwareBusy) {
            self.sched().remove(&key);
        }
        if let Some(r) = &release {
            g.leases.remove(&r.lease);
        }
        Ok(release)
    }

    /// Devices stopped by HARDWARE_BUSY at least `after` ago, with what their `StartPcSampling`
    /// carried; each is counted as asked again from now.
    pub fn busy_due(&self, after: std::time::Duration) -> Vec<(Key, wire::StartPcSampling)> {
        let now = std::time::Instant::now();
        let mut g = self.lock();
        let mut due = Vec::new();
        for (key, s) in g.devices.iter_mut() {
            if s.lease.is_none() && s.busy_since.is_some_and(|t| now.duration_since(t) >= after) {
                s.busy_since = None;
                due.push((*key, s.start.clone()));
            }
        }
        due
    }

    /// When the next device stopped by HARDWARE_BUSY is due to ask again.
    pub fn next_busy_retry(&self, after: std::time::Duration) -> Option<std::time::Instant> {
        self.lock().devices.values().filter_map(|s| s.busy_since).min().map(|t| t + after)
    }

    /// Counts a batch from agent connection `proc`.
    pub fn add_batch(&self, proc: u64, b: &wire::PcSampleBatch) {
        let (taken, lost) = crate::ingest::batch_totals(b);
        let key = (b.session_id, proc, b.device_id);
        let mut g = self.lock();
        if let Some(s) = g.devices.get_mut(&key) {
            s.samples += taken;
            s.dropped += lost;
        }
        let mut s = self.sched();
        s.samples(&key, taken, b.sampled_ns);
        // Samples taken are work on the GPU too (the process's own reports may come late).
        if taken > 0 {
            s.activity(&key, Instant::now());
        }
    }

    /// Ends PC sampling of `session` (of one process when `proc` is given): devices still
    /// sampling or waiting get `state`; returns the leases to release.
    /// `running`: the processes still hold the hardware until they disable (a session's stop,
    /// a process given to another session), unlike a process that left.
    pub fn stop(&self, session: u64, proc: Option<u64>, state: &str, running: bool) -> Vec<Release> {
        let mut g = self.lock();
        let mut out = Vec::new();
        let keys: Vec<Key> =
            g.devices.keys().filter(|k| k.0 == session && proc.is_none_or(|p| k.1 == p)).copied().collect();
        self.sched().remove_where(session, proc, running, Instant::now());
        for key in keys {
            let Some(s) = g.devices.get_mut(&key) else { continue };
            s.granted = false;
            if let Some(l) = s.lease.take() {
                out.push(Release { lease: l, reason: state.to_string() });
                g.leases.remove(&l);
            }
            if let Some(s) = g.devices.get_mut(&key)
                && (s.state == "sampling"
                    || s.state.starts_with("waiting")
                    || s.state.starts_with("preempted")
                    || s.state.starts_with("not sampled"))
            {
                s.state = state.to_string();
            }
        }
        out
    }

    /// The devices of each process of `session`, for GetSession.
    pub fn snapshot(&self, session: u64) -> BTreeMap<u64, Vec<pb::PcSamplingDevice>> {
        let g = self.lock();
        let mut out: BTreeMap<u64, Vec<pb::PcSamplingDevice>> = BTreeMap::new();
        for ((_, proc, dev), s) in g.devices.range((session, 0, 0)..=(session, u64::MAX, u32::MAX)) {
            out.entry(*proc).or_default().push(s.to_pb(*dev));
        }
        out
    }

    /// Forgets process `proc` of `session` (stopped first): its final states, to store.
    pub fn forget(&self, session: u64, proc: u64) -> Vec<(Key, DevState)> {
        let mut g = self.lock();
        let keys: Vec<Key> = g.devices.range((session, proc, 0)..=(session, proc, u32::MAX)).map(|(k, _)| *k).collect();
        keys.into_iter().filter_map(|k| g.devices.remove(&k).map(|s| (k, s))).collect()
    }

    /// Forgets a finished session: its final states (to store) and its stream ends.
    pub fn finish(&self, session: u64) -> Vec<(Key, DevState)> {
        let mut g = self.lock();
        let keys: Vec<Key> =
            g.devices.range((session, 0, 0)..=(session, u64::MAX, u32::MAX)).map(|(k, _)| *k).collect();
        let mut out = Vec::new();
        for k in keys {
            if let Some(s) = g.devices.remove(&k) {
                if let Some(l) = s.lease {
                    g.leases.remove(&l);
                }
                out.push((k, s));
            }
        }
        drop(g);
        self.close_stream(session);
        out
    }

    // ------------------------------------------------------------ streams

    fn streams(&self) -> MutexGuard<'_, HashMap<u64, broadcast::Sender<Arc<Push>>>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A receiver of the batches of `session` pushed from now on.
    pub fn subscribe(&self, session: u64) -> broadcast::Receiver<Arc<Push>> {
        self.streams().entry(session).or_insert_with(|| broadcast::channel(self.queue).0).subscribe()
    }

    /// Per (process, CUDA device ordinal in the process) that a session PC-samples or wants
    /// to: whether sampling runs there now, in any session.
    pub fn process_devices(&self) -> BTreeMap<(u64, u32), bool> {
        let mut out = BTreeMap::new();
        for ((_, proc, dev), s) in &self.lock().devices {
            *out.entry((*proc, *dev)).or_insert(false) |= s.state == "sampling";
        }
        out
    }

    /// Whether anyone streams `session` (so that rows are built only for someone).
    pub fn has_subscribers(&self, session: u64) -> bool {
        self.streams().get(&session).is_some_and(|s| s.receiver_count() > 0)
    }

    /// Pushes a batch to the subscribers of `session`.
    pub fn publish(&self, session: u64, p: Push) {
        let streams = self.streams();
        if let Some(tx) = streams.get(&session) {
            let _ = tx.send(Arc::new(p));
        }
    }

    /// Ends the streams of `session`: subscribers see the end once they drained the ring.
    pub fn close_stream(&self, session: u64) {
        self.streams().remove(&session);
    }

    // ------------------------------------------------------------ cubins

    /// Whether a cubin with `hash` is stored (or on its way to the writer).
    pub fn cubin_known(&self, hash: &str) -> bool {
        self.cubins.lock().unwrap_or_else(|e| e.into_inner()).contains(hash)
    }

    /// Marks a cubin stored; false if it was already.
    pub fn cubin_stored(&self, hash: &str) -> bool {
        self.cubins.lock().unwrap_or_else(|e| e.into_inner()).insert(hash.to_string())
    }

    /// Notes a subscriber dropped for being slow.
    pub fn note_dropped(&self) {
        self.dropped_subscribers.fetch_add(1, Relaxed);
    }
}

/// A stall reason without CUPTI's prefix, for people ("stalled_long_scoreboard").
pub fn short_stall(name: &str) -> &str {
    name.strip_prefix(STALL_PREFIX).unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_sched() -> sched::SchedConfig {
        let s = std::time::Duration::from_secs;
        sched::SchedConfig { turn: s(1), max_wait: s(4), active_for: s(3), handover_timeout: s(2) }
    }

    fn state(status: wire::PcSamplingStatus, detail: &str, heals: u32) -> wire::PcSamplingState {
        wire::PcSamplingState {
            session_id: 1,
            device_id: 0,
            status: status as i32,
            detail: detail.into(),
            heals,
            ..Default::default()
        }
    }

    #[test]
    fn lease_states_follow_the_arbiter_and_the_agent() {
        let hub = PcHub::new(16, test_sched());
        hub.request((1, 7, 0), wire::StartPcSampling { period_log2: 12, ..Default::default() }, || Ok(42));
        hub.request((1, 7, 1), wire::StartPcSampling::default(), || Err("GPU 1 is not managed".into()));
        assert_eq!(hub.start_message(42).map(|m| m.period_log2), Some(12));
        let snap = |d: usize| hub.snapshot(1)[&7][d].state.clone();
        assert_eq!(snap(0), "waiting for the lease");
        assert_eq!(snap(1), "no lease (GPU 1 is not managed)");
        hub.granted(42);
        assert_eq!(snap(0), "sampling");
        hub.revoked(42, "pause by uid 0: ncu");
        assert_eq!(snap(0), "preempted (pause by uid 0: ncu)");
        // The agent's STOPPED after our StopPcSampling keeps our reason, and so does a SAMPLING
        // that crossed the preemption.
        assert_eq!(hub.agent_state(7, &state(wire::PcSamplingStatus::Sampling, "", 0)), Ok(None));
        assert_eq!(hub.agent_state(7, &state(wire::PcSamplingStatus::Stopped, "revoked", 0)), Ok(None));
        assert_eq!(snap(0), "preempted (pause by uid 0: ncu)");
        hub.granted(42);
        hub.agent_state(7, &state(wire::PcSamplingStatus::Healed, "", 2)).unwrap();
        hub.agent_state(7, &state(wire::PcSamplingStatus::Healed, "", 3)).unwrap();
        assert_eq!(hub.snapshot(1)[&7][0].heals, 3);
        let r = hub.agent_state(7, &state(wire::PcSamplingStatus::HardwareBusy, "ncu", 0)).unwrap();
        assert_eq!(r.map(|r| r.lease), Some(42));
        assert_eq!(snap(0), "hardware busy (ncu)");
        assert!(hub.agent_state(7, &state(wire::PcSamplingStatus::Unspecified, "", 0)).is_err());
        let b = wire::PcSampleBatch {
            session_id: 1,
            device_id: 0,
            total_samples: 10,
            dropped_samples: 2,
            ..Default::default()
        };
        hub.add_batch(7, &b);
        let fin = hub.finish(1);
        assert_eq!(fin.len(), 2);
        assert_eq!((fin[0].1.samples, fin[0].1.dropped), (10, 2));
        assert!(hub.snapshot(1).is_empty());
    }

    #[test]
    fn stop_releases_held_and_waiting_leases() {
        let hub = PcHub::new(16, test_sched());
        hub.request((3, 1, 0), wire::StartPcSampling::default(), || Ok(1));
        hub.request((3, 2, 0), wire::StartPcSampling::default(), || Ok(2));
        hub.granted(1);
        let r = hub.stop(3, Some(2), "stopped (process left)", false);
        assert_eq!(r, vec![Release { lease: 2, reason: "stopped (process left)".into() }]);
        let r = hub.stop(3, None, "stopped", true);
        assert_eq!(r.iter().map(|r| r.lease).collect::<Vec<_>>(), vec![1]);
        assert_eq!(hub.snapshot(3)[&1][0].state, "stopped");
        assert_eq!(short_stall("smsp__pcsamp_warps_issue_stalled_barrier"), "stalled_barrier");
    }
}
