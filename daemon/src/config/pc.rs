//! `[pc]`: PC sampling's default mode, the windows' cost budget and the per-GPU scheduler.

use anyhow::{Result, bail};
use serde::Deserialize;

use super::Dur;

/// PC sampling: its default mode, the windows' budget and the per-GPU scheduler.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcConfig {
    pub mode: String,
    pub cost_budget_pct: f64,
    pub window: Dur,
    pub target_samples_per_s: u32,
    pub turn: Dur,
    pub max_wait: Dur,
    pub active_for: Dur,
    pub handover_timeout: Dur,
    /// PC-sample every GPU process the injector is in, without a session (the node's
    /// always-on profile, rolled up per minute).
    pub always_on: bool,
    /// How long the always-on profile's per-minute rollups are kept.
    pub always_on_keep: Dur,
}

impl PcConfig {
    pub(super) fn validate(&self) -> Result<()> {
        if !matches!(self.mode.as_str(), "windows" | "continuous") {
            bail!("pc.mode must be \"windows\" or \"continuous\", not {:?}", self.mode);
        }
        if !(self.cost_budget_pct > 0.0 && self.cost_budget_pct <= 10.0) {
            bail!("pc.cost_budget_pct must be above 0 and at most 10 (%), not {}", self.cost_budget_pct);
        }
        let ms = |d: &Dur| d.0.as_millis();
        if !(1..=1000).contains(&ms(&self.window)) {
            bail!("pc.window must be between 1ms and 1s, not {:?}", self.window.0);
        }
        if self.target_samples_per_s == 0 {
            bail!("pc.target_samples_per_s must be greater than 0");
        }
        if ms(&self.turn) < 100 || self.max_wait.0 < self.turn.0 {
            bail!("pc.turn must be at least 100ms and pc.max_wait at least pc.turn");
        }
        if ms(&self.active_for) < 500 {
            bail!("pc.active_for must be at least 500ms (processes report about once a second)");
        }
        if ms(&self.handover_timeout) < 100 {
            bail!("pc.handover_timeout must be at least 100ms");
        }
        if self.always_on_keep.0.as_secs() < 60 {
            bail!("pc.always_on_keep must be at least 1m (the rollups are per minute)");
        }
        Ok(())
    }
}
