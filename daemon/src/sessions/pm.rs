//! CUPTI PM sampling for a session (`collect.pm_sampling_rate_hz`): while the session is active
//! it holds the on-demand sampler of every GPU this gpuprofd manages, as a `pm watch --source
//! cupti` does ([`crate::arbiter::SamplerUse`]): at the fastest rate any user asked for,
//! renewed before its `sampler.lease_ttl` runs out, preempted by a pause like any other lease,
//! and let go when the session stops. The samples are stored with the device metrics (source
//! `cupti_pm`) like every sampler's.

use std::time::{Duration, Instant};

use std::sync::Arc;

use super::spec::Collect;
use crate::arbiter::{Arbiter, SamplerUse};
use crate::config::SamplerConfig;
use crate::error::{ApiError, ApiResult};

/// The sessions' holds on the samplers, by session id (kept under the sessions lock).
pub(crate) type Holds = std::collections::HashMap<u64, PmHold>;

/// A session's hold on the samplers.
pub(crate) struct PmHold {
    rate_hz: u32,
    uses: Vec<SamplerUse>,
    /// Devices whose sampler could not be had yet (asked again at each renewal).
    missing: Vec<u32>,
    renewed: Instant,
}

/// What the sessions' PM sampling uses: the `[sampler]` settings and the arbiter whose
/// on-demand samplers it holds.
#[derive(Clone, Copy)]
pub(crate) struct Pm<'a> {
    pub sampler: &'a SamplerConfig,
    pub arbiter: &'a Arc<Arbiter>,
}

/// Whether a session may ask for CUPTI PM sampling here (checked at `StartSession`).
pub(super) fn check(d: Pm<'_>) -> ApiResult<()> {
    if !d.sampler.enabled {
        return Err(ApiError::FailedPrecondition(
            "collect.pm_sampling_rate_hz: CUPTI PM sampling is disabled in this gpuprofd's config ([sampler] enabled = false)"
                .into(),
        ));
    }
    if d.arbiter.devices().is_empty() {
        return Err(ApiError::FailedPrecondition(
            "collect.pm_sampling_rate_hz: this gpuprofd has no GPU with a CUPTI PM sampler (no NVIDIA driver found, or none configured in [sampler] devices)"
                .into(),
        ));
    }
    Ok(())
}

fn every(d: Pm<'_>) -> Duration {
    (d.sampler.lease_ttl.0 / 3).max(Duration::from_millis(300))
}

/// The session became active: asks for every managed GPU's sampler.
pub(super) fn start(d: Pm<'_>, g: &mut Holds, id: u64, collect: &Collect) {
    let rate_hz = collect.pm_sampling_rate_hz;
    if rate_hz == 0 || g.contains_key(&id) {
        return;
    }
    let mut hold = PmHold { rate_hz, uses: Vec::new(), missing: d.arbiter.devices(), renewed: Instant::now() };
    acquire_missing(d, id, &mut hold);
    g.insert(id, hold);
}

fn acquire_missing(d: Pm<'_>, id: u64, hold: &mut PmHold) {
    let interval = 1_000_000_000 / u64::from(hold.rate_hz.max(1));
    let reason = format!("session {id}: PM sampling at {} Hz", hold.rate_hz);
    let ttl = d.sampler.lease_ttl.0;
    let mut still = Vec::new();
    for dev in std::mem::take(&mut hold.missing) {
        match d.arbiter.acquire_sampler(dev, interval, ttl, &reason) {
            Ok(u) => hold.uses.push(u),
            Err(e) => {
                tracing::warn!(session = id, gpu = dev, error = %e, "session's CUPTI PM sampler not granted yet");
                still.push(dev);
            }
        }
    }
    hold.missing = still;
}

/// Renews the holds that are due; asks again for the samplers not had yet.
pub(super) fn renew_due(d: Pm<'_>, g: &mut Holds, now: Instant) {
    let every = every(d);
    for (id, hold) in g.iter_mut() {
        if now.duration_since(hold.renewed) < every {
            continue;
        }
        hold.renewed = now;
        for u in &hold.uses {
            if let Err(e) = u.renew() {
                tracing::debug!(session = id, gpu = u.device, error = %e, "session's CUPTI PM sampler lease not renewed");
            }
        }
        if !hold.missing.is_empty() {
            acquire_missing(d, *id, hold);
        }
    }
}

/// When the next renewal is due, if any session holds samplers.
pub(super) fn next_renewal(d: Pm<'_>, g: &Holds) -> Option<Instant> {
    g.values().map(|h| h.renewed + every(d)).min()
}

/// The session stops: its holds go (the last user of a sampler stops it).
pub(super) fn stop(g: &mut Holds, id: u64) {
    g.remove(&id);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built from its parts, no daemon: refused while `[sampler]` is off or no GPU has a
    /// sampler; a session's hold without GPUs holds nothing and is let go at its stop.
    #[test]
    fn pm_holds_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        let mut off = cfg.sampler.clone();
        off.enabled = false;
        let e = check(Pm { sampler: &off, arbiter: &arbiter }).unwrap_err();
        assert!(e.to_string().contains("[sampler] enabled = false"), "{e}");
        let pm = Pm { sampler: &cfg.sampler, arbiter: &arbiter };
        let e = check(pm).unwrap_err();
        assert!(e.to_string().contains("no GPU with a CUPTI PM sampler"), "{e}");
        let mut holds = Holds::new();
        let collect = Collect { pm_sampling_rate_hz: 1000, ..Default::default() };
        start(pm, &mut holds, 7, &collect);
        assert!(holds[&7].uses.is_empty() && holds[&7].missing.is_empty());
        let at = next_renewal(pm, &holds).unwrap();
        assert!(at > holds[&7].renewed && at <= holds[&7].renewed + cfg.sampler.lease_ttl.0);
        stop(&mut holds, 7);
        assert!(holds.is_empty() && next_renewal(pm, &holds).is_none());
    }
}
