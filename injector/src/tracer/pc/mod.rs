//! PC sampling through CUPTI on the daemon's lease, per device's primary context, in windows
//! under a cost budget ([`window`], [`budget`]) or continuously: enabled, read and disabled on
//! the application's threads at its kernel launches and synchronizations ([`app`]); aggregated
//! per (function, PC, stall reason) and resolved to source lines from the cubins ([`cubins`]) on
//! the background thread ([`resolve`]), which also heals a hardware buffer stuck full and stands
//! down on HARDWARE_BUSY. While any device is leased the library holds the process's one CUPTI
//! subscriber ([`hooks`]); PC sampling is refused when another CUPTI client holds it.

mod app;
mod budget;
mod context;
mod cubins;
mod launches;
mod meter;
mod resolve;
mod stalls;
mod window;

pub use app::register_hooks;
pub use stalls::{STALL_PREFIX, select_stalls};
pub use window::set_detach_mode;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gpuprof_cupti::device::Driver;
use gpuprof_cupti::pcsampling::{PcConfig, StallReasons};
use gpuprof_cupti::{Context, Cupti, LiveContext};

use super::hooks::{self, User};

use super::backend::{PcBatch, PcEvent, PcEventKind, PcOutput, PcRequest, PcRow};
use crate::log::log;
use app::{Done, Op};
use context::Agg;
use resolve::Resolver;

/// The sampling period when the lease names none: 2^15 cycles (at 2^10 and 2^13 a busy GPU
/// filled CUPTI's hardware buffer faster than CUPTI decoded it).
pub const DEFAULT_PERIOD_LOG2: u32 = 15;
/// Windows mode: the hardware buffer when the session names none (CUPTI's default is 512 MiB;
/// starting the hardware takes longer the larger it is).
const WINDOW_HW_BUFFER_MIB: usize = 16;
/// Windows mode with CUPTI finalized between windows: how long before the next window is due
/// CUPTI is attached again (collections run about once a second).
const REATTACH_AHEAD: Duration = Duration::from_millis(1100);
/// Windows mode: how often CUPTI's worker thread wakes (ms), which bounds a disable's wait.
const WINDOW_WORKER_MS: u32 = 5;
/// Time spent resolving source lines per collection at most.
const LINE_BUDGET: Duration = Duration::from_millis(100);
/// How long rows wait for their module's cubin to be found (see [`PcSampler::output`]).
const HOLD_FOR: Duration = Duration::from_secs(15);

/// The process's CUDA driver (for the devices' primary contexts).
static DRIVER: OnceLock<Driver> = OnceLock::new();

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// The device has no active primary context yet.
    NoContext,
    /// Enabling is armed for the next synchronization.
    Enabling,
    Live,
    /// Disabling is armed (a stop, a heal, a failure).
    Disabling,
    /// Stopped: sent once more, then forgotten with this event.
    Closed(PcEventKind, String),
}

struct Dev {
    req: PcRequest,
    phase: Phase,
    reasons: Option<StallReasons>,
    agg: Agg,
    totals: (u64, u64),
    since_ns: u64,
    /// Stopped while an operation was armed: closes when it completes.
    stop_after: Option<String>,
    /// Time sampled (enabled) since the last batch.
    sampled: Duration,
    /// A stop is armed (the disable waits for the application's next synchronization).
    stopping: bool,
    /// Rows have waited for their module's cubin since then.
    held_since: Option<Instant>,
}

/// The PC sampler of a [`CuptiBackend`](super::CuptiBackend).
pub struct PcSampler {
    cupti: Arc<Cupti>,
    devs: HashMap<u32, Dev>,
    crc_registered: bool,
    events: Vec<PcEvent>,
    /// Names and source lines of the rows.
    resolve: Resolver,
    /// [`hooks::finalizations`] when last subscribed.
    finalizations: u64,
}

impl PcSampler {
    pub fn new(cupti: Arc<Cupti>) -> PcSampler {
        PcSampler {
            resolve: Resolver::new(cupti.clone()),
            cupti,
            devs: HashMap::new(),
            crc_registered: false,
            events: Vec::new(),
            finalizations: 0,
        }
    }

    fn event(&mut self, device: u32, kind: PcEventKind, detail: impl Into<String>) {
        let detail = detail.into();
        log!(Info, "PC sampling on device {device}: {kind:?} {detail}");
        self.events.push(PcEvent { device, kind, detail });
    }

    /// The process's subscriber ([`super::hooks`]), and cubin capture.
    fn subscribe(&mut self) -> Result<(), String> {
        app::init(&self.cupti);
        if hooks::finalizations() != self.finalizations {
            // What was registered with CUPTI went with its finalize.
            self.finalizations = hooks::finalizations();
            self.crc_registered = false;
        }
        cubins::capture_on(&self.cupti, true);
        if !self.crc_registered {
            self.crc_registered = true;
            if let Err(e) = self.cupti.register_compute_crc(cubins::on_crc) {
                log!(Debug, "PC sampling: compute-CRC callback: {e}");
            }
        }
        hooks::acquire(&self.cupti, User::Pc)
            .map_err(|e| format!("PC sampling needs the CUPTI subscriber, which another CUPTI client holds: {e}"))?;
        window::DETACHED.store(false, std::sync::atomic::Ordering::SeqCst);
        meter::set_detached(Vec::new());
        Ok(())
    }

    /// With CUPTI finalized between windows: subscribes again when a window is due within
    /// [`REATTACH_AHEAD`] or an enable waits; forgets the detach once nothing is windowed; ends
    /// the windowed devices, saying why, if another CUPTI client took the subscriber.
    fn reattach_if_due(&mut self) {
        if !window::DETACHED.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // An enable the budget put off is no reason to attach CUPTI (and pay its per-launch cost)
        // before it may run.
        let waiting = app::pending_within(REATTACH_AHEAD);
        if !app::windowed() && !app::pending() {
            window::DETACHED.store(false, std::sync::atomic::Ordering::SeqCst);
            meter::set_detached(Vec::new());
            return;
        }
        if !waiting && !app::window_due(REATTACH_AHEAD) {
            return;
        }
        let t = Instant::now();
        match self.subscribe() {
            Ok(()) => log!(Debug, "PC sampling: CUPTI attached again for the next window ({:?})", t.elapsed()),
            Err(e) => {
                log!(Warn, "PC sampling: {e}");
                window::DETACHED.store(false, std::sync::atomic::Ordering::SeqCst);
                meter::set_detached(Vec::new());
                for (&device, d) in &mut self.devs {
                    if d.phase == Phase::Live && !d.req.continuous {
                        d.phase = Phase::Disabling;
                        // Between windows nothing is enabled: done at once, no CUDA call.
                        app::arm(Op::Disable { device, kind: PcEventKind::Failed, reason: e.clone() });
                    }
                }
            }
        }
    }

    fn release_if_idle(&mut self) {
        // A finalize asked of the application's next synchronization ends the subscriber; it
        // is not let go before (and made again at the next lease while the application runs).
        if self.devs.is_empty() && !app::pending() && !window::detach_asked() {
            cubins::capture_on(&self.cupti, false);
            cubins::forget_from_start();
            if hooks::held_by(User::Pc) {
                hooks::release(&self.cupti, User::Pc);
            }
        }
    }

    pub fn start(&mut self, req: PcRequest) -> Result<(), String> {
        if !(req.period_log2 == 0 || (5..=31).contains(&req.period_log2)) {
            return Err(format!("sampling period 2^{} is outside 2^5..2^31", req.period_log2));
        }
        if DRIVER.get().is_none()
            && let Some(d) = Driver::already_loaded()
        {
            let _ = DRIVER.set(d);
        }
        if DRIVER.get().is_none() {
            return Err("the CUDA driver is not loaded in this process".into());
        }
        if let Some(d) = self.devs.get(&req.device) {
            // The same lease again while it is being enabled or sampled: nothing to do. While
            // it is being disabled (a turn given back, then granted again before the
            // application synchronized), the new one waits for the stop: taking it for the same
            // would leave the device stopped under a lease the daemon thinks is sampling.
            let stopping =
                d.stopping || d.stop_after.is_some() || matches!(d.phase, Phase::Disabling | Phase::Closed(..));
            if d.req == req && !stopping {
                return Ok(());
            }
            return Err(super::backend::STILL_STOPPING.into());
        }
        self.subscribe()?;
        let device = req.device;
        let dev = Dev {
            req,
            phase: Phase::NoContext,
            reasons: None,
            agg: HashMap::new(),
            totals: (0, 0),
            since_ns: gpuprof_cupti::clock::realtime_ns(),
            stop_after: None,
            sampled: Duration::ZERO,
            stopping: false,
            held_since: None,
        };
        self.devs.insert(device, dev);
        self.arm_enable(device);
        self.switch_launches();
        Ok(())
    }

    /// The launch callbacks on while work may be due at launches (an enable armed, a window
    /// open or due within [`REATTACH_AHEAD`], a continuous read), off otherwise.
    fn switch_launches(&mut self) {
        if window::DETACHED.load(std::sync::atomic::Ordering::SeqCst) {
            return; // no subscriber until CUPTI is attached again
        }
        // A finalize asked of the next launch or synchronization needs the launch callbacks too.
        let want = app::launches_wanted(REATTACH_AHEAD) || window::detach_asked() || window::finalize_due();
        if !hooks::set_launches(&self.cupti, want) {
            log!(Debug, "PC sampling: launch callbacks could not be switched {}", if want { "on" } else { "off" });
        }
    }

    /// Arms enabling on the device's primary context, once it exists.
    fn arm_enable(&mut self, device: u32) {
        let Some(driver) = DRIVER.get() else { return };
        let Some(d) = self.devs.get_mut(&device) else { return };
        let Some(pctx) = driver.active_primary_context(device) else {
            d.phase = Phase::NoContext; // tried again at each collection
            return;
        };
        let period = if d.req.period_log2 == 0 { DEFAULT_PERIOD_LOG2 } else { d.req.period_log2 };
        let cfg = PcConfig {
            period_log2: period,
            stall_index: Vec::new(),
            scratch_bytes: meter::scratch_mib_or(d.req.scratch_buffer_mib) << 20,
            hw_bytes: match d.req.hw_buffer_mib {
                0 => meter::hw_mib(if d.req.continuous { 0 } else { WINDOW_HW_BUFFER_MIB }) << 20,
                m => (m as usize) << 20,
            },
            // Continuous: CUPTI's default (its worker thread wakes every 100 ms). Windows: a
            // disable waits for the worker's wake-up, so it wakes more often (a window's
            // samples not decoded by its close come with the next).
            worker_sleep_ms: meter::worker_ms(if d.req.continuous { 0 } else { WINDOW_WORKER_MS }),
            start_stop: false,
        };
        let win = (!d.req.continuous).then(|| budget::WinCfg {
            window: meter::window_len(d.req.window_ms),
            budget: f64::from(if d.req.cost_budget_ppm == 0 { 5000 } else { d.req.cost_budget_ppm }) / 1e6,
        });
        app::arm(Op::Enable { device, ctx: pctx.context(), cfg, wanted: d.req.stall_reasons.clone(), win });
        d.phase = Phase::Enabling;
    }

    /// Stops sampling on `device` at the next synchronization; reported by a later collection.
    pub fn stop(&mut self, device: u32, reason: &str) {
        let Some(d) = self.devs.get_mut(&device) else { return };
        match d.phase {
            Phase::NoContext => d.phase = Phase::Closed(PcEventKind::Stopped, reason.to_string()),
            Phase::Live => {
                d.phase = Phase::Disabling;
                d.stopping = true;
                app::arm(Op::Disable { device, kind: PcEventKind::Stopped, reason: reason.to_string() });
            }
            Phase::Enabling if app::cancel_enable(device) => {
                d.phase = Phase::Closed(PcEventKind::Stopped, reason.into())
            }
            Phase::Enabling | Phase::Disabling => d.stop_after = Some(reason.to_string()),
            Phase::Closed(..) => {}
        }
    }

    pub fn devices(&self) -> Vec<u32> {
        self.devs
            .iter()
            .filter(|(_, d)| d.stop_after.is_none() && !matches!(d.phase, Phase::Closed(..)))
            .map(|(&k, _)| k)
            .collect()
    }

    /// Waits up to `wait` for the devices enabling or disabling to get there at the
    /// application's synchronizations (a stop may need both: an enable already armed, then the
    /// disable).
    fn settle(&mut self, wait: Duration) {
        let t0 = Instant::now();
        loop {
            let moving = self.devs.values().any(|d| matches!(d.phase, Phase::Enabling | Phase::Disabling));
            if !moving || t0.elapsed() >= wait {
                return;
            }
            if app::pending() {
                std::thread::sleep(Duration::from_millis(2));
            } else {
                self.take_results();
            }
        }
    }

    /// Applies what ran at synchronizations: samples read, contexts enabled and disabled.
    fn take_results(&mut self) {
        let (done, reads, sampled) = app::take();
        for (device, t) in sampled {
            if let Some(d) = self.devs.get_mut(&device) {
                d.sampled += t;
            }
        }
        for (device, agg, totals, failure) in reads {
            let Some(d) = self.devs.get_mut(&device) else { continue };
            context::merge(&mut d.agg, &mut d.totals, agg, totals);
            if let Some((e, full)) = failure
                && d.phase == Phase::Live
            {
                d.phase = Phase::Disabling;
                let (kind, reason) = context::failure_kind(e, full);
                app::arm(Op::Disable { device, kind, reason });
            }
        }
        for r in done {
            match r {
                Done::Enabled { device, reasons, unknown } => {
                    let Some(d) = self.devs.get_mut(&device) else { continue };
                    let mut detail = format!(
                        "period 2^{}",
                        if d.req.period_log2 == 0 { DEFAULT_PERIOD_LOG2 } else { d.req.period_log2 }
                    );
                    if !unknown.is_empty() {
                        detail.push_str(&format!("; unknown stall reasons ignored: {}", unknown.join(", ")));
                    }
                    d.reasons = Some(reasons);
                    d.since_ns = gpuprof_cupti::clock::realtime_ns();
                    d.phase = Phase::Live;
                    if let Some(reason) = d.stop_after.take() {
                        // Stopped while it was being enabled: still stopping until disabled (a
                        // lease granted meanwhile waits for that, see `start`).
                        d.phase = Phase::Disabling;
                        d.stopping = true;
                        app::arm(Op::Disable { device, kind: PcEventKind::Stopped, reason });
                    }
                    self.event(device, PcEventKind::Sampling, detail);
                }
                Done::EnableFailed { device, error } => {
                    let Some(d) = self.devs.get_mut(&device) else { continue };
                    let kind = if error.is_hardware_busy() { PcEventKind::HardwareBusy } else { PcEventKind::Failed };
                    d.phase = Phase::Closed(kind, error.to_string());
                }
                Done::ContextGone { device, agg, totals } => {
                    let Some(d) = self.devs.get_mut(&device) else { continue };
                    context::merge(&mut d.agg, &mut d.totals, agg, totals);
                    log!(Info, "PC sampling on device {device}: its context was destroyed; waiting for a new one");
                    d.phase = match d.stop_after.take() {
                        Some(r) => Phase::Closed(PcEventKind::Stopped, r),
                        None => Phase::NoContext,
                    };
                }
                Done::Disabled { device, kind, reason, agg, totals } => {
                    let Some(d) = self.devs.get_mut(&device) else { continue };
                    context::merge(&mut d.agg, &mut d.totals, agg, totals);
                    if kind != PcEventKind::Healed {
                        d.phase = Phase::Closed(kind, reason);
                        continue;
                    }
                    let reopen = match d.stop_after.take() {
                        Some(r) => {
                            d.phase = Phase::Closed(PcEventKind::Stopped, r);
                            false
                        }
                        None => {
                            d.phase = Phase::NoContext;
                            true
                        }
                    };
                    self.event(device, PcEventKind::Healed, reason);
                    if reopen {
                        self.arm_enable(device);
                    }
                }
            }
        }
    }

    /// Collects every device: waits up to `wait` for armed operations (see [`Self::settle`]),
    /// takes what was read, enables devices whose context appeared, resolves lines, and hands
    /// out the batches and events.
    pub fn collect(&mut self, wait: Duration) -> PcOutput {
        meter::mark_own_thread();
        self.settle(wait);
        self.take_results();
        let keys: Vec<u32> = self.devs.keys().copied().collect();
        for dev in &keys {
            if self.devs.get(dev).is_some_and(|d| d.phase == Phase::NoContext) {
                self.arm_enable(*dev);
            }
        }
        // A window due soon, or an enable armed while CUPTI is finalized between windows,
        // needs the callbacks back.
        self.reattach_if_due();
        let out = self.output(true);
        // A window closed: CUPTI is finalized once its rows have their lines (a CUPTI call after
        // the finalize would attach CUPTI again, with its cost per launch) and no cubin is being
        // looked for; at the next launch or synchronization of any application thread.
        if window::finalize_due() && !cubins::looking() {
            window::take_finalize_due();
            window::ask_detach_any();
        }
        self.switch_launches();
        self.release_if_idle();
        out
    }

    /// At exit, after [`stop_at_exit`] ran on the exiting thread: what it read, and what was
    /// collected since the last collection. Touches neither CUDA nor the subscriber.
    pub fn collect_at_exit(&mut self) -> PcOutput {
        self.take_results();
        for d in self.devs.values_mut() {
            if !matches!(d.phase, Phase::Closed(..)) {
                d.phase = Phase::Closed(PcEventKind::Stopped, "process exit".into());
            }
        }
        // No cubin is looked for in the files of a process on its way out.
        self.output(false)
    }

    /// Hands out what the devices hold: rows with their lines, cubins, events.
    /// `late`: modules loaded before sampling are asked for and looked for.
    fn output(&mut self, late: bool) -> PcOutput {
        let keys: Vec<u32> = self.devs.keys().copied().collect();
        let (seen, kept, skipped) = cubins::stats();
        log!(
            Debug,
            "PC sampling: {} device(s); modules seen {seen}, cubins kept {kept}, left out {skipped}",
            keys.len()
        );
        let sm_of =
            |dev| DRIVER.get().and_then(|drv| drv.facts(dev).ok()).map(|f| f.compute_major * 10 + f.compute_minor);
        if late && meter::lines_on() {
            self.resolve.find_late_cubins(self.devs.iter().map(|(dev, d)| (*dev, &d.agg)), sm_of);
        }
        let now = gpuprof_cupti::clock::realtime_ns();
        let mut out = PcOutput::default();
        let deadline = Instant::now() + if meter::lines_on() { LINE_BUDGET } else { Duration::ZERO };
        let mut need_cubins: Vec<u64> = Vec::new();
        for dev in keys {
            let Some(mut d) = self.devs.remove(&dev) else { continue };
            let mut rows = Vec::with_capacity(d.agg.len());
            // Rows of a module whose cubin is still being asked for or looked for wait for it
            // (windows are seconds apart: sent without lines, a late attach's first window
            // would have none), for [`HOLD_FOR`] at most and never at a close or exit.
            let closing = !late || matches!(d.phase, Phase::Closed(..));
            let hold = !closing && d.held_since.get_or_insert_with(Instant::now).elapsed() < HOLD_FOR;
            let mut held = Agg::new();
            for ((fptr, crc, pc, stall), count) in std::mem::take(&mut d.agg) {
                if hold && crc != 0 && cubins::get(crc).is_none() && self.resolve.looking_for(crc) {
                    held.insert((fptr, crc, pc, stall), count);
                    continue;
                }
                let function = self.resolve.name(fptr);
                let stall_name = match &d.reasons {
                    Some(r) if !r.name(stall).is_empty() => self.resolve.intern(r.name(stall)),
                    _ => self.resolve.intern(&format!("stall_{stall}")),
                };
                let (file, line) = self.resolve.line(crc, fptr, pc, deadline);
                if crc != 0 && !need_cubins.contains(&crc) {
                    need_cubins.push(crc);
                }
                let module = if crc == 0 { String::new() } else { format!("{crc:016x}") };
                rows.push(PcRow { function, pc_offset: pc, stall: stall_name, count, module, file, line });
            }
            if held.is_empty() {
                d.held_since = None;
            }
            d.agg = held;
            if !rows.is_empty() || d.totals != (0, 0) {
                out.batches.push(PcBatch {
                    device: dev,
                    start_ns: d.since_ns,
                    end_ns: now,
                    rows,
                    total_samples: d.totals.0,
                    dropped_samples: d.totals.1,
                    sampled_ns: d.sampled.as_nanos() as u64,
                });
            }
            d.totals = (0, 0);
            d.sampled = Duration::ZERO;
            d.since_ns = now;
            if let Phase::Closed(kind, reason) = &d.phase {
                let (app_time, windows) = app::app_cost();
                let mut reason = if windows > 0 || !app_time.is_zero() {
                    format!(
                        "{reason}; {windows} windows, {:.1} ms in PC-sampling calls on the application's threads, \
                         {:.1} ms added to its synchronizations",
                        app_time.as_secs_f64() * 1e3,
                        app::app_cost_extra().as_secs_f64() * 1e3
                    )
                } else {
                    reason.clone()
                };
                let unresolved = cubins::unresolved();
                if unresolved > 0 {
                    reason.push_str(&format!(
                        "; {unresolved} modules without source lines (loaded from memory before sampling began)"
                    ));
                }
                self.event(dev, *kind, reason);
            } else {
                self.devs.insert(dev, d);
            }
        }
        out.cubins =
            need_cubins.iter().filter_map(|crc| cubins::get(*crc).map(|b| (format!("{crc:016x}"), b))).collect();
        out.events = std::mem::take(&mut self.events);
        out.cubin_query = self.resolve.take_query();
        out.cubins_not_found = cubins::take_not_found().into_iter().map(|crc| format!("{crc:016x}")).collect();
        out
    }

    /// gpuprofd answered a query for cubins of modules loaded before sampling.
    pub fn cubin_answer(&mut self, a: crate::tracer::CubinAnswer) {
        self.resolve.answer(a);
    }
}

/// A PC-sampling session awaits this process (the new-process hint, read inside `cuInit`):
/// PC sampling's callbacks registered, and [`cubins::capture_from_start`].
pub fn capture_from_start(cupti: &Arc<Cupti>) -> Result<(), gpuprof_cupti::CuptiError> {
    app::init(cupti);
    app::register_hooks();
    cubins::capture_from_start(cupti)
}

/// A trace stops: [`cubins::release_from_start`], unless a device is sampled or waits.
pub fn release_from_start(cupti: &Arc<Cupti>) {
    cubins::release_from_start(cupti, app::pending() || app::sampling());
}

/// Called on the exiting thread by the `atexit` handler: reads and disables every context
/// still sampled (see [`app::stop_all`]; `live` vouches for them); [`PcSampler::collect_at_exit`]
/// then sends it.
pub fn stop_at_exit(live: &dyn Fn(Context) -> Option<LiveContext<'static>>) {
    app::stop_all("process exit", live);
}

/// Per device of `devices`: whether the process has an active primary context there, and the
/// CUDA synchronizations and kernel launches counted on that context since the last call (by
/// the subscriber's callbacks, which exist while a session traces the process). When it saw
/// none, the launch callbacks are switched on for a few launches ([`meter::PROBING`]), so that a
/// process that launches without ever synchronizing is seen working at the next call.
pub fn device_activity(devices: &[u32]) -> Vec<(u32, bool, u64, u64)> {
    if DRIVER.get().is_none()
        && let Some(d) = gpuprof_cupti::device::Driver::already_loaded()
    {
        let _ = DRIVER.set(d);
    }
    let Some(driver) = DRIVER.get() else { return Vec::new() };
    let syncs = meter::SYNCS.take();
    let launches = meter::LAUNCHES_BY_CTX.take();
    let detached = meter::detached_contexts();
    let on = |of: &[(usize, u64)], ctx: usize| of.iter().filter(|(c, _)| *c == ctx).map(|(_, n)| n).sum::<u64>();
    let out: Vec<(u32, bool, u64, u64)> = devices
        .iter()
        .filter_map(|&dev| {
            let ctx = driver.active_primary_context(dev)?.context().id();
            let (n, l) = (on(&syncs, ctx), on(&launches, ctx));
            // Between windows with CUPTI finalized no call is seen: the context counts as
            // working as it did in its last window (the next window looks again).
            Some((dev, true, if n == 0 && l == 0 && detached.contains(&ctx) { 1 } else { n }, l))
        })
        .collect();
    crate::log::log!(Debug, "synchronizations by context {syncs:x?}, launches {launches:x?}; by device {out:?}");
    if syncs.is_empty() && !out.is_empty() && hooks::held() && !app::launches_wanted(Duration::ZERO) {
        meter::PROBING.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(cupti) = app::cupti() {
            hooks::set_launches(cupti, true);
        }
    }
    out
}
