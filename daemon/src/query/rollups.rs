//! Summaries read from the rollups (the one place they are read): records per session and
//! table, a session's rowid range, top kernels, copies, API calls and device busy time. The
//! rollup tables are written by [`crate::rollup`].

use std::collections::{BTreeMap, HashMap};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::{copy_kind_name, names};

/// Records stored for a session, per process (as far as the last pass).
pub fn session_counts(c: &Connection, session: u64) -> rusqlite::Result<HashMap<u64, u64>> {
    let mut stmt = c.prepare_cached("SELECT proc, sum(n) FROM session_rows WHERE session = ?1 GROUP BY proc")?;
    let rows = stmt.query_map([session as i64], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)))?;
    rows.collect()
}

/// Records of a session in one table, as far as the last pass.
pub fn table_count(c: &Connection, table: &str, session: u64) -> rusqlite::Result<u64> {
    let n: Option<i64> = c
        .prepare_cached("SELECT sum(n) FROM session_rows WHERE session = ?1 AND tbl = ?2")?
        .query_row(params![session as i64, table], |r| r.get(0))?;
    Ok(n.unwrap_or(0) as u64)
}

/// The rowid range holding `session`'s rows of `table`. Open sessions extend to the end of
/// the table (rows after the last pass may be theirs).
pub fn rowid_range(c: &Connection, table: &str, session: u64) -> rusqlite::Result<(i64, i64)> {
    let (first, last): (Option<i64>, Option<i64>) = c
        .prepare_cached("SELECT min(first_rowid), max(last_rowid) FROM session_rows WHERE session = ?1 AND tbl = ?2")?
        .query_row(params![session as i64, table], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let open: bool = c
        .prepare_cached("SELECT state IN ('pending', 'active', 'stopping') FROM sessions WHERE id = ?1")?
        .query_row([session as i64], |r| r.get(0))
        .optional()?
        .unwrap_or(false);
    let progress: i64 = c
        .prepare_cached("SELECT last_rowid FROM rollup_progress WHERE tbl = ?1")?
        .query_row([table], |r| r.get(0))
        .optional()?
        .unwrap_or(0);
    let lo = first.unwrap_or(progress + 1);
    let hi = if open { i64::MAX } else { last.unwrap_or(0) };
    Ok((lo, hi))
}

/// Filter conditions on a rollup table (alias `t`) with proc/dev/stream/name columns as given.
fn rollup_where(
    session: u64,
    f: &pb::RecordFilter,
    dev: bool,
    stream: bool,
    name: bool,
) -> (String, Vec<rusqlite::types::Value>) {
    use rusqlite::types::Value;
    let mut sql = "t.session = ?".to_string();
    let mut p = vec![Value::Integer(session as i64)];
    let mut list = |col: &str, vals: Vec<i64>| {
        if !vals.is_empty() {
            sql.push_str(&format!(" AND {col} IN ({})", vec!["?"; vals.len()].join(",")));
            p.extend(vals.into_iter().map(Value::Integer));
        }
    };
    list("t.proc", f.process_ids.iter().map(|x| *x as i64).collect());
    if dev {
        list("t.dev", f.device_ids.iter().map(|x| i64::from(*x)).collect());
    }
    if stream {
        list("t.stream", f.stream_ids.iter().map(|x| i64::from(*x)).collect());
    }
    if name && !f.name_pattern.is_empty() {
        sql.push_str(&format!(" AND t.name IN (SELECT id FROM strings WHERE {})", super::NAME_GLOB));
        p.push(Value::Text(f.name_pattern.clone()));
        p.push(Value::Text(f.name_pattern.clone()));
    }
    (sql, p)
}

/// Kernel count and the `top` kernels by total time, from the rollup: one pass over the
/// session's rollup rows (per name and bucket where the filter allows, else per process,
/// device, stream too), summed per name and per (name, bucket) here.
pub fn top_kernels(
    c: &Connection,
    session: u64,
    f: &pb::RecordFilter,
    top: usize,
) -> rusqlite::Result<(u64, u64, Vec<pb::KernelStat>)> {
    /// One name's sums: count, total, min, max, and (count, min, max, total) per bucket.
    struct Agg {
        n: i64,
        total: i64,
        min: i64,
        max: i64,
        hist: BTreeMap<i64, (i64, i64, i64, i64)>,
    }
    let (w, p) = rollup_where(session, f, true, true, true);
    // Without process, device or stream filters the per-name rollup has the same sums in far
    // fewer rows.
    let table = if f.process_ids.is_empty() && f.device_ids.is_empty() && f.stream_ids.is_empty() {
        "kernel_name_rollup"
    } else {
        "kernel_rollup"
    };
    let mut stmt =
        c.prepare(&format!("SELECT t.name, t.bucket, t.n, t.total, t.min, t.max FROM {table} t WHERE {w}"))?;
    let mut rows = stmt.query(params_from_iter(p.iter()))?;
    let (mut count, mut sum) = (0i64, 0i64);
    let mut per: HashMap<i64, Agg> = HashMap::new();
    while let Some(r) = rows.next()? {
        let (name, bucket, n, total, min, max): (i64, i64, i64, i64, i64, i64) =
            (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?);
        count += n;
        sum += total;
        let a = per.entry(name).or_insert(Agg { n: 0, total: 0, min: i64::MAX, max: i64::MIN, hist: BTreeMap::new() });
        a.n += n;
        a.total += total;
        a.min = a.min.min(min);
        a.max = a.max.max(max);
        let h = a.hist.entry(bucket).or_insert((0, i64::MAX, i64::MIN, 0));
        h.0 += n;
        h.1 = h.1.min(min);
        h.2 = h.2.max(max);
        h.3 += total;
    }
    let mut heads: Vec<(i64, Agg)> = per.into_iter().collect();
    heads.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(&b.0)));
    heads.truncate(top);
    let mut out = Vec::with_capacity(heads.len());
    for (name, a) in heads {
        let buckets: Vec<(i64, i64, i64, i64)> = a.hist.into_values().collect();
        let hist: Vec<(i64, i64, i64)> = buckets.iter().map(|&(n, min, max, _)| (n, min, max)).collect();
        let n = a.n.max(0) as u64;
        let total = a.total.max(0) as u64;
        let (name, mangled_name) = names(c, name)?;
        out.push(pb::KernelStat {
            name,
            mangled_name,
            count: n,
            total_ns: total,
            mean_ns: total.checked_div(n).unwrap_or(0),
            p50_ns: quantile(&hist, n, 0.5),
            p95_ns: quantile(&hist, n, 0.95),
            max_ns: a.max.max(0) as u64,
            min_ns: a.min.max(0) as u64,
            stddev_ns: bucket_stddev(&buckets),
        });
    }
    Ok((count.max(0) as u64, sum.max(0) as u64, out))
}

/// The nearest-rank quantile from (count, min, max) buckets in order.
pub fn quantile(hist: &[(i64, i64, i64)], n: u64, q: f64) -> u64 {
    if n == 0 {
        return 0;
    }
    let rank = ((q * n as f64).ceil() as i64).clamp(1, n as i64) - 1;
    let mut seen = 0i64;
    for &(cnt, min, max) in hist {
        if rank < seen + cnt {
            let k = rank - seen;
            if cnt <= 1 || min == max {
                return min.max(0) as u64;
            }
            return (min + (max - min) * k / (cnt - 1)).max(0) as u64;
        }
        seen += cnt;
    }
    hist.last().map(|h| h.2.max(0) as u64).unwrap_or(0)
}

/// The standard deviation of durations kept as (count, min, max, total) buckets: the spread
/// of the buckets' means around the overall mean exactly, plus the spread inside each bucket
/// (at most 1/32 of a power of two wide): none for one value, exact for two, uniform between
/// its extremes for more.
pub fn bucket_stddev(buckets: &[(i64, i64, i64, i64)]) -> f64 {
    let n: f64 = buckets.iter().map(|b| b.0 as f64).sum();
    if n < 2.0 {
        return 0.0;
    }
    let mean = buckets.iter().map(|b| b.3 as f64).sum::<f64>() / n;
    let mut sq = 0.0;
    for &(cnt, min, max, total) in buckets {
        if cnt <= 0 {
            continue;
        }
        let (cnt_f, width) = (cnt as f64, (max - min).max(0) as f64);
        let m = total as f64 / cnt_f;
        let inside = match cnt {
            1 => 0.0,
            2 => width * width / 4.0,
            _ => width * width / 12.0,
        };
        sq += cnt_f * ((m - mean) * (m - mean) + inside);
    }
    // The sample standard deviation (n - 1), as for the rows.
    (sq / (n - 1.0)).sqrt()
}

/// Copy totals per direction, from the rollup.
pub fn copies(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Vec<pb::CopyStat>> {
    let (w, p) = rollup_where(session, f, true, true, false);
    let mut stmt = c.prepare(&format!(
        "SELECT t.kind, sum(t.n), sum(t.bytes), sum(t.total) FROM memcpy_rollup t WHERE {w}
         GROUP BY t.kind ORDER BY sum(t.bytes) DESC"
    ))?;
    let rows = stmt.query_map(params_from_iter(p.iter()), |r| {
        let bytes = r.get::<_, i64>(2)?.max(0) as u64;
        let total = r.get::<_, i64>(3)?.max(0) as u64;
        Ok(pb::CopyStat {
            direction: copy_kind_name(r.get(0)?),
            count: r.get::<_, i64>(1)?.max(0) as u64,
            bytes,
            total_ns: total,
            bandwidth_gbps: if total > 0 { bytes as f64 / total as f64 } else { 0.0 },
        })
    })?;
    rows.collect()
}

/// API calls by total time, from the rollup.
pub fn api_calls(c: &Connection, session: u64, f: &pb::RecordFilter, top: usize) -> rusqlite::Result<Vec<pb::ApiStat>> {
    let (w, p) = rollup_where(session, f, false, false, false);
    let mut stmt = c.prepare(&format!(
        "SELECT t.domain, t.cbid, sum(t.n), sum(t.total), max(t.max) FROM api_rollup t WHERE {w}
         GROUP BY t.domain, t.cbid ORDER BY sum(t.total) DESC LIMIT {top}"
    ))?;
    let rows = stmt.query_map(params_from_iter(p.iter()), |r| {
        let domain: i64 = r.get(0)?;
        Ok(pb::ApiStat {
            name: crate::cbid::name(domain, r.get(1)?),
            domain: crate::cbid::domain_name(domain).into(),
            count: r.get::<_, i64>(2)?.max(0) as u64,
            total_ns: r.get::<_, i64>(3)?.max(0) as u64,
            max_ns: r.get::<_, i64>(4)?.max(0) as u64,
        })
    })?;
    rows.collect()
}

/// Busy time per device, from the rollup.
pub fn device_busy(c: &Connection, session: u64, f: &pb::RecordFilter) -> rusqlite::Result<Vec<pb::DeviceBusy>> {
    let mut stmt = c.prepare_cached(
        "SELECT dev, closed_ns + open_end - open_start, last_ns - first_ns FROM busy_rollup WHERE session = ?1 ORDER BY dev",
    )?;
    let rows = stmt.query_map([session as i64], |r| {
        Ok(pb::DeviceBusy {
            device_id: r.get(0)?,
            busy_ns: r.get::<_, i64>(1)?.max(0) as u64,
            span_ns: r.get::<_, i64>(2)?.max(0) as u64,
        })
    })?;
    let all: Vec<pb::DeviceBusy> = rows.collect::<rusqlite::Result<_>>()?;
    Ok(all.into_iter().filter(|d| f.device_ids.is_empty() || f.device_ids.contains(&d.device_id)).collect())
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn stddev_from_buckets() {
        use super::bucket_stddev;
        // Single-value buckets: exact (values 10 and 30: sample sd sqrt(200)).
        assert!((bucket_stddev(&[(1, 10, 10, 10), (1, 30, 30, 30)]) - 200f64.sqrt()).abs() < 1e-9);
        // Two values in one bucket: exact too.
        assert!((bucket_stddev(&[(2, 10, 30, 40)]) - 200f64.sqrt()).abs() < 1e-9);
        assert_eq!(bucket_stddev(&[(5, 7, 7, 35)]), 0.0);
        assert_eq!(bucket_stddev(&[(1, 7, 7, 7)]), 0.0);
    }

    #[test]
    fn quantiles_from_buckets() {
        // 100 values 1..=100, each its own bucket.
        let hist: Vec<(i64, i64, i64)> = (1..=100).map(|v| (1, v, v)).collect();
        assert_eq!(quantile(&hist, 100, 0.5), 50);
        assert_eq!(quantile(&hist, 100, 0.95), 95);
        // One bucket of identical values.
        assert_eq!(quantile(&[(10, 7, 7)], 10, 0.5), 7);
    }
}
