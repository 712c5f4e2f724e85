//! The arbiter's rows: `leases` (every lease, live and past), `pauses` (operator pauses that
//! must survive a restart) and `audit` (every grant, revoke, expiry, pause and resume).
//!
//! [`apply`] writes the rows for a list of events; the daemon runs it on the writer connection
//! (`WriterHandle::call`), tests on an in-memory database. [`load`] reads back what a restart
//! needs.

use rusqlite::{Connection, OptionalExtension, params};

use super::core::{Event, Holder, Lease, LeaseId, Nanos, RestoredPause};

fn upsert_lease(c: &Connection, l: &Lease) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO leases(id, device, holder_kind, holder, priority, reason, granted_ns, expires_ns)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT(id) DO UPDATE SET granted_ns = COALESCE(leases.granted_ns, excluded.granted_ns),
           expires_ns = excluded.expires_ns, reason = excluded.reason",
    )?
    .execute(params![
        l.id as i64,
        l.device,
        l.holder.kind(),
        l.holder.describe(),
        l.priority,
        l.reason,
        l.granted_at.map(|t| t as i64),
        l.expires_at.map(|t| t as i64),
    ])?;
    Ok(())
}

fn end_lease(c: &Connection, l: &Lease, now: Nanos, why: &str) -> rusqlite::Result<()> {
    upsert_lease(c, l)?;
    c.prepare_cached("UPDATE leases SET ended_ns = ?1, end_reason = ?2 WHERE id = ?3 AND ended_ns IS NULL")?
        .execute(params![now as i64, why, l.id as i64])?;
    if matches!(l.holder, Holder::Pause { .. }) {
        c.prepare_cached("UPDATE pauses SET ended_ns = ?1 WHERE id = ?2 AND ended_ns IS NULL")?
            .execute(params![now as i64, l.id as i64])?;
    }
    Ok(())
}

fn audit(
    c: &Connection,
    now: Nanos,
    device: u32,
    event: &str,
    lease: Option<LeaseId>,
    actor: &str,
    detail: &str,
) -> rusqlite::Result<()> {
    c.prepare_cached("INSERT INTO audit(ts_ns, device, event, lease, actor, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?
        .execute(params![now as i64, device, event, lease.map(|l| l as i64), actor, detail])?;
    Ok(())
}

fn who(l: &Lease) -> String {
    format!("{} ({})", l.holder.describe(), l.holder.kind())
}

/// Writes the rows for `events`, in one transaction.
pub fn apply(conn: &mut Connection, events: &[Event], now: Nanos) -> rusqlite::Result<()> {
    let tx = conn.transaction()?;
    for e in events {
        match e {
            Event::Queued { lease } => {
                upsert_lease(&tx, lease)?;
                audit(
                    &tx,
                    now,
                    lease.device,
                    "queue",
                    Some(lease.id),
                    &lease.holder.describe(),
                    &format!("{} waits (priority {}): {}", who(lease), lease.priority, lease.reason),
                )?;
            }
            Event::Granted { lease } => {
                upsert_lease(&tx, lease)?;
                if let Holder::Pause { uid } = lease.holder {
                    tx.prepare_cached(
                        "INSERT OR IGNORE INTO pauses(id, device, owner_uid, reason, created_ns, expires_ns)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    )?
                    .execute(params![
                        lease.id as i64,
                        lease.device,
                        uid,
                        lease.reason,
                        now as i64,
                        lease.expires_at.unwrap_or(0) as i64
                    ])?;
                    audit(
                        &tx,
                        now,
                        lease.device,
                        "pause",
                        Some(lease.id),
                        &lease.holder.describe(),
                        &format!("paused until {} ns: {}", lease.expires_at.unwrap_or(0), lease.reason),
                    )?;
                }
                audit(
                    &tx,
                    now,
                    lease.device,
                    "grant",
                    Some(lease.id),
                    "gpuprofd",
                    &format!("granted to {} (priority {}): {}", who(lease), lease.priority, lease.reason),
                )?;
            }
            Event::Extended { lease, actor } => {
                upsert_lease(&tx, lease)?;
                tx.prepare_cached("UPDATE pauses SET expires_ns = ?1, reason = ?2 WHERE id = ?3")?.execute(params![
                    lease.expires_at.unwrap_or(0) as i64,
                    lease.reason,
                    lease.id as i64
                ])?;
                audit(
                    &tx,
                    now,
                    lease.device,
                    "pause",
                    Some(lease.id),
                    actor,
                    &format!("pause extended until {} ns: {}", lease.expires_at.unwrap_or(0), lease.reason),
                )?;
            }
            Event::Revoked { lease, by, reason } => {
                audit(
                    &tx,
                    now,
                    lease.device,
                    "revoke",
                    Some(lease.id),
                    "gpuprofd",
                    &format!("revoked from {}: preempted by lease {by} ({reason}); queued to come back", who(lease)),
                )?;
            }
            Event::Released { lease, actor, reason, .. } => {
                end_lease(&tx, lease, now, reason)?;
                let event = if matches!(lease.holder, Holder::Pause { .. }) && reason == "resumed" {
                    "resume"
                } else {
                    "release"
                };
                audit(&tx, now, lease.device, event, Some(lease.id), actor, &format!("{}: {reason}", who(lease)))?;
            }
            Event::Expired { lease, .. } => {
                end_lease(&tx, lease, now, "expired")?;
                audit(
                    &tx,
                    now,
                    lease.device,
                    "expire",
                    Some(lease.id),
                    "gpuprofd",
                    &format!("{} expired: {}", who(lease), lease.reason),
                )?;
            }
            Event::ExternalBusy { device, lease, attempts, retry_at } => {
                if *attempts == 1 {
                    audit(
                        &tx,
                        now,
                        *device,
                        "external",
                        Some(lease.id),
                        "gpuprofd",
                        &format!(
                            "an outside tool holds the performance monitor (CUPTI_ERROR_HARDWARE_BUSY for {}); retrying at {retry_at} ns",
                            who(lease)
                        ),
                    )?;
                }
            }
            Event::ExternalCleared { device } => {
                audit(&tx, now, *device, "external", None, "gpuprofd", "the outside holder is gone")?;
            }
            Event::Retry { .. } => {}
        }
    }
    tx.commit()
}

/// What a restart needs: open pauses and the largest lease id. Leases other than pauses
/// that were open when the daemon stopped are closed (their holders are gone).
pub fn load(conn: &Connection, now: Nanos) -> rusqlite::Result<(Vec<RestoredPause>, LeaseId)> {
    let tx = conn.unchecked_transaction()?;
    let closed = tx.execute(
        "UPDATE leases SET ended_ns = ?1, end_reason = 'daemon restarted'
         WHERE ended_ns IS NULL AND holder_kind != 'pause'",
        [now as i64],
    )?;
    if closed > 0 {
        tracing::info!(leases = closed, "closed leases left open by the previous run");
    }
    let max_lease: Option<i64> = tx.query_row("SELECT MAX(id) FROM leases", [], |r| r.get(0)).optional()?.flatten();
    let max_pause: Option<i64> = tx.query_row("SELECT MAX(id) FROM pauses", [], |r| r.get(0)).optional()?.flatten();
    let mut pauses = Vec::new();
    {
        let mut stmt = tx.prepare(
            "SELECT id, device, owner_uid, reason, created_ns, expires_ns FROM pauses WHERE ended_ns IS NULL ORDER BY id",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            pauses.push(RestoredPause {
                lease: r.get::<_, i64>(0)? as LeaseId,
                device: r.get(1)?,
                uid: r.get(2)?,
                reason: r.get(3)?,
                created_at: r.get::<_, i64>(4)? as Nanos,
                expires_at: r.get::<_, i64>(5)? as Nanos,
            });
        }
    }
    tx.commit()?;
    let max = max_lease.unwrap_or(0).max(max_pause.unwrap_or(0)).max(0) as LeaseId;
    Ok((pauses, max))
}
