//! Reading a session's records: filtered record streams and summaries.
//!
//! Everything here runs on read-only connections in blocking threads. A session's rows
//! are found by rowid range (each session's first and last rowid per table come from the
//! rollup, see [`crate::rollup`]), so a query touches only the pages of that session,
//! never the whole table, and no index on the hot record tables is needed.

use std::collections::{BTreeMap, HashMap};

use gpuprof_proto::api as pb;
use rusqlite::types::Value;
use rusqlite::{Connection, params_from_iter};
use tokio::sync::mpsc;

use crate::Daemon;
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

pub mod summary;

/// Records stored for a session, per process.
pub fn session_record_counts(c: &Connection, session: u64) -> rusqlite::Result<HashMap<u64, u64>> {
    summary::session_counts(c, session)
}

/// A WHERE clause with its parameters.
#[derive(Debug, Default, Clone)]
pub struct Where {
    pub sql: String,
    pub params: Vec<Value>,
}

impl Where {
    fn and(&mut self, cond: &str, params: impl IntoIterator<Item = Value>) {
        self.sql.push_str(" AND ");
        self.sql.push_str(cond);
        self.params.extend(params);
    }

    fn in_list(&mut self, col: &str, vals: impl IntoIterator<Item = i64>) {
        let vals: Vec<i64> = vals.into_iter().collect();
        if vals.is_empty() {
            return;
        }
        let marks = vec!["?"; vals.len()].join(",");
        self.and(&format!("{col} IN ({marks})"), vals.into_iter().map(Value::Integer));
    }
}

/// Which columns a table has, for filters.
#[derive(Debug, Clone, Copy)]
pub struct Cols {
    pub dev: bool,
    pub stream: bool,
    pub name: bool,
    pub time: bool,
}

pub fn cols(table: &str) -> Cols {
    match table {
        "kernel" => Cols { dev: true, stream: true, name: true, time: true },
        "memcpy" | "memset" | "graph" => Cols { dev: true, stream: true, name: false, time: true },
        "sync" => Cols { dev: false, stream: true, name: false, time: true },
        "api" | "marker" | "overhead" => Cols { dev: false, stream: false, name: false, time: true },
        _ => Cols { dev: false, stream: false, name: false, time: false },
    }
}

/// Checks a filter's fields.
pub fn check_filter(f: &pb::RecordFilter) -> ApiResult<()> {
    if !f.name_pattern.is_empty() {
        gpuprof_proto::glob::check(&f.name_pattern).map_err(|e| ApiError::invalid("filter.name_pattern", e))?;
    }
    if let Some(t) = &f.time_range
        && t.end_ns != 0
        && t.end_ns <= t.start_ns
    {
        return Err(ApiError::invalid(
            "filter.time_range",
            format!("end_ns {} is not after start_ns {}", t.end_ns, t.start_ns),
        ));
    }
    Ok(())
}

/// The WHERE clause selecting `session`'s rows of `table` (alias `t`, processes joined as
/// `p` when `time` filters apply) that pass `f`.
pub fn where_for(c: &Connection, table: &str, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Where> {
    let (lo, hi) = summary::rowid_range(c, table, session)?;
    let mut w = Where {
        sql: "t.rowid BETWEEN ? AND ? AND t.session = ?".into(),
        params: vec![Value::Integer(lo), Value::Integer(hi), Value::Integer(session as i64)],
    };
    let cl = cols(table);
    w.in_list("t.proc", f.process_ids.iter().map(|p| *p as i64));
    if cl.dev {
        w.in_list("t.dev", f.device_ids.iter().map(|d| i64::from(*d)));
    }
    if cl.stream {
        w.in_list("t.stream", f.stream_ids.iter().map(|d| i64::from(*d)));
    }
    if cl.name && !f.name_pattern.is_empty() {
        w.and("t.name IN (SELECT id FROM strings WHERE value GLOB ?)", [Value::Text(f.name_pattern.clone())]);
    }
    if cl.time
        && let Some(tr) = &f.time_range
    {
        if tr.start_ns > 0 {
            w.and(
                "t.start + t.dur + (SELECT base_ns FROM processes WHERE id = t.proc) >= ?",
                [Value::Integer(tr.start_ns as i64)],
            );
        }
        if tr.end_ns > 0 {
            w.and(
                "t.start + (SELECT base_ns FROM processes WHERE id = t.proc) < ?",
                [Value::Integer(tr.end_ns as i64)],
            );
        }
    }
    Ok(w)
}

/// Whether a filter needs the rows themselves: the rollups have no time dimension.
fn needs_scan(f: &pb::RecordFilter) -> bool {
    f.time_range.as_ref().is_some_and(|t| t.start_ns > 0 || t.end_ns > 0)
}

/// GetSummary's body, on a read connection.
pub fn summary(c: &Connection, session: u64, f: &pb::RecordFilter, top: usize) -> ApiResult<pb::GetSummaryResponse> {
    let mut out = pb::GetSummaryResponse::default();
    // Top kernels.
    if needs_scan(f) {
        // Same shape as the rollup: exact count/sum/extremes, percentiles from 3% buckets;
        // memory grows with distinct names, not with rows.
        let w = where_for(c, "kernel", session, f)?;
        let mut per: HashMap<i64, NameStats> = HashMap::new();
        let mut stmt = c.prepare(&format!("SELECT t.name, t.dur FROM kernel t WHERE {}", w.sql))?;
        let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
        while let Some(r) = rows.next()? {
            per.entry(r.get(0)?).or_default().add(r.get::<_, i64>(1)?.max(0));
        }
        out.kernel_count = per.values().map(|v| v.n).sum();
        out.kernel_total_ns = per.values().map(|v| v.total).sum();
        let mut totals: Vec<(i64, u64)> = per.iter().map(|(k, v)| (*k, v.total)).collect();
        totals.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        for (name, _) in totals.into_iter().take(top) {
            let Some(st) = per.remove(&name) else { continue };
            out.top_kernels.push(st.into_stat(string(c, name)?));
        }
    } else {
        let (count, total, stats) = summary::top_kernels(c, session, f, top)?;
        out.kernel_count = count;
        out.kernel_total_ns = total;
        out.top_kernels = stats;
    }
    if needs_scan(f) {
        out.copies = copies(c, session, f)?;
        out.api_calls = api_calls(c, session, f, top)?;
    } else {
        out.copies = summary::copies(c, session, f)?;
        out.api_calls = summary::api_calls(c, session, f, top)?;
    }
    // The busy rollup is per device only; other filters need the rows.
    if needs_scan(f) || !f.process_ids.is_empty() || !f.stream_ids.is_empty() || !f.name_pattern.is_empty() {
        out.device_busy = device_busy(c, session, f)?;
    } else {
        out.device_busy = summary::device_busy(c, session, f)?;
    }
    Ok(out)
}

/// An interned string's value ("" for 0 or unknown ids).
pub fn string(c: &Connection, id: i64) -> rusqlite::Result<String> {
    use rusqlite::OptionalExtension;
    if id == 0 {
        return Ok(String::new());
    }
    Ok(c.prepare_cached("SELECT value FROM strings WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?
        .unwrap_or_default())
}

/// CUpti_ActivityMemcpyKind as a short name.
pub fn copy_kind_name(k: i64) -> String {
    match k {
        1 => "HtoD".into(),
        2 => "DtoH".into(),
        3 => "HtoA".into(),
        4 => "AtoH".into(),
        5 => "AtoA".into(),
        6 => "AtoD".into(),
        7 => "DtoA".into(),
        8 => "DtoD".into(),
        9 => "HtoH".into(),
        10 => "PtoP".into(),
        other => format!("kind{other}"),
    }
}

fn copies(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Vec<pb::CopyStat>> {
    let w = where_for(c, "memcpy", session, f)?;
    let mut stmt = c.prepare(&format!(
        "SELECT t.kind, count(*), sum(t.bytes), sum(t.dur) FROM memcpy t WHERE {} GROUP BY t.kind ORDER BY sum(t.bytes) DESC",
        w.sql
    ))?;
    let rows = stmt.query_map(params_from_iter(w.params.iter()), |r| {
        let bytes = r.get::<_, i64>(2)?.max(0) as u64;
        let total = r.get::<_, i64>(3)?.max(0) as u64;
        Ok(pb::CopyStat {
            direction: copy_kind_name(r.get(0)?),
            count: r.get::<_, i64>(1)? as u64,
            bytes,
            total_ns: total,
            bandwidth_gbps: if total > 0 { bytes as f64 / total as f64 } else { 0.0 },
        })
    })?;
    rows.collect()
}

fn api_calls(c: &Connection, session: u64, f: &pb::RecordFilter, top: usize) -> rusqlite::Result<Vec<pb::ApiStat>> {
    let w = where_for(c, "api", session, f)?;
    let mut stmt = c.prepare(&format!(
        "SELECT t.domain, t.cbid, count(*), sum(t.dur), max(t.dur) FROM api t WHERE {}
         GROUP BY t.domain, t.cbid ORDER BY sum(t.dur) DESC LIMIT {top}",
        w.sql
    ))?;
    let rows = stmt.query_map(params_from_iter(w.params.iter()), |r| {
        let domain: i64 = r.get(0)?;
        let cbid: i64 = r.get(1)?;
        Ok(pb::ApiStat {
            name: crate::cbid::name(domain, cbid),
            domain: crate::cbid::domain_name(domain).into(),
            count: r.get::<_, i64>(2)? as u64,
            total_ns: r.get::<_, i64>(3)?.max(0) as u64,
            max_ns: r.get::<_, i64>(4)?.max(0) as u64,
        })
    })?;
    rows.collect()
}

/// Busy time per device: the union of kernel, copy and set intervals.
fn device_busy(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Vec<pb::DeviceBusy>> {
    // One stream of (device, start, end) sorted by SQLite (which spills to disk when large),
    // swept in order: memory does not grow with the rows.
    let mut parts = Vec::new();
    let mut params = Vec::new();
    for table in ["kernel", "memcpy", "memset"] {
        let w = where_for(c, table, session, f)?;
        parts.push(format!(
            "SELECT t.dev AS dev, t.start + p.base_ns AS s, t.start + p.base_ns + max(t.dur, 0) AS e
             FROM {table} t JOIN processes p ON p.id = t.proc WHERE {}",
            w.sql
        ));
        params.extend(w.params);
    }
    let mut stmt = c.prepare(&format!("SELECT dev, s, e FROM ({}) ORDER BY dev, s", parts.join(" UNION ALL ")))?;
    let mut rows = stmt.query(params_from_iter(params.iter()))?;
    let mut sweep = Sweep::default();
    while let Some(r) = rows.next()? {
        sweep.push(r.get(0)?, r.get(1)?, r.get(2)?);
    }
    Ok(sweep.finish())
}

/// Kernel durations of one name: exact count, sum and extremes, log-scale buckets.
struct NameStats {
    n: u64,
    total: u64,
    min: u64,
    max: u64,
    /// bucket → (count, min, max).
    hist: BTreeMap<i64, (i64, i64, i64)>,
}

impl Default for NameStats {
    fn default() -> Self {
        NameStats { n: 0, total: 0, min: u64::MAX, max: 0, hist: BTreeMap::new() }
    }
}

impl NameStats {
    fn add(&mut self, d: i64) {
        self.n += 1;
        self.total += d as u64;
        self.min = self.min.min(d as u64);
        self.max = self.max.max(d as u64);
        let h = self.hist.entry(crate::rollup::bucket(d)).or_insert((0, i64::MAX, i64::MIN));
        h.0 += 1;
        h.1 = h.1.min(d);
        h.2 = h.2.max(d);
    }

    fn into_stat(self, name: String) -> pb::KernelStat {
        let hist: Vec<(i64, i64, i64)> = self.hist.into_values().collect();
        pb::KernelStat {
            name,
            count: self.n,
            total_ns: self.total,
            mean_ns: self.total.checked_div(self.n).unwrap_or(0),
            p50_ns: summary::quantile(&hist, self.n, 0.5),
            p95_ns: summary::quantile(&hist, self.n, 0.95),
            max_ns: self.max,
            min_ns: if self.n == 0 { 0 } else { self.min },
        }
    }
}

/// Busy time per device from intervals sorted by (device, start).
#[derive(Default)]
struct Sweep {
    out: Vec<pb::DeviceBusy>,
    /// Device, merged interval open now (start, end), busy so far, first start, last end.
    cur: Option<(u32, i64, i64, i64, i64, i64)>,
}

impl Sweep {
    fn push(&mut self, dev: u32, s: i64, e: i64) {
        match &mut self.cur {
            Some((d, cs, ce, busy, _, last)) if *d == dev => {
                *last = (*last).max(e);
                if s <= *ce {
                    *ce = (*ce).max(e);
                } else {
                    *busy += *ce - *cs;
                    *cs = s;
                    *ce = e;
                }
            }
            _ => {
                self.close();
                self.cur = Some((dev, s, e, 0, s, e));
            }
        }
    }

    fn close(&mut self) {
        if let Some((dev, cs, ce, busy, first, last)) = self.cur.take() {
            self.out.push(pb::DeviceBusy {
                device_id: dev,
                busy_ns: (busy + ce - cs).max(0) as u64,
                span_ns: (last - first).max(0) as u64,
            });
        }
    }

    fn finish(mut self) -> Vec<pb::DeviceBusy> {
        self.close();
        self.out
    }
}

// ---------------------------------------------------------------- requests

/// Largest `top` accepted by GetSummary.
const MAX_TOP: u32 = 1000;
/// Rows per QueryRecordsResponse message.
const ROWS_PER_MESSAGE: usize = 2000;
/// Record kinds QueryRecords serves.
pub const QUERY_KINDS: &[&str] = &["kernel", "memcpy", "memset", "api", "sync", "marker"];

/// GetSummary.
pub async fn get_summary(d: &Daemon, caller: &Caller, req: pb::GetSummaryRequest) -> ApiResult<pb::GetSummaryResponse> {
    let top = match req.top {
        0 => 20,
        n if n > MAX_TOP => return Err(ApiError::invalid("top", format!("{n} is above the maximum of {MAX_TOP}"))),
        n => n,
    } as usize;
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    crate::access::authorize_session(d, caller, req.session_id).await?;
    crate::rollup::catch_up(d).await?;
    let path = d.db_path.clone();
    let id = req.session_id;
    tokio::task::spawn_blocking(move || {
        let c = crate::store::open_reader(&path)?;
        summary(&c, id, &f, top)
    })
    .await?
}

/// QueryRecords: checks the request, then streams from a blocking reader thread.
pub async fn query_records(
    d: &Daemon,
    caller: &Caller,
    req: pb::QueryRecordsRequest,
) -> ApiResult<mpsc::Receiver<Result<pb::QueryRecordsResponse, tonic::Status>>> {
    let mut kinds: Vec<&'static str> = Vec::new();
    for k in &req.kinds {
        match QUERY_KINDS.iter().find(|q| **q == k.as_str()) {
            Some(q) if !kinds.contains(q) => kinds.push(q),
            Some(_) => {}
            None => {
                return Err(ApiError::invalid(
                    "kinds",
                    format!("unknown record kind {k:?}; use one of {}", QUERY_KINDS.join(", ")),
                ));
            }
        }
    }
    if kinds.is_empty() {
        kinds.push("kernel");
    }
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    crate::access::authorize_session(d, caller, req.session_id).await?;
    crate::rollup::catch_up(d).await?;
    let (tx, rx) = mpsc::channel(4);
    let path = d.db_path.clone();
    let session = req.session_id;
    let limit = if req.limit == 0 { u64::MAX } else { req.limit };
    tokio::task::spawn_blocking(move || {
        let r = crate::store::open_reader(&path)
            .map_err(ApiError::from)
            .and_then(|c| stream_records(&c, session, &kinds, &f, limit, &tx).map_err(ApiError::from));
        if let Err(e) = r {
            let _ = tx.blocking_send(Err(e.into()));
        }
    });
    Ok(rx)
}

/// Interned strings, cached for one query.
#[derive(Default)]
pub struct Strings(HashMap<i64, String>);

impl Strings {
    pub fn get(&mut self, c: &Connection, id: i64) -> rusqlite::Result<String> {
        if let Some(s) = self.0.get(&id) {
            return Ok(s.clone());
        }
        let s = string(c, id)?;
        self.0.insert(id, s.clone());
        Ok(s)
    }
}

/// CUpti_ActivitySynchronizationType as a name.
pub fn sync_type_name(t: i64) -> &'static str {
    match t {
        1 => "event",
        2 => "stream_wait_event",
        3 => "stream",
        4 => "context",
        _ => "unknown",
    }
}

fn stream_records(
    c: &Connection,
    session: u64,
    kinds: &[&str],
    f: &pb::RecordFilter,
    limit: u64,
    tx: &mpsc::Sender<Result<pb::QueryRecordsResponse, tonic::Status>>,
) -> rusqlite::Result<()> {
    let mut strings = Strings::default();
    let mut left = limit;
    let mut msg = pb::QueryRecordsResponse::default();
    let mut in_msg = 0usize;
    // Sends the message when full (or `force`); false when the client went away.
    let flush = |msg: &mut pb::QueryRecordsResponse, in_msg: &mut usize, force: bool| -> bool {
        if *in_msg == 0 || (!force && *in_msg < ROWS_PER_MESSAGE) {
            return true;
        }
        *in_msg = 0;
        tx.blocking_send(Ok(std::mem::take(msg))).is_ok()
    };
    for kind in kinds {
        if left == 0 {
            break;
        }
        let w = where_for(c, kind, session, f)?;
        let cols = match *kind {
            "kernel" => "t.dev, t.stream, t.corr, t.name, t.gx, t.gy, t.gz, t.bx, t.by, t.bz, t.regs, t.ssmem, t.dsmem",
            "memcpy" => "t.dev, t.stream, t.corr, t.bytes, t.kind, 0, 0, 0, 0, 0, 0, 0, 0",
            "memset" => "t.dev, t.stream, t.corr, t.bytes, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            "api" => "t.tid, t.corr, t.domain, t.cbid, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            "sync" => "t.stream, t.corr, t.type, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0",
            _ => "t.tid, t.name, t.domain, t.is_mark, 0, 0, 0, 0, 0, 0, 0, 0, 0",
        };
        let mut stmt = c.prepare(&format!(
            "SELECT t.proc, t.start + p.base_ns, t.dur, {cols} FROM {kind} t JOIN processes p ON p.id = t.proc
             WHERE {} ORDER BY t.rowid",
            w.sql
        ))?;
        let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
        while let Some(r) = rows.next()? {
            let proc = r.get::<_, i64>(0)? as u64;
            let start = r.get::<_, i64>(1)?.max(0) as u64;
            let end = start + r.get::<_, i64>(2)?.max(0) as u64;
            let v = |i: usize| -> rusqlite::Result<i64> { r.get::<_, i64>(3 + i) };
            let u = |i: usize| -> rusqlite::Result<u32> { Ok(v(i)? as u32) };
            match *kind {
                "kernel" => msg.kernels.push(pb::KernelRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    device_id: u(0)?,
                    stream_id: u(1)?,
                    correlation_id: u(2)?,
                    name: strings.get(c, v(3)?)?,
                    grid_x: u(4)?,
                    grid_y: u(5)?,
                    grid_z: u(6)?,
                    block_x: u(7)?,
                    block_y: u(8)?,
                    block_z: u(9)?,
                    registers_per_thread: u(10)?,
                    static_shared_bytes: u(11)?,
                    dynamic_shared_bytes: u(12)?,
                }),
                "memcpy" => msg.memcpys.push(pb::MemcpyRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    device_id: u(0)?,
                    stream_id: u(1)?,
                    correlation_id: u(2)?,
                    bytes: v(3)?.max(0) as u64,
                    direction: copy_kind_name(v(4)?),
                }),
                "memset" => msg.memsets.push(pb::MemsetRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    device_id: u(0)?,
                    stream_id: u(1)?,
                    correlation_id: u(2)?,
                    bytes: v(3)?.max(0) as u64,
                }),
                "api" => msg.api_calls.push(pb::ApiRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    thread_id: u(0)?,
                    correlation_id: u(1)?,
                    domain: crate::cbid::domain_name(v(2)?).into(),
                    name: crate::cbid::name(v(2)?, v(3)?),
                    cbid: u(3)?,
                }),
                "sync" => msg.syncs.push(pb::SyncRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    stream_id: u(0)?,
                    correlation_id: u(1)?,
                    sync_type: sync_type_name(v(2)?).into(),
                }),
                _ => msg.markers.push(pb::MarkerRow {
                    process_id: proc,
                    start_ns: start,
                    end_ns: end,
                    thread_id: u(0)?,
                    name: strings.get(c, v(1)?)?,
                    domain: strings.get(c, v(2)?)?,
                    is_mark: v(3)? != 0,
                }),
            }
            in_msg += 1;
            left -= 1;
            if !flush(&mut msg, &mut in_msg, false) {
                return Ok(());
            }
            if left == 0 {
                break;
            }
        }
    }
    flush(&mut msg, &mut in_msg, true);
    Ok(())
}

/// ListDevices: the GPUs this daemon manages (found by the driver, in PCI order, which is
/// the daemon-wide index that samplers and reservations use), completed with what agents
/// reported about them; then GPUs only agents reported (e.g. in containers without the
/// driver's /proc view), numbered after those.
pub async fn list_devices(d: &Daemon) -> ApiResult<pb::ListDevicesResponse> {
    let path = d.db_path.clone();
    let reported = tokio::task::spawn_blocking(move || -> ApiResult<Vec<(pb::Device, String)>> {
        let c = crate::store::open_reader(&path)?;
        let mut stmt = c.prepare(
            "SELECT uuid, name, compute_major, compute_minor, sm_count, global_memory_bytes, pci_bus_id
             FROM devices ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                pb::Device {
                    index: 0,
                    uuid: r.get(0)?,
                    name: r.get(1)?,
                    compute_major: r.get(2)?,
                    compute_minor: r.get(3)?,
                    sm_count: r.get(4)?,
                    global_memory_bytes: r.get::<_, i64>(5)?.max(0) as u64,
                    monitor_state: String::new(),
                },
                r.get::<_, String>(6)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    })
    .await??;
    let same = |a: &str, b: &str| !a.is_empty() && a.eq_ignore_ascii_case(b);
    let mut used = vec![false; reported.len()];
    let mut devices = Vec::new();
    for g in &d.gpus.found {
        let mut dev = pb::Device {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.model.clone(),
            monitor_state: d.arbiter.monitor_state(g.index),
            ..Default::default()
        };
        if let Some(i) = reported.iter().position(|(r, bus)| same(&r.uuid, &g.uuid) || same(bus, &g.pci_bus_id)) {
            used[i] = true;
            let r = &reported[i].0;
            dev.compute_major = r.compute_major;
            dev.compute_minor = r.compute_minor;
            dev.sm_count = r.sm_count;
            dev.global_memory_bytes = r.global_memory_bytes;
            if dev.name.is_empty() {
                dev.name = r.name.clone();
            }
        }
        devices.push(dev);
    }
    let mut next = d.gpus.found.iter().map(|g| g.index + 1).max().unwrap_or(0);
    for (i, (r, _)) in reported.into_iter().enumerate() {
        if used[i] {
            continue;
        }
        devices.push(pb::Device { index: next, monitor_state: "unmanaged".into(), ..r });
        next += 1;
    }
    Ok(pb::ListDevicesResponse { devices })
}

/// ListProcesses: connected agents (and, if asked, past connections). Users other than
/// root and the admin group see their own processes only.
pub async fn list_processes(
    d: &Daemon,
    caller: &Caller,
    req: pb::ListProcessesRequest,
) -> ApiResult<pb::ListProcessesResponse> {
    let mut processes: Vec<pb::Process> = d
        .registry
        .all()
        .into_iter()
        .filter(|a| caller.may_access(a.uid))
        .map(|a| pb::Process {
            id: a.id,
            pid: a.pid,
            uid: a.uid,
            exe: a.exe.clone(),
            cmdline: a.cmdline.clone(),
            cgroup: a.cgroup.clone(),
            agent_kind: a.kind.to_string(),
            connected_at_ns: a.connected_at_ns,
            disconnected_at_ns: 0,
            trace_state: a.trace_state(),
            cupti_version: a.cupti_version,
        })
        .collect();
    if req.include_exited {
        let path = d.db_path.clone();
        let (admin, uid) = (caller.admin, caller.uid);
        let past = tokio::task::spawn_blocking(move || -> ApiResult<Vec<pb::Process>> {
            let c = crate::store::open_reader(&path)?;
            let mut stmt = c.prepare(
                "SELECT id, pid, uid, exe, cmdline, cgroup, agent_kind, connected_ns, disconnected_ns, cupti_version
                 FROM processes WHERE disconnected_ns IS NOT NULL AND (?1 OR uid = ?2)
                 ORDER BY id DESC LIMIT 1000",
            )?;
            let rows = stmt.query_map(rusqlite::params![admin, uid], |r| {
                let cmdline: String = r.get(4)?;
                Ok(pb::Process {
                    id: r.get::<_, i64>(0)? as u64,
                    pid: r.get(1)?,
                    uid: r.get(2)?,
                    exe: r.get(3)?,
                    cmdline: serde_json::from_str(&cmdline).unwrap_or_default(),
                    cgroup: r.get(5)?,
                    agent_kind: r.get(6)?,
                    connected_at_ns: r.get::<_, i64>(7)?.max(0) as u64,
                    disconnected_at_ns: r.get::<_, i64>(8)?.max(0) as u64,
                    trace_state: "exited".into(),
                    cupti_version: r.get(9)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await??;
        let live: std::collections::HashSet<u64> = processes.iter().map(|p| p.id).collect();
        processes.extend(past.into_iter().filter(|p| !live.contains(&p.id)));
        processes.sort_by_key(|p| p.id);
    }
    Ok(pb::ListProcessesResponse { processes })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_sweep_over_sorted_intervals() {
        let mut sw = Sweep::default();
        for (d, s, e) in [(0, 0, 5), (0, 10, 20), (0, 15, 30), (0, 40, 41), (1, 5, 6)] {
            sw.push(d, s, e);
        }
        let v = sw.finish();
        assert_eq!((v[0].device_id, v[0].busy_ns, v[0].span_ns), (0, 5 + 20 + 1, 41));
        assert_eq!((v[1].device_id, v[1].busy_ns, v[1].span_ns), (1, 1, 1));
        assert!(Sweep::default().finish().is_empty());
    }

    #[test]
    fn name_stats() {
        let mut st = NameStats::default();
        for d in 1..=100 {
            st.add(d);
        }
        let k = st.into_stat("k".into());
        assert_eq!((k.count, k.total_ns, k.min_ns, k.max_ns, k.p50_ns, k.p95_ns), (100, 5050, 1, 100, 50, 95));
    }
}
