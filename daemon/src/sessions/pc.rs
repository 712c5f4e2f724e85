//! PC sampling of a session's processes: each device a process reported in its Hello is a
//! candidate of that GPU's scheduler ([`crate::pcsamp::sched`]) when the process joins; the
//! performance-monitor lease is asked for when it is the process's turn on that GPU (it works
//! there, and it is its turn among those that do) and handed back when the turn ends, the
//! session stops, the process leaves or sampling fails; the states go to
//! [`crate::pcsamp::PcHub`] while the session is open and to `pc_sampling` rows when it ends.

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;

use super::spec::Collect;
use super::state::{Inner, State};
use super::store::Op;
use crate::Daemon;
use crate::arbiter::core::Holder;
use crate::pcsamp::Release;
use crate::registry::Agent;

/// The daemon's GPU index of a device a process reported, or why it has none.
fn gpu_of(d: &Daemon, dev: &wire::Device) -> Result<u32, String> {
    let managed = d.arbiter.devices();
    if managed.is_empty() {
        return Err("this gpuprofd manages no GPU: no NVIDIA driver found, or [sampler] disabled".into());
    }
    let found = &d.gpus.found;
    let by_id = found.iter().find(|g| {
        (!dev.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(&dev.uuid))
            || (!dev.pci_bus_id.is_empty() && g.pci_bus_id.eq_ignore_ascii_case(&dev.pci_bus_id))
    });
    let index = match by_id {
        Some(g) => g.index,
        // No driver list to match against (devices from [sampler] devices): CUDA's ordinal.
        None if found.is_empty() => dev.id,
        None => return Err(format!("{} is not a GPU this gpuprofd found", dev.uuid)),
    };
    if managed.contains(&index) {
        Ok(index)
    } else {
        Err(format!("GPU {index} is not managed by this gpuprofd (managed: {managed:?})"))
    }
}

/// Makes every device of `a`, which just joined `session`, a candidate of its GPU's scheduler.
pub(super) fn request(d: &Daemon, session: u64, collect: &Collect, a: &Agent) {
    if !collect.pc_sampling {
        return;
    }
    let pc = &d.config.pc;
    let continuous = match collect.pc_mode.as_str() {
        "" => pc.mode == "continuous",
        m => m == "continuous",
    };
    let budget_ppm = if collect.pc_cost_budget_ppm != 0 {
        collect.pc_cost_budget_ppm
    } else {
        (pc.cost_budget_pct * 10_000.0) as u32
    };
    for dev in &a.devices {
        let start = wire::StartPcSampling {
            session_id: session,
            device_id: dev.id,
            period_log2: collect.pc_sampling_period_log2,
            stall_reasons: collect.pc_stall_reasons.clone(),
            flush_interval_ms: collect.pc_flush_interval_ms,
            hw_buffer_mib: collect.pc_hw_buffer_mib,
            scratch_buffer_mib: collect.pc_scratch_buffer_mib,
            mode: if continuous { wire::PcMode::Continuous } else { wire::PcMode::Windows } as i32,
            window_ms: pc.window.0.as_millis() as u32,
            cost_budget_ppm: budget_ppm,
            target_samples_per_s: pc.target_samples_per_s,
        };
        candidate(d, a, dev, start);
    }
}

/// Makes device `dev` of `a` a candidate of its GPU's scheduler for `start`'s session.
fn candidate(d: &Daemon, a: &Agent, dev: &wire::Device, start: wire::StartPcSampling) {
    let key = (start.session_id, a.id, dev.id);
    match gpu_of(d, dev) {
        Ok(gpu) => d.pc.track(key, gpu, start),
        // Not a GPU this daemon manages: no lease, and the state says why.
        Err(why) => d.pc.request(key, start, || Err(why)),
    }
}

/// Runs the GPUs' schedulers: asks for the leases of the processes whose turn begins and
/// releases those whose turn ended. A paused GPU rotates nothing.
pub(super) fn schedule(d: &Daemon) {
    let frozen: Vec<u32> = d
        .arbiter
        .devices()
        .into_iter()
        .filter(|g| d.arbiter.holder_of(*g).is_some_and(|l| matches!(l.holder, Holder::Pause { .. })))
        .collect();
    let (grant, release_now) = d.pc.schedule(std::time::Instant::now(), &frozen);
    release(d, release_now);
    for (session, proc, device) in grant {
        let Some(a) = d.registry.get(proc) else { continue };
        let Some(dev) = a.devices.iter().find(|x| x.id == device) else { continue };
        let Some(start) = d.pc.start_of(&(session, proc, device)) else { continue };
        ask(d, &a, dev, start);
    }
}

/// When the schedulers run next at the latest.
pub(super) fn next_schedule(d: &Daemon) -> Option<std::time::Instant> {
    d.pc.next_schedule()
}

/// Asks for the lease of device `dev` of `a` for `start`'s session.
fn ask(d: &Daemon, a: &Agent, dev: &wire::Device, start: wire::StartPcSampling) {
    let session = start.session_id;
    let period_log2 = start.period_log2;
    d.pc.request((session, a.id, dev.id), start, || {
        let gpu = gpu_of(d, dev)?;
        let holder = Holder::PcSampling { session, proc: a.id, pid: a.pid, agent_device: dev.id, period_log2 };
        d.arbiter
            .request_pc_sampling(gpu, holder, format!("PC sampling for session {session}"), None)
            .map_err(|e| e.to_string())
    });
}

/// Devices a profiler outside gpuprof stopped (HARDWARE_BUSY) ask for their lease again once
/// `sampler.pc_busy_retry` has passed, while their process is still in the session.
pub(super) fn retry_busy(d: &Daemon, g: &Inner) {
    for ((session, proc, device), start) in d.pc.busy_due(d.config.sampler.pc_busy_retry.0) {
        let member =
            g.open.get(&session).is_some_and(|l| l.state == State::Active) && g.busy.get(&proc) == Some(&session);
        let Some(a) = d.registry.get(proc).filter(|_| member) else { continue };
        let Some(dev) = a.devices.iter().find(|x| x.id == device) else { continue };
        tracing::info!(session, process = proc, device, "PC sampling takes turns again after HARDWARE_BUSY");
        candidate(d, &a, dev, start);
    }
}

/// When the next device stopped by HARDWARE_BUSY asks again.
pub(super) fn next_busy_retry(d: &Daemon) -> Option<std::time::Instant> {
    d.pc.next_busy_retry(d.config.sampler.pc_busy_retry.0)
}

fn release(d: &Daemon, leases: Vec<Release>) {
    for r in leases {
        // Already gone (its connection closed first) is fine.
        let _ = d.arbiter.release(r.lease, "gpuprofd", &r.reason);
    }
}

/// The session stops: every lease goes back (StopPcSampling to the holders).
pub(super) fn stop(d: &Daemon, session: u64) {
    release(d, d.pc.stop(session, None, "stopped", true));
}

/// Process `proc` left the session, or cannot be traced in it (`why`: "stopped (...)").
pub(super) fn left(d: &Daemon, session: u64, proc: u64, why: &str) {
    release(d, d.pc.stop(session, Some(proc), why, false));
}

/// The always-on profile gives process `proc` to another session (`why`: "stopped (...)"),
/// or forgets a process that left: its leases go back, its final states are stored and the
/// hub forgets it.
pub(super) fn forget(d: &Daemon, session: u64, proc: u64, why: &str, running: bool) {
    release(d, d.pc.stop(session, Some(proc), why, running));
    for ((session, proc, device), s) in d.pc.forget(session, proc) {
        d.sessions.op(Op::PcState { session, proc, device, state: s.state, heals: s.heals });
    }
}

/// The session ended: the last leases go back and the final states are queued for storage.
pub(super) fn finish(d: &Daemon, session: u64) {
    stop(d, session);
    for ((session, proc, device), s) in d.pc.finish(session) {
        d.sessions.op(Op::PcState { session, proc, device, state: s.state, heals: s.heals });
    }
}

/// Overlays the live PC-sampling states of open sessions on their processes.
pub(super) fn overlay(d: &Daemon, s: &mut pb::Session) {
    let snap = d.pc.snapshot(s.id);
    for p in &mut s.processes {
        if let Some(devs) = snap.get(&p.process_id) {
            p.pc_sampling = devs.clone();
        }
    }
}
