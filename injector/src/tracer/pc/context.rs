//! PC sampling on one context: enabling and configuring it ([`enable`], with the first
//! range under start/stop control), closing a range, reading what CUPTI holds
//! ([`drain_into`]) into the aggregate ([`Agg`]), and the state a sampled context keeps
//! ([`Live`]), for the synchronizations' work (`app.rs`) and the windows (`window.rs`).
//! The calls take the synchronization's [`LiveContext`] (gpuprof-cupti's [`PcSampling`] keeps
//! the rest of what CUPTI needs).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gpuprof_cupti::pcsampling::{FunctionName, PcBuffer, PcConfig, StallReasons};

use super::budget::WinCfg;
use crate::tracer::PcEventKind;
use gpuprof_cupti::{Context, Cupti, CuptiError, LiveContext, PcSampling};

use super::meter::WINDOWS;
use super::stalls::select_stalls;

/// PCs read per `GetData` call.
const PCS_PER_READ: usize = 5000;
/// `GetData` calls per read at most.
const MAX_READS: usize = 64;

/// (function name, cubin CRC, PC offset, stall reason index) → samples.
pub type Agg = HashMap<(FunctionName, u64, u64, u32), u64>;

/// Sampling enabled on one context, with the buffer reads go into.
pub struct Enabled {
    pub(super) sampling: PcSampling,
    pub(super) read: PcBuffer,
}

/// A context being sampled.
pub(super) struct Live<W> {
    pub(super) ctx: Context,
    /// Sampling enabled since then and not yet counted in `State::sampled`.
    pub(super) on_since: Option<Instant>,
    /// None while a window is closed (windows of an enable each).
    pub(super) on: Option<Enabled>,
    /// Windows mode (None: continuous): the windows' state, with what enabling needs again.
    pub(super) win: Option<W>,
    pub(super) agg: Agg,
    pub(super) totals: (u64, u64),
    pub(super) last_read: Option<Instant>,
    pub(super) failure: Option<(CuptiError, bool)>,
}

/// Closes the context's open range, if any (start/stop control), before a read and disable.
pub(super) fn stop_range(cupti: &Cupti, on_ctx: LiveContext<'_>, on: &mut Enabled) {
    let _ = on.sampling.stop(cupti, on_ctx);
}

/// Disables sampling and adds what CUPTI still had (the buffer given at configuration) to
/// the aggregate: the PCs and samples that buffer held, or the disable's error (CUPTI may then
/// still sample the context: no `cuptiFinalize` may follow).
pub(super) fn disable_into(
    cupti: &Cupti,
    on_ctx: LiveContext<'_>,
    on: Enabled,
    agg: &mut Agg,
    totals: &mut (u64, u64),
) -> Result<(usize, u64), CuptiError> {
    match on.sampling.disable(cupti, on_ctx)? {
        Some(at_disable) => {
            absorb(&at_disable, agg, totals);
            Ok((at_disable.records().count(), at_disable.total_samples()))
        }
        None => Ok((0, 0)),
    }
}

/// Enables sampling on the synchronization's context and configures it; with start/stop
/// control ([`PcConfig::start_stop`]) it opens the first range too.
pub(super) fn enable(
    cupti: &Cupti,
    c: LiveContext<'_>,
    cfg: PcConfig,
    wanted: &[String],
) -> Result<(Enabled, StallReasons, Vec<String>), CuptiError> {
    let t0 = Instant::now();
    let mut sampling = PcSampling::enable(cupti, c)?;
    let t_enable = t0.elapsed();
    // The process's first enable carries CUPTI's one-time set-up.
    static ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !ONCE.swap(true, Ordering::Relaxed) {
        super::meter::SETUP_NS.store(t_enable.as_nanos() as u64, Ordering::Relaxed);
    }
    let reasons = match sampling.stall_reasons(cupti, c) {
        Ok(r) => r,
        Err(e) => return Err(undo(cupti, c, sampling, e)),
    };
    let (stall_index, unknown) = select_stalls(&reasons, wanted);
    let ranged = cfg.start_stop;
    let cfg = PcConfig { stall_index, ..cfg };
    let n = reasons.index.len().max(1);
    let t_reasons = t0.elapsed();
    if let Err(e) = sampling.configure(cupti, c, &cfg, PcBuffer::new(PCS_PER_READ, n)) {
        return Err(undo(cupti, c, sampling, e));
    }
    let t_configure = t0.elapsed();
    if ranged && let Err(e) = sampling.start(cupti, c) {
        return Err(undo(cupti, c, sampling, e));
    }
    if WINDOWS.load(Ordering::Relaxed) < 20 {
        crate::log::log!(
            Info,
            "PC sampling enable: cuptiPCSamplingEnable {:.2} ms, stall reasons {:.2} ms, configure {:.2} ms, \
             start {:.2} ms",
            t_enable.as_secs_f64() * 1e3,
            (t_reasons - t_enable).as_secs_f64() * 1e3,
            (t_configure - t_reasons).as_secs_f64() * 1e3,
            (t0.elapsed() - t_configure).as_secs_f64() * 1e3
        );
    }
    Ok((Enabled { sampling, read: PcBuffer::new(PCS_PER_READ, n) }, reasons, unknown))
}

/// Takes a failed enable back: disables what it enabled; the error.
fn undo(cupti: &Cupti, c: LiveContext<'_>, sampling: PcSampling, e: CuptiError) -> CuptiError {
    let _ = sampling.disable(cupti, c);
    e
}

pub(super) fn drain_into(
    cupti: &Cupti,
    ctx: LiveContext<'_>,
    on: &mut Enabled,
    agg: &mut Agg,
    totals: &mut (u64, u64),
) -> Option<(CuptiError, bool)> {
    for _ in 0..MAX_READS {
        let r = on.sampling.read(cupti, ctx, &mut on.read);
        absorb(&on.read, agg, totals);
        match r {
            Ok(()) if on.read.remaining_pcs() > 0 => continue,
            Ok(()) => return None,
            Err(e) => return Some((e, on.read.hardware_buffer_full())),
        }
    }
    None
}

pub(super) fn absorb(buf: &PcBuffer, agg: &mut Agg, totals: &mut (u64, u64)) {
    for rec in buf.records() {
        for s in rec.stalls {
            let key = (rec.function_name, rec.cubin_crc, rec.pc_offset, s.pcSamplingStallReasonIndex);
            *agg.entry(key).or_default() += u64::from(s.samples);
        }
    }
    totals.0 += buf.total_samples();
    totals.1 += buf.dropped_samples();
}

/// What a failed read means: a hardware buffer stuck full is healed (disable, enable again);
/// HARDWARE_BUSY or 999 (what `GetData` returns when an outside client took the monitor)
/// stands down; anything else fails.
pub(super) fn failure_kind(e: CuptiError, full: bool) -> (crate::tracer::PcEventKind, String) {
    if full || e.code == gpuprof_cupti::ids::CUPTI_ERROR_OUT_OF_MEMORY {
        return (crate::tracer::PcEventKind::Healed, format!("hardware buffer full ({e}); sampling restarted"));
    }
    crate::log::log!(Warn, "PC sampling stopped: {e}");
    if e.is_hardware_busy() || e.code == gpuprof_cupti::ids::CUPTI_ERROR_UNKNOWN {
        (crate::tracer::PcEventKind::HardwareBusy, e.to_string())
    } else {
        (crate::tracer::PcEventKind::Failed, e.to_string())
    }
}

/// Adds what a read or a disable returned to a device's aggregate and totals.
pub(super) fn merge(into: &mut Agg, into_totals: &mut (u64, u64), agg: Agg, totals: (u64, u64)) {
    for (k, v) in agg {
        *into.entry(k).or_default() += v;
    }
    into_totals.0 += totals.0;
    into_totals.1 += totals.1;
}

/// Operations for the next launch or synchronization on the device's context ([`super::app`]).
pub enum Op {
    Enable {
        device: u32,
        ctx: Context,
        cfg: PcConfig,
        wanted: Vec<String>,
        /// Windows mode (None: continuous).
        win: Option<WinCfg>,
    },
    /// Disable; then report `kind` (`Healed` means enable again).
    Disable { device: u32, kind: PcEventKind, reason: String },
}

/// Results of [`Op`]s for the background thread.
pub enum Done {
    Enabled {
        device: u32,
        reasons: StallReasons,
        unknown: Vec<String>,
    },
    EnableFailed {
        device: u32,
        error: CuptiError,
    },
    Disabled {
        device: u32,
        kind: PcEventKind,
        reason: String,
        agg: Agg,
        totals: (u64, u64),
    },
    /// The context was being destroyed: read, disabled, and the device waits for a new one.
    ContextGone {
        device: u32,
        agg: Agg,
        totals: (u64, u64),
    },
}
