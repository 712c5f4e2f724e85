//! ExportTrace: a session as Chrome trace JSON (Perfetto UI, chrome://tracing) or as a
//! standalone SQLite file, streamed to the client in chunks.
//!
//! Chrome JSON layout:
//! - one trace process per gpuprof process (its host threads: API calls and NVTX ranges
//!   on the calling thread, plus "CUDA synchronization" and "CUPTI overhead" tracks), and
//!   one per (process, GPU) whose threads are the CUDA streams (kernels, copies, sets,
//!   graph launches);
//! - flow arrows from each launch/copy API call to the device activities with the same
//!   correlation id (one arrow per activity, so a graph launch fans out);
//! - `ts`/`dur` in µs relative to the session's first record (`otherData.t0_ns`), written
//!   from integers with ns precision;
//! - records are merged across tables in (process, start) order, so every track's events
//!   appear with non-decreasing timestamps.
//!
//! The file is assembled on a blocking thread from a read connection and never touches a
//! path the client chose; the SQLite export is built in the daemon's state directory and
//! removed once sent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, Row, params_from_iter};
use tokio::sync::mpsc;

use crate::Daemon;
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};
use crate::query::{Strings, check_filter, copy_kind_name, sync_type_name, where_for};

/// Bytes per ExportTraceResponse.
const CHUNK: usize = 256 << 10;
/// Tables whose rows become trace events.
pub const EVENT_TABLES: &[&str] = &["kernel", "memcpy", "memset", "graph", "api", "marker", "sync", "overhead"];
/// Synthetic thread ids of per-process host tracks.
const SYNC_TID: u64 = 4_294_967_294;
const OVERHEAD_TID: u64 = 4_294_967_293;

type Tx = mpsc::Sender<Result<pb::ExportTraceResponse, tonic::Status>>;

/// ExportTrace: checks the request, then produces the file on a blocking thread.
pub async fn export(
    d: &Daemon,
    caller: &Caller,
    req: pb::ExportTraceRequest,
) -> ApiResult<mpsc::Receiver<Result<pb::ExportTraceResponse, tonic::Status>>> {
    let format = pb::ExportFormat::try_from(req.format)
        .map_err(|_| ApiError::invalid("format", format!("{} is not an export format", req.format)))?;
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    crate::access::authorize_session(d, caller, req.session_id).await?;
    crate::rollup::catch_up(d).await?;
    let (tx, rx) = mpsc::channel(8);
    let db = d.db_path.clone();
    let session = req.session_id;
    let tmp_dir = db.parent().map(|p| p.join("exports")).unwrap_or_else(|| PathBuf::from("exports"));
    tokio::task::spawn_blocking(move || {
        let r = match format {
            pb::ExportFormat::Unspecified | pb::ExportFormat::ChromeJson => chrome(&db, session, &f, &tx),
            pb::ExportFormat::Sqlite => sqlite(&db, &tmp_dir, session, &f, &tx),
        };
        match r {
            Ok(()) => {}
            Err(Stop::ClientGone) => tracing::debug!(session, "export cancelled by the client"),
            Err(Stop::Failed(e)) => {
                let _ = tx.blocking_send(Err(e.into()));
            }
        }
    });
    Ok(rx)
}

/// Why an export ended early.
enum Stop {
    ClientGone,
    Failed(ApiError),
}

impl<E: Into<ApiError>> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Failed(e.into())
    }
}

/// Buffers output and sends it in chunks with progress.
struct Out<'a> {
    tx: &'a Tx,
    buf: Vec<u8>,
    written: u64,
    total: u64,
}

impl Out<'_> {
    fn maybe_send(&mut self) -> Result<(), Stop> {
        if self.buf.len() >= CHUNK { self.send() } else { Ok(()) }
    }

    fn send(&mut self) -> Result<(), Stop> {
        let m = pb::ExportTraceResponse {
            data: std::mem::take(&mut self.buf),
            events_written: self.written,
            events_total: self.total.max(self.written),
        };
        self.buf.reserve(CHUNK + 4096);
        self.tx.blocking_send(Ok(m)).map_err(|_| Stop::ClientGone)
    }
}

/// Rows an export will hold, from the rollup (exact without filters, an upper bound with).
fn total_rows(c: &Connection, session: u64, tables: &[&str]) -> rusqlite::Result<u64> {
    let mut n = 0;
    for t in tables {
        n += crate::query::rollups::table_count(c, t, session)?;
    }
    Ok(n)
}

/// JSON string literal of `s`.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// ns as µs with three decimals, from integers.
fn us(out: &mut Vec<u8>, ns: i64) {
    let neg = ns < 0;
    let a = ns.unsigned_abs();
    let _ = write!(Buf(out), "{}{}.{:03}", if neg { "-" } else { "" }, a / 1000, a % 1000);
}

/// `fmt::Write` over a byte vector.
struct Buf<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Buf<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// One record from any table, as the merge sees it.
struct Rec {
    proc: i64,
    start: i64,
    table: usize,
    /// Columns after proc/start, as in `select_cols`.
    v: [i64; 8],
}

fn select_cols(table: &str) -> &'static str {
    // proc, abs start, dur, then up to 8 table-specific integers.
    match table {
        "kernel" => {
            "t.dev, t.stream, t.corr, t.name, t.gx * 1000000 + t.gy * 1000 + t.gz, t.bx * 1000000 + t.by * 1000 + t.bz, t.regs, t.ssmem + t.dsmem"
        }
        "memcpy" => "t.dev, t.stream, t.corr, t.bytes, t.kind, t.src_dev, t.dst_dev, 0",
        "memset" => "t.dev, t.stream, t.corr, t.bytes, t.value, 0, 0, 0",
        "graph" => "t.dev, t.stream, t.corr, t.graph_id, 0, 0, 0, 0",
        "api" => "t.tid, t.corr, t.domain, t.cbid, t.ret, 0, 0, 0",
        "marker" => "t.tid, t.name, t.domain, t.is_mark, t.id, 0, 0, 0",
        "sync" => "t.stream, t.corr, t.type, t.event, 0, 0, 0, 0",
        _ => "t.kind, t.obj_kind, t.obj_id, 0, 0, 0, 0, 0",
    }
}

fn read_rec(r: &Row<'_>, table: usize) -> rusqlite::Result<(Rec, i64)> {
    let mut v = [0i64; 8];
    for (i, x) in v.iter_mut().enumerate() {
        *x = r.get(3 + i)?;
    }
    Ok((Rec { proc: r.get(0)?, start: r.get(1)?, table, v }, r.get::<_, i64>(2)?.max(0)))
}

/// Flow key: process and correlation id.
fn key(proc: i64, corr: i64) -> u64 {
    ((proc as u64) << 32) | (corr as u64 & 0xffff_ffff)
}

/// Correlation ids present on both sides (API call and device activity), with how many
/// device activities each has, sorted; flow ids are offsets into it.
struct Flows {
    keys: Vec<u64>,
    counts: Vec<u32>,
    first_id: Vec<u64>,
    next: Vec<u32>,
}

impl Flows {
    fn build(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Flows> {
        let mut api = Vec::new();
        let w = where_for(c, "api", session, f)?;
        let mut st = c.prepare(&format!("SELECT t.proc, t.corr FROM api t WHERE {} AND t.corr != 0", w.sql))?;
        let mut rows = st.query(params_from_iter(w.params.iter()))?;
        while let Some(r) = rows.next()? {
            api.push(key(r.get(0)?, r.get(1)?));
        }
        api.sort_unstable();
        api.dedup();
        let mut dev = Vec::new();
        for t in ["kernel", "memcpy", "memset"] {
            let w = where_for(c, t, session, f)?;
            let mut st = c.prepare(&format!("SELECT t.proc, t.corr FROM {t} t WHERE {} AND t.corr != 0", w.sql))?;
            let mut rows = st.query(params_from_iter(w.params.iter()))?;
            while let Some(r) = rows.next()? {
                let k = key(r.get(0)?, r.get(1)?);
                if api.binary_search(&k).is_ok() {
                    dev.push(k);
                }
            }
        }
        drop(api);
        dev.sort_unstable();
        let mut keys = Vec::new();
        let mut counts: Vec<u32> = Vec::new();
        for k in dev {
            if keys.last() == Some(&k) {
                if let Some(c) = counts.last_mut() {
                    *c += 1;
                }
            } else {
                keys.push(k);
                counts.push(1);
            }
        }
        let mut first_id = Vec::with_capacity(keys.len());
        let mut id = 1u64;
        for c in &counts {
            first_id.push(id);
            id += u64::from(*c);
        }
        let next = vec![0; keys.len()];
        Ok(Flows { keys, counts, first_id, next })
    }

    /// Flow ids starting at an API call.
    fn starts(&self, k: u64) -> Option<(u64, u32)> {
        self.keys.binary_search(&k).ok().map(|i| (self.first_id[i], self.counts[i]))
    }

    /// The next flow id ending at a device activity.
    fn end(&mut self, k: u64) -> Option<u64> {
        let i = self.keys.binary_search(&k).ok()?;
        if self.next[i] >= self.counts[i] {
            return None;
        }
        self.next[i] += 1;
        Some(self.first_id[i] + u64::from(self.next[i]) - 1)
    }
}

/// Chrome trace JSON.
fn chrome(db: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let mut strings = Strings::default();
    let mut out =
        Out { tx, buf: Vec::with_capacity(CHUNK + 4096), written: 0, total: total_rows(&c, session, EVENT_TABLES)? };
    let mut flows = Flows::build(&c, session, f)?;

    // Processes of the session: daemon id → (pid, exe, base_ns).
    let mut procs: BTreeMap<i64, (i64, String, i64)> = BTreeMap::new();
    {
        let mut st = c.prepare(
            "SELECT p.id, p.pid, p.exe, p.base_ns FROM processes p
             WHERE p.id IN (SELECT proc FROM session_processes WHERE session = ?1
                            UNION SELECT proc FROM session_rows WHERE session = ?1)",
        )?;
        let mut rows = st.query([session as i64])?;
        while let Some(r) = rows.next()? {
            procs.insert(r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?));
        }
    }

    // One cursor per table, ordered by (process, start); merged below.
    let mut stmts = Vec::new();
    let mut params = Vec::new();
    for t in EVENT_TABLES {
        let w = where_for(&c, t, session, f)?;
        stmts.push(c.prepare(&format!(
            "SELECT t.proc, t.start + p.base_ns, t.dur, {} FROM {t} t JOIN processes p ON p.id = t.proc
             WHERE {} ORDER BY t.proc, t.start",
            select_cols(t),
            w.sql
        ))?);
        params.push(w.params);
    }
    let mut cursors = Vec::new();
    for (st, p) in stmts.iter_mut().zip(&params) {
        cursors.push(st.query(params_from_iter(p.iter()))?);
    }
    let mut heads: Vec<Option<(Rec, i64)>> = Vec::with_capacity(cursors.len());
    for (i, cur) in cursors.iter_mut().enumerate() {
        heads.push(match cur.next()? {
            Some(r) => Some(read_rec(r, i)?),
            None => None,
        });
    }
    // t0: the earliest start over all tables and processes.
    let mut t0 = i64::MAX;
    for (t, p) in EVENT_TABLES.iter().zip(&params) {
        let w = where_for(&c, t, session, f)?;
        let m: Option<i64> = c
            .prepare(&format!(
                "SELECT min(s) FROM (SELECT min(t.start) + (SELECT base_ns FROM processes WHERE id = t.proc) AS s
                 FROM {t} t WHERE {} GROUP BY t.proc)",
                w.sql
            ))?
            .query_row(params_from_iter(p.iter()), |r| r.get(0))?;
        if let Some(m) = m {
            t0 = t0.min(m);
        }
    }
    if t0 == i64::MAX {
        t0 = 0;
    }

    out.buf.extend_from_slice(b"{\"displayTimeUnit\":\"ns\",\"otherData\":{\"gpuprof_session\":");
    let _ = write!(Buf(&mut out.buf), "{session},\"t0_ns\":{t0}");
    out.buf.extend_from_slice(b"},\"traceEvents\":[\n");
    let mut first = true;
    let mut host_threads: BTreeSet<(i64, u64)> = BTreeSet::new();
    let mut streams: BTreeSet<(i64, i64, i64)> = BTreeSet::new();
    let mut names: HashMap<i64, String> = HashMap::new();

    loop {
        // The head with the smallest (proc, start).
        let mut best: Option<usize> = None;
        for (i, h) in heads.iter().enumerate() {
            if let Some((r, _)) = h {
                let better = match best.and_then(|b| heads[b].as_ref()) {
                    None => true,
                    Some((b, _)) => (r.proc, r.start) < (b.proc, b.start),
                };
                if better {
                    best = Some(i);
                }
            }
        }
        let Some(i) = best else { break };
        let (rec, dur) = match heads[i].take() {
            Some(h) => h,
            None => break,
        };
        heads[i] = match cursors[i].next()? {
            Some(r) => Some(read_rec(r, i)?),
            None => None,
        };
        let table = EVENT_TABLES[rec.table];
        let v = rec.v;
        let ts = rec.start - t0;
        let host_pid = rec.proc * 1000;
        let dev_pid = |dev: i64| rec.proc * 1000 + 1 + dev.clamp(0, 998);
        let mut ev =
            |out: &mut Out<'_>, ph: &str, name: &str, cat: &str, pid: i64, tid: u64, dur: Option<i64>, args: &str| {
                if !first {
                    out.buf.extend_from_slice(b",\n");
                }
                first = false;
                let _ = write!(
                    Buf(&mut out.buf),
                    "{{\"ph\":\"{ph}\",\"cat\":\"{cat}\",\"name\":{name},\"pid\":{pid},\"tid\":{tid},\"ts\":"
                );
                us(&mut out.buf, ts);
                if let Some(d) = dur {
                    out.buf.extend_from_slice(b",\"dur\":");
                    us(&mut out.buf, d);
                }
                if ph == "i" {
                    out.buf.extend_from_slice(b",\"s\":\"t\"");
                }
                if !args.is_empty() {
                    let _ = write!(Buf(&mut out.buf), ",\"args\":{{{args}}}");
                }
                out.buf.push(b'}');
            };
        let mut name_of = |id: i64, c: &Connection| -> rusqlite::Result<String> {
            if let Some(n) = names.get(&id) {
                return Ok(n.clone());
            }
            let n = json_str(&strings.get(c, id)?);
            names.insert(id, n.clone());
            Ok(n)
        };
        match table {
            "kernel" | "memcpy" | "memset" | "graph" => {
                let (dev, stream, corr) = (v[0], v[1], v[2]);
                streams.insert((rec.proc, dev, stream));
                let pid = dev_pid(dev);
                let tid = stream as u64;
                let (name, cat, args) = match table {
                    "kernel" => (
                        name_of(v[3], &c)?,
                        "kernel",
                        format!(
                            "\"correlation\":{corr},\"grid\":[{},{},{}],\"block\":[{},{},{}],\"registers\":{},\"shared_bytes\":{}",
                            v[4] / 1_000_000,
                            v[4] / 1000 % 1000,
                            v[4] % 1000,
                            v[5] / 1_000_000,
                            v[5] / 1000 % 1000,
                            v[5] % 1000,
                            v[6],
                            v[7]
                        ),
                    ),
                    "memcpy" => {
                        let dir = copy_kind_name(v[4]);
                        (
                            json_str(&format!("Memcpy {dir}")),
                            "memcpy",
                            format!(
                                "\"correlation\":{corr},\"bytes\":{},\"direction\":\"{dir}\",\"src_device\":{},\"dst_device\":{}",
                                v[3], v[5], v[6]
                            ),
                        )
                    }
                    "memset" => (
                        "\"Memset\"".to_string(),
                        "memset",
                        format!("\"correlation\":{corr},\"bytes\":{},\"value\":{}", v[3], v[4]),
                    ),
                    _ => (
                        json_str(&format!("Graph {}", v[3])),
                        "graph",
                        format!("\"correlation\":{corr},\"graph_id\":{}", v[3]),
                    ),
                };
                ev(&mut out, "X", &name, cat, pid, tid, Some(dur), &args);
                if table != "graph"
                    && corr != 0
                    && let Some(id) = flows.end(key(rec.proc, corr))
                {
                    ev(&mut out, "f", "\"launch\"", "flow", pid, tid, None, "");
                    // Patch in the flow id and binding point (the event above is complete).
                    out.buf.pop();
                    let _ = write!(Buf(&mut out.buf), ",\"id\":{id},\"bp\":\"e\"}}");
                }
            }
            "api" => {
                let (tid, corr, domain, cbid) = (v[0] as u64, v[1], v[2], v[3]);
                host_threads.insert((rec.proc, tid));
                let cat = if domain == 2 { "cuda_driver" } else { "cuda_runtime" };
                let name = json_str(&crate::cbid::name(domain, cbid));
                ev(
                    &mut out,
                    "X",
                    &name,
                    cat,
                    host_pid,
                    tid,
                    Some(dur),
                    &format!("\"correlation\":{corr},\"cbid\":{cbid},\"return\":{}", v[4]),
                );
                if corr != 0
                    && let Some((id0, n)) = flows.starts(key(rec.proc, corr))
                {
                    for k in 0..u64::from(n) {
                        ev(&mut out, "s", "\"launch\"", "flow", host_pid, tid, None, "");
                        out.buf.pop();
                        let _ = write!(Buf(&mut out.buf), ",\"id\":{}}}", id0 + k);
                    }
                }
            }
            "marker" => {
                let tid = v[0] as u64;
                host_threads.insert((rec.proc, tid));
                let name = name_of(v[1], &c)?;
                let domain = if v[2] != 0 { name_of(v[2], &c)? } else { "\"\"".into() };
                let args = format!("\"domain\":{domain}");
                if v[3] != 0 {
                    ev(&mut out, "i", &name, "nvtx", host_pid, tid, None, &args);
                } else {
                    ev(&mut out, "X", &name, "nvtx", host_pid, tid, Some(dur), &args);
                }
            }
            "sync" => {
                host_threads.insert((rec.proc, SYNC_TID));
                let name = json_str(&format!("Sync {}", sync_type_name(v[2])));
                ev(
                    &mut out,
                    "X",
                    &name,
                    "sync",
                    host_pid,
                    SYNC_TID,
                    Some(dur),
                    &format!("\"correlation\":{},\"stream\":{},\"event\":{}", v[1], v[0], v[3]),
                );
            }
            _ => {
                host_threads.insert((rec.proc, OVERHEAD_TID));
                let name = json_str(&format!("CUPTI overhead {}", v[0]));
                ev(
                    &mut out,
                    "X",
                    &name,
                    "overhead",
                    host_pid,
                    OVERHEAD_TID,
                    Some(dur),
                    &format!("\"object_kind\":{},\"object_id\":{}", v[1], v[2]),
                );
            }
        }
        out.written += 1;
        out.maybe_send()?;
    }

    // Names of processes and threads (metadata events carry no time).
    let mut meta = |out: &mut Out<'_>, what: &str, pid: i64, tid: Option<u64>, value: &str| {
        if !first {
            out.buf.extend_from_slice(b",\n");
        }
        first = false;
        let tid = tid.map(|t| format!(",\"tid\":{t}")).unwrap_or_default();
        let _ =
            write!(Buf(&mut out.buf), "{{\"ph\":\"M\",\"name\":\"{what}\",\"pid\":{pid}{tid},\"args\":{{{value}}}}}");
    };
    let label = |proc: i64| match procs.get(&proc) {
        Some((pid, exe, _)) => format!("{} (pid {pid})", exe.rsplit('/').next().unwrap_or(exe)),
        None => format!("process {proc}"),
    };
    let mut seen_host = BTreeSet::new();
    for (proc, tid) in &host_threads {
        if seen_host.insert(*proc) {
            meta(&mut out, "process_name", proc * 1000, None, &format!("\"name\":{}", json_str(&label(*proc))));
            meta(&mut out, "process_sort_index", proc * 1000, None, &format!("\"sort_index\":{}", proc * 1000));
        }
        let tname = match *tid {
            SYNC_TID => "CUDA synchronization".to_string(),
            OVERHEAD_TID => "CUPTI overhead".to_string(),
            t => format!("thread {t}"),
        };
        meta(&mut out, "thread_name", proc * 1000, Some(*tid), &format!("\"name\":{}", json_str(&tname)));
    }
    let mut seen_dev = BTreeSet::new();
    for (proc, dev, stream) in &streams {
        let pid = proc * 1000 + 1 + dev.clamp(&0, &998);
        if seen_dev.insert(pid) {
            meta(
                &mut out,
                "process_name",
                pid,
                None,
                &format!("\"name\":{}", json_str(&format!("GPU {dev} · {}", label(*proc)))),
            );
            meta(&mut out, "process_sort_index", pid, None, &format!("\"sort_index\":{pid}"));
        }
        meta(
            &mut out,
            "thread_name",
            pid,
            Some(*stream as u64),
            &format!("\"name\":{}", json_str(&format!("stream {stream}"))),
        );
    }
    out.buf.extend_from_slice(b"\n]}\n");
    out.send()
}

/// A standalone SQLite database with the session's rows, the same schema as gpuprofd's
/// record tables (times relative to `processes.base_ns`, `*_v` views with absolute times).
fn sqlite(db: &Path, tmp_dir: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    std::fs::create_dir_all(tmp_dir).map_err(|e| ApiError::Internal(format!("creating {}: {e}", tmp_dir.display())))?;
    let path = tmp_dir.join(format!("session-{session}-{}-{}.db", std::process::id(), crate::clock::now_ns()));
    let _cleanup = RemoveOnDrop(path.clone());
    let total = {
        let c = crate::store::open_reader(db)?;
        total_rows(&c, session, crate::catalog::RECORD_TABLES)?
    };
    let mut out = Out { tx, buf: Vec::new(), written: 0, total };
    {
        let c = Connection::open(&path)?;
        c.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA foreign_keys=OFF;")?;
        c.execute_batch(crate::store::MIGRATIONS[0].1)?;
        c.execute("ATTACH DATABASE ?1 AS src", [format!("file:{}?mode=ro", db.display())])
            .or_else(|_| c.execute("ATTACH DATABASE ?1 AS src", [db.display().to_string()]))?;
        c.execute_batch("BEGIN")?;
        for t in crate::catalog::RECORD_TABLES {
            let w = where_for(&c, t, session, f).map_err(ApiError::from)?;
            // where_for reads src tables unqualified; qualify the source table.
            let sql = format!(
                "INSERT INTO main.{t} SELECT t.* FROM src.{t} t WHERE {}",
                w.sql.replace("FROM processes", "FROM src.processes").replace("FROM strings", "FROM src.strings")
            );
            let n = c.execute(&sql, params_from_iter(w.params.iter()))?;
            out.written += n as u64;
            out.send()?;
        }
        let s = session as i64;
        c.execute_batch(&format!(
            "INSERT INTO main.sessions SELECT * FROM src.sessions WHERE id = {s};
             INSERT INTO main.session_processes(session, proc, joined_ns, left_ns, state, detail)
               SELECT session, proc, joined_ns, left_ns, state, detail FROM src.session_processes WHERE session = {s};
             INSERT INTO main.processes SELECT * FROM src.processes
               WHERE id IN (SELECT proc FROM main.session_processes UNION SELECT proc FROM main.kernel
                            UNION SELECT proc FROM main.api UNION SELECT proc FROM main.memcpy);
             INSERT INTO main.process_devices SELECT * FROM src.process_devices WHERE proc IN (SELECT id FROM main.processes);
             INSERT INTO main.devices SELECT * FROM src.devices WHERE id IN (SELECT device FROM main.process_devices);
             INSERT INTO main.strings SELECT * FROM src.strings
               WHERE id IN (SELECT name FROM main.kernel UNION SELECT name FROM main.marker UNION SELECT domain FROM main.marker);
             INSERT INTO main.drops SELECT * FROM src.drops WHERE proc IN (SELECT id FROM main.processes);
             INSERT INTO main.meta(key, value) VALUES ('gpuprof_export_session', '{s}');
             COMMIT;
             DETACH DATABASE src;"
        ))?;
    }
    let mut file = std::fs::File::open(&path).map_err(|e| ApiError::Internal(format!("reading the export: {e}")))?;
    loop {
        let mut chunk = vec![0u8; CHUNK];
        let n = std::io::Read::read(&mut file, &mut chunk)
            .map_err(|e| ApiError::Internal(format!("reading the export: {e}")))?;
        if n == 0 {
            break;
        }
        chunk.truncate(n);
        out.buf = chunk;
        out.send()?;
    }
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_from_integers() {
        let mut b = Vec::new();
        us(&mut b, 1_234_567);
        b.push(b' ');
        us(&mut b, 5);
        b.push(b' ');
        us(&mut b, -1500);
        assert_eq!(String::from_utf8(b).unwrap(), "1234.567 0.005 -1.500");
    }

    #[test]
    fn flow_keys() {
        assert_ne!(key(1, 5), key(2, 5));
        assert_eq!(key(3, 0xffff_ffff) >> 32, 3);
    }
}
