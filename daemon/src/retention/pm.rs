//! PM samples: kept at full rate for `retention.pm_full_rate`, then folded into `pm_rollup`
//! (count, mean, min, max per bucket of `retention.pm_rollup_width`) in small writer steps;
//! the aggregates are kept for `retention.pm_rollup_keep`.

use rusqlite::{Connection, OptionalExtension, params};
use tokio_util::sync::CancellationToken;

use super::Retention;
use super::steps::YIELD;

/// Samples folded per step, in ns of sample time.
const STEP_NS: i64 = 10_000_000_000;

/// One step: folds up to `STEP_NS` of the oldest samples of the first device that has samples
/// older than `cutoff`. Returns false when nothing older than `cutoff` is left.
pub fn rollup_step(c: &mut Connection, cutoff: i64, width: i64) -> rusqlite::Result<bool> {
    let width = width.max(1);
    let tx = c.transaction()?;
    let mut device: Option<i64> =
        tx.query_row("SELECT MIN(device) FROM pm_sample", [], |r| r.get(0)).optional()?.flatten();
    while let Some(dev) = device {
        let lo: Option<i64> =
            tx.query_row("SELECT MIN(ts) FROM pm_sample WHERE device = ?1", [dev], |r| r.get(0)).optional()?.flatten();
        if let Some(lo) = lo.filter(|lo| *lo < cutoff) {
            let lo = lo - lo.rem_euclid(width);
            let step = STEP_NS.max(width) / width * width;
            let hi = (lo + step).min(cutoff - cutoff.rem_euclid(width)).max(lo + width).min(cutoff);
            tx.execute(
                "INSERT INTO pm_rollup(device, bucket_ns, width_ns, metric, n, mean, min, max)
                 SELECT device, (ts / ?4) * ?4, ?4, metric, COUNT(*), AVG(value), MIN(value), MAX(value)
                 FROM pm_sample WHERE device = ?1 AND ts >= ?2 AND ts < ?3
                 GROUP BY 2, metric
                 ON CONFLICT(device, metric, bucket_ns) DO UPDATE SET
                   mean = (pm_rollup.mean * pm_rollup.n + excluded.mean * excluded.n) / (pm_rollup.n + excluded.n),
                   n = pm_rollup.n + excluded.n,
                   min = MIN(pm_rollup.min, excluded.min),
                   max = MAX(pm_rollup.max, excluded.max)",
                params![dev, lo, hi, width],
            )?;
            tx.execute("DELETE FROM pm_sample WHERE device = ?1 AND ts >= ?2 AND ts < ?3", params![dev, lo, hi])?;
            tx.commit()?;
            return Ok(true);
        }
        device = tx
            .query_row("SELECT MIN(device) FROM pm_sample WHERE device > ?1", [dev], |r| r.get(0))
            .optional()?
            .flatten();
    }
    tx.commit()?;
    Ok(false)
}

/// Drops aggregates older than `cutoff`.
pub fn expire_rollups(c: &mut Connection, cutoff: i64) -> rusqlite::Result<usize> {
    c.execute("DELETE FROM pm_rollup WHERE bucket_ns < ?1", [cutoff])
}

/// One PM retention pass; false once the daemon is shutting down.
pub(super) async fn pm_pass(d: &Retention, shutdown: &CancellationToken, width: i64) -> bool {
    let r = &d.retention();
    let now = crate::clock::now_ns() as i64;
    let cutoff = now - r.pm_full_rate.0.as_nanos() as i64;
    let mut steps = 0u64;
    loop {
        if shutdown.is_cancelled() {
            return false;
        }
        match d.writer.call(move |c| rollup_step(c, cutoff, width)).await {
            Ok(Ok(true)) => steps += 1,
            Ok(Ok(false)) => break,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "PM retention step failed");
                break;
            }
            Err(_) => return false,
        }
        // Let queued ingest batches go first.
        tokio::time::sleep(YIELD).await;
    }
    let keep_cutoff = now - r.pm_rollup_keep.0.as_nanos() as i64;
    match d.writer.call(move |c| expire_rollups(c, keep_cutoff)).await {
        Ok(Ok(n)) if n > 0 || steps > 0 => {
            tracing::debug!(steps, expired_rollups = n, "PM retention done")
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "expiring PM rollups failed"),
        _ => {}
    }
    true
}
