//! [`Converter`]: decoded records into bounded batches for one connection.

use std::collections::HashMap;

use gpuprof_proto::agent as pb;
use gpuprof_proto::kinds;

use super::interner::Interner;
use super::kinds::{kind_of, kind_of_activity};
use crate::records::{self, Record};
use gpuprof_cupti::device::uuid_string;

/// Most NVTX ranges waiting for their end.
pub const MAX_OPEN_MARKERS: usize = 1 << 16;
/// Records per RecordBatch frame (well under the daemon's 4 MiB frame limit).
pub const BATCH_RECORDS: usize = 8192;

/// Reads the C string at an address found in a record (CUPTI-owned memory).
pub type StrReader<'a> = &'a dyn Fn(u64) -> Option<String>;

struct OpenMarker {
    start: u64,
    name_id: u32,
    domain_id: u32,
    thread_id: u32,
}

/// Accumulates records into batches for one connection.
#[derive(Default)]
pub struct Converter {
    pub interner: Interner,
    batch: pb::RecordBatch,
    count: usize,
    /// Full batches waiting to be sent (a large CUPTI buffer fills several).
    ready: Vec<pb::RecordBatch>,
    open_markers: HashMap<u32, OpenMarker>,
    /// The (context, stream) `place` saw last: consecutive records mostly share it.
    last_placed: Option<(u32, u32)>,
    /// Records sent per kind (index = RecordKind as i32).
    pub sent: [u64; kinds::SLOTS],
    /// Records dropped by the injector per kind (could not be queued or were incomplete).
    pub dropped: [u64; kinds::SLOTS],
    /// Device/context/stream records seen, replayed when a trace starts on a new connection.
    pub devices: HashMap<u32, pb::Device>,
    pub contexts: HashMap<u32, pb::ContextRecord>,
    pub streams: HashMap<(u32, u32), pb::StreamRecord>,
}

impl Converter {
    pub fn new() -> Converter {
        Converter::default()
    }

    /// Starts a new connection: strings must be defined again; the replay caches stay.
    pub fn reset_connection(&mut self) {
        self.interner = Interner::default();
        self.batch = pb::RecordBatch::default();
        self.count = 0;
        self.ready.clear();
        self.open_markers.clear();
    }

    pub fn set_session(&mut self, session_id: u64) {
        self.batch.session_id = session_id;
    }

    pub fn session(&self) -> u64 {
        self.batch.session_id
    }

    /// Records waiting to be sent.
    pub fn len(&self) -> usize {
        self.count + self.ready.len() * BATCH_RECORDS
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.ready.is_empty()
    }

    /// At least one full batch is waiting.
    pub fn full(&self) -> bool {
        !self.ready.is_empty() || self.count >= BATCH_RECORDS
    }

    /// Closes the current batch so no frame grows past `BATCH_RECORDS` records.
    fn seal(&mut self) {
        let session_id = self.batch.session_id;
        let batch = std::mem::replace(&mut self.batch, pb::RecordBatch { session_id, ..Default::default() });
        self.count = 0;
        self.ready.push(batch);
    }

    pub fn count_drop(&mut self, kind: pb::RecordKind, n: u64) {
        self.dropped[kind as usize] += n;
    }

    /// Counts every record of a batch that could not be sent as dropped.
    pub fn count_batch_dropped(&mut self, b: &pb::RecordBatch) {
        for (k, n) in kinds::batch_counts(b) {
            self.count_drop(k, n as u64);
        }
    }

    /// Decodes one raw record and adds it to the batch.
    pub fn push_raw(&mut self, bytes: &[u8], strings: StrReader<'_>) {
        match records::decode(bytes) {
            Ok(r) => self.push(r, strings),
            Err(records::DecodeError::Unhandled(_)) => {}
            Err(records::DecodeError::Truncated { kind, .. }) => {
                self.count_drop(kind_of_activity(kind), 1);
            }
        }
    }

    fn name(&mut self, addr: u64, strings: StrReader<'_>) -> u32 {
        if addr == 0 {
            return 0;
        }
        match strings(addr) {
            Some(s) => self.interner.intern(&s),
            None => 0,
        }
    }

    /// Adds one NCCL collective.
    pub fn push_collective(&mut self, c: crate::nccl::Collective) {
        let intern = |i: &mut Interner, s: &str| if s.is_empty() { 0 } else { i.intern(s) };
        let rec = pb::CollectiveRecord {
            start_ns: c.start_ns,
            end_ns: c.end_ns,
            gpu_start_ns: c.gpu_start_ns,
            gpu_end_ns: c.gpu_end_ns,
            name_id: intern(&mut self.interner, &c.name),
            datatype_id: intern(&mut self.interner, &c.datatype),
            algo_id: intern(&mut self.interner, &c.algo),
            proto_id: intern(&mut self.interner, &c.proto),
            seq: c.seq,
            comm_hash: c.comm_hash,
            count: c.count,
            bytes: c.bytes(),
            root: c.root,
            rank: c.rank,
            nranks: c.nranks,
            channels: c.channels,
            thread_id: c.thread_id,
        };
        self.batch.collectives.push(rec);
        self.sent[pb::RecordKind::Collective as usize] += 1;
        self.count += 1;
        if self.count >= BATCH_RECORDS {
            self.seal();
        }
    }

    /// Adds one decoded record.
    pub fn push(&mut self, r: Record, strings: StrReader<'_>) {
        let kind = kind_of(&r);
        let placement = match &r {
            Record::Kernel(k) if k.start != 0 && k.end != 0 => Some((k.device_id, k.context_id, k.stream_id)),
            Record::Memcpy(m) => Some((m.device_id, m.context_id, m.stream_id)),
            Record::Memset(m) => Some((m.device_id, m.context_id, m.stream_id)),
            _ => None,
        };
        if let Some((dev, ctx, stream)) = placement {
            self.place(dev, ctx, stream);
        }
        let b = &mut self.batch;
        match r {
            Record::Kernel(k) => {
                if k.start == 0 || k.end == 0 {
                    // Delivered by a forced flush before the kernel finished.
                    self.dropped[kind as usize] += 1;
                    return;
                }
                let name_id = self.name(k.name, strings);
                self.batch.kernels.push(pb::KernelRecord {
                    start_ns: k.start,
                    end_ns: k.end,
                    device_id: k.device_id,
                    context_id: k.context_id,
                    stream_id: k.stream_id,
                    correlation_id: k.correlation_id,
                    name_id,
                    grid_x: k.grid[0] as u32,
                    grid_y: k.grid[1] as u32,
                    grid_z: k.grid[2] as u32,
                    block_x: k.block[0] as u32,
                    block_y: k.block[1] as u32,
                    block_z: k.block[2] as u32,
                    registers_per_thread: u32::from(k.registers_per_thread),
                    static_shared_bytes: k.static_shared as u32,
                    dynamic_shared_bytes: k.dynamic_shared as u32,
                    graph_node_id: k.graph_node_id,
                    graph_id: k.graph_id,
                });
            }
            Record::Memcpy(m) => b.memcpys.push(pb::MemcpyRecord {
                start_ns: m.start,
                end_ns: m.end,
                device_id: m.device_id,
                context_id: m.context_id,
                stream_id: m.stream_id,
                correlation_id: m.correlation_id,
                bytes: m.bytes,
                copy_kind: u32::from(m.copy_kind),
                src_kind: u32::from(m.src_kind),
                dst_kind: u32::from(m.dst_kind),
                src_device_id: m.src_device_id,
                dst_device_id: m.dst_device_id,
                graph_node_id: m.graph_node_id,
                is_async: m.is_async,
            }),
            Record::Memset(m) => b.memsets.push(pb::MemsetRecord {
                start_ns: m.start,
                end_ns: m.end,
                device_id: m.device_id,
                context_id: m.context_id,
                stream_id: m.stream_id,
                correlation_id: m.correlation_id,
                bytes: m.bytes,
                value: m.value,
                memory_kind: u32::from(m.memory_kind),
                graph_node_id: m.graph_node_id,
            }),
            Record::Api(a) => b.api_calls.push(pb::ApiRecord {
                domain: if a.driver { pb::ApiDomain::Driver } else { pb::ApiDomain::Runtime } as i32,
                cbid: a.cbid,
                start_ns: a.start,
                end_ns: a.end,
                correlation_id: a.correlation_id,
                thread_id: a.thread_id,
                return_value: a.return_value,
            }),
            Record::Sync(s) => b.syncs.push(pb::SyncRecord {
                sync_type: s.sync_type,
                start_ns: s.start,
                end_ns: s.end,
                correlation_id: s.correlation_id,
                context_id: s.context_id,
                stream_id: s.stream_id,
                event_id: s.event_id,
            }),
            Record::Overhead(o) => b.overheads.push(pb::OverheadRecord {
                overhead_kind: o.overhead_kind,
                object_kind: o.object_kind,
                object_id: o.object_id,
                start_ns: o.start,
                end_ns: o.end,
            }),
            Record::Marker(m) => {
                if m.is_end() {
                    let Some(open) = self.open_markers.remove(&m.id) else { return };
                    self.batch.markers.push(pb::MarkerRecord {
                        id: u64::from(m.id),
                        start_ns: open.start,
                        end_ns: m.timestamp,
                        name_id: open.name_id,
                        domain_id: open.domain_id,
                        thread_id: open.thread_id,
                        is_mark: false,
                    });
                } else {
                    let name_id = self.name(m.name, strings);
                    let domain_id = self.name(m.domain, strings);
                    if m.is_start() {
                        if self.open_markers.len() >= MAX_OPEN_MARKERS {
                            self.dropped[kind as usize] += 1;
                            return;
                        }
                        self.open_markers.insert(
                            m.id,
                            OpenMarker { start: m.timestamp, name_id, domain_id, thread_id: m.thread_id },
                        );
                        return; // sent when it ends
                    }
                    self.batch.markers.push(pb::MarkerRecord {
                        id: u64::from(m.id),
                        start_ns: m.timestamp,
                        end_ns: m.timestamp,
                        name_id,
                        domain_id,
                        thread_id: m.thread_id,
                        is_mark: true,
                    });
                }
            }
            Record::ExternalCorrelation(e) => b.external_correlations.push(pb::ExternalCorrelationRecord {
                external_kind: e.external_kind,
                external_id: e.external_id,
                correlation_id: e.correlation_id,
            }),
            Record::Device(d) => {
                let name = if d.name != 0 { strings(d.name).unwrap_or_default() } else { String::new() };
                let dev = pb::Device {
                    id: d.id,
                    uuid: uuid_string(&d.uuid),
                    name,
                    compute_major: d.compute_major,
                    compute_minor: d.compute_minor,
                    sm_count: d.sm_count,
                    global_memory_bytes: d.global_memory,
                    pci_bus_id: self.devices.get(&d.id).map(|x| x.pci_bus_id.clone()).unwrap_or_default(),
                };
                self.devices.insert(d.id, dev.clone());
                self.batch.devices.push(dev);
            }
            Record::Context(c) => {
                let rec = pb::ContextRecord {
                    context_id: c.context_id,
                    device_id: c.device_id,
                    null_stream_id: u32::from(c.null_stream_id),
                };
                self.contexts.insert(c.context_id, rec);
                self.batch.contexts.push(rec);
            }
            Record::Stream(s) => {
                let rec = pb::StreamRecord {
                    stream_id: s.stream_id,
                    context_id: s.context_id,
                    priority: s.priority as i32,
                    flags: s.flags,
                };
                if self.streams.len() < 1 << 16 {
                    self.streams.insert((s.context_id, s.stream_id), rec);
                }
                self.batch.streams.push(rec);
            }
            Record::Graph(g) => b.graphs.push(pb::GraphRecord {
                start_ns: g.start,
                end_ns: g.end,
                device_id: g.device_id,
                context_id: g.context_id,
                stream_id: g.stream_id,
                correlation_id: g.correlation_id,
                graph_id: g.graph_id,
            }),
        }
        self.sent[kind as usize] += 1;
        self.count += 1;
        if self.count >= BATCH_RECORDS {
            self.seal();
        }
    }

    /// CUPTI reports a context or stream only when it is created: for one created before the
    /// trace started, derive the record from the first activity on it, with what cannot be
    /// known (null stream id, stream flags) as `u32::MAX`. The daemon keeps a record CUPTI
    /// reported over a derived one.
    fn place(&mut self, dev: u32, ctx: u32, stream: u32) {
        if self.last_placed == Some((ctx, stream)) {
            return;
        }
        self.last_placed = Some((ctx, stream));
        if let std::collections::hash_map::Entry::Vacant(e) = self.contexts.entry(ctx) {
            let rec = pb::ContextRecord { context_id: ctx, device_id: dev, null_stream_id: u32::MAX };
            e.insert(rec);
            self.batch.contexts.push(rec);
            self.sent[pb::RecordKind::Context as usize] += 1;
            self.count += 1;
        }
        if self.streams.len() < 1 << 16 && !self.streams.contains_key(&(ctx, stream)) {
            let rec = pb::StreamRecord { stream_id: stream, context_id: ctx, priority: 0, flags: u32::MAX };
            self.streams.insert((ctx, stream), rec);
            self.batch.streams.push(rec);
            self.sent[pb::RecordKind::Stream as usize] += 1;
            self.count += 1;
        }
    }

    /// Adds the cached device/context/stream records (late attach, new connection).
    pub fn replay_topology(&mut self) {
        let mut devs: Vec<_> = self.devices.values().cloned().collect();
        devs.sort_by_key(|d| d.id);
        self.count += devs.len() + self.contexts.len() + self.streams.len();
        self.batch.devices.extend(devs);
        self.batch.contexts.extend(self.contexts.values().copied());
        self.batch.streams.extend(self.streams.values().copied());
    }

    /// Devices learned from the driver (hello): cached so trace starts replay them.
    pub fn learn_devices(&mut self, devs: &[pb::Device]) {
        for d in devs {
            self.devices.entry(d.id).or_insert_with(|| d.clone());
        }
    }

    /// The messages to send now: new strings first, then the records that use them.
    pub fn take_messages(&mut self) -> Vec<pb::AgentMessage> {
        let mut out = Vec::with_capacity(2);
        if let Some(t) = self.interner.take_pending() {
            out.push(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Strings(t)) });
        }
        if self.count > 0 {
            self.seal();
        }
        out.extend(self.ready.drain(..).map(|b| pb::AgentMessage { msg: Some(pb::agent_message::Msg::Records(b)) }));
        out
    }

    /// Cumulative drop counters for the kinds that have any.
    pub fn drop_report(&self, cupti_dropped: u64) -> pb::DropReport {
        let counts: Vec<pb::DropCount> = (1..kinds::SLOTS)
            .filter(|&i| self.dropped[i] > 0)
            .filter_map(|i| {
                pb::RecordKind::try_from(i as i32)
                    .ok()
                    .map(|kind| pb::DropCount { kind: kind as i32, dropped: self.dropped[i] })
            })
            .collect();
        pb::DropReport { counts, cupti_dropped }
    }
}
