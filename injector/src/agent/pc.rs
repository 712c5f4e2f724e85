//! PC sampling on the daemon's lease: start and stop per device, the periodic collection, and
//! its batches, states and cubins as protocol messages.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;

use super::Agent;
use crate::log::log;
use crate::tracer::{Backend, PcEventKind, PcOutput, PcRequest};

/// Largest piece of a cubin per message.
pub const CUBIN_CHUNK: usize = 1 << 20;

/// The agent's PC-sampling bookkeeping.
#[derive(Default)]
pub struct PcState {
    /// Leased devices → session.
    pub leases: HashMap<u32, u64>,
    pub every: Duration,
    pub next: Option<Instant>,
    /// Cubin hashes sent on this connection (or received from gpuprofd: it has those).
    pub cubins_sent: HashSet<String>,
    /// Cubins gpuprofd is sending in answer to a query: hash → (announced size, bytes so far).
    pub incoming: HashMap<String, (u64, Vec<u8>)>,
    /// Cubins received whole, for the answer that ends the query.
    pub received: Vec<(String, Vec<u8>)>,
    /// Cubins asked of gpuprofd and not answered yet (pieces of others are left out).
    pub queried: HashSet<String>,
    /// Per device: samples, dropped, heals since the lease began.
    pub totals: HashMap<u32, (u64, u64, u32)>,
    /// Devices the backend reported sampling.
    pub sampling: HashSet<u32>,
    /// Per device: when its lease began (for [`FIRST_ROWS_FOR`]).
    pub leased_at: HashMap<u32, Instant>,
    /// Leases granted while the device's previous one was still stopping (a turn given back
    /// and granted again before the application synchronized): started once it has stopped.
    pub deferred: HashMap<u32, (pb::StartPcSampling, Instant)>,
}

impl PcState {
    /// A new connection: what was sent or half received on the last one no longer counts.
    pub fn new_connection(&mut self) {
        self.cubins_sent.clear();
        self.incoming.clear();
        self.received.clear();
        self.queried.clear();
    }
}

/// Cubin bytes accepted from gpuprofd in one answer (as gpuprofd sends at most).
const MAX_ANSWER_BYTES: usize = 128 << 20;
/// Cubins in one query (as gpuprofd accepts).
const MAX_QUERY: usize = 256;

pub use crate::tracer::STILL_STOPPING;
/// How long a deferred start waits for the last lease to stop.
const DEFER_FOR: Duration = Duration::from_secs(10);

/// How soon to collect while a lease is being enabled and right after it began.
const FIRST_COLLECT: Duration = Duration::from_millis(200);
/// For this long after a lease begins, collections come every [`FIRST_COLLECT`] until the
/// device's first samples are in: a window's samples are read at its close, and the first
/// rows should not wait a whole flush interval for the next collection.
const FIRST_ROWS_FOR: Duration = Duration::from_secs(5);

impl<B: Backend> Agent<B> {
    pub(super) fn start_pc(&mut self, p: pb::StartPcSampling) {
        log!(Info, "PC sampling lease on device {} for session {}", p.device_id, p.session_id);
        self.pc.deferred.remove(&p.device_id);
        if p.session_id != self.session || self.session == 0 {
            let detail =
                format!("PC sampling lease for session {} while tracing session {}", p.session_id, self.session);
            log!(Warn, "{detail}");
            self.send_pc_state(p.session_id, p.device_id, pb::PcSamplingStatus::Failed, detail);
            return;
        }
        let every = Duration::from_millis(
            u64::from(if p.flush_interval_ms == 0 { 1000 } else { p.flush_interval_ms }).clamp(50, 60_000),
        );
        let req = PcRequest {
            session: p.session_id,
            device: p.device_id,
            period_log2: p.period_log2,
            stall_reasons: p.stall_reasons.clone(),
            hw_buffer_mib: p.hw_buffer_mib,
            scratch_buffer_mib: p.scratch_buffer_mib,
            continuous: p.mode == pb::PcMode::Continuous as i32,
            window_ms: p.window_ms,
            cost_budget_ppm: p.cost_budget_ppm,
        };
        match self.backend.pc_start(req) {
            Ok(()) => {
                self.pc.leases.insert(p.device_id, p.session_id);
                self.pc.totals.entry(p.device_id).or_default();
                self.pc.leased_at.insert(p.device_id, Instant::now());
                self.pc.every = every;
                self.pc.next.get_or_insert_with(|| Instant::now() + every);
                // The backend reports Sampling once its context is enabled.
                self.collect_pc();
            }
            Err(detail) if detail == STILL_STOPPING => {
                log!(Info, "PC sampling on device {}: starts once its last lease has stopped", p.device_id);
                self.pc.deferred.insert(p.device_id, (p, Instant::now() + DEFER_FOR));
                self.pc.next = Some(Instant::now() + FIRST_COLLECT);
            }
            Err(detail) => {
                log!(Warn, "PC sampling on device {}: {detail}", p.device_id);
                self.send_pc_state(p.session_id, p.device_id, pb::PcSamplingStatus::Failed, detail);
            }
        }
    }

    pub(super) fn stop_pc(&mut self, device: u32, reason: &str) {
        if !self.pc.leases.contains_key(&device) {
            log!(Info, "PC sampling on device {device}: stop ({reason}) without a lease");
            return;
        }
        log!(Info, "PC sampling on device {device}: stop ({reason})");
        self.backend.pc_stop(device, reason);
        self.finish_pc();
    }

    /// Stops every lease (trace stop, exit).
    pub(super) fn stop_all_pc(&mut self, reason: &str) {
        let devs: Vec<u32> = self.pc.leases.keys().copied().collect();
        for d in &devs {
            self.backend.pc_stop(*d, reason);
        }
        if !devs.is_empty() {
            self.finish_pc();
        }
    }

    /// After stops: waits for them, sends what they left.
    fn finish_pc(&mut self) {
        let out = self.backend.pc_finish();
        self.send_pc_output(out);
        self.schedule_pc(self.pc.every);
    }

    /// The next collection, while any lease is held.
    fn schedule_pc(&mut self, after: Duration) {
        self.pc.next = (!self.pc.leases.is_empty()).then(|| Instant::now() + after);
    }

    /// Collects and sends; called at the PC flush time and at stops.
    pub(super) fn collect_pc(&mut self) {
        let out = self.backend.pc_collect();
        // Once sampling begins (or while it is being enabled) look again soon, so the first
        // samples reach the daemon well within a second of the lease.
        let soon = out.events.iter().any(|e| e.kind == PcEventKind::Sampling)
            || self.backend.pc_devices().len() > self.pc.sampling.len();
        self.send_pc_output(out);
        let soon = soon || self.awaiting_first_rows();
        self.schedule_pc(if soon { self.pc.every.min(FIRST_COLLECT) } else { self.pc.every });
        self.start_deferred();
    }

    /// Whether a device leased less than [`FIRST_ROWS_FOR`] ago has sent no samples yet.
    fn awaiting_first_rows(&self) -> bool {
        self.pc.leased_at.iter().any(|(dev, t)| {
            t.elapsed() < FIRST_ROWS_FOR && self.pc.totals.get(dev).is_some_and(|&(samples, _, _)| samples == 0)
        })
    }

    /// Starts the leases deferred behind a stop once the stop is done (or fails them after
    /// [`DEFER_FOR`]).
    fn start_deferred(&mut self) {
        let now = Instant::now();
        let devices: Vec<u32> = self.pc.deferred.keys().copied().collect();
        for dev in devices {
            let Some((p, until)) = self.pc.deferred.remove(&dev) else { continue };
            let session = p.session_id;
            if now >= until {
                self.send_pc_state(session, dev, pb::PcSamplingStatus::Failed, STILL_STOPPING.into());
                continue;
            }
            // The old lease's stop is reported first (it drops its bookkeeping), then this one
            // starts; deferred again, it keeps its first deadline.
            if !self.pc.leases.contains_key(&dev) {
                self.start_pc(p);
            } else {
                self.pc.deferred.insert(dev, (p, until));
            }
            if let Some(d) = self.pc.deferred.get_mut(&dev) {
                d.1 = until;
                self.pc.next = Some(now + FIRST_COLLECT);
            }
        }
    }

    /// At exit: sends what the exiting thread read when it disabled PC sampling.
    pub(super) fn pc_exit(&mut self) {
        if !self.pc.leases.is_empty() {
            let mut out = self.backend.pc_exit();
            // Nothing is asked for or looked for in the files of a process on its way out.
            out.cubin_query.clear();
            self.send_pc_output(out);
        }
    }

    /// A piece of a cubin gpuprofd sends in answer to a query. A piece out of order or past
    /// the size drops that cubin (it is looked for in the mapped files instead).
    pub(super) fn pc_cubin_piece(&mut self, c: pb::CubinChunk) {
        if !self.pc.queried.contains(&c.hash) {
            log!(Warn, "PC sampling: a piece of cubin {} from gpuprofd, which was not asked for, left out", c.hash);
            return;
        }
        let (size, mut data) = self.pc.incoming.remove(&c.hash).unwrap_or((c.size, Vec::new()));
        let end = c.offset.saturating_add(c.data.len() as u64);
        let held: usize = self.pc.incoming.values().map(|(_, d)| d.len()).sum::<usize>()
            + self.pc.received.iter().map(|(_, d)| d.len()).sum::<usize>();
        if c.size != size
            || c.offset != data.len() as u64
            || end > size
            || held.saturating_add(size as usize) > MAX_ANSWER_BYTES
        {
            log!(
                Warn,
                "PC sampling: a piece of cubin {} from gpuprofd out of order or over the limit, left out",
                c.hash
            );
            return;
        }
        data.extend_from_slice(&c.data);
        if end == size {
            self.pc.cubins_sent.insert(c.hash.clone());
            self.pc.received.push((c.hash, data));
        } else {
            self.pc.incoming.insert(c.hash, (size, data));
        }
    }

    /// The end of gpuprofd's answer to a query: the cubins received whole go to the backend
    /// with the rest of the answer (a cubin said sent but not received whole counts unknown).
    pub(super) fn pc_cubin_answer(&mut self, a: pb::CubinAnswer) {
        let cubins = std::mem::take(&mut self.pc.received);
        let mut unknown = a.unknown;
        unknown.extend(a.sent.into_iter().filter(|h| !cubins.iter().any(|(c, _)| c == h)));
        self.pc.incoming.clear();
        for h in cubins.iter().map(|(h, _)| h).chain(&unknown).chain(&a.nowhere) {
            self.pc.queried.remove(h);
        }
        self.backend.pc_cubin_answer(crate::tracer::CubinAnswer { cubins, nowhere: a.nowhere, unknown });
    }

    fn send_pc_output(&mut self, out: PcOutput) {
        let welcomed = self.conn.as_ref().is_some_and(|c| c.welcomed);
        if self.conn.as_ref().is_some_and(|c| c.welcomed && c.cubin_cache) {
            for q in out.cubin_query.chunks(MAX_QUERY) {
                self.pc.queried.extend(q.iter().cloned());
                self.send(Out::CubinQuery(pb::CubinQuery { hashes: q.to_vec() }));
            }
            for n in out.cubins_not_found.chunks(MAX_QUERY) {
                self.send(Out::CubinsNotFound(pb::CubinsNotFound { hashes: n.to_vec() }));
            }
        } else if !out.cubin_query.is_empty() {
            // No daemon, or one without the cache: the backend looks in the mapped files now.
            let unknown = out.cubin_query.clone();
            self.backend.pc_cubin_answer(crate::tracer::CubinAnswer { unknown, ..Default::default() });
        }
        // Cubins first, so the daemon has each before the samples that name it.
        for (hash, bytes) in &out.cubins {
            if !welcomed || self.pc.cubins_sent.contains(hash) {
                continue;
            }
            let mut ok = true;
            for (i, piece) in bytes.chunks(CUBIN_CHUNK).enumerate() {
                ok &= self.send(Out::Cubin(pb::CubinChunk {
                    hash: hash.clone(),
                    size: bytes.len() as u64,
                    offset: (i * CUBIN_CHUNK) as u64,
                    data: piece.to_vec(),
                }));
                if !ok {
                    break;
                }
            }
            if ok {
                self.pc.cubins_sent.insert(hash.clone());
            }
        }
        for b in out.batches {
            let Some(&session) = self.pc.leases.get(&b.device) else { continue };
            let t = self.pc.totals.entry(b.device).or_default();
            t.0 += b.total_samples;
            t.1 += b.dropped_samples;
            let interner = &mut self.conv.interner;
            let samples = b
                .rows
                .iter()
                .map(|r| pb::PcSample {
                    function_name_id: interner.intern(&r.function),
                    pc_offset: r.pc_offset,
                    stall_reason_id: interner.intern(&r.stall),
                    count: r.count,
                    module_id: if r.module.is_empty() { 0 } else { interner.intern(&r.module) },
                    file_id: if r.file.is_empty() { 0 } else { interner.intern(&r.file) },
                    line: r.line,
                })
                .collect();
            if !welcomed {
                continue;
            }
            if let Some(t) = self.conv.interner.take_pending() {
                self.send(Out::Strings(t));
            }
            self.send(Out::PcSamples(pb::PcSampleBatch {
                session_id: session,
                device_id: b.device,
                samples,
                start_ns: b.start_ns,
                end_ns: b.end_ns,
                total_samples: b.total_samples,
                dropped_samples: b.dropped_samples,
                sampled_ns: b.sampled_ns,
            }));
        }
        for e in out.events {
            let session = self.pc.leases.get(&e.device).copied().unwrap_or(self.session);
            let status = match e.kind {
                PcEventKind::Sampling => pb::PcSamplingStatus::Sampling,
                PcEventKind::Stopped => pb::PcSamplingStatus::Stopped,
                PcEventKind::Failed => pb::PcSamplingStatus::Failed,
                PcEventKind::HardwareBusy => pb::PcSamplingStatus::HardwareBusy,
                PcEventKind::Healed => {
                    self.pc.totals.entry(e.device).or_default().2 += 1;
                    pb::PcSamplingStatus::Healed
                }
            };
            if e.kind == PcEventKind::Sampling {
                self.pc.sampling.insert(e.device);
            }
            self.send_pc_state(session, e.device, status, e.detail);
            if matches!(e.kind, PcEventKind::Stopped | PcEventKind::Failed | PcEventKind::HardwareBusy) {
                self.pc.sampling.remove(&e.device);
                self.pc.leases.remove(&e.device);
                self.pc.totals.remove(&e.device);
                self.pc.leased_at.remove(&e.device);
            }
        }
    }

    fn send_pc_state(&mut self, session_id: u64, device_id: u32, status: pb::PcSamplingStatus, detail: String) {
        let (samples, dropped, heals) = self.pc.totals.get(&device_id).copied().unwrap_or_default();
        self.send(Out::PcSamplingState(pb::PcSamplingState {
            session_id,
            device_id,
            status: status as i32,
            detail,
            samples,
            dropped,
            heals,
        }));
    }
}
