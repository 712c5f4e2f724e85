//! On-demand sampler leases (`sampler.always_on = false`): a device is managed without a
//! sampler lease, and the sampler asks for the monitor only while someone wants its samples.
//! The lease has an expiry its users renew; a pause preempts it like the always-on one.

use super::{ArbiterError, Core, Event, Holder, Lease, LeaseId, Nanos, PRIO_SAMPLER};

impl Core {
    /// Starts managing `device` with no sampler lease. Idempotent.
    pub fn manage(&mut self, device: u32) {
        self.devices.entry(device).or_default();
    }

    /// The device's sampler lease (held or waiting), if any.
    pub fn sampler_lease(&self, device: u32) -> Option<&Lease> {
        let d = self.devices.get(&device)?;
        d.holder.iter().chain(d.waiting.iter()).find(|l| l.holder == Holder::Sampler)
    }

    /// Asks for the sampler on `device` until `now + ttl`, or moves the expiry of the sampler
    /// lease already there (one that never expires stays so).
    pub fn request_sampler(
        &mut self,
        device: u32,
        reason: &str,
        ttl: Nanos,
        now: Nanos,
    ) -> Result<(LeaseId, Vec<Event>), ArbiterError> {
        let Some(dev) = self.devices.get_mut(&device) else {
            return Err(ArbiterError::UnknownDevice(device));
        };
        let expires = now.saturating_add(ttl);
        if let Some(l) = dev.holder.iter_mut().chain(dev.waiting.iter_mut()).find(|l| l.holder == Holder::Sampler) {
            if l.expires_at.is_some() {
                l.expires_at = Some(l.expires_at.unwrap_or(0).max(expires));
            }
            return Ok((l.id, Vec::new()));
        }
        let id = self.alloc_id();
        let lease = Lease {
            id,
            device,
            holder: Holder::Sampler,
            priority: PRIO_SAMPLER,
            reason: reason.to_string(),
            requested_at: now,
            granted_at: None,
            expires_at: Some(expires),
            conn: None,
        };
        Ok((id, self.insert(lease, now)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::Timing;
    use super::*;

    #[test]
    fn on_demand_sampler_comes_and_goes() {
        let mut c = Core::new(Timing::default(), 0);
        c.manage(0);
        assert!(c.holder(0).is_none());
        let (id, ev) = c.request_sampler(0, "pm watch", 10, 100).unwrap();
        assert!(matches!(ev.as_slice(), [Event::Granted { .. }]));
        let (again, ev) = c.request_sampler(0, "pm watch", 10, 105).unwrap();
        assert_eq!((again, ev.len()), (id, 0));
        assert_eq!(c.holder(0).unwrap().expires_at, Some(115));
        // A pause preempts it; it waits; it expires while waiting.
        let (_, ev) = c.pause(&[0], 0, "ncu", 1000, 106).unwrap();
        assert!(ev.iter().any(|e| matches!(e, Event::Revoked { .. })));
        assert!(c.sampler_lease(0).is_some());
        c.tick(200);
        assert!(c.sampler_lease(0).is_none());
        assert!(c.request_sampler(7, "x", 1, 1).is_err());
    }
}
