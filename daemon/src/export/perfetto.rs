//! The Perfetto trace writer (`.pftrace`): Perfetto's own protobuf format, which
//! ui.perfetto.dev and trace_processor read without converting.
//!
//! Layout: a process track per gpuprof process (its pid and executable); under it a thread
//! track per host thread (API calls, NVTX ranges), "CUDA synchronization" and "CUPTI
//! overhead" tracks, and a track per GPU whose children are the CUDA streams (kernels,
//! copies, sets, graph launches). Each record is a slice (a begin and an end event; an NVTX
//! mark is an instant) at CUPTI's own ns timestamps. Each launch or copy call starts a flow
//! per activity it launched, which ends at that activity. Every track is described once,
//! right before its first event; all packets are one sequence. Event names, categories and
//! argument names are interned (`interned_data`): given an iid in the packet of the first
//! event that uses them, referred to by it afterwards. Sessions with PC sampling add,
//! under each process, a counter track per (kernel, stall reason) of its ten hottest kernels:
//! the samples in each second (from `pc_timeline`), 0 in seconds without any.

use std::collections::HashMap;
use std::path::Path;

use gpuprof_proto::api as pb;
use gpuprof_proto::perfetto::{
    CounterDescriptor, DebugAnnotationName, EventCategory, EventName, InternedData, ProcessDescriptor,
    ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent, trace_packet, track_event,
};
use prost::Message;
use rusqlite::Connection;

use super::chrome::{Gpus, Procs, gpu_name, session_gpus, session_procs};
use super::flows::{Flows, key};
use super::out::{Out, Stop, Tx, total_rows};
use super::perfetto_wire::{self, Event, Packet, Scratch, Val};
use super::records::{EVENT_TABLES, Prelude, Rec, each_record};
use crate::fasthash::FastMap;
use crate::query::{Strings, copy_kind_name, sync_type_name};

/// The one packet sequence of the file.
const SEQUENCE: u32 = 1;
/// `SEQ_INCREMENTAL_STATE_CLEARED`, on the first packet.
const STATE_CLEARED: u32 = 1;
/// `SEQ_NEEDS_INCREMENTAL_STATE`, on packets whose event refers to interned names.
const NEEDS_STATE: u32 = 2;

/// A session as a Perfetto trace.
pub(super) fn perfetto(db: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let total = total_rows(&c, session, EVENT_TABLES)?;
    let out = Out::new(tx, total);
    let procs = session_procs(&c, session)?;
    let gpus = session_gpus(&c, session)?;
    let start = |p: Prelude| {
        Ok(Writer {
            c: &c,
            out,
            flows: p.flows,
            procs,
            gpus,
            tracks: FastMap::default(),
            strings: Strings::default(),
            first: true,
            names: FastMap::default(),
            interned: Some(fixed_names()),
            args: Vec::new(),
            flow_ids: Vec::new(),
            terminating: Vec::new(),
            scratch: Scratch::default(),
        })
    };
    let mut w = each_record(db, session, f, start, |w, rec, dur| {
        w.record(rec, dur)?;
        w.out.written += 1;
        w.out.maybe_send()
    })?;
    w.pc_counters(session)?;
    if w.first {
        // Nothing was written: a file of no packets is a valid trace to protobuf, but not to
        // ui.perfetto.dev or trace_processor, which refuse an empty file. One track named for
        // the session makes it an (empty) trace they open.
        w.packet(TracePacket {
            data: Some(trace_packet::Data::TrackDescriptor(TrackDescriptor {
                uuid: Some(EMPTY_TRACK),
                name: Some(format!("gpuprof session {session}: no records")),
                ..Default::default()
            })),
            ..Default::default()
        });
    }
    w.out.send()
}

/// The uuid of the one track of a session without records.
const EMPTY_TRACK: u64 = 1;

/// Kernels per process that get stall-reason counter tracks.
const PC_COUNTER_KERNELS: usize = 10;

/// A track of the trace, by what it shows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Track {
    Process(i64),
    Thread(i64, u32),
    Sync(i64),
    Overhead(i64),
    Gpu(i64, i64),
    Stream(i64, i64, i64),
    /// Samples of one stall reason in one kernel: (process, function, stall reason).
    PcStall(i64, i64, i64),
}

/// Event categories: interned (iid = the value) in the first packet with an event that names one.
#[derive(Clone, Copy)]
enum Cat {
    Kernel = 1,
    Memcpy,
    Memset,
    Graph,
    CudaRuntime,
    CudaDriver,
    Nvtx,
    Sync,
    Overhead,
    Nccl,
}

impl Cat {
    const ALL: [Cat; 10] = [
        Cat::Kernel,
        Cat::Memcpy,
        Cat::Memset,
        Cat::Graph,
        Cat::CudaRuntime,
        Cat::CudaDriver,
        Cat::Nvtx,
        Cat::Sync,
        Cat::Overhead,
        Cat::Nccl,
    ];

    fn name(self) -> &'static str {
        match self {
            Cat::Kernel => "kernel",
            Cat::Memcpy => "memcpy",
            Cat::Memset => "memset",
            Cat::Graph => "graph",
            Cat::CudaRuntime => "cuda_runtime",
            Cat::CudaDriver => "cuda_driver",
            Cat::Nvtx => "nvtx",
            Cat::Sync => "sync",
            Cat::Overhead => "overhead",
            Cat::Nccl => "nccl",
        }
    }
}

/// Argument names: interned (iid = the value) with the categories.
#[derive(Clone, Copy)]
enum Arg {
    Correlation = 1,
    Grid,
    Block,
    Registers,
    SharedBytes,
    Bytes,
    Direction,
    Value,
    GraphId,
    Cbid,
    Return,
    Domain,
    Stream,
    Event,
    ObjectKind,
    ObjectId,
    Seq,
    Communicator,
}

impl Arg {
    const ALL: [Arg; 18] = [
        Arg::Correlation,
        Arg::Grid,
        Arg::Block,
        Arg::Registers,
        Arg::SharedBytes,
        Arg::Bytes,
        Arg::Direction,
        Arg::Value,
        Arg::GraphId,
        Arg::Cbid,
        Arg::Return,
        Arg::Domain,
        Arg::Stream,
        Arg::Event,
        Arg::ObjectKind,
        Arg::ObjectId,
        Arg::Seq,
        Arg::Communicator,
    ];

    fn name(self) -> &'static str {
        match self {
            Arg::Correlation => "correlation",
            Arg::Grid => "grid",
            Arg::Block => "block",
            Arg::Registers => "registers",
            Arg::SharedBytes => "shared_bytes",
            Arg::Bytes => "bytes",
            Arg::Direction => "direction",
            Arg::Value => "value",
            Arg::GraphId => "graph_id",
            Arg::Cbid => "cbid",
            Arg::Return => "return",
            Arg::Domain => "domain",
            Arg::Stream => "stream",
            Arg::Event => "event",
            Arg::ObjectKind => "object_kind",
            Arg::ObjectId => "object_id",
            Arg::Seq => "seq",
            Arg::Communicator => "communicator",
        }
    }
}

/// An event's name, by what it is made from: interned the first time it is used.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Name {
    /// A stored string (kernel or NVTX range), shown demangled.
    Str(i64),
    /// An API call: (domain, cbid).
    Api(i64, i64),
    Memcpy(i64),
    Memset,
    Graph(i64),
    Sync(i64),
    Overhead(i64),
}

/// What one record becomes: its track, name and category (its arguments go to
/// `Writer::args`).
struct Slice {
    track: Track,
    name: Name,
    cat: Cat,
}

struct Writer<'a> {
    c: &'a Connection,
    out: Out<'a>,
    flows: Flows,
    procs: Procs,
    gpus: Gpus,
    /// Tracks described so far, with their uuids (1, 2, ...).
    tracks: FastMap<Track, u64>,
    strings: Strings,
    first: bool,
    /// Event names interned so far, with their iids (1, 2, ...).
    names: FastMap<Name, u64>,
    /// Interned data for the next event's packet: the categories and argument names (on the
    /// first), and the names it is the first to use.
    interned: Option<InternedData>,
    /// The current record's arguments, the flows it starts and those it ends (kept to reuse).
    args: Vec<(u64, Val)>,
    flow_ids: Vec<u64>,
    terminating: Vec<u64>,
    scratch: Scratch,
}

/// Every category and argument name, interned in the first event's packet.
fn fixed_names() -> InternedData {
    InternedData {
        event_categories: Cat::ALL
            .iter()
            .map(|&c| EventCategory { iid: Some(c as u64), name: Some(c.name().into()) })
            .collect(),
        debug_annotation_names: Arg::ALL
            .iter()
            .map(|&a| DebugAnnotationName { iid: Some(a as u64), name: Some(a.name().into()) })
            .collect(),
        event_names: Vec::new(),
    }
}

impl Writer<'_> {
    /// A record's slice (or instant), with the flows it starts or ends.
    fn record(&mut self, rec: &Rec, dur: i64) -> Result<(), Stop> {
        let v = rec.v;
        let p = rec.proc;
        let table = EVENT_TABLES[rec.table];
        let mut args = std::mem::take(&mut self.args);
        args.clear();
        let uint = |name: Arg, v: i64| (name as u64, Val::Uint(v.max(0) as u64));
        let int = |name: Arg, v: i64| (name as u64, Val::Int(v));
        let corr_arg = |corr: i64| uint(Arg::Correlation, corr);
        let (slice, instant) = match table {
            "kernel" | "memcpy" | "memset" | "graph" => {
                let (name, cat) = match table {
                    "kernel" => {
                        args.extend([
                            corr_arg(v[2]),
                            (Arg::Grid as u64, Val::Dim3(v[4])),
                            (Arg::Block as u64, Val::Dim3(v[5])),
                            uint(Arg::Registers, v[6]),
                            uint(Arg::SharedBytes, v[7]),
                        ]);
                        (Name::Str(v[3]), Cat::Kernel)
                    }
                    "memcpy" => {
                        let dir = (Arg::Direction as u64, Val::Text(copy_kind_name(v[4])));
                        args.extend([corr_arg(v[2]), uint(Arg::Bytes, v[3]), dir]);
                        (Name::Memcpy(v[4]), Cat::Memcpy)
                    }
                    "memset" => {
                        args.extend([corr_arg(v[2]), uint(Arg::Bytes, v[3]), int(Arg::Value, v[4])]);
                        (Name::Memset, Cat::Memset)
                    }
                    _ => {
                        args.extend([corr_arg(v[2]), uint(Arg::GraphId, v[3])]);
                        (Name::Graph(v[3]), Cat::Graph)
                    }
                };
                (Slice { track: Track::Stream(p, v[0], v[1]), name, cat }, false)
            }
            "api" => {
                let cat = if v[2] == 2 { Cat::CudaDriver } else { Cat::CudaRuntime };
                args.extend([corr_arg(v[1]), uint(Arg::Cbid, v[3]), int(Arg::Return, v[4])]);
                (Slice { track: Track::Thread(p, v[0] as u32), name: Name::Api(v[2], v[3]), cat }, false)
            }
            "marker" => {
                let domain = if v[2] != 0 { self.strings.get(self.c, v[2])? } else { String::new() };
                args.push((Arg::Domain as u64, Val::Text(domain)));
                (Slice { track: Track::Thread(p, v[0] as u32), name: Name::Str(v[1]), cat: Cat::Nvtx }, v[3] != 0)
            }
            "collective" => {
                args.extend([
                    uint(Arg::Seq, v[2]),
                    (Arg::Communicator as u64, Val::Text(format!("{:016x}", v[3] as u64))),
                    uint(Arg::Bytes, v[4]),
                ]);
                (Slice { track: Track::Thread(p, v[0] as u32), name: Name::Str(v[1]), cat: Cat::Nccl }, false)
            }
            "sync" => {
                args.extend([corr_arg(v[1]), int(Arg::Stream, v[0]), int(Arg::Event, v[3])]);
                (Slice { track: Track::Sync(p), name: Name::Sync(v[2]), cat: Cat::Sync }, false)
            }
            _ => {
                args.extend([int(Arg::ObjectKind, v[1]), int(Arg::ObjectId, v[2])]);
                (Slice { track: Track::Overhead(p), name: Name::Overhead(v[0]), cat: Cat::Overhead }, false)
            }
        };
        // Launch flows: from a call to each activity it launched (graph launches have none).
        let mut flow_ids = std::mem::take(&mut self.flow_ids);
        let mut terminating = std::mem::take(&mut self.terminating);
        flow_ids.clear();
        terminating.clear();
        match table {
            "kernel" | "memcpy" | "memset" if v[2] != 0 => terminating.extend(self.flows.end(key(p, v[2]))),
            "api" if v[1] != 0 => {
                if let Some((id0, n)) = self.flows.starts(key(p, v[1])) {
                    flow_ids.extend(id0..id0 + u64::from(n));
                }
            }
            _ => {}
        }
        let track_uuid = self.track(slice.track);
        let name_iid = self.intern(slice.name)?;
        let kind = if instant { track_event::Type::Instant } else { track_event::Type::SliceBegin } as i32;
        let begin = Event {
            kind,
            track_uuid,
            named: Some((slice.cat as u64, name_iid)),
            args: &args,
            flow_ids: &flow_ids,
            terminating_flow_ids: &terminating,
        };
        self.write_event(rec.start, &begin);
        if !instant {
            let end = Event {
                kind: track_event::Type::SliceEnd as i32,
                track_uuid,
                named: None,
                args: &[],
                flow_ids: &[],
                terminating_flow_ids: &[],
            };
            self.write_event(rec.start + dur, &end);
        }
        (self.args, self.flow_ids, self.terminating) = (args, flow_ids, terminating);
        Ok(())
    }

    /// A record's event as its packet (see [`Writer::event`], which this writes the same bytes
    /// as, without building the messages).
    fn write_event(&mut self, ts: i64, e: &Event<'_>) {
        let needs = e.named.is_some();
        let interned = if needs { self.interned.take() } else { None };
        let mut flags = needs.then_some(NEEDS_STATE);
        if std::mem::take(&mut self.first) {
            flags = Some(flags.unwrap_or(0) | STATE_CLEARED);
        }
        let p = Packet { timestamp: ts.max(0) as u64, sequence: SEQUENCE, interned: interned.as_ref(), flags };
        perfetto_wire::write(&mut self.out.buf, &mut self.scratch, e, &p);
    }

    /// The iid of an event name, interned in the next event's packet the first time it is used
    /// (with the categories and argument names, the very first time).
    fn intern(&mut self, name: Name) -> Result<u64, Stop> {
        if let Some(&iid) = self.names.get(&name) {
            return Ok(iid);
        }
        let text = match name {
            Name::Str(id) => self.strings.get(self.c, id)?,
            Name::Api(domain, cbid) => crate::cbid::name(domain, cbid).to_string(),
            Name::Memcpy(kind) => format!("Memcpy {}", copy_kind_name(kind)),
            Name::Memset => "Memset".into(),
            Name::Graph(id) => format!("Graph {id}"),
            Name::Sync(t) => format!("Sync {}", sync_type_name(t)),
            Name::Overhead(kind) => format!("CUPTI overhead {kind}"),
        };
        let iid = self.names.len() as u64 + 1;
        self.names.insert(name, iid);
        self.interned.get_or_insert_default().event_names.push(EventName { iid: Some(iid), name: Some(text) });
        Ok(iid)
    }

    /// An event's packet, with the interned data it is the first to use; an event that refers to
    /// interned names says so (`SEQ_NEEDS_INCREMENTAL_STATE`).
    fn event(&mut self, ts: i64, e: TrackEvent) {
        let needs = e.name_iid.is_some();
        let interned_data = if needs { self.interned.take() } else { None };
        self.packet(TracePacket {
            timestamp: Some(ts.max(0) as u64),
            interned_data,
            sequence_flags: needs.then_some(NEEDS_STATE),
            data: Some(trace_packet::Data::TrackEvent(e)),
            ..Default::default()
        });
    }

    /// The uuid of a track, described (with its parents) the first time it is used.
    fn track(&mut self, t: Track) -> u64 {
        if let Some(&u) = self.tracks.get(&t) {
            return u;
        }
        let parent = match t {
            Track::Process(_) => None,
            Track::Thread(p, _) | Track::Sync(p) | Track::Overhead(p) | Track::Gpu(p, _) | Track::PcStall(p, _, _) => {
                Some(self.track(Track::Process(p)))
            }
            Track::Stream(p, dev, _) => Some(self.track(Track::Gpu(p, dev))),
        };
        let uuid = self.tracks.len() as u64 + 1;
        self.tracks.insert(t, uuid);
        let (pid, exe) = match t {
            Track::Process(p) | Track::Thread(p, _) => {
                self.procs.get(&p).map(|(pid, exe, _)| (*pid as i32, exe.clone())).unwrap_or((0, String::new()))
            }
            _ => (0, String::new()),
        };
        let mut d = TrackDescriptor { uuid: Some(uuid), parent_uuid: parent, ..Default::default() };
        match t {
            Track::Process(p) => {
                let name = exe.rsplit('/').next().filter(|n| !n.is_empty()).map(str::to_string);
                d.process = Some(ProcessDescriptor {
                    pid: Some(pid),
                    process_name: Some(name.unwrap_or_else(|| format!("process {p}"))),
                });
            }
            // A thread track when the id can be one; a named track otherwise.
            Track::Thread(_, tid) if i32::try_from(tid).is_ok() && pid > 0 => {
                d.thread = Some(ThreadDescriptor {
                    pid: Some(pid),
                    tid: Some(tid as i32),
                    thread_name: Some(format!("thread {tid}")),
                });
            }
            Track::Thread(_, tid) => d.name = Some(format!("thread {tid}")),
            Track::Sync(_) => d.name = Some("CUDA synchronization".into()),
            Track::Overhead(_) => d.name = Some("CUPTI overhead".into()),
            Track::Gpu(p, dev) => d.name = Some(gpu_name(&self.gpus, p, dev)),
            Track::Stream(_, _, stream) => d.name = Some(format!("stream {stream}")),
            Track::PcStall(_, function, stall) => {
                let kernel = self.strings.get(self.c, function).unwrap_or_default();
                let stall = self.strings.get(self.c, stall).unwrap_or_default();
                let short: String = kernel.chars().take(60).collect();
                d.name = Some(format!("PC {short}: {}", crate::pcsamp::short_stall(&stall)));
                d.counter = Some(CounterDescriptor {});
            }
        }
        self.packet(TracePacket { data: Some(trace_packet::Data::TrackDescriptor(d)), ..Default::default() });
        uuid
    }

    /// Stall-reason counters of the session's hottest kernels, per process.
    fn pc_counters(&mut self, session: u64) -> Result<(), Stop> {
        let mut stmt = self.c.prepare(
            "SELECT proc, function, stall, t, count FROM pc_timeline WHERE session = ?1
             ORDER BY proc, function, stall, t",
        )?;
        let rows: Vec<[i64; 5]> = stmt
            .query_map([session as i64], |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?]))?
            .collect::<rusqlite::Result<_>>()?;
        let mut totals: HashMap<(i64, i64), i64> = HashMap::new();
        for r in &rows {
            *totals.entry((r[0], r[1])).or_default() += r[4];
        }
        let mut hot: Vec<((i64, i64), i64)> = totals.into_iter().collect();
        hot.sort_by(|a, b| a.0.0.cmp(&b.0.0).then(b.1.cmp(&a.1)).then(a.0.1.cmp(&b.0.1)));
        let mut kept: std::collections::HashSet<(i64, i64)> = std::collections::HashSet::new();
        let mut per_proc: HashMap<i64, usize> = HashMap::new();
        for ((p, f), _) in hot {
            let n = per_proc.entry(p).or_default();
            if *n < PC_COUNTER_KERNELS {
                *n += 1;
                kept.insert((p, f));
            }
        }
        const S: i64 = 1_000_000_000;
        for (i, r) in rows.iter().enumerate() {
            let [p, f, stall, t, count] = *r;
            if !kept.contains(&(p, f)) {
                continue;
            }
            let uuid = self.track(Track::PcStall(p, f, stall));
            let counter = |v: i64| TrackEvent {
                r#type: Some(track_event::Type::Counter as i32),
                track_uuid: Some(uuid),
                counter_value: Some(v),
                ..Default::default()
            };
            self.event(t.saturating_mul(S), counter(count));
            let next = rows.get(i + 1).filter(|n| n[..3] == r[..3]).map(|n| n[3]);
            if next != Some(t + 1) {
                self.event((t + 1).saturating_mul(S), counter(0));
            }
            self.out.maybe_send()?;
        }
        Ok(())
    }

    /// A packet as field 1 of `Trace`, on the one sequence.
    fn packet(&mut self, mut p: TracePacket) {
        p.trusted_packet_sequence_id = Some(SEQUENCE);
        if std::mem::take(&mut self.first) {
            p.sequence_flags = Some(p.sequence_flags.unwrap_or(0) | STATE_CLEARED);
        }
        self.out.buf.push(0x0a); // field 1, length-delimited
        // Encoding into a Vec cannot run out of room.
        let _ = p.encode_length_delimited(&mut self.out.buf);
    }
}
