//! Decoded records → `gpuprof.agent.v1` messages, on the injector's background thread:
//! string interning per connection, NVTX start/end pairing, batching, per-kind counters.

use std::collections::HashMap;

use gpuprof_proto::agent as pb;

use crate::records::{self, Record};
use gpuprof_cupti::device::uuid_string;
use gpuprof_cupti::sys::cupti as sys;

/// Most distinct strings interned on one connection; past it records carry id 0 (no string)
/// rather than letting unique NVTX messages grow the table without bound.
pub const MAX_STRINGS: usize = 1 << 20;
/// Most NVTX ranges waiting for their end.
pub const MAX_OPEN_MARKERS: usize = 1 << 16;
/// Records per RecordBatch frame (well under the daemon's 4 MiB frame limit).
pub const BATCH_RECORDS: usize = 8192;

/// Per-connection string table: ids 1, 2, 3, ... in definition order.
#[derive(Default)]
pub struct Interner {
    ids: HashMap<Box<str>, u32>,
    pending: Vec<pb::InternedString>,
    overflowed: u64,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        if self.ids.len() >= MAX_STRINGS {
            self.overflowed += 1;
            return 0;
        }
        let id = self.ids.len() as u32 + 1;
        self.ids.insert(s.into(), id);
        self.pending.push(pb::InternedString { id, value: s.to_string() });
        id
    }

    /// Definitions not yet sent.
    pub fn take_pending(&mut self) -> Option<pb::StringTable> {
        if self.pending.is_empty() {
            None
        } else {
            Some(pb::StringTable { strings: std::mem::take(&mut self.pending) })
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Reads the C string at an address found in a record (CUPTI-owned memory).
pub type StrReader<'a> = &'a dyn Fn(u64) -> Option<String>;

/// Index into the per-kind counters.
pub fn kind_of(r: &Record) -> pb::RecordKind {
    match r {
        Record::Kernel(_) => pb::RecordKind::Kernel,
        Record::Memcpy(_) => pb::RecordKind::Memcpy,
        Record::Memset(_) => pb::RecordKind::Memset,
        Record::Api(_) => pb::RecordKind::Api,
        Record::Sync(_) => pb::RecordKind::Sync,
        Record::Overhead(_) => pb::RecordKind::Overhead,
        Record::Marker(_) => pb::RecordKind::Marker,
        Record::ExternalCorrelation(_) => pb::RecordKind::ExternalCorrelation,
        Record::Device(_) => pb::RecordKind::Device,
        Record::Context(_) => pb::RecordKind::Context,
        Record::Stream(_) => pb::RecordKind::Stream,
        Record::Graph(_) => pb::RecordKind::Graph,
    }
}

/// The RecordKind of a raw CUPTI activity kind (for drop counting without decoding).
pub fn kind_of_activity(kind: u32) -> pb::RecordKind {
    match kind {
        sys::CUPTI_ACTIVITY_KIND_KERNEL | sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => pb::RecordKind::Kernel,
        sys::CUPTI_ACTIVITY_KIND_MEMCPY | sys::CUPTI_ACTIVITY_KIND_MEMCPY2 => pb::RecordKind::Memcpy,
        sys::CUPTI_ACTIVITY_KIND_MEMSET => pb::RecordKind::Memset,
        sys::CUPTI_ACTIVITY_KIND_RUNTIME | sys::CUPTI_ACTIVITY_KIND_DRIVER => pb::RecordKind::Api,
        sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => pb::RecordKind::Sync,
        sys::CUPTI_ACTIVITY_KIND_OVERHEAD => pb::RecordKind::Overhead,
        sys::CUPTI_ACTIVITY_KIND_MARKER => pb::RecordKind::Marker,
        sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => pb::RecordKind::ExternalCorrelation,
        sys::CUPTI_ACTIVITY_KIND_DEVICE => pb::RecordKind::Device,
        sys::CUPTI_ACTIVITY_KIND_CONTEXT => pb::RecordKind::Context,
        sys::CUPTI_ACTIVITY_KIND_STREAM => pb::RecordKind::Stream,
        sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => pb::RecordKind::Graph,
        _ => pb::RecordKind::Unspecified,
    }
}

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
    pub sent: [u64; 16],
    /// Records dropped by the injector per kind (could not be queued or were incomplete).
    pub dropped: [u64; 16],
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
        use pb::RecordKind as K;
        for (k, n) in [
            (K::Kernel, b.kernels.len()),
            (K::Memcpy, b.memcpys.len()),
            (K::Memset, b.memsets.len()),
            (K::Api, b.api_calls.len()),
            (K::Sync, b.syncs.len()),
            (K::Overhead, b.overheads.len()),
            (K::Marker, b.markers.len()),
            (K::ExternalCorrelation, b.external_correlations.len()),
            (K::Device, b.devices.len()),
            (K::Context, b.contexts.len()),
            (K::Stream, b.streams.len()),
            (K::Graph, b.graphs.len()),
        ] {
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
        let counts: Vec<pb::DropCount> = (1..16)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::tests::{W, kernel_bytes, memcpy_bytes};
    use std::collections::HashMap;

    fn strings<'a>(map: &'a HashMap<u64, &'static str>) -> impl Fn(u64) -> Option<String> + 'a {
        move |a| map.get(&a).map(|s| s.to_string())
    }

    #[test]
    fn kernels_intern_names_once_and_strings_precede_records() {
        let names: HashMap<u64, &str> = [(0x10, "ampere_sgemm_128x64_nn"), (0x20, "elementwise_kernel")].into();
        let rd = strings(&names);
        let mut c = Converter::new();
        c.set_session(7);
        for i in 0..5 {
            c.push_raw(&kernel_bytes(i, 100 + u64::from(i), 200 + u64::from(i), 0x10), &rd);
        }
        c.push_raw(&kernel_bytes(9, 1, 2, 0x20), &rd);
        c.push_raw(&memcpy_bytes(10, 1 << 20, 1, false), &rd);
        let msgs = c.take_messages();
        assert_eq!(msgs.len(), 2);
        let Some(pb::agent_message::Msg::Strings(t)) = &msgs[0].msg else { panic!("{msgs:?}") };
        assert_eq!(
            t.strings.iter().map(|s| (s.id, s.value.as_str())).collect::<Vec<_>>(),
            vec![(1, "ampere_sgemm_128x64_nn"), (2, "elementwise_kernel")]
        );
        let Some(pb::agent_message::Msg::Records(b)) = &msgs[1].msg else { panic!() };
        assert_eq!(b.session_id, 7);
        assert_eq!(b.kernels.len(), 6);
        assert!(b.kernels[..5].iter().all(|k| k.name_id == 1));
        assert_eq!(b.kernels[5].name_id, 2);
        assert_eq!(b.memcpys[0].bytes, 1 << 20);
        // Nothing new: no string table the second time.
        c.push_raw(&kernel_bytes(11, 1, 2, 0x10), &rd);
        let msgs = c.take_messages();
        assert_eq!(msgs.len(), 1);
        assert!(matches!(msgs[0].msg, Some(pb::agent_message::Msg::Records(_))));
        assert_eq!(c.sent[pb::RecordKind::Kernel as usize], 7);
    }

    #[test]
    fn a_large_buffer_becomes_several_bounded_batches() {
        use prost::Message;
        let names: HashMap<u64, &str> = [(0x10, "k")].into();
        let rd = strings(&names);
        let mut c = Converter::new();
        c.set_session(3);
        let n = BATCH_RECORDS * 2 + 100;
        assert_eq!(n, (BATCH_RECORDS - 2) + BATCH_RECORDS + 102);
        for i in 0..n as u32 {
            c.push_raw(&kernel_bytes(i, 10, 20, 0x10), &rd);
        }
        assert!(c.full());
        assert_eq!(c.len(), n + 2, "the kernels and the derived context and stream");
        let msgs = c.take_messages();
        assert!(matches!(msgs[0].msg, Some(pb::agent_message::Msg::Strings(_))), "strings first");
        let sizes: Vec<usize> = msgs[1..]
            .iter()
            .map(|m| match &m.msg {
                Some(pb::agent_message::Msg::Records(b)) => {
                    assert_eq!(b.session_id, 3);
                    b.kernels.len()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        // The first batch also carries the context and stream derived from the first kernel.
        assert_eq!(sizes, vec![BATCH_RECORDS - 2, BATCH_RECORDS, 102]);
        let biggest = msgs.iter().map(|m| m.encoded_len()).max().unwrap();
        assert!(biggest < gpuprof_proto::frame::DEFAULT_MAX_FRAME_BYTES as usize / 2, "{biggest} bytes");
        assert!(c.is_empty() && !c.full());
    }

    #[test]
    fn contexts_and_streams_from_before_the_trace_are_derived_once() {
        let rd = |_| None;
        let mut c = Converter::new();
        c.set_session(4);
        // kernel_bytes: device 0, context 1, stream 7 (see records::tests).
        c.push_raw(&kernel_bytes(1, 10, 20, 0), &rd);
        c.push_raw(&kernel_bytes(2, 30, 40, 0), &rd);
        c.push_raw(&memcpy_bytes(3, 64, 1, false), &rd);
        let msgs = c.take_messages();
        let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!("{msgs:?}") };
        let k = &b.kernels[0];
        assert_eq!(
            b.contexts,
            vec![pb::ContextRecord { context_id: k.context_id, device_id: k.device_id, null_stream_id: u32::MAX }]
        );
        let m = &b.memcpys[0];
        let mut want =
            vec![pb::StreamRecord { stream_id: k.stream_id, context_id: k.context_id, priority: 0, flags: u32::MAX }];
        if (m.context_id, m.stream_id) != (k.context_id, k.stream_id) {
            want.push(pb::StreamRecord {
                stream_id: m.stream_id,
                context_id: m.context_id,
                priority: 0,
                flags: u32::MAX,
            });
        }
        assert_eq!(b.streams, want, "one derived stream per (context, stream)");
        // Known now: later activity derives nothing, and a reconnect replays what was learned.
        c.push_raw(&kernel_bytes(4, 50, 60, 0), &rd);
        let msgs = c.take_messages();
        let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!() };
        assert!(b.contexts.is_empty() && b.streams.is_empty());
        c.reset_connection();
        c.replay_topology();
        let msgs = c.take_messages();
        let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!() };
        assert_eq!((b.contexts.len(), b.streams.len()), (1, want.len()));
    }

    #[test]
    fn incomplete_kernels_are_counted_not_sent() {
        let rd = |_| None;
        let mut c = Converter::new();
        c.push_raw(&kernel_bytes(1, 0, 0, 0), &rd);
        assert!(c.is_empty());
        let r = c.drop_report(3);
        assert_eq!(r.counts, vec![pb::DropCount { kind: pb::RecordKind::Kernel as i32, dropped: 1 }]);
        assert_eq!(r.cupti_dropped, 3);
    }

    #[test]
    fn nvtx_ranges_are_paired_and_marks_pass_through() {
        let names: HashMap<u64, &str> = [(0x1, "forward"), (0x2, "step"), (0x3, "my.domain")].into();
        let rd = strings(&names);
        let marker = |flags: u32, ts: u64, id: u32, name: u64, domain: u64| {
            let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_MARKER, 56);
            w.u32(4, flags).u64(8, ts).u32(16, id).u32(20, sys::CUPTI_ACTIVITY_OBJECT_THREAD).u32(24, 1).u32(28, 42);
            w.u64(40, name).u64(48, domain);
            w.0
        };
        let mut c = Converter::new();
        c.push_raw(&marker(sys::CUPTI_ACTIVITY_FLAG_MARKER_START, 100, 5, 0x1, 0x3), &rd);
        c.push_raw(&marker(sys::CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 150, 6, 0x2, 0), &rd);
        c.push_raw(&marker(sys::CUPTI_ACTIVITY_FLAG_MARKER_END, 300, 5, 0, 0), &rd);
        c.push_raw(&marker(sys::CUPTI_ACTIVITY_FLAG_MARKER_END, 301, 99, 0, 0), &rd); // unknown id
        let msgs = c.take_messages();
        let Some(pb::agent_message::Msg::Records(b)) = &msgs[1].msg else { panic!() };
        assert_eq!(b.markers.len(), 2);
        assert!(b.markers[0].is_mark && b.markers[0].start_ns == 150);
        let r = &b.markers[1];
        assert_eq!((r.start_ns, r.end_ns, r.thread_id, r.is_mark), (100, 300, 42, false));
        assert_eq!((r.name_id, r.domain_id), (1, 2));
    }

    #[test]
    fn topology_is_cached_and_replayed() {
        let rd = |_| Some("NVIDIA H100 80GB HBM3".to_string());
        let mut c = Converter::new();
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_CONTEXT, 32);
        w.u32(4, 1).u32(8, 0).u16(12, 1).u16(14, 7);
        c.push_raw(&w.0, &rd);
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_DEVICE, 184);
        w.u64(16, 80 << 30).u32(44, 132).u32(104, 9).u32(112, 0).u64(136, 0x99);
        for i in 0..16 {
            w.u8(120 + i, 0xab);
        }
        c.push_raw(&w.0, &rd);
        let _ = c.take_messages();
        c.reset_connection();
        c.replay_topology();
        let msgs = c.take_messages();
        let Some(pb::agent_message::Msg::Records(b)) = &msgs[0].msg else { panic!("{msgs:?}") };
        assert_eq!(b.contexts, vec![pb::ContextRecord { context_id: 1, device_id: 0, null_stream_id: 7 }]);
        assert_eq!(b.devices[0].uuid, "GPU-abababab-abab-abab-abab-abababababab");
        assert_eq!(b.devices[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(b.devices[0].sm_count, 132);
    }

    #[test]
    fn interner_caps() {
        let mut i = Interner::default();
        assert_eq!(i.intern("a"), 1);
        assert_eq!(i.intern("b"), 2);
        assert_eq!(i.intern("a"), 1);
        assert_eq!(i.take_pending().unwrap().strings.len(), 2);
        assert!(i.take_pending().is_none());
    }
}
