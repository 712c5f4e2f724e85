//! The arbiter's driver task: turns the lease events of [`super::Arbiter`] into commands to
//! samplers and injectors, audit rows and PM-stream markers, expires leases on time, and
//! follows agent connections and sampler states.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use gpuprof_proto::agent::{self as wire, DaemonMessage, daemon_message};
use gpuprof_proto::api as pb;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use super::core::{Event, Holder, Lease, Nanos};
use super::{Arbiter, paused_marker, persist};
use crate::config::SamplerConfig;
use crate::ingest::WriterHandle;
use crate::pcsamp::PcHub;
use crate::registry::{AgentEvent, Registry};

/// Where the driver records what the GPUs' samplers report (the sampler module's `Gpus`).
pub trait SamplerStates: Sync {
    fn set_state(&self, device: u32, state: &str, detail: &str);
    fn set_connected(&self, device: u32, connected: bool);
    /// The sampler's connection closed (`reason`).
    fn set_disconnected(&self, device: u32, reason: &str);
}

/// What the driver uses: the arbiter it drives, the agents it commands, the samplers' states,
/// PC sampling's leases, the writer for audit rows, and `[sampler]`.
pub struct Driver<'a> {
    pub arbiter: &'a Arbiter,
    pub registry: &'a Registry,
    pub gpus: &'a dyn SamplerStates,
    pub pc: &'a PcHub,
    pub writer: &'a WriterHandle,
    pub sampler: &'a SamplerConfig,
}

/// What the driver last told each device's sampler.
#[derive(Default)]
struct SamplerLink {
    /// Agent connection of the device's sampler.
    conn: Option<u64>,
    /// Last command sent: Some(true) start, Some(false) stop.
    sent: Option<bool>,
    /// Interval of the last start sent.
    sent_interval: u64,
    /// Stream subscribers were told sampling is stopped.
    marked_paused: bool,
}

/// The arbiter's driver: applies events (commands to agents, audit rows, markers), expires
/// leases on time, and follows agent connections and sampler states. Runs until `shutdown`.
pub async fn run(d: Driver<'_>, mut agents: broadcast::Receiver<AgentEvent>, shutdown: CancellationToken) {
    let arb = d.arbiter;
    let Some(mut events) = arb.events_rx.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        tracing::error!("arbiter driver started twice");
        return;
    };
    // Rows are written by a persister running beside the driver, in order, so a busy writer
    // never delays a command.
    let (db_tx, db_rx) = mpsc::unbounded_channel::<(Vec<Event>, Nanos)>();
    let persister = persist_task(d.writer, db_rx);
    let driver = drive(&d, arb, &mut events, &mut agents, db_tx, &shutdown);
    tokio::join!(driver, persister);
}

async fn drive(
    d: &Driver<'_>,
    arb: &Arbiter,
    events: &mut mpsc::UnboundedReceiver<Vec<Event>>,
    agents: &mut broadcast::Receiver<AgentEvent>,
    db_tx: mpsc::UnboundedSender<(Vec<Event>, Nanos)>,
    shutdown: &CancellationToken,
) {
    let mut links: BTreeMap<u32, SamplerLink> = BTreeMap::new();
    for a in d.registry.all() {
        if a.kind == "sampler" {
            links.entry(a.sampler_device).or_default().conn = Some(a.id);
        }
    }
    sync_all(d, &mut links);
    loop {
        let sleep_for = arb
            .next_deadline()
            .map(|t| Duration::from_nanos(t.saturating_sub(arb.now())))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(batch) = events.recv() => {
                handle(d, &mut links, &batch);
                let _ = db_tx.send((batch, arb.now()));
            }
            ev = agents.recv() => match ev {
                Ok(ev) => on_agent_event(d, &mut links, ev),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "arbiter missed agent events; resynchronizing");
                    resync(d, &mut links);
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            // A sampler user came or went (its rate may change what the sampler should do).
            _ = arb.wake.notified() => sync_all(d, &mut links),
            _ = tokio::time::sleep(sleep_for) => arb.tick(),
        }
    }
    // Rows of events already applied still get written.
    while let Ok(batch) = events.try_recv() {
        let _ = db_tx.send((batch, arb.now()));
    }
    drop(db_tx);
}

async fn persist_task(writer: &WriterHandle, mut rx: mpsc::UnboundedReceiver<(Vec<Event>, Nanos)>) {
    while let Some((batch, now)) = rx.recv().await {
        match writer.call(move |c| persist::apply(c, &batch, now)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "cannot write arbiter audit rows"),
            Err(_) => {
                tracing::warn!("database writer gone; arbiter rows not written");
                return;
            }
        }
    }
}

fn resync(d: &Driver<'_>, links: &mut BTreeMap<u32, SamplerLink>) {
    for l in links.values_mut() {
        l.conn = None;
        l.sent = None;
    }
    for a in d.registry.all() {
        if a.kind == "sampler" {
            links.entry(a.sampler_device).or_default().conn = Some(a.id);
        }
    }
    sync_all(d, links);
}

fn on_agent_event(d: &Driver<'_>, links: &mut BTreeMap<u32, SamplerLink>, ev: AgentEvent) {
    match ev {
        AgentEvent::Connected(a) if a.kind == "sampler" => {
            let device = a.sampler_device;
            if !d.arbiter.lock().is_managed(device) {
                tracing::info!(device, "sampler connected for a GPU not yet managed; managing it");
                if d.sampler.always_on {
                    d.arbiter.add_device(device);
                } else {
                    d.arbiter.manage_device(device);
                }
            }
            let link = links.entry(device).or_default();
            link.conn = Some(a.id);
            // A sampler connects idle: it needs a command only to start.
            link.sent = Some(false);
            d.gpus.set_connected(device, true);
            sync(d, device, link);
        }
        AgentEvent::Connected(_) => {}
        AgentEvent::Disconnected { id, reason } => {
            for (device, link) in links.iter_mut() {
                if link.conn == Some(id) {
                    link.conn = None;
                    link.sent = None;
                    d.gpus.set_disconnected(*device, &reason);
                }
            }
            d.arbiter.with_core(|c, now| ((), c.connection_closed(id, now)));
        }
        AgentEvent::SamplerState { id, device, status, detail } => {
            let Some(link) = links.get(&device) else {
                return;
            };
            if link.conn != Some(id) {
                return;
            }
            match wire::SamplerStatus::try_from(status) {
                Ok(wire::SamplerStatus::Sampling) => {
                    d.gpus.set_state(device, "sampling", &detail);
                    d.arbiter.external_clear(device);
                }
                Ok(wire::SamplerStatus::Stopped) => d.gpus.set_state(device, "stopped", &detail),
                Ok(wire::SamplerStatus::HardwareBusy) => {
                    d.gpus.set_state(device, "hardware busy", &detail);
                    let lease = d.arbiter.sampler_lease(device);
                    if lease.is_some() {
                        d.arbiter.external_busy(device, lease);
                    }
                }
                Ok(wire::SamplerStatus::Failed) => {
                    tracing::warn!(device, detail = %detail, "PM sampler failed");
                    d.gpus.set_state(device, "failed", &detail);
                }
                _ => {}
            }
        }
        AgentEvent::TraceState { .. } => {}
    }
}

fn sync_all(d: &Driver<'_>, links: &mut BTreeMap<u32, SamplerLink>) {
    for device in d.arbiter.devices() {
        let link = links.entry(device).or_default();
        sync(d, device, link);
    }
}

/// Brings a device's sampler and stream marker in line with the arbiter's state.
fn sync(d: &Driver<'_>, device: u32, link: &mut SamplerLink) {
    let (want, free, marker) = {
        let core = d.arbiter.lock();
        let Some(s) = core.device(device) else {
            return;
        };
        (s.holder.as_ref().is_some_and(|l| l.holder == Holder::Sampler), s.holder.is_none(), paused_marker(device, s))
    };
    let why = if free {
        "no one needs CUPTI PM sampling now (it runs on demand)"
    } else {
        "performance monitor lease revoked"
    };
    let interval = sampler_interval(d, device);
    let rate_changed = want && link.sent == Some(true) && link.sent_interval != interval;
    if (link.sent != Some(want) || rate_changed)
        && let Some(conn) = link.conn
        && send_sampler(d, conn, want, interval, why)
    {
        link.sent = Some(want);
        link.sent_interval = interval;
    }
    match marker {
        Some(m) if !link.marked_paused => {
            link.marked_paused = true;
            let _ = d.arbiter.markers.send(m);
        }
        None if link.marked_paused => {
            link.marked_paused = false;
            let (holder, reason) = if want {
                ("gpuprofd sampler", "sampling resumed")
            } else {
                ("", "performance monitor free again; CUPTI PM sampling runs on demand")
            };
            let _ = d.arbiter.markers.send(pb::PmPaused {
                device,
                holder: holder.into(),
                reason: reason.into(),
                resumed: true,
            });
        }
        _ => {}
    }
}

/// The interval a device's sampler samples at: its on-demand users' fastest, else the config's.
fn sampler_interval(d: &Driver<'_>, device: u32) -> u64 {
    d.arbiter.sampler_interval(device).unwrap_or(d.sampler.interval.0.as_nanos() as u64)
}

fn send_sampler(d: &Driver<'_>, conn: u64, start: bool, interval_ns: u64, why: &str) -> bool {
    let Some(agent) = d.registry.get(conn) else {
        return false;
    };
    let cfg = &d.sampler;
    let msg = if start {
        daemon_message::Msg::StartPmSampling(wire::StartPmSampling { metrics: cfg.metrics.clone(), interval_ns })
    } else {
        daemon_message::Msg::StopPmSampling(wire::StopPmSampling { reason: why.to_string() })
    };
    let ok = agent.send(DaemonMessage { msg: Some(msg) });
    if !ok {
        tracing::warn!(conn, start, "cannot send a command to the sampler (queue full or gone)");
    }
    ok
}

fn send_pc(d: &Driver<'_>, l: &Lease, start: bool, reason: &str) {
    let Holder::PcSampling { session, proc, agent_device, period_log2, .. } = l.holder else {
        return;
    };
    let Some(agent) = d.registry.get(proc) else {
        return;
    };
    let msg = if start {
        // The session's options, as the sessions supervisor filed them with the request.
        let mut m = d.pc.start_message(l.id).unwrap_or_default();
        (m.session_id, m.device_id, m.period_log2) = (session, agent_device, period_log2);
        daemon_message::Msg::StartPcSampling(m)
    } else {
        daemon_message::Msg::StopPcSampling(wire::StopPcSampling {
            session_id: session,
            device_id: agent_device,
            reason: reason.to_string(),
        })
    };
    if !agent.send(DaemonMessage { msg: Some(msg) }) {
        tracing::warn!(proc, start, "cannot send a PC sampling command (queue full or gone)");
    }
}

/// Who holds a device, for the state of a PC-sampling lease waiting or preempted.
fn who(l: &Lease) -> String {
    match &l.holder {
        Holder::Pause { .. } => format!("pause by {}: {}", l.holder.describe(), l.reason),
        Holder::Sampler => "the gpuprofd PM sampler".into(),
        Holder::PcSampling { .. } => format!("PC sampling of {}", l.holder.describe()),
    }
}

/// The holder of `device` now, described by [`who`].
fn holder_now(d: &Driver<'_>, device: u32) -> String {
    d.arbiter.holder_of(device).map(|l| who(&l)).unwrap_or_else(|| "nobody".into())
}

/// Applies one batch of events: commands to PC-sampling holders, sampler sync, markers.
fn handle(d: &Driver<'_>, links: &mut BTreeMap<u32, SamplerLink>, batch: &[Event]) {
    let mut touched: HashMap<u32, ()> = HashMap::new();
    for e in batch {
        match e {
            Event::Granted { lease } => {
                tracing::info!(device = lease.device, lease = lease.id, holder = %lease.holder.describe(), reason = %lease.reason, "performance monitor granted");
                if matches!(lease.holder, Holder::PcSampling { .. }) {
                    d.pc.granted(lease.id);
                }
                send_pc(d, lease, true, "");
                touched.insert(lease.device, ());
            }
            Event::Revoked { lease, by, reason } => {
                tracing::info!(device = lease.device, lease = lease.id, by, reason = %reason, holder = %lease.holder.describe(), "performance monitor revoked");
                send_pc(d, lease, false, &format!("preempted: {reason}"));
                if matches!(lease.holder, Holder::PcSampling { .. }) {
                    d.pc.revoked(lease.id, &holder_now(d, lease.device));
                }
                touched.insert(lease.device, ());
            }
            Event::Released { lease, was_holder, reason, .. } => {
                if *was_holder {
                    send_pc(d, lease, false, reason);
                }
                tracing::info!(device = lease.device, lease = lease.id, holder = %lease.holder.describe(), reason = %reason, "lease released");
                touched.insert(lease.device, ());
            }
            Event::Expired { lease, was_holder } => {
                if *was_holder {
                    send_pc(d, lease, false, "lease expired");
                }
                tracing::info!(device = lease.device, lease = lease.id, holder = %lease.holder.describe(), "lease expired");
                touched.insert(lease.device, ());
            }
            Event::Retry { device, lease } => {
                match lease.holder {
                    Holder::Sampler => {
                        if let Some(conn) = links.get(device).and_then(|l| l.conn) {
                            send_sampler(d, conn, true, sampler_interval(d, *device), "");
                        }
                    }
                    Holder::PcSampling { .. } => send_pc(d, lease, true, ""),
                    Holder::Pause { .. } => {}
                }
                touched.insert(*device, ());
            }
            Event::ExternalBusy { device, attempts, retry_at, .. } => {
                if *attempts == 1 {
                    tracing::warn!(device, "an outside tool holds the performance monitor; retrying with backoff");
                }
                tracing::debug!(device, attempts, retry_at, "hardware busy");
                touched.insert(*device, ());
            }
            Event::ExternalCleared { device } => {
                touched.insert(*device, ());
            }
            Event::Queued { lease } => {
                if matches!(lease.holder, Holder::PcSampling { .. }) {
                    d.pc.queued(lease.id, &holder_now(d, lease.device));
                }
                touched.insert(lease.device, ());
            }
            Event::Extended { lease, .. } => {
                touched.insert(lease.device, ());
            }
        }
    }
    for device in touched.into_keys() {
        let link = links.entry(device).or_default();
        sync(d, device, link);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver built from its parts, no daemon: a sampler lease granted while no sampler
    /// is connected is written to the lease table.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_grant_is_written_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&db, &cfg.storage).unwrap();
        let arbiter = super::super::open(&conn, &cfg).unwrap();
        let writer = crate::ingest::TestWriter::start(conn, &cfg.ingest);
        let (registry, gpus) = (Registry::default(), crate::sampler::Gpus::from_config_in(&cfg, dir.path()));
        let pc = PcHub::new(16, crate::pcsamp::sched::SchedConfig::from_config(&cfg.pc));
        arbiter.manage_device(0);
        let shutdown = CancellationToken::new();
        let parts = Driver {
            arbiter: &arbiter,
            registry: &registry,
            gpus: &gpus,
            pc: &pc,
            writer: &writer.handle,
            sampler: &cfg.sampler,
        };
        let agents = registry.subscribe();
        let stop = shutdown.clone();
        let granted = async {
            let lease = arbiter.acquire_sampler(0, 1_000_000, Duration::from_secs(30), "test: PM sampling").unwrap();
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
            lease
        };
        let (_, lease) = tokio::join!(run(parts, agents, shutdown.clone()), granted);
        drop(lease);
        writer.stop().await;
        let c = crate::store::open_reader(&db).unwrap();
        let (leases, reason): (i64, String) = c
            .query_row("SELECT count(*), max(reason) FROM leases WHERE device = 0", [], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap();
        assert_eq!((leases, reason.as_str()), (1, "test: PM sampling"));
    }
}
