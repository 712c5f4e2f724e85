//! CUPTI PM sampling for a session (`collect.pm_sampling_rate_hz`): while the session is active
//! it holds the on-demand sampler of every GPU this gpuprofd manages, as a `pm watch --source
//! cupti` does ([`crate::arbiter::SamplerUse`]): at the fastest rate any user asked for,
//! renewed before its `sampler.lease_ttl` runs out, preempted by a pause like any other lease,
//! and let go when the session stops. The samples are stored with the device metrics (source
//! `cupti_pm`) like every sampler's.

use std::time::{Duration, Instant};

use super::spec::Collect;
use crate::Daemon;
use crate::arbiter::SamplerUse;
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

/// Whether a session may ask for CUPTI PM sampling here (checked at `StartSession`).
pub(super) fn check(d: &Daemon) -> ApiResult<()> {
    if !d.config.sampler.enabled {
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

fn every(d: &Daemon) -> Duration {
    (d.config.sampler.lease_ttl.0 / 3).max(Duration::from_millis(300))
}

/// The session became active: asks for every managed GPU's sampler.
pub(super) fn start(d: &Daemon, g: &mut Holds, id: u64, collect: &Collect) {
    let rate_hz = collect.pm_sampling_rate_hz;
    if rate_hz == 0 || g.contains_key(&id) {
        return;
    }
    let mut hold = PmHold { rate_hz, uses: Vec::new(), missing: d.arbiter.devices(), renewed: Instant::now() };
    acquire_missing(d, id, &mut hold);
    g.insert(id, hold);
}

fn acquire_missing(d: &Daemon, id: u64, hold: &mut PmHold) {
    let interval = 1_000_000_000 / u64::from(hold.rate_hz.max(1));
    let reason = format!("session {id}: PM sampling at {} Hz", hold.rate_hz);
    let ttl = d.config.sampler.lease_ttl.0;
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
pub(super) fn renew_due(d: &Daemon, g: &mut Holds, now: Instant) {
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
pub(super) fn next_renewal(d: &Daemon, g: &Holds) -> Option<Instant> {
    g.values().map(|h| h.renewed + every(d)).min()
}

/// The session stops: its holds go (the last user of a sampler stops it).
pub(super) fn stop(g: &mut Holds, id: u64) {
    g.remove(&id);
}
