//! On-demand CUPTI PM sampling: users (PM streams that asked for `cupti_rate_hz`) hold a
//! [`SamplerUse`]; the device's sampler lease lives while at least one does (renewed before
//! its `sampler.lease_ttl` runs out) and is released when the last goes. The sampler samples
//! at the fastest rate its users asked for.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::Arbiter;
use super::core::Nanos;
use crate::error::{ApiError, ApiResult};

/// Users of each device's sampler: user id → interval asked for (ns).
#[derive(Default)]
pub struct SamplerUsers {
    next: u64,
    by_device: BTreeMap<u32, BTreeMap<u64, u64>>,
}

/// One user's hold on a device's sampler; dropping it lets go.
pub struct SamplerUse {
    arb: Arc<Arbiter>,
    pub device: u32,
    user: u64,
    ttl: Nanos,
    reason: String,
}

impl Arbiter {
    fn users(&self) -> std::sync::MutexGuard<'_, SamplerUsers> {
        self.users.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts managing `device` without asking for its sampler (on-demand mode).
    pub fn manage_device(&self, device: u32) {
        self.with_core(|c, _| {
            c.manage(device);
            ((), Vec::new())
        });
    }

    /// The interval the device's sampler should sample at: the shortest its users asked for.
    pub fn sampler_interval(&self, device: u32) -> Option<u64> {
        self.users().by_device.get(&device).and_then(|u| u.values().min().copied())
    }

    /// Asks for CUPTI PM sampling on `device` at `interval_ns` for as long as the returned
    /// use lives (renew it within `ttl`).
    pub fn acquire_sampler(
        self: &Arc<Self>,
        device: u32,
        interval_ns: u64,
        ttl: Duration,
        reason: &str,
    ) -> ApiResult<SamplerUse> {
        let user = {
            let mut u = self.users();
            u.next += 1;
            let id = u.next;
            u.by_device.entry(device).or_default().insert(id, interval_ns);
            id
        };
        let s =
            SamplerUse { arb: self.clone(), device, user, ttl: ttl.as_nanos() as Nanos, reason: reason.to_string() };
        s.renew().map_err(|e| ApiError::NotFound(format!("devices: {e} (managed: {:?})", self.devices())))?;
        Ok(s)
    }
}

impl SamplerUse {
    /// Moves the lease's expiry (asks for a new lease if it expired or was let go).
    pub fn renew(&self) -> Result<(), super::core::ArbiterError> {
        let (device, ttl, reason) = (self.device, self.ttl, self.reason.clone());
        self.arb.with_core(|c, now| match c.request_sampler(device, &reason, ttl, now) {
            Ok((_, ev)) => (Ok(()), ev),
            Err(e) => (Err(e), Vec::new()),
        })
    }
}

impl Drop for SamplerUse {
    fn drop(&mut self) {
        let last = {
            let mut u = self.arb.users();
            let users = u.by_device.entry(self.device).or_default();
            users.remove(&self.user);
            let last = users.is_empty();
            if last {
                u.by_device.remove(&self.device);
            }
            last
        };
        let device = self.device;
        self.arb.with_core(|c, now| {
            // Only an on-demand lease (one with an expiry) goes; always_on's stays.
            let lease = c.sampler_lease(device).filter(|l| last && l.expires_at.is_some()).map(|l| l.id);
            match lease.map(|id| c.release(id, "gpuprofd", "its last user is gone", now)) {
                Some(Ok(ev)) => ((), ev),
                _ => ((), Vec::new()),
            }
        });
    }
}
