//! The arbiter's state machine: pure, synchronous, driven by the caller's clock.
//!
//! Every operation takes `now` (ns since the Unix epoch) and returns the [`Event`]s it caused,
//! in order. The service ([`super::Arbiter`]) applies them (commands to samplers and injectors,
//! audit rows, stream markers); tests drive the same core with a fake clock.
//!
//! Rules, per device:
//! - at most one holder; everyone else waits in a queue;
//! - the holder is always the live lease with the highest priority, ties going to the oldest
//!   request: a higher-priority request preempts the holder, which goes back to the queue
//!   (keeping its place) and is granted again when the device frees up;
//! - leases may expire (pauses always do) and may belong to an agent connection, in which case
//!   they end when it closes;
//! - when the holder reports that an outside tool holds the hardware (CUPTI_ERROR_HARDWARE_BUSY)
//!   the device is marked held externally and the holder is told to retry with exponential
//!   backoff; a successful start, or a change of holder, clears the mark.

use std::collections::BTreeMap;

#[path = "core_lease.rs"]
mod on_demand;

/// Nanoseconds since the Unix epoch.
pub type Nanos = u64;
/// Lease id, unique for the life of the database.
pub type LeaseId = u64;

/// Priority of the background PM sampler.
pub const PRIO_SAMPLER: u32 = 100;
/// Priority of a session's PC sampling.
pub const PRIO_PC_SAMPLING: u32 = 200;
/// Priority of an operator's pause.
pub const PRIO_PAUSE: u32 = 300;

/// Who wants or holds a device's performance monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The device's PM sampler (`gpuprofd sampler`); lives as long as the daemon.
    Sampler,
    /// PC sampling for a session inside one injected process (agent connection `proc`).
    PcSampling {
        session: u64,
        proc: u64,
        pid: u32,
        /// The device ordinal as the process's CUDA sees it.
        agent_device: u32,
        period_log2: u32,
    },
    /// An operator's pause: the monitor is left free for outside tools.
    Pause { uid: u32 },
}

impl Holder {
    /// `leases.holder_kind` / `Reservation.holder_kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Holder::Sampler => "sampler",
            Holder::PcSampling { .. } => "pc_sampling",
            Holder::Pause { .. } => "pause",
        }
    }

    pub fn priority(&self) -> u32 {
        match self {
            Holder::Sampler => PRIO_SAMPLER,
            Holder::PcSampling { .. } => PRIO_PC_SAMPLING,
            Holder::Pause { .. } => PRIO_PAUSE,
        }
    }

    /// Who, for people: "gpuprofd sampler", "session 12 pid 4242", "uid 1000".
    pub fn describe(&self) -> String {
        match self {
            Holder::Sampler => "gpuprofd sampler".to_string(),
            Holder::PcSampling { session, pid, .. } => format!("session {session} pid {pid}"),
            Holder::Pause { uid } => format!("uid {uid}"),
        }
    }
}

/// A request for, or a grant of, one device's performance monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub id: LeaseId,
    pub device: u32,
    pub holder: Holder,
    pub priority: u32,
    pub reason: String,
    /// When it was asked for; orders leases of equal priority.
    pub requested_at: Nanos,
    /// Last time it was granted (None while it has never held the device).
    pub granted_at: Option<Nanos>,
    /// It ends by itself at this time.
    pub expires_at: Option<Nanos>,
    /// The agent connection it dies with.
    pub conn: Option<u64>,
}

/// An outside tool holds the monitor (as reported by the holder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    pub since: Nanos,
    /// Consecutive busy reports.
    pub attempts: u32,
    /// When the holder is told to try again (None: a retry is out, awaiting its report).
    pub retry_at: Option<Nanos>,
}

/// What an operation caused, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The lease waits behind a higher-priority (or older) holder.
    Queued { lease: Lease },
    /// The lease now holds the device: start it.
    Granted { lease: Lease },
    /// A pause that was already in place got a new expiry and reason.
    Extended { lease: Lease, actor: String },
    /// The holder was preempted by `by`; it stays queued and comes back later: stop it.
    Revoked { lease: Lease, by: LeaseId, reason: String },
    /// The lease ended on request or with its connection: stop it if it held the device.
    Released { lease: Lease, was_holder: bool, actor: String, reason: String },
    /// The lease reached its expiry: stop it if it held the device.
    Expired { lease: Lease, was_holder: bool },
    /// The holder could not get the hardware: an outside tool holds it.
    ExternalBusy { device: u32, lease: Lease, attempts: u32, retry_at: Nanos },
    /// The outside holder is gone (the holder started, or the holder changed).
    ExternalCleared { device: u32 },
    /// Time for the holder to try the hardware again.
    Retry { device: u32, lease: Lease },
}

/// Why an operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArbiterError {
    #[error("GPU {0} is not managed by this gpuprofd")]
    UnknownDevice(u32),
    #[error("no lease {0}")]
    UnknownLease(LeaseId),
    #[error("{0}")]
    Invalid(String),
}

/// Timing knobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// First retry after a busy report.
    pub retry_initial: Nanos,
    /// Longest wait between retries.
    pub retry_max: Nanos,
}

impl Default for Timing {
    fn default() -> Self {
        Timing { retry_initial: 1_000_000_000, retry_max: 60_000_000_000 }
    }
}

impl Timing {
    /// Wait before retry number `attempts` (1-based): initial, 2×, 4×, ... capped.
    pub fn backoff(&self, attempts: u32) -> Nanos {
        let shift = attempts.saturating_sub(1).min(30);
        self.retry_initial.saturating_mul(1 << shift).min(self.retry_max)
    }
}

/// One device's state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceState {
    pub holder: Option<Lease>,
    /// Waiting leases, best first (priority descending, then oldest request).
    pub waiting: Vec<Lease>,
    pub external: Option<External>,
}

/// A pause read back from the database at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredPause {
    pub lease: LeaseId,
    pub device: u32,
    pub uid: u32,
    pub reason: String,
    pub created_at: Nanos,
    pub expires_at: Nanos,
}

/// All devices' state.
#[derive(Debug, Clone)]
pub struct Core {
    devices: BTreeMap<u32, DeviceState>,
    next_id: LeaseId,
    timing: Timing,
}

fn rank(l: &Lease) -> (std::cmp::Reverse<u32>, Nanos, LeaseId) {
    (std::cmp::Reverse(l.priority), l.requested_at, l.id)
}

impl Core {
    /// An empty arbiter whose lease ids start after `max_lease_id`.
    pub fn new(timing: Timing, max_lease_id: LeaseId) -> Core {
        Core { devices: BTreeMap::new(), next_id: max_lease_id + 1, timing }
    }

    /// Reinstalls pauses that were active when the daemon stopped; those whose expiry passed
    /// meanwhile end now (an `Expired` event each). Call before adding devices, so that the
    /// sampler queues behind a surviving pause instead of starting.
    pub fn restore(&mut self, pauses: Vec<RestoredPause>, now: Nanos) -> Vec<Event> {
        let mut ev = Vec::new();
        for p in pauses {
            self.next_id = self.next_id.max(p.lease + 1);
            let lease = Lease {
                id: p.lease,
                device: p.device,
                holder: Holder::Pause { uid: p.uid },
                priority: PRIO_PAUSE,
                reason: p.reason,
                requested_at: p.created_at,
                granted_at: Some(p.created_at),
                expires_at: Some(p.expires_at),
                conn: None,
            };
            let dev = self.devices.entry(p.device).or_default();
            if p.expires_at <= now {
                ev.push(Event::Expired { lease, was_holder: true });
            } else if dev.holder.is_none() {
                dev.holder = Some(lease);
            } else {
                // Two open pauses for one device (should not happen): keep the later expiry.
                if let Some(h) = dev.holder.as_mut() {
                    if h.expires_at < lease.expires_at {
                        let old = std::mem::replace(h, lease);
                        ev.push(Event::Released {
                            lease: old,
                            was_holder: true,
                            actor: "gpuprofd".into(),
                            reason: "superseded at restart".into(),
                        });
                    } else {
                        ev.push(Event::Released {
                            lease,
                            was_holder: true,
                            actor: "gpuprofd".into(),
                            reason: "superseded at restart".into(),
                        });
                    }
                }
            }
        }
        ev
    }

    /// Starts managing `device`: its sampler asks for the monitor. Idempotent.
    pub fn add_device(&mut self, device: u32, now: Nanos) -> Vec<Event> {
        let dev = self.devices.entry(device).or_default();
        let has_sampler = dev.holder.iter().chain(dev.waiting.iter()).any(|l| l.holder == Holder::Sampler);
        if has_sampler {
            return Vec::new();
        }
        let id = self.alloc_id();
        let lease = Lease {
            id,
            device,
            holder: Holder::Sampler,
            priority: PRIO_SAMPLER,
            reason: "background PM sampling".into(),
            requested_at: now,
            granted_at: None,
            expires_at: None,
            conn: None,
        };
        self.insert(lease, now)
    }

    /// Devices managed, in order.
    pub fn devices(&self) -> impl Iterator<Item = (u32, &DeviceState)> {
        self.devices.iter().map(|(d, s)| (*d, s))
    }

    pub fn device(&self, device: u32) -> Option<&DeviceState> {
        self.devices.get(&device)
    }

    pub fn is_managed(&self, device: u32) -> bool {
        self.devices.contains_key(&device)
    }

    pub fn holder(&self, device: u32) -> Option<&Lease> {
        self.devices.get(&device).and_then(|d| d.holder.as_ref())
    }

    /// Every lease, held or waiting.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.devices.values().flat_map(|d| d.holder.iter().chain(d.waiting.iter()))
    }

    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    fn alloc_id(&mut self) -> LeaseId {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Asks for a device's monitor. Pauses go through [`Core::pause`].
    pub fn request(
        &mut self,
        device: u32,
        holder: Holder,
        reason: String,
        ttl: Option<Nanos>,
        conn: Option<u64>,
        now: Nanos,
    ) -> Result<(LeaseId, Vec<Event>), ArbiterError> {
        if !self.devices.contains_key(&device) {
            return Err(ArbiterError::UnknownDevice(device));
        }
        if matches!(holder, Holder::Pause { .. }) {
            return Err(ArbiterError::Invalid("pauses are made with pause()".into()));
        }
        if holder == Holder::Sampler {
            return Err(ArbiterError::Invalid("the sampler lease is made with add_device()".into()));
        }
        let id = self.alloc_id();
        let lease = Lease {
            id,
            device,
            priority: holder.priority(),
            holder,
            reason,
            requested_at: now,
            granted_at: None,
            expires_at: ttl.map(|t| now.saturating_add(t)),
            conn,
        };
        Ok((id, self.insert(lease, now)))
    }

    /// Puts a new lease in place: granted, preempting, or queued.
    fn insert(&mut self, mut lease: Lease, now: Nanos) -> Vec<Event> {
        let mut ev = Vec::new();
        let Some(dev) = self.devices.get_mut(&lease.device) else {
            return ev;
        };
        match dev.holder.take() {
            None => {
                lease.granted_at = Some(now);
                ev.push(Event::Granted { lease: lease.clone() });
                dev.holder = Some(lease);
            }
            Some(h) if rank(&lease) < rank(&h) => {
                ev.push(Event::Revoked { lease: h.clone(), by: lease.id, reason: lease.reason.clone() });
                Self::enqueue(&mut dev.waiting, h);
                lease.granted_at = Some(now);
                if dev.external.take().is_some() {
                    ev.push(Event::ExternalCleared { device: lease.device });
                }
                ev.push(Event::Granted { lease: lease.clone() });
                dev.holder = Some(lease);
            }
            Some(h) => {
                dev.holder = Some(h);
                ev.push(Event::Queued { lease: lease.clone() });
                Self::enqueue(&mut dev.waiting, lease);
            }
        }
        ev
    }

    fn enqueue(waiting: &mut Vec<Lease>, lease: Lease) {
        let pos = waiting.partition_point(|w| rank(w) < rank(&lease));
        waiting.insert(pos, lease);
    }

    /// Grants the device to the best waiting lease if it has no holder.
    fn promote(&mut self, device: u32, now: Nanos, ev: &mut Vec<Event>) {
        let Some(dev) = self.devices.get_mut(&device) else {
            return;
        };
        if dev.holder.is_some() {
            return;
        }
        if dev.external.take().is_some() {
            ev.push(Event::ExternalCleared { device });
        }
        if !dev.waiting.is_empty() {
            let mut l = dev.waiting.remove(0);
            l.granted_at = Some(now);
            ev.push(Event::Granted { lease: l.clone() });
            dev.holder = Some(l);
        }
    }

    /// Removes a lease wherever it is; returns it and whether it held its device.
    fn take(&mut self, id: LeaseId) -> Option<(Lease, bool)> {
        for dev in self.devices.values_mut() {
            if dev.holder.as_ref().is_some_and(|h| h.id == id) {
                return dev.holder.take().map(|l| (l, true));
            }
            if let Some(i) = dev.waiting.iter().position(|w| w.id == id) {
                return Some((dev.waiting.remove(i), false));
            }
        }
        None
    }

    /// Ends a lease on request.
    pub fn release(&mut self, id: LeaseId, actor: &str, reason: &str, now: Nanos) -> Result<Vec<Event>, ArbiterError> {
        let Some((lease, was_holder)) = self.take(id) else {
            return Err(ArbiterError::UnknownLease(id));
        };
        let device = lease.device;
        let mut ev = vec![Event::Released { lease, was_holder, actor: actor.to_string(), reason: reason.to_string() }];
        self.promote(device, now, &mut ev);
        Ok(ev)
    }

    /// Pauses `devices` for `ttl`: the monitor is left to outside tools. A device already
    /// paused keeps its pause with the new expiry and reason. Returns the pause leases.
    pub fn pause(
        &mut self,
        devices: &[u32],
        uid: u32,
        reason: &str,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<(Vec<Lease>, Vec<Event>), ArbiterError> {
        if let Some(d) = devices.iter().find(|d| !self.devices.contains_key(d)) {
            return Err(ArbiterError::UnknownDevice(*d));
        }
        let mut leases = Vec::new();
        let mut ev = Vec::new();
        for &device in devices {
            let expires = now.saturating_add(ttl);
            if let Some(h) = self.devices.get_mut(&device).and_then(|d| d.holder.as_mut())
                && matches!(h.holder, Holder::Pause { .. })
            {
                h.expires_at = Some(expires);
                h.reason = reason.to_string();
                ev.push(Event::Extended { lease: h.clone(), actor: format!("uid {uid}") });
                leases.push(h.clone());
                continue;
            }
            let id = self.alloc_id();
            let lease = Lease {
                id,
                device,
                holder: Holder::Pause { uid },
                priority: PRIO_PAUSE,
                reason: reason.to_string(),
                requested_at: now,
                granted_at: Some(now),
                expires_at: Some(expires),
                conn: None,
            };
            ev.extend(self.insert(lease, now));
            if let Some(h) = self.holder(device) {
                leases.push(h.clone());
            }
        }
        Ok((leases, ev))
    }

    /// Ends the pauses on `devices`; returns the devices that were paused.
    pub fn resume(&mut self, devices: &[u32], uid: u32, now: Nanos) -> Result<(Vec<u32>, Vec<Event>), ArbiterError> {
        if let Some(d) = devices.iter().find(|d| !self.devices.contains_key(d)) {
            return Err(ArbiterError::UnknownDevice(*d));
        }
        let mut resumed = Vec::new();
        let mut ev = Vec::new();
        for &device in devices {
            let Some(id) = self.holder(device).filter(|h| matches!(h.holder, Holder::Pause { .. })).map(|h| h.id)
            else {
                continue;
            };
            ev.extend(self.release(id, &format!("uid {uid}"), "resumed", now)?);
            resumed.push(device);
        }
        Ok((resumed, ev))
    }

    /// An agent connection closed: its leases end.
    pub fn connection_closed(&mut self, conn: u64, now: Nanos) -> Vec<Event> {
        let ids: Vec<LeaseId> = self.leases().filter(|l| l.conn == Some(conn)).map(|l| l.id).collect();
        let mut ev = Vec::new();
        for id in ids {
            if let Ok(e) = self.release(id, "gpuprofd", "connection closed", now) {
                ev.extend(e);
            }
        }
        ev
    }

    /// Expires leases and schedules retries whose time has come.
    pub fn tick(&mut self, now: Nanos) -> Vec<Event> {
        let mut ev = Vec::new();
        let expired: Vec<LeaseId> =
            self.leases().filter(|l| l.expires_at.is_some_and(|e| e <= now)).map(|l| l.id).collect();
        for id in expired {
            if let Some((lease, was_holder)) = self.take(id) {
                let device = lease.device;
                ev.push(Event::Expired { lease, was_holder });
                self.promote(device, now, &mut ev);
            }
        }
        for (&device, dev) in self.devices.iter_mut() {
            if let (Some(x), Some(h)) = (dev.external.as_mut(), dev.holder.as_ref())
                && x.retry_at.is_some_and(|t| t <= now)
            {
                x.retry_at = None;
                ev.push(Event::Retry { device, lease: h.clone() });
            }
        }
        ev
    }

    /// The holder of `device` could not get the hardware (CUPTI_ERROR_HARDWARE_BUSY).
    /// `lease` names the holder that reported it; a report from a former holder is ignored.
    pub fn external_busy(&mut self, device: u32, lease: Option<LeaseId>, now: Nanos) -> Vec<Event> {
        let timing = self.timing.clone();
        let Some(dev) = self.devices.get_mut(&device) else {
            return Vec::new();
        };
        let Some(h) = dev.holder.as_ref() else {
            return Vec::new();
        };
        if lease.is_some_and(|l| l != h.id) || matches!(h.holder, Holder::Pause { .. }) {
            return Vec::new();
        }
        let x = dev.external.get_or_insert(External { since: now, attempts: 0, retry_at: None });
        x.attempts += 1;
        let retry_at = now.saturating_add(timing.backoff(x.attempts));
        x.retry_at = Some(retry_at);
        vec![Event::ExternalBusy { device, lease: h.clone(), attempts: x.attempts, retry_at }]
    }

    /// The holder of `device` got the hardware: no outside holder any more.
    pub fn external_clear(&mut self, device: u32) -> Vec<Event> {
        match self.devices.get_mut(&device).and_then(|dev| dev.external.take()) {
            Some(_) => vec![Event::ExternalCleared { device }],
            None => Vec::new(),
        }
    }

    /// The next time [`Core::tick`] has something to do.
    pub fn next_deadline(&self) -> Option<Nanos> {
        let expiries = self.leases().filter_map(|l| l.expires_at);
        let retries = self.devices.values().filter_map(|d| d.external.as_ref().and_then(|x| x.retry_at));
        expiries.chain(retries).min()
    }
}
