//! GetSummary's body: from the rollups ([`super::rollups`]) when the filter allows, else by
//! scanning the session's rows (a time range needs the rows themselves).

use std::collections::{BTreeMap, HashMap};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, params_from_iter};

use crate::error::ApiResult;

use super::filter::needs_scan;
use super::{copy_kind_name, names, rollups, string, where_for};

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
            out.top_kernels.push(st.into_stat(names(c, name)?));
        }
    } else {
        let (count, total, stats) = rollups::top_kernels(c, session, f, top)?;
        out.kernel_count = count;
        out.kernel_total_ns = total;
        out.top_kernels = stats;
    }
    out.collectives = collectives(c, session, f)?;
    if needs_scan(f) {
        out.copies = copies(c, session, f)?;
        out.api_calls = api_calls(c, session, f, top)?;
    } else {
        out.copies = rollups::copies(c, session, f)?;
        out.api_calls = rollups::api_calls(c, session, f, top)?;
    }
    // The busy rollup is per device only; other filters need the rows.
    if needs_scan(f) || !f.process_ids.is_empty() || !f.stream_ids.is_empty() || !f.name_pattern.is_empty() {
        out.device_busy = device_busy(c, session, f)?;
    } else {
        out.device_busy = rollups::device_busy(c, session, f)?;
    }
    Ok(out)
}

/// Kernels per name and launch shape, from the rows: each a KernelStat named
/// "NAME [grid X×Y×Z, block X×Y×Z]", with the exact standard deviation; longest total first.
pub fn kernels_by_shape(c: &Connection, session: u64, f: &pb::RecordFilter) -> ApiResult<Vec<pb::KernelStat>> {
    let w = where_for(c, "kernel", session, f)?;
    let mut per: HashMap<(i64, [i64; 6]), NameStats> = HashMap::new();
    let mut stmt =
        c.prepare(&format!("SELECT t.name, t.dur, t.gx, t.gy, t.gz, t.bx, t.by, t.bz FROM kernel t WHERE {}", w.sql))?;
    let mut rows = stmt.query(params_from_iter(w.params.iter()))?;
    while let Some(r) = rows.next()? {
        let shape = [r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?];
        per.entry((r.get(0)?, shape)).or_default().add(r.get::<_, i64>(1)?.max(0));
    }
    let mut out = Vec::with_capacity(per.len());
    for ((name, [gx, gy, gz, bx, by, bz]), st) in per {
        let (n, m) = names(c, name)?;
        out.push(st.into_stat((format!("{n} [grid {gx}×{gy}×{gz}, block {bx}×{by}×{bz}]"), m)));
    }
    out.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.name.cmp(&b.name)));
    Ok(out)
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

/// NCCL collectives per name, most time in the kernel first (the session's rows, read by
/// rowid range: one per collective and rank).
fn collectives(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Vec<pb::CollectiveStat>> {
    let w = where_for(c, "collective", session, f)?;
    let mut stmt = c.prepare(&format!(
        "SELECT t.name, count(*), sum(t.bytes), sum(max(t.gpu_dur, 0)) FROM collective t WHERE {}
         GROUP BY t.name ORDER BY sum(max(t.gpu_dur, 0)) DESC, count(*) DESC",
        w.sql
    ))?;
    let rows: Vec<(i64, i64, i64, i64)> = stmt
        .query_map(params_from_iter(w.params.iter()), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<rusqlite::Result<_>>()?;
    rows.into_iter()
        .map(|(name, n, bytes, total)| {
            Ok(pb::CollectiveStat {
                name: string(c, name)?,
                count: n.max(0) as u64,
                bytes: bytes.max(0) as u64,
                total_ns: total.max(0) as u64,
            })
        })
        .collect()
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
    // A record without a timestamp (0 after a late attach) is not part of the device's time.
    let mut stmt =
        c.prepare(&format!("SELECT dev, s, e FROM ({}) WHERE s > 0 ORDER BY dev, s", parts.join(" UNION ALL ")))?;
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
    /// Sum of the squared durations, for the standard deviation.
    sq: f64,
    min: u64,
    max: u64,
    /// bucket → (count, min, max).
    hist: BTreeMap<i64, (i64, i64, i64)>,
}

impl Default for NameStats {
    fn default() -> Self {
        NameStats { n: 0, total: 0, sq: 0.0, min: u64::MAX, max: 0, hist: BTreeMap::new() }
    }
}

impl NameStats {
    fn add(&mut self, d: i64) {
        self.n += 1;
        self.total += d as u64;
        self.sq += (d as f64) * (d as f64);
        self.min = self.min.min(d as u64);
        self.max = self.max.max(d as u64);
        let h = self.hist.entry(crate::rollup::bucket(d)).or_insert((0, i64::MAX, i64::MIN));
        h.0 += 1;
        h.1 = h.1.min(d);
        h.2 = h.2.max(d);
    }

    fn into_stat(self, (name, mangled_name): (String, String)) -> pb::KernelStat {
        let stddev_ns = if self.n < 2 {
            0.0
        } else {
            let (n, sum) = (self.n as f64, self.total as f64);
            ((self.sq - sum * sum / n).max(0.0) / (n - 1.0)).sqrt()
        };
        let hist: Vec<(i64, i64, i64)> = self.hist.into_values().collect();
        pb::KernelStat {
            name,
            mangled_name,
            count: self.n,
            total_ns: self.total,
            mean_ns: self.total.checked_div(self.n).unwrap_or(0),
            p50_ns: rollups::quantile(&hist, self.n, 0.5),
            p95_ns: rollups::quantile(&hist, self.n, 0.95),
            max_ns: self.max,
            min_ns: if self.n == 0 { 0 } else { self.min },
            stddev_ns,
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
        let k = st.into_stat(("k".into(), String::new()));
        assert_eq!((k.count, k.total_ns, k.min_ns, k.max_ns, k.p50_ns, k.p95_ns), (100, 5050, 1, 100, 50, 95));
        // 1..=100: sample standard deviation sqrt(841.67).
        assert!((k.stddev_ns - 29.011_491).abs() < 1e-5, "{}", k.stddev_ns);
    }
}
