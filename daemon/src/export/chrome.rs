//! The Chrome trace JSON writer: the header, one event per record in (process, start) order
//! (with the ends of launch arrows), then the names of the trace's processes and threads.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use gpuprof_proto::api as pb;
use rusqlite::Connection;

use super::flows::{Flows, key};
use super::json::{Buf, json_str, us};
use super::out::{Out, Stop, Tx, total_rows};
use super::records::{EVENT_TABLES, Prelude, Rec, each_record};
use crate::fasthash::FastMap;
use crate::query::{Strings, copy_kind_name, sync_type_name};

/// Synthetic thread ids of per-process host tracks.
const SYNC_TID: u64 = 4_294_967_294;
const OVERHEAD_TID: u64 = 4_294_967_293;

/// Processes of the session: daemon id → (pid, exe, base_ns).
pub(super) type Procs = BTreeMap<i64, (i64, String, i64)>;

/// Chrome trace JSON, gzipped at the level given.
pub(super) fn chrome(db: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx, gzip: Option<u32>) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let total = total_rows(&c, session, EVENT_TABLES)?;
    let out = match gzip {
        Some(level) => Out::gzipped(tx, total, level)?,
        None => Out::new(tx, total),
    };
    let procs = session_procs(&c, session)?;
    let start = |p: Prelude| {
        // Times are relative to the earliest record (0 when there is none).
        let t0 = if p.first == i64::MAX { 0 } else { p.first };
        let mut trace = Trace::new(&c, out, p.flows, t0);
        trace.header(session);
        Ok(trace)
    };
    let mut trace = each_record(db, session, f, start, |t, rec, dur| t.record(rec, dur))?;
    trace.track_names(&procs, &session_gpus(&c, session)?);
    trace.finish()
}

/// The processes that joined the session or have records in it. A rank of a distributed job
/// is named by its rank first ("rank 3 · python3"), as the exports' process names show it.
pub(super) fn session_procs(c: &Connection, session: u64) -> rusqlite::Result<Procs> {
    let mut procs = Procs::new();
    let mut st = c.prepare(
        "SELECT p.id, p.pid, p.exe, p.base_ns, p.job_rank FROM processes p
         WHERE p.id IN (SELECT proc FROM session_processes WHERE session = ?1
                        UNION SELECT proc FROM session_rows WHERE session = ?1)",
    )?;
    let mut rows = st.query([session as i64])?;
    while let Some(r) = rows.next()? {
        let exe: String = r.get(2)?;
        let name = match r.get::<_, Option<i64>>(4)? {
            Some(rank) => format!("rank {rank} · {}", exe.rsplit('/').next().unwrap_or(&exe)),
            None => exe,
        };
        procs.insert(r.get(0)?, (r.get(1)?, name, r.get(3)?));
    }
    Ok(procs)
}

/// Each (process, device ordinal) of the session's processes → the GPU's name and UUID.
pub(super) type Gpus = BTreeMap<(i64, i64), (String, String)>;

pub(super) fn session_gpus(c: &Connection, session: u64) -> rusqlite::Result<Gpus> {
    let mut st = c.prepare(
        "SELECT pd.proc, pd.device_id, d.name, d.uuid FROM process_devices pd JOIN devices d ON d.id = pd.device
         WHERE pd.proc IN (SELECT proc FROM session_processes WHERE session = ?1
                           UNION SELECT proc FROM session_rows WHERE session = ?1)",
    )?;
    let mut gpus = Gpus::new();
    let mut rows = st.query([session as i64])?;
    while let Some(r) = rows.next()? {
        gpus.insert((r.get(0)?, r.get(1)?), (r.get(2)?, r.get(3)?));
    }
    Ok(gpus)
}

/// A GPU track's name: the process's device ordinal, with the GPU's model and UUID when known.
pub(super) fn gpu_name(gpus: &Gpus, proc: i64, dev: i64) -> String {
    match gpus.get(&(proc, dev)) {
        Some((name, uuid)) => format!("GPU {dev} · {name} ({uuid})"),
        None => format!("GPU {dev}"),
    }
}

/// The trace process of a gpuprof process's host threads.
fn host_pid(proc: i64) -> i64 {
    proc * 1000
}

/// The trace process of a gpuprof process's work on one GPU (its threads are the streams).
fn gpu_pid(proc: i64, dev: i64) -> i64 {
    proc * 1000 + 1 + dev.clamp(0, 998)
}

/// A process's label: the executable's file name and the pid.
fn label(procs: &Procs, proc: i64) -> String {
    match procs.get(&proc) {
        Some((pid, exe, _)) => format!("{} (pid {pid})", exe.rsplit('/').next().unwrap_or(exe)),
        None => format!("process {proc}"),
    }
}

/// Where and when an event goes: trace process, thread, and time in ns after t0.
#[derive(Clone, Copy)]
struct Place {
    pid: i64,
    tid: u64,
    ts: i64,
}

/// A trace being written, with what its closing metadata needs.
struct Trace<'a> {
    c: &'a Connection,
    out: Out<'a>,
    flows: Flows,
    /// Event times are relative to this (ns since the epoch).
    t0: i64,
    /// Nothing written yet after the header (no separator before the next event).
    first: bool,
    strings: Strings,
    /// String id → JSON string literal.
    names: FastMap<i64, String>,
    /// Names made from record fields (API function, copy direction, ...) → JSON string literal.
    labels: FastMap<(u8, i64, i64), String>,
    /// (process, thread) of every host track used.
    host_threads: BTreeSet<(i64, u64)>,
    /// (process, GPU, stream) of every device track used.
    streams: BTreeSet<(i64, i64, i64)>,
}

impl<'a> Trace<'a> {
    fn new(c: &'a Connection, out: Out<'a>, flows: Flows, t0: i64) -> Trace<'a> {
        Trace {
            c,
            out,
            flows,
            t0,
            first: true,
            strings: Strings::default(),
            names: FastMap::default(),
            labels: FastMap::default(),
            host_threads: BTreeSet::new(),
            streams: BTreeSet::new(),
        }
    }

    /// Everything before the first event: the session and t0.
    fn header(&mut self, session: u64) {
        let t0 = self.t0;
        self.out.buf.extend_from_slice(b"{\"displayTimeUnit\":\"ns\",\"otherData\":{\"gpuprof_session\":");
        let _ = write!(Buf(&mut self.out.buf), "{session},\"t0_ns\":{t0}");
        self.out.buf.extend_from_slice(b"},\"traceEvents\":[\n");
    }

    /// One record as its event(s); sends the output on once a chunk is full.
    fn record(&mut self, rec: &Rec, dur: i64) -> Result<(), Stop> {
        match EVENT_TABLES[rec.table] {
            table @ ("kernel" | "memcpy" | "memset" | "graph") => self.device_activity(table, rec, dur)?,
            "api" => self.api_call(rec, dur),
            "marker" => self.marker(rec, dur)?,
            "sync" => self.sync(rec, dur),
            "collective" => self.collective(rec, dur)?,
            _ => self.overhead(rec, dur),
        }
        self.out.written += 1;
        self.out.maybe_send()
    }

    /// The closing bracket, and everything still buffered sent.
    fn finish(mut self) -> Result<(), Stop> {
        self.out.buf.extend_from_slice(b"\n]}\n");
        self.out.finish()
    }

    // ------------------------------------------------------------ events of each record kind
    //
    // Events are written straight into the output buffer (names rendered as JSON literals once
    // per distinct name, integers with `itoa`): an export writes one per record.

    /// A kernel, copy, set or graph launch on its stream's track, with the end of the launch
    /// arrow from its API call (not for graph launches).
    fn device_activity(&mut self, table: &str, rec: &Rec, dur: i64) -> rusqlite::Result<()> {
        let v = &rec.v;
        let (dev, stream, corr) = (v[0], v[1], v[2]);
        self.streams.insert((rec.proc, dev, stream));
        let at = self.place(rec, gpu_pid(rec.proc, dev), stream as u64);
        let name = match table {
            "kernel" => {
                self.cache_name(v[3])?;
                &self.names[&v[3]]
            }
            "memcpy" => {
                self.labels.entry((0, v[4], 0)).or_insert_with(|| json_str(&format!("Memcpy {}", copy_kind_name(v[4]))))
            }
            "memset" => self.labels.entry((1, 0, 0)).or_insert_with(|| "\"Memset\"".to_string()),
            _ => self.labels.entry((2, v[3], 0)).or_insert_with(|| json_str(&format!("Graph {}", v[3]))),
        };
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "X", name, table, at, Some(dur));
        w.s(",\"args\":{\"correlation\":").i(corr);
        match table {
            "kernel" => {
                // Grid and block are stored as x * 10^6 + y * 10^3 + z.
                w.s(",\"grid\":[").i(v[4] / 1_000_000).s(",").i(v[4] / 1000 % 1000).s(",").i(v[4] % 1000);
                w.s("],\"block\":[").i(v[5] / 1_000_000).s(",").i(v[5] / 1000 % 1000).s(",").i(v[5] % 1000);
                w.s("],\"registers\":").i(v[6]).s(",\"shared_bytes\":").i(v[7]);
            }
            "memcpy" => {
                w.s(",\"bytes\":").i(v[3]).s(",\"direction\":\"").s(&copy_kind_name(v[4]));
                w.s("\",\"src_device\":").i(v[5]).s(",\"dst_device\":").i(v[6]);
            }
            "memset" => {
                w.s(",\"bytes\":").i(v[3]).s(",\"value\":").i(v[4]);
            }
            _ => {
                w.s(",\"graph_id\":").i(v[3]);
            }
        }
        w.s("}}");
        if table != "graph"
            && corr != 0
            && let Some(id) = self.flows.end(key(rec.proc, corr))
        {
            self.flow_end(at, id);
        }
        Ok(())
    }

    /// A CUDA runtime or driver call on its host thread, with the starts of the launch arrows
    /// to the activities it launched.
    fn api_call(&mut self, rec: &Rec, dur: i64) {
        let v = &rec.v;
        let (tid, corr, domain, cbid) = (v[0] as u64, v[1], v[2], v[3]);
        self.host_threads.insert((rec.proc, tid));
        let cat = if domain == 2 { "cuda_driver" } else { "cuda_runtime" };
        let at = self.place(rec, host_pid(rec.proc), tid);
        let name = self.labels.entry((3, domain, cbid)).or_insert_with(|| json_str(&crate::cbid::name(domain, cbid)));
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "X", name, cat, at, Some(dur));
        w.s(",\"args\":{\"correlation\":").i(corr).s(",\"cbid\":").i(cbid).s(",\"return\":").i(v[4]).s("}}");
        if corr != 0
            && let Some((id0, n)) = self.flows.starts(key(rec.proc, corr))
        {
            self.flow_starts(at, id0, n);
        }
    }

    /// An NVTX range, or a mark (an instant event), on its host thread.
    fn marker(&mut self, rec: &Rec, dur: i64) -> rusqlite::Result<()> {
        let v = &rec.v;
        let tid = v[0] as u64;
        self.host_threads.insert((rec.proc, tid));
        self.cache_name(v[1])?;
        if v[2] != 0 {
            self.cache_name(v[2])?;
        }
        let at = self.place(rec, host_pid(rec.proc), tid);
        let name = &self.names[&v[1]];
        let domain = if v[2] != 0 { self.names[&v[2]].as_str() } else { "\"\"" };
        let mut w = W(&mut self.out.buf);
        if v[3] != 0 {
            head(&mut w, &mut self.first, "i", name, "nvtx", at, None);
            w.s(",\"s\":\"t\"");
        } else {
            head(&mut w, &mut self.first, "X", name, "nvtx", at, Some(dur));
        }
        w.s(",\"args\":{\"domain\":").s(domain).s("}}");
        Ok(())
    }

    /// An NCCL collective's enqueue on the thread that called it (its run is the NCCL kernel on
    /// the stream's track).
    fn collective(&mut self, rec: &Rec, dur: i64) -> rusqlite::Result<()> {
        let v = &rec.v;
        let tid = v[0] as u64;
        self.host_threads.insert((rec.proc, tid));
        self.cache_name(v[1])?;
        let at = self.place(rec, host_pid(rec.proc), tid);
        let name = &self.names[&v[1]];
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "X", name, "nccl", at, Some(dur));
        w.s(",\"args\":{\"seq\":").i(v[2]).s(",\"communicator\":\"");
        let _ = write!(Buf(&mut self.out.buf), "{:016x}", v[3] as u64);
        let mut w = W(&mut self.out.buf);
        w.s("\",\"bytes\":").i(v[4]).s("}}");
        Ok(())
    }

    /// A synchronization on the process's "CUDA synchronization" track.
    fn sync(&mut self, rec: &Rec, dur: i64) {
        let v = &rec.v;
        self.host_threads.insert((rec.proc, SYNC_TID));
        let at = self.place(rec, host_pid(rec.proc), SYNC_TID);
        let name =
            self.labels.entry((4, v[2], 0)).or_insert_with(|| json_str(&format!("Sync {}", sync_type_name(v[2]))));
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "X", name, "sync", at, Some(dur));
        w.s(",\"args\":{\"correlation\":").i(v[1]).s(",\"stream\":").i(v[0]).s(",\"event\":").i(v[3]).s("}}");
    }

    /// CUPTI's own overhead on the process's "CUPTI overhead" track.
    fn overhead(&mut self, rec: &Rec, dur: i64) {
        let v = &rec.v;
        self.host_threads.insert((rec.proc, OVERHEAD_TID));
        let at = self.place(rec, host_pid(rec.proc), OVERHEAD_TID);
        let name = self.labels.entry((5, v[0], 0)).or_insert_with(|| json_str(&format!("CUPTI overhead {}", v[0])));
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "X", name, "overhead", at, Some(dur));
        w.s(",\"args\":{\"object_kind\":").i(v[1]).s(",\"object_id\":").i(v[2]).s("}}");
    }

    // ------------------------------------------------------------ writing events

    /// Where a record's event goes: `pid`/`tid`, at the record's start.
    fn place(&self, rec: &Rec, pid: i64, tid: u64) -> Place {
        Place { pid, tid, ts: rec.start - self.t0 }
    }

    /// Looks a stored string up once, as a JSON string literal, into `names`.
    fn cache_name(&mut self, id: i64) -> rusqlite::Result<()> {
        if !self.names.contains_key(&id) {
            let n = json_str(&self.strings.get(self.c, id)?);
            self.names.insert(id, n);
        }
        Ok(())
    }

    /// The separator before every event but the first.
    fn separate(&mut self) {
        if !self.first {
            self.out.buf.extend_from_slice(b",\n");
        }
        self.first = false;
    }

    /// The end of launch arrow `id` at a device activity.
    fn flow_end(&mut self, at: Place, id: u64) {
        let mut w = W(&mut self.out.buf);
        head(&mut w, &mut self.first, "f", "\"launch\"", "flow", at, None);
        w.s(",\"id\":").u(id).s(",\"bp\":\"e\"}");
    }

    /// The starts of `n` launch arrows, ids `id0` on, at an API call.
    fn flow_starts(&mut self, at: Place, id0: u64, n: u32) {
        for k in 0..u64::from(n) {
            let mut w = W(&mut self.out.buf);
            head(&mut w, &mut self.first, "s", "\"launch\"", "flow", at, None);
            w.s(",\"id\":").u(id0 + k).s("}");
        }
    }

    // ------------------------------------------------------------ names of processes and threads

    /// Names of the host tracks, then of the GPU tracks (metadata events carry no time).
    fn track_names(&mut self, procs: &Procs, gpus: &Gpus) {
        self.host_track_names(procs);
        self.gpu_track_names(procs, gpus);
    }

    /// Each process's host threads, and the synchronization and overhead tracks.
    fn host_track_names(&mut self, procs: &Procs) {
        let mut seen = BTreeSet::new();
        for (proc, tid) in std::mem::take(&mut self.host_threads) {
            let pid = host_pid(proc);
            if seen.insert(proc) {
                self.meta("process_name", pid, None, &format!("\"name\":{}", json_str(&label(procs, proc))));
                self.meta("process_sort_index", pid, None, &format!("\"sort_index\":{pid}"));
            }
            let tname = match tid {
                SYNC_TID => "CUDA synchronization".to_string(),
                OVERHEAD_TID => "CUPTI overhead".to_string(),
                t => format!("thread {t}"),
            };
            self.meta("thread_name", pid, Some(tid), &format!("\"name\":{}", json_str(&tname)));
        }
    }

    /// Each (process, GPU) and its streams.
    fn gpu_track_names(&mut self, procs: &Procs, gpus: &Gpus) {
        let mut seen = BTreeSet::new();
        for (proc, dev, stream) in std::mem::take(&mut self.streams) {
            let pid = gpu_pid(proc, dev);
            if seen.insert(pid) {
                let name = json_str(&format!("{} · {}", gpu_name(gpus, proc, dev), label(procs, proc)));
                self.meta("process_name", pid, None, &format!("\"name\":{name}"));
                self.meta("process_sort_index", pid, None, &format!("\"sort_index\":{pid}"));
            }
            let name = json_str(&format!("stream {stream}"));
            self.meta("thread_name", pid, Some(stream as u64), &format!("\"name\":{name}"));
        }
    }

    /// A metadata event: `what` (a name or sort index) of a trace process or thread.
    fn meta(&mut self, what: &str, pid: i64, tid: Option<u64>, value: &str) {
        self.separate();
        let tid = tid.map(|t| format!(",\"tid\":{t}")).unwrap_or_default();
        let _ = write!(
            Buf(&mut self.out.buf),
            "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid}{tid},\"args\":{{{value}}}}}"
        );
    }
}

/// Writes into the output buffer: text as is, integers in decimal.
struct W<'a>(&'a mut Vec<u8>);

impl W<'_> {
    fn s(&mut self, text: &str) -> &mut Self {
        self.0.extend_from_slice(text.as_bytes());
        self
    }

    fn i(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self
    }

    fn u(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
        self
    }
}

/// The separator (but before the first event) and the start of one timed event: `ph` X
/// (complete, with `dur`), i (instant) or s/f (flow); `name` is a JSON literal. The caller
/// adds what else the event has and its closing brace.
fn head(w: &mut W<'_>, first: &mut bool, ph: &str, name: &str, cat: &str, at: Place, dur: Option<i64>) {
    if !std::mem::replace(first, false) {
        w.s(",\n");
    }
    w.s("{\"ph\":\"").s(ph).s("\",\"cat\":\"").s(cat).s("\",\"name\":").s(name);
    w.s(",\"pid\":").i(at.pid).s(",\"tid\":").u(at.tid).s(",\"ts\":");
    us(w.0, at.ts);
    if let Some(d) = dur {
        w.s(",\"dur\":");
        us(w.0, d);
    }
}
