//! PC sampling of a session's processes: each device a process reported in its Hello is a
//! candidate of that GPU's scheduler ([`crate::pcsamp::sched`]) when the process joins; the
//! performance-monitor lease is asked for when it is the process's turn on that GPU (it works
//! there, and it is its turn among those that do) and handed back when the turn ends, the
//! session stops, the process leaves or sampling fails; the states go to
//! [`crate::pcsamp::PcHub`] while the session is open and to `pc_sampling` rows when it ends.

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;

use std::time::Duration;

use super::Sessions;
use super::spec::Collect;
use super::state::{Inner, State};
use super::store::Op;
use crate::arbiter::Arbiter;
use crate::arbiter::core::Holder;
use crate::config::PcConfig;
use crate::pcsamp::{PcHub, Release};
use crate::registry::{Agent, Registry};
use crate::sampler::GpuInfo;

/// What the members' PC sampling uses: the `[pc]` settings, the hub of PC-sampling states and
/// schedulers, the arbiter that leases the GPUs, the GPUs the driver listed (to match a
/// process's devices), the connected agents, and the sessions whose persister stores the
/// final states.
#[derive(Clone, Copy)]
pub(crate) struct Pc<'a> {
    pub settings: &'a PcConfig,
    /// `sampler.pc_busy_retry`: how long a device stopped by HARDWARE_BUSY waits to ask again.
    pub busy_retry: Duration,
    pub hub: &'a PcHub,
    pub arbiter: &'a Arbiter,
    pub found: &'a [GpuInfo],
    pub registry: &'a Registry,
    pub sessions: &'a Sessions,
}

/// The daemon's GPU index of a device a process reported, or why it has none.
fn gpu_of(d: Pc<'_>, dev: &wire::Device) -> Result<u32, String> {
    let managed = d.arbiter.devices();
    if managed.is_empty() {
        return Err("this gpuprofd manages no GPU: no NVIDIA driver found, or [sampler] disabled".into());
    }
    let found = d.found;
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
pub(super) fn request(d: Pc<'_>, session: u64, collect: &Collect, a: &Agent) {
    if !collect.pc_sampling {
        return;
    }
    let pc = d.settings;
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
fn candidate(d: Pc<'_>, a: &Agent, dev: &wire::Device, start: wire::StartPcSampling) {
    let key = (start.session_id, a.id, dev.id);
    match gpu_of(d, dev) {
        Ok(gpu) => d.hub.track(key, gpu, start),
        // Not a GPU this daemon manages: no lease, and the state says why.
        Err(why) => d.hub.request(key, start, || Err(why)),
    }
}

/// Runs the GPUs' schedulers: asks for the leases of the processes whose turn begins and
/// releases those whose turn ended. A paused GPU rotates nothing.
pub(super) fn schedule(d: Pc<'_>) {
    let frozen: Vec<u32> = d
        .arbiter
        .devices()
        .into_iter()
        .filter(|g| d.arbiter.holder_of(*g).is_some_and(|l| matches!(l.holder, Holder::Pause { .. })))
        .collect();
    let (grant, release_now) = d.hub.schedule(std::time::Instant::now(), &frozen);
    release(d, release_now);
    for (session, proc, device) in grant {
        let Some(a) = d.registry.get(proc) else { continue };
        let Some(dev) = a.devices.iter().find(|x| x.id == device) else { continue };
        let Some(start) = d.hub.start_of(&(session, proc, device)) else { continue };
        ask(d, &a, dev, start);
    }
}

/// When the schedulers run next at the latest.
pub(super) fn next_schedule(d: Pc<'_>) -> Option<std::time::Instant> {
    d.hub.next_schedule()
}

/// Asks for the lease of device `dev` of `a` for `start`'s session.
fn ask(d: Pc<'_>, a: &Agent, dev: &wire::Device, start: wire::StartPcSampling) {
    let session = start.session_id;
    let period_log2 = start.period_log2;
    d.hub.request((session, a.id, dev.id), start, || {
        let gpu = gpu_of(d, dev)?;
        let holder = Holder::PcSampling { session, proc: a.id, pid: a.pid, agent_device: dev.id, period_log2 };
        d.arbiter
            .request_pc_sampling(gpu, holder, format!("PC sampling for session {session}"), None)
            .map_err(|e| e.to_string())
    });
}

/// Devices a profiler outside gpuprof stopped (HARDWARE_BUSY) ask for their lease again once
/// `sampler.pc_busy_retry` has passed, while their process is still in the session.
pub(super) fn retry_busy(d: Pc<'_>, g: &Inner) {
    for ((session, proc, device), start) in d.hub.busy_due(d.busy_retry) {
        let member =
            g.open.get(&session).is_some_and(|l| l.state == State::Active) && g.busy.get(&proc) == Some(&session);
        let Some(a) = d.registry.get(proc).filter(|_| member) else { continue };
        let Some(dev) = a.devices.iter().find(|x| x.id == device) else { continue };
        tracing::info!(session, process = proc, device, "PC sampling takes turns again after HARDWARE_BUSY");
        candidate(d, &a, dev, start);
    }
}

/// When the next device stopped by HARDWARE_BUSY asks again.
pub(super) fn next_busy_retry(d: Pc<'_>) -> Option<std::time::Instant> {
    d.hub.next_busy_retry(d.busy_retry)
}

fn release(d: Pc<'_>, leases: Vec<Release>) {
    for r in leases {
        // Already gone (its connection closed first) is fine.
        let _ = d.arbiter.release(r.lease, "gpuprofd", &r.reason);
    }
}

/// The session stops: every lease goes back (StopPcSampling to the holders).
pub(super) fn stop(d: Pc<'_>, session: u64) {
    release(d, d.hub.stop(session, None, "stopped", true));
}

/// Process `proc` left the session, or cannot be traced in it (`why`: "stopped (...)").
pub(super) fn left(d: Pc<'_>, session: u64, proc: u64, why: &str) {
    release(d, d.hub.stop(session, Some(proc), why, false));
}

/// The always-on profile gives process `proc` to another session (`why`: "stopped (...)"),
/// or forgets a process that left: its leases go back, its final states are stored and the
/// hub forgets it.
pub(super) fn forget(d: Pc<'_>, session: u64, proc: u64, why: &str, running: bool) {
    release(d, d.hub.stop(session, Some(proc), why, running));
    for ((session, proc, device), s) in d.hub.forget(session, proc) {
        d.sessions.op(Op::PcState { session, proc, device, state: s.state, heals: s.heals });
    }
}

/// The session ended: the last leases go back and the final states are queued for storage.
pub(super) fn finish(d: Pc<'_>, session: u64) {
    stop(d, session);
    for ((session, proc, device), s) in d.hub.finish(session) {
        d.sessions.op(Op::PcState { session, proc, device, state: s.state, heals: s.heals });
    }
}

/// Overlays the live PC-sampling states of open sessions on their processes.
pub(super) fn overlay(d: Pc<'_>, s: &mut pb::Session) {
    let snap = d.hub.snapshot(s.id);
    for p in &mut s.processes {
        if let Some(devs) = snap.get(&p.process_id) {
            p.pc_sampling = devs.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pcsamp::sched::SchedConfig;

    fn agent(id: u64, devices: Vec<wire::Device>) -> Arc<Agent> {
        Arc::new(Agent { devices, ..Agent::for_test(id, tokio::sync::mpsc::channel(8).0) })
    }

    fn states(hub: &PcHub, session: u64, proc: u64) -> Vec<String> {
        hub.snapshot(session).get(&proc).map(|v| v.iter().map(|d| d.state.clone()).collect()).unwrap_or_default()
    }

    /// Built from its parts, no daemon: a process's device on a daemon that manages no GPU
    /// gets no lease and says why (also on GetSession's overlay); one on a managed GPU waits
    /// for its turn, gets the arbiter's lease at its turn, and hands it back at the stop; a
    /// device the driver did not list is refused; a finished session is forgotten.
    #[tokio::test]
    async fn members_pc_sampling_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&dir.path().join("t.db"), &cfg.storage).unwrap();
        let arbiter = crate::arbiter::open(&conn, &cfg).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let (sessions, persister) = Sessions::new(writer.handle.clone());
        let persister = tokio::spawn(persister);
        let hub = PcHub::new(16, SchedConfig::from_config(&cfg.pc));
        let registry = Registry::default();
        let mut pc = Pc {
            settings: &cfg.pc,
            busy_retry: cfg.sampler.pc_busy_retry.0,
            hub: &hub,
            arbiter: &arbiter,
            found: &[],
            registry: &registry,
            sessions: &sessions,
        };
        let collect = Collect { pc_sampling: true, ..Default::default() };
        let dev0 = wire::Device { id: 0, ..Default::default() };

        // No GPU managed: no lease, and the state says why.
        let a = agent(1, vec![dev0.clone()]);
        registry.insert(a.clone());
        request(pc, 5, &collect, &a);
        let s = states(&hub, 5, 1);
        assert!(s.len() == 1 && s[0].contains("manages no GPU"), "{s:?}");
        let mut session = pb::Session {
            id: 5,
            processes: vec![pb::SessionProcess { process_id: 1, ..Default::default() }],
            ..Default::default()
        };
        overlay(pc, &mut session);
        assert_eq!(session.processes[0].pc_sampling.len(), 1);
        assert!(session.processes[0].pc_sampling[0].state.contains("manages no GPU"));
        finish(pc, 5);
        assert!(hub.snapshot(5).is_empty());

        // GPU 0 managed: a candidate of its scheduler until it works, then its lease is asked.
        arbiter.add_device(0);
        request(pc, 6, &collect, &a);
        assert!(states(&hub, 6, 1)[0].starts_with("not sampled"), "{:?}", states(&hub, 6, 1));
        assert!(hub.activity(1, [0], std::time::Instant::now()));
        schedule(pc);
        let held = arbiter.holder_of(0).map(|l| l.holder);
        assert!(matches!(held, Some(Holder::PcSampling { session: 6, proc: 1, .. })), "{held:?}");
        assert!(!states(&hub, 6, 1)[0].starts_with("no lease"), "{:?}", states(&hub, 6, 1));
        stop(pc, 6);
        let held = arbiter.holder_of(0).map(|l| l.holder);
        assert!(!matches!(held, Some(Holder::PcSampling { .. })), "{held:?}");
        assert_eq!(states(&hub, 6, 1), ["stopped"]);
        finish(pc, 6);

        // A driver list without the process's GPU.
        let found = [GpuInfo { index: 0, pci_bus_id: "0000:01:00.0".into(), model: "x".into(), uuid: "GPU-a".into() }];
        pc.found = &found;
        let b = agent(2, vec![wire::Device { id: 0, uuid: "GPU-b".into(), ..Default::default() }]);
        registry.insert(b.clone());
        request(pc, 7, &collect, &b);
        let s = states(&hub, 7, 2);
        assert!(s[0].contains("GPU-b is not a GPU this gpuprofd found"), "{s:?}");

        sessions.persisted().await;
        drop(sessions);
        persister.await.unwrap();
        writer.stop().await;
    }
}
