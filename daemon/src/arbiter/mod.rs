//! Per-device performance-monitor arbiter.
//!
//! The GPU performance monitor is exclusive per device: PM sampling, PC sampling, Nsight
//! Compute and DCGM profiling each need it. The arbiter owns gpuprof's claim on it and gives
//! it back on request: leases with a holder (background sampler 100, a session's PC sampling
//! 200, an operator's pause 300), a reason and an expiry; preemption by priority; a queue;
//! leases that die with their agent connection; an audit row for everything; pauses that
//! survive a restart; and an "held externally" mark with backoff retries when an outside tool
//! has the hardware.
//!
//! [`core`] is the pure state machine (driven by a clock passed in, model-tested);
//! [`persist`] writes and reads its rows; this module wraps both for the daemon: an
//! [`Arbiter`] shared by the API, and a driver task ([`run`]) that turns the core's events into
//! commands to samplers and injectors, audit rows and PM stream markers.

pub mod core;
mod driver;
mod ondemand;
pub mod persist;

pub use driver::{Driver, SamplerStates, run};
pub use ondemand::SamplerUse;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gpuprof_proto::api as pb;
use tokio::sync::{Notify, broadcast, mpsc};

use self::core::{ArbiterError, Core, Event, Holder, Lease, LeaseId, Nanos, Timing};
use crate::error::{ApiError, ApiResult};

/// Where the arbiter gets the time from; tests pass a fake one.
pub trait Clock: Send + Sync {
    /// Nanoseconds since the Unix epoch.
    fn now_ns(&self) -> Nanos;
}

/// The system's wall clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> Nanos {
        crate::clock::now_ns()
    }
}

/// Pause limits.
#[derive(Debug, Clone)]
pub struct PauseLimits {
    /// Used when a pause asks for no duration.
    pub default_ttl: Duration,
    /// Longest pause accepted.
    pub max_ttl: Duration,
}

/// The arbiter shared by the API and the driver task.
pub struct Arbiter {
    core: Mutex<Core>,
    clock: Arc<dyn Clock>,
    limits: PauseLimits,
    events: mpsc::UnboundedSender<Vec<Event>>,
    events_rx: Mutex<Option<mpsc::UnboundedReceiver<Vec<Event>>>>,
    wake: Notify,
    markers: broadcast::Sender<pb::PmPaused>,
    users: Mutex<ondemand::SamplerUsers>,
}

impl From<ArbiterError> for ApiError {
    fn from(e: ArbiterError) -> Self {
        match e {
            ArbiterError::UnknownDevice(_) | ArbiterError::UnknownLease(_) => ApiError::NotFound(e.to_string()),
            ArbiterError::Invalid(_) => ApiError::invalid("request", e.to_string()),
        }
    }
}

impl Arbiter {
    /// A new arbiter with restored pauses; `startup` events (pauses that expired while the
    /// daemon was down) are queued for the driver like any other.
    pub fn new(
        clock: Arc<dyn Clock>,
        timing: Timing,
        limits: PauseLimits,
        restored: Vec<core::RestoredPause>,
        max_lease_id: LeaseId,
    ) -> Arbiter {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut core = Core::new(timing, max_lease_id);
        let now = clock.now_ns();
        let ev = core.restore(restored, now);
        if !ev.is_empty() {
            let _ = tx.send(ev);
        }
        Arbiter {
            core: Mutex::new(core),
            clock,
            limits,
            events: tx,
            events_rx: Mutex::new(Some(rx)),
            wake: Notify::new(),
            markers: broadcast::channel(256).0,
            users: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now(&self) -> Nanos {
        self.clock.now_ns()
    }

    /// Runs `f` on the core under its lock and hands the events to the driver in order.
    fn with_core<T>(&self, f: impl FnOnce(&mut Core, Nanos) -> (T, Vec<Event>)) -> T {
        let now = self.clock.now_ns();
        let mut core = self.lock();
        let (out, ev) = f(&mut core, now);
        if !ev.is_empty() {
            let _ = self.events.send(ev);
        }
        drop(core);
        self.wake.notify_one();
        out
    }

    /// Starts managing `device` (its sampler asks for the monitor).
    pub fn add_device(&self, device: u32) {
        self.with_core(|c, now| ((), c.add_device(device, now)));
    }

    /// Devices managed, in order.
    pub fn devices(&self) -> Vec<u32> {
        self.lock().devices().map(|(d, _)| d).collect()
    }

    /// Pauses devices (all when `devices` is empty and `all` is set).
    pub fn pause(
        &self,
        devices: &[u32],
        all: bool,
        uid: u32,
        reason: &str,
        ttl: Option<Duration>,
    ) -> ApiResult<Vec<pb::Reservation>> {
        let ttl = ttl.filter(|t| !t.is_zero()).unwrap_or(self.limits.default_ttl);
        if ttl > self.limits.max_ttl {
            return Err(ApiError::invalid(
                "duration_seconds",
                format!(
                    "{} s is longer than the maximum pause of {} s (arbiter.max_pause)",
                    ttl.as_secs(),
                    self.limits.max_ttl.as_secs()
                ),
            ));
        }
        let devices = self.resolve(devices, all)?;
        let reason = if reason.trim().is_empty() { "paused by operator".to_string() } else { reason.to_string() };
        let leases = self.with_core(|c, now| match c.pause(&devices, uid, &reason, ttl.as_nanos() as Nanos, now) {
            Ok((l, ev)) => (Ok(l), ev),
            Err(e) => (Err(e), Vec::new()),
        })?;
        Ok(leases.iter().map(|l| reservation(l, false)).collect())
    }

    /// Ends pauses; returns the devices that were paused.
    pub fn resume(&self, devices: &[u32], all: bool, uid: u32) -> ApiResult<Vec<u32>> {
        let devices = self.resolve(devices, all)?;
        Ok(self.with_core(|c, now| match c.resume(&devices, uid, now) {
            Ok((d, ev)) => (Ok(d), ev),
            Err(e) => (Err(e), Vec::new()),
        })?)
    }

    fn resolve(&self, devices: &[u32], all: bool) -> ApiResult<Vec<u32>> {
        let managed = self.devices();
        if managed.is_empty() {
            return Err(ApiError::FailedPrecondition(
                "this gpuprofd manages no GPU (none found, or [sampler] disabled); nothing to pause or resume".into(),
            ));
        }
        if all {
            return Ok(managed);
        }
        if devices.is_empty() {
            return Err(ApiError::invalid("devices", "name at least one GPU, or set all"));
        }
        let mut out = Vec::new();
        for d in devices {
            if !managed.contains(d) {
                return Err(ApiError::NotFound(format!(
                    "devices: GPU {d} is not managed by this gpuprofd (managed: {})",
                    managed.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
                )));
            }
            if !out.contains(d) {
                out.push(*d);
            }
        }
        Ok(out)
    }

    /// Asks for PC sampling on a device for a session's process; the lease dies with the
    /// process's connection. The driver sends StartPcSampling when it is granted.
    pub fn request_pc_sampling(
        &self,
        device: u32,
        holder: Holder,
        reason: String,
        ttl: Option<Duration>,
    ) -> Result<LeaseId, ArbiterError> {
        let conn = match &holder {
            Holder::PcSampling { proc, .. } => Some(*proc),
            _ => return Err(ArbiterError::Invalid("request_pc_sampling needs a PcSampling holder".into())),
        };
        self.with_core(|c, now| {
            match c.request(device, holder, reason, ttl.map(|t| t.as_nanos() as Nanos), conn, now) {
                Ok((id, ev)) => (Ok(id), ev),
                Err(e) => (Err(e), Vec::new()),
            }
        })
    }

    /// Ends a lease (e.g. a session's PC sampling when the session stops).
    pub fn release(&self, lease: LeaseId, actor: &str, reason: &str) -> Result<(), ArbiterError> {
        self.with_core(|c, now| match c.release(lease, actor, reason, now) {
            Ok(ev) => (Ok(()), ev),
            Err(e) => (Err(e), Vec::new()),
        })
    }

    /// The holder of `device` (lease `lease` if known) got CUPTI_ERROR_HARDWARE_BUSY (or 999
    /// at PC sampling GetData): an outside tool holds the monitor.
    pub fn external_busy(&self, device: u32, lease: Option<LeaseId>) {
        self.with_core(|c, now| ((), c.external_busy(device, lease, now)));
    }

    /// The holder of `device` has the hardware.
    pub fn external_clear(&self, device: u32) {
        self.with_core(|c, _| ((), c.external_clear(device)));
    }

    /// Who holds each device and who waits.
    pub fn reservations(&self) -> Vec<pb::DeviceReservations> {
        let core = self.lock();
        core.devices()
            .map(|(device, s)| pb::DeviceReservations {
                device,
                holder: s.holder.as_ref().map(|l| reservation(l, s.external.is_some())),
                waiting: s.waiting.iter().map(|l| reservation(l, false)).collect(),
                held_externally: s.external.is_some(),
            })
            .collect()
    }

    /// A short state of one device's monitor for people: "sampling", "paused by uid 0 until ...".
    pub fn monitor_state(&self, device: u32) -> String {
        let core = self.lock();
        let Some(s) = core.device(device) else {
            return "unmanaged".into();
        };
        if s.external.is_some() {
            return "held by an outside tool".into();
        }
        match &s.holder {
            None => "free".into(),
            Some(l) => match &l.holder {
                Holder::Sampler => "sampler".into(),
                Holder::PcSampling { .. } => format!("pc sampling ({})", l.holder.describe()),
                Holder::Pause { .. } => {
                    let left = l.expires_at.unwrap_or(0).saturating_sub(self.clock.now_ns()) / 1_000_000_000;
                    format!("paused by {} for {left} s more: {}", l.holder.describe(), l.reason)
                }
            },
        }
    }

    /// Paused markers for PM streams.
    pub fn markers(&self) -> broadcast::Receiver<pb::PmPaused> {
        self.markers.subscribe()
    }

    /// The marker for each device whose sampling is stopped now (for a new subscriber).
    pub fn current_markers(&self) -> Vec<pb::PmPaused> {
        let core = self.lock();
        core.devices().filter_map(|(d, s)| paused_marker(d, s)).collect()
    }

    /// The lease that holds `device` now.
    pub fn holder_of(&self, device: u32) -> Option<Lease> {
        self.lock().holder(device).cloned()
    }

    fn sampler_lease(&self, device: u32) -> Option<LeaseId> {
        self.holder_of(device).filter(|l| l.holder == Holder::Sampler).map(|l| l.id)
    }

    fn tick(&self) {
        self.with_core(|c, now| ((), c.tick(now)));
    }

    fn next_deadline(&self) -> Option<Nanos> {
        self.lock().next_deadline()
    }
}

fn reservation(l: &Lease, external: bool) -> pb::Reservation {
    pb::Reservation {
        device: l.device,
        holder_kind: if external { "external".into() } else { l.holder.kind().into() },
        holder: if external {
            format!("an outside tool (CUPTI_ERROR_HARDWARE_BUSY); gpuprof's holder: {}", l.holder.describe())
        } else {
            l.holder.describe()
        },
        priority: l.priority,
        reason: l.reason.clone(),
        granted_at_ns: l.granted_at.unwrap_or(0),
        expires_at_ns: l.expires_at.unwrap_or(0),
        lease_id: l.id,
    }
}

/// The marker describing why sampling on a device is stopped, if it is.
fn paused_marker(device: u32, s: &core::DeviceState) -> Option<pb::PmPaused> {
    if s.external.is_some() {
        return Some(pb::PmPaused {
            device,
            holder: "an outside tool".into(),
            reason: "another profiler (Nsight Compute, DCGM) holds the performance monitor; retrying".into(),
            resumed: false,
        });
    }
    match &s.holder {
        Some(l) if l.holder == Holder::Sampler => None,
        Some(l) => Some(pb::PmPaused { device, holder: l.holder.describe(), reason: l.reason.clone(), resumed: false }),
        // On demand, an idle sampler is not a pause; one that waits (expired away) neither.
        None => None,
    }
}

/// The uid this daemon runs as (a daemon started by a user for itself obeys that user).
/// Restores the arbiter from the database (before the writer thread takes the connection).
pub fn open(conn: &rusqlite::Connection, config: &crate::config::Config) -> anyhow::Result<Arc<Arbiter>> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (pauses, max_lease) = persist::load(conn, clock.now_ns())?;
    if !pauses.is_empty() {
        tracing::info!(pauses = pauses.len(), "restoring operator pauses of the previous run");
    }
    let a = &config.arbiter;
    let timing = Timing {
        retry_initial: a.external_retry_initial.0.as_nanos() as Nanos,
        retry_max: a.external_retry_max.0.as_nanos() as Nanos,
    };
    let limits = PauseLimits { default_ttl: a.default_pause.0, max_ttl: a.max_pause.0 };
    Ok(Arc::new(Arbiter::new(clock, timing, limits, pauses, max_lease)))
}
