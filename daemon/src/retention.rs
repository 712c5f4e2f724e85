//! PM sample retention: full-rate rows in `pm_sample` for `retention.pm_full_rate`, then
//! folded into `pm_rollup` aggregates (count, mean, min, max per bucket of
//! `retention.pm_rollup_width`) kept for `retention.pm_rollup_keep`.
//!
//! The work runs on the writer connection in small steps (one device, at most ten seconds of
//! samples each), each step queued like any ingest batch, so ingest never waits long behind it.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tokio_util::sync::CancellationToken;

use crate::Daemon;

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

/// Runs retention every `retention.interval` until shutdown.
pub async fn run(d: Arc<Daemon>, shutdown: CancellationToken) {
    let r = d.config.retention.clone();
    let width = r.pm_rollup_width.0.as_nanos() as i64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(r.interval.0) => {}
        }
        let now = crate::agent::now_ns() as i64;
        let cutoff = now - r.pm_full_rate.0.as_nanos() as i64;
        let mut steps = 0u64;
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            match d.writer.call(move |c| rollup_step(c, cutoff, width)).await {
                Ok(Ok(true)) => steps += 1,
                Ok(Ok(false)) => break,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "PM retention step failed");
                    break;
                }
                Err(_) => return,
            }
            // Let queued ingest batches go first.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let keep_cutoff = now - r.pm_rollup_keep.0.as_nanos() as i64;
        match d.writer.call(move |c| expire_rollups(c, keep_cutoff)).await {
            Ok(Ok(n)) if n > 0 || steps > 0 => {
                tracing::debug!(steps, expired_rollups = n, "PM retention done")
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "expiring PM rollups failed"),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_old_samples_into_rollups() {
        let mut c = Connection::open_in_memory().unwrap();
        crate::store::migrate(&c).unwrap();
        let s = 1_000_000_000i64;
        // 30 s of samples at 100 Hz on two devices, two metrics.
        for dev in [1, 2] {
            for i in 0..3000i64 {
                for m in [1, 2] {
                    c.execute(
                        "INSERT INTO pm_sample(device, ts, dur, metric, value) VALUES (?1, ?2, 10000000, ?3, ?4)",
                        params![dev, 1000 * s + i * 10_000_000, m, (i % 10) as f64 + m as f64],
                    )
                    .unwrap();
                }
            }
        }
        let cutoff = 1020 * s;
        let mut steps = 0;
        while rollup_step(&mut c, cutoff, s).unwrap() {
            steps += 1;
            assert!(steps < 100);
        }
        assert!(steps >= 4, "small steps: {steps}");
        let left: i64 = c.query_row("SELECT COUNT(*) FROM pm_sample", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 2 * 2 * 1000, "the last 10 s stay at full rate");
        let min_ts: i64 = c.query_row("SELECT MIN(ts) FROM pm_sample", [], |r| r.get(0)).unwrap();
        assert!(min_ts >= cutoff);
        let (buckets, n, mean, lo, hi): (i64, i64, f64, f64, f64) = c
            .query_row(
                "SELECT COUNT(*), SUM(n), AVG(mean), MIN(min), MAX(max) FROM pm_rollup WHERE device = 1 AND metric = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .unwrap();
        assert_eq!(buckets, 20);
        assert_eq!(n, 2000);
        assert!((mean - 5.5).abs() < 1e-9, "{mean}");
        assert_eq!((lo, hi), (1.0, 10.0));
        assert_eq!(expire_rollups(&mut c, 1010 * s).unwrap(), 2 * 2 * 10);
    }
}
