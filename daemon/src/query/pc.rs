//! A session's PC samples: read once from `pc_sample` (rows aggregated per process, function,
//! PC and stall reason, so a session has thousands, not millions) and grouped here for
//! `QueryPcSamples` and the pprof export.

use std::collections::HashMap;

use gpuprof_proto::api as pb;
use rusqlite::Connection;

use super::Reads;
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

/// Largest `limit` accepted by QueryPcSamples.
pub const MAX_PC_ROWS: u32 = 10_000;

/// One (function, PC, stall reason) of a session, summed over its processes.
#[derive(Debug, Clone)]
pub struct PcRow {
    /// strings.id of the function name.
    pub function: i64,
    /// Demangled (or as reported when not a mangled symbol).
    pub name: String,
    /// As CUPTI reported it.
    pub mangled: String,
    pub pc: u64,
    /// As CUPTI reported it.
    pub stall: String,
    pub count: u64,
    pub file: String,
    pub line: u32,
}

/// The PC sample rows of `session` whose function matches `kernel` (a glob on the demangled
/// or the reported name; empty: all), summed over processes.
pub fn pc_rows(c: &Connection, session: u64, kernel: &str) -> rusqlite::Result<Vec<PcRow>> {
    pc_rows_of(c, session, &[], kernel)
}

/// Like [`pc_rows`], of the processes `procs` only (empty: all of the session's).
pub fn pc_rows_of(c: &Connection, session: u64, procs: &[u64], kernel: &str) -> rusqlite::Result<Vec<PcRow>> {
    let only = if procs.is_empty() {
        String::new()
    } else {
        let ids: Vec<String> = procs.iter().map(u64::to_string).collect();
        format!(" AND p.proc IN ({})", ids.join(","))
    };
    let mut stmt = c.prepare_cached(&format!(
        "SELECT p.function, COALESCE(f.demangled, f.value, ''), COALESCE(f.value, ''), p.pc,
                COALESCE(s.value, ''), sum(p.count), COALESCE(fl.value, ''), max(p.line)
         FROM pc_sample p
         LEFT JOIN strings f ON f.id = p.function
         LEFT JOIN strings s ON s.id = p.stall
         LEFT JOIN strings fl ON fl.id = p.file
         WHERE p.session = ?1{only}
         GROUP BY p.function, p.pc, p.stall"
    ))?;
    let rows = stmt.query_map([session as i64], |r| {
        Ok(PcRow {
            function: r.get(0)?,
            name: r.get(1)?,
            mangled: r.get(2)?,
            pc: r.get::<_, i64>(3)? as u64,
            stall: r.get(4)?,
            count: r.get::<_, i64>(5)? as u64,
            file: r.get(6)?,
            line: r.get::<_, i64>(7)? as u32,
        })
    })?;
    let mut out = Vec::new();
    for r in rows {
        let r = r?;
        if r.named(kernel) {
            out.push(r);
        }
    }
    Ok(out)
}

impl PcRow {
    /// Whether its function matches `kernel`, a glob on the demangled or the reported name
    /// (empty: any).
    fn named(&self, kernel: &str) -> bool {
        kernel.is_empty()
            || gpuprof_proto::glob::matches(kernel, &self.name)
            || gpuprof_proto::glob::matches(kernel, &self.mangled)
    }
}

/// A glob argument of QueryPcSamples (`field`), checked unless empty.
pub fn check_glob(field: &'static str, g: &str) -> ApiResult<()> {
    match gpuprof_proto::glob::check(g) {
        Err(e) if !g.is_empty() => Err(ApiError::invalid(field, format!("{g:?}: {e}"))),
        _ => Ok(()),
    }
}

/// Which processes of the always-on profile a query covers.
#[derive(Debug, Clone, Default)]
pub struct NodeFilter {
    /// Glob on the pod's name, namespace/name or UID (empty: any).
    pub pod: String,
    /// Glob on the executable's path or base name (empty: any).
    pub exe: String,
    /// Only processes of this user (None: every user's).
    pub uid: Option<u32>,
}

impl NodeFilter {
    fn matches(&self, uid: u32, exe: &str, pod: (&str, &str, &str)) -> bool {
        use gpuprof_proto::glob::matches;
        let base = exe.rsplit('/').next().unwrap_or(exe);
        let (name, ns, pod_uid) = pod;
        self.uid.is_none_or(|u| u == uid)
            && (self.exe.is_empty() || matches(&self.exe, exe) || matches(&self.exe, base))
            && (self.pod.is_empty()
                || (!name.is_empty() && (matches(&self.pod, name) || matches(&self.pod, &format!("{ns}/{name}"))))
                || (!pod_uid.is_empty() && matches(&self.pod, pod_uid)))
    }
}

/// The always-on profile's samples from minute `since_s` (s since the Unix epoch) on, of the
/// processes `f` covers, whose function matches `kernel`, summed per (function, line, stall
/// reason); PC offsets are not kept there (0). Also returns the samples those processes lost
/// (while PC-sampled, in any session).
pub fn node_rows(c: &Connection, since_s: i64, f: &NodeFilter, kernel: &str) -> rusqlite::Result<(Vec<PcRow>, u64)> {
    node_rows_until(c, since_s, i64::MAX, f, kernel)
}

/// Like [`node_rows`], of the minutes before `until_s` only.
pub fn node_rows_until(
    c: &Connection,
    since_s: i64,
    until_s: i64,
    f: &NodeFilter,
    kernel: &str,
) -> rusqlite::Result<(Vec<PcRow>, u64)> {
    // The processes first (few), then their rollups.
    let mut procs = Vec::new();
    {
        let mut stmt = c.prepare_cached(
            "SELECT DISTINCT p.id, p.uid, p.exe, p.pod_name, p.pod_namespace, p.pod_uid
             FROM processes p WHERE p.id IN (SELECT DISTINCT proc FROM pc_rollup WHERE minute >= ?1 AND minute < ?2)",
        )?;
        let rows = stmt.query_map([since_s, until_s], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)? as u32,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
                r.get::<_, String>(5)?,
            ))
        })?;
        for r in rows {
            let (id, uid, exe, name, ns, pod_uid) = r?;
            if f.matches(uid, &exe, (&name, &ns, &pod_uid)) {
                procs.push(id);
            }
        }
    }
    let mut stmt = c.prepare_cached(
        "SELECT p.function, COALESCE(f.demangled, f.value, ''), COALESCE(f.value, ''),
                COALESCE(s.value, ''), sum(p.count), COALESCE(fl.value, ''), p.line
         FROM pc_rollup p
         LEFT JOIN strings f ON f.id = p.function
         LEFT JOIN strings s ON s.id = p.stall
         LEFT JOIN strings fl ON fl.id = p.file
         WHERE p.minute >= ?1 AND p.minute < ?3 AND p.proc = ?2
         GROUP BY p.function, p.file, p.line, p.stall",
    )?;
    let mut sums: HashMap<(i64, String, u32, String), PcRow> = HashMap::new();
    for proc in &procs {
        let rows = stmt.query_map([since_s, *proc, until_s], |r| {
            Ok(PcRow {
                function: r.get(0)?,
                name: r.get(1)?,
                mangled: r.get(2)?,
                pc: 0,
                stall: r.get(3)?,
                count: r.get::<_, i64>(4)? as u64,
                file: r.get(5)?,
                line: r.get::<_, i64>(6)? as u32,
            })
        })?;
        for r in rows {
            let r = r?;
            if !r.named(kernel) {
                continue;
            }
            sums.entry((r.function, r.file.clone(), r.line, r.stall.clone()))
                .and_modify(|e| e.count += r.count)
                .or_insert(r);
        }
    }
    let mut dropped = 0u64;
    let mut lost = c.prepare_cached("SELECT coalesce(sum(dropped), 0) FROM pc_sampling WHERE proc = ?1")?;
    for proc in &procs {
        dropped += lost.query_row([*proc], |r| r.get::<_, i64>(0))?.max(0) as u64;
    }
    Ok((sums.into_values().collect(), dropped))
}

/// Samples the session's processes lost (hardware buffer full).
pub fn pc_dropped(c: &Connection, session: u64) -> rusqlite::Result<u64> {
    let n: i64 =
        c.query_row("SELECT coalesce(sum(dropped), 0) FROM pc_sampling WHERE session = ?1", [session as i64], |r| {
            r.get(0)
        })?;
    Ok(n.max(0) as u64)
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Group {
    Function(i64),
    Line(i64, String, u32),
    Stall(String),
    Pc(i64, u64),
}

/// A group under construction: its row, samples per stall reason, per source line.
type Acc<'a> = (pb::PcProfileRow, HashMap<&'a str, u64>, HashMap<(&'a str, u32), u64>);

/// Groups rows (already filtered) into at most `limit` rows, hottest first; returns the rows
/// and how many there were without the limit. Function rows carry the function's hottest
/// source line.
pub fn group(rows: &[PcRow], by: pb::PcGroupBy, limit: usize) -> (Vec<pb::PcProfileRow>, u64) {
    let mut groups: HashMap<Group, Acc<'_>> = HashMap::new();
    for r in rows {
        let key = match by {
            pb::PcGroupBy::Unspecified | pb::PcGroupBy::Function => Group::Function(r.function),
            pb::PcGroupBy::Line => Group::Line(r.function, r.file.clone(), r.line),
            pb::PcGroupBy::Stall => Group::Stall(r.stall.clone()),
            pb::PcGroupBy::Pc => Group::Pc(r.function, r.pc),
        };
        let e = groups.entry(key.clone()).or_insert_with(|| {
            let mut row = pb::PcProfileRow::default();
            match &key {
                Group::Stall(s) => row.stall_reason = s.clone(),
                _ => {
                    row.function_name = r.name.clone();
                    row.mangled_name = r.mangled.clone();
                }
            }
            if matches!(key, Group::Line(..) | Group::Pc(..)) {
                row.file = r.file.clone();
                row.line = r.line;
            }
            if matches!(key, Group::Pc(..)) {
                row.pc_offset = r.pc;
            }
            (row, HashMap::new(), HashMap::new())
        });
        e.0.samples += r.count;
        *e.1.entry(r.stall.as_str()).or_default() += r.count;
        if matches!(key, Group::Function(_)) && !r.file.is_empty() {
            *e.2.entry((r.file.as_str(), r.line)).or_default() += r.count;
        }
    }
    let total_rows = groups.len() as u64;
    let mut out: Vec<pb::PcProfileRow> = groups
        .into_values()
        .map(|(mut row, stalls, lines)| {
            if let Some(((file, line), _)) = lines.into_iter().max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0))) {
                (row.file, row.line) = (file.to_string(), line);
            }
            let mut s: Vec<pb::StallCount> = stalls
                .into_iter()
                .map(|(reason, count)| pb::StallCount { reason: reason.to_string(), count })
                .collect();
            s.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
            row.stalls = s;
            row
        })
        .collect();
    out.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| a.function_name.cmp(&b.function_name))
            .then_with(|| a.file.cmp(&b.file))
            .then_with(|| a.line.cmp(&b.line))
            .then_with(|| a.pc_offset.cmp(&b.pc_offset))
            .then_with(|| a.stall_reason.cmp(&b.stall_reason))
    });
    out.truncate(limit);
    (out, total_rows)
}

/// A request's row limit (0: 20), at most [`MAX_PC_ROWS`].
pub(crate) fn row_limit(limit: u32) -> ApiResult<usize> {
    match limit {
        0 => Ok(20),
        n if n > MAX_PC_ROWS => Err(ApiError::invalid("limit", format!("{n} is above the maximum of {MAX_PC_ROWS}"))),
        n => Ok(n as usize),
    }
}

/// QueryPcSamples.
pub async fn query_pc_samples(
    d: Reads<'_>,
    caller: &Caller,
    req: pb::QueryPcSamplesRequest,
) -> ApiResult<pb::QueryPcSamplesResponse> {
    let limit = row_limit(req.limit)?;
    let by = pb::PcGroupBy::try_from(req.group_by).map_err(|_| {
        ApiError::invalid("group_by", format!("{} is not a grouping (function, line, stall, pc)", req.group_by))
    })?;
    check_glob("kernel", &req.kernel)?;
    if req.since_ns > 0 || !req.pod.is_empty() || !req.exe.is_empty() {
        return query_node(d, caller, req, by, limit).await;
    }
    d.authorize(caller, req.session_id).await?;
    let path = d.db_path.to_path_buf();
    tokio::task::spawn_blocking(move || -> ApiResult<pb::QueryPcSamplesResponse> {
        let c = crate::store::open_reader(&path)?;
        let rows = pc_rows(&c, req.session_id, &req.kernel)?;
        let total_samples = rows.iter().map(|r| r.count).sum();
        let (rows, total_rows) = group(&rows, by, limit);
        Ok(pb::QueryPcSamplesResponse {
            rows,
            total_samples,
            dropped_samples: pc_dropped(&c, req.session_id)?,
            total_rows,
        })
    })
    .await?
}

/// QueryPcSamples of the node's always-on profile (`since_ns` set).
async fn query_node(
    d: Reads<'_>,
    caller: &Caller,
    req: pb::QueryPcSamplesRequest,
    by: pb::PcGroupBy,
    limit: usize,
) -> ApiResult<pb::QueryPcSamplesResponse> {
    if req.session_id != 0 {
        return Err(ApiError::invalid(
            "since_ns",
            "since_ns, pod and exe query the node's always-on profile; leave session_id 0 (or drop them to query the session)",
        ));
    }
    if req.since_ns == 0 {
        return Err(ApiError::invalid("since_ns", "pod and exe need since_ns: the start of the period to query"));
    }
    let now = crate::clock::now_ns();
    if req.since_ns > now {
        return Err(ApiError::invalid("since_ns", "in the future (it is ns since the Unix epoch)"));
    }
    check_glob("pod", &req.pod)?;
    check_glob("exe", &req.exe)?;
    caller.require_authenticated()?;
    let f = NodeFilter {
        pod: req.pod.clone(),
        exe: req.exe.clone(),
        // Administrators see every process; others their own (as with sessions).
        uid: (!caller.admin).then_some(caller.uid),
    };
    let since_s = (req.since_ns / 1_000_000_000 / 60 * 60) as i64;
    // Rollups are written by the writer: what it holds goes first.
    let _ = d.writer.flush().await;
    let path = d.db_path.to_path_buf();
    tokio::task::spawn_blocking(move || -> ApiResult<pb::QueryPcSamplesResponse> {
        let c = crate::store::open_reader(&path)?;
        let (rows, dropped_samples) = node_rows(&c, since_s, &f, &req.kernel)?;
        let total_samples = rows.iter().map(|r| r.count).sum();
        let (rows, total_rows) = group(&rows, by, limit);
        Ok(pb::QueryPcSamplesResponse { rows, total_samples, dropped_samples, total_rows })
    })
    .await?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(function: i64, pc: u64, stall: &str, count: u64, line: u32) -> PcRow {
        PcRow {
            function,
            name: format!("k{function}"),
            mangled: format!("_Z2k{function}v"),
            pc,
            stall: stall.into(),
            count,
            file: if line > 0 { "k.cu".into() } else { String::new() },
            line,
        }
    }

    #[test]
    fn grouping_sums_and_orders_hottest_first() {
        let rows = [
            row(1, 0x10, "stalled_barrier", 5, 7),
            row(1, 0x10, "stalled_long_scoreboard", 20, 7),
            row(1, 0x20, "stalled_long_scoreboard", 1, 9),
            row(2, 0x10, "selected", 30, 0),
        ];
        let (f, n) = group(&rows, pb::PcGroupBy::Function, 10);
        assert_eq!(n, 2);
        assert_eq!((f[0].function_name.as_str(), f[0].samples), ("k2", 30));
        assert_eq!((f[1].function_name.as_str(), f[1].samples), ("k1", 26));
        assert_eq!(f[1].stalls[0], pb::StallCount { reason: "stalled_long_scoreboard".into(), count: 21 });
        assert_eq!((f[1].file.as_str(), f[1].line), ("k.cu", 7), "the function's hottest line");
        assert_eq!((f[0].file.as_str(), f[0].line), ("", 0));
        let (l, _) = group(&rows, pb::PcGroupBy::Line, 10);
        assert_eq!(l.iter().map(|r| (r.line, r.samples)).collect::<Vec<_>>(), [(0, 30), (7, 25), (9, 1)]);
        let (s, _) = group(&rows, pb::PcGroupBy::Stall, 10);
        assert_eq!(s[0].stall_reason, "selected");
        assert_eq!((s[1].stall_reason.as_str(), s[1].samples), ("stalled_long_scoreboard", 21));
        assert!(s[1].function_name.is_empty());
        let (p, n) = group(&rows, pb::PcGroupBy::Pc, 2);
        assert_eq!(n, 3);
        assert_eq!(p.len(), 2);
        assert_eq!((p[1].pc_offset, p[1].samples, p[1].file.as_str()), (0x10, 25, "k.cu"));
    }
}
