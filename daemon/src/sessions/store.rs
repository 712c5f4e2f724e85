//! The `sessions` and `session_processes` rows: the persister task that writes every change
//! in order ([`Op`]), [`recover`] at start, and reading sessions back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpuprof_proto::api as pb;
use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use super::spec::{Collect, TargetSpec};
use super::state::{Inner, MemberState, State};
use crate::clock::now_ns;
use crate::error::{ApiError, ApiResult};
use crate::ingest::WriterHandle;

/// A database write, queued in the order the in-memory state changed.
pub(super) enum Op {
    State {
        id: u64,
        state: State,
        started_ns: Option<u64>,
        stopped_ns: Option<u64>,
        reason: Option<String>,
    },
    Join {
        session: u64,
        proc: u64,
        joined_ns: u64,
        state: MemberState,
        detail: String,
    },
    Member {
        session: u64,
        proc: u64,
        state: MemberState,
        detail: String,
        left_ns: Option<u64>,
    },
    /// A member's detail, its state kept: how a process that stopped left CUPTI, reported after
    /// the session ended (a detach left pending at the stop).
    Detail {
        session: u64,
        proc: u64,
        detail: String,
    },
    /// The last PC-sampling state of a process's device in the session.
    PcState {
        session: u64,
        proc: u64,
        device: u32,
        state: String,
        heals: u32,
    },
    /// The session reached a final state: forget it in memory once written, then wake waiters.
    Finished {
        id: u64,
        waiters: Vec<oneshot::Sender<()>>,
    },
    /// Reply once everything before is written.
    Barrier(oneshot::Sender<()>),
}

/// Marks sessions left open by a previous run as interrupted. Runs at start, before agents connect.
pub fn recover(conn: &Connection) -> rusqlite::Result<usize> {
    let now = now_ns() as i64;
    let n = conn.execute(
        "UPDATE sessions SET state = 'interrupted', stopped_ns = coalesce(stopped_ns, ?1),
           stop_reason = CASE WHEN coalesce(stop_reason, '') = ''
                              THEN 'gpuprofd stopped while the session was open'
                              ELSE stop_reason || '; gpuprofd stopped before it finished' END
         WHERE state IN ('pending', 'active', 'stopping')",
        [now],
    )?;
    conn.execute(
        "UPDATE session_processes SET left_ns = coalesce(left_ns, ?1),
           state = CASE WHEN state = 'tracing' THEN 'exited' ELSE state END
         WHERE left_ns IS NULL AND session IN (SELECT id FROM sessions WHERE state = 'interrupted')",
        [now],
    )?;
    if n > 0 {
        tracing::warn!(sessions = n, "marked sessions left open by the previous run as interrupted");
    }
    Ok(n)
}

/// Records each process dropped while in the session: its cumulative drops now (or when it
/// left) minus those when it joined.
fn session_drops(c: &Connection, session: u64, procs: &[u64]) -> rusqlite::Result<HashMap<u64, u64>> {
    let mut out = HashMap::new();
    let mut stmt = c.prepare_cached(
        "SELECT sp.proc, coalesce(sp.drops_at_leave, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = sp.proc))
                - sp.drops_at_join
         FROM session_processes sp WHERE sp.session = ?1",
    )?;
    let mut rows = stmt.query([session as i64])?;
    while let Some(r) = rows.next()? {
        let p: i64 = r.get(0)?;
        let n: i64 = r.get(1)?;
        out.insert(p as u64, n.max(0) as u64);
    }
    for p in procs {
        out.entry(*p).or_insert(0);
    }
    Ok(out)
}

fn load_targets(json: &str) -> Vec<pb::Target> {
    serde_json::from_str::<Vec<TargetSpec>>(json).unwrap_or_default().iter().map(TargetSpec::to_pb).collect()
}

fn load_collect(json: &str) -> pb::CollectOptions {
    serde_json::from_str::<Collect>(json).unwrap_or_default().to_pb()
}

const SESSION_COLS: &str =
    "id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, coalesce(started_ns, 0),
     coalesce(stopped_ns, 0), duration_ms, max_records, coalesce(stop_reason, '')";

fn session_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<pb::Session> {
    let state: String = r.get(2)?;
    let targets: String = r.get(3)?;
    let collect: String = r.get(4)?;
    Ok(pb::Session {
        id: r.get::<_, i64>(0)? as u64,
        name: r.get(1)?,
        state: State::parse(&state).map(|s| s.to_pb()).unwrap_or_default() as i32,
        targets: load_targets(&targets),
        collect: Some(load_collect(&collect)),
        owner_uid: r.get(5)?,
        created_at_ns: r.get::<_, i64>(6)? as u64,
        start_at_ns: r.get::<_, i64>(7)? as u64,
        started_at_ns: r.get::<_, i64>(8)? as u64,
        stopped_at_ns: r.get::<_, i64>(9)? as u64,
        duration_ms: r.get::<_, i64>(10)? as u64,
        max_records: r.get::<_, i64>(11)? as u64,
        stop_reason: r.get(12)?,
        processes: Vec::new(),
        records: 0,
    })
}

/// A session and its processes from the database.
pub fn load(c: &Connection, id: u64) -> rusqlite::Result<Option<pb::Session>> {
    let Some(mut s) = c
        .prepare_cached(&format!("SELECT {SESSION_COLS} FROM sessions WHERE id = ?1"))?
        .query_row([id as i64], session_from_row)
        .optional()?
    else {
        return Ok(None);
    };
    load_members(c, &mut s)?;
    Ok(Some(s))
}

fn load_members(c: &Connection, s: &mut pb::Session) -> rusqlite::Result<()> {
    let mut stmt = c.prepare_cached(
        "SELECT sp.proc, p.pid, p.exe, sp.state, sp.joined_ns, sp.detail
         FROM session_processes sp JOIN processes p ON p.id = sp.proc
         WHERE sp.session = ?1 ORDER BY sp.proc",
    )?;
    s.processes = stmt
        .query_map([s.id as i64], |r| {
            let state: String = r.get(3)?;
            Ok(pb::SessionProcess {
                process_id: r.get::<_, i64>(0)? as u64,
                pid: r.get(1)?,
                exe: r.get(2)?,
                records: 0,
                dropped: 0,
                displaced: state == "displaced",
                state,
                joined_at_ns: r.get::<_, i64>(4)? as u64,
                detail: r.get(5)?,
                ..Default::default()
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(())
}

/// Adds record counts (from the rollups), drop counts and the processes' containers and pods
/// to sessions.
pub(super) fn fill_counts_from(c: &Connection, sessions: &mut [pb::Session]) -> anyhow::Result<()> {
    for s in sessions.iter_mut() {
        let procs: Vec<u64> = s.processes.iter().map(|p| p.process_id).collect();
        let records = crate::query::session_record_counts(c, s.id)?;
        let drops = session_drops(c, s.id, &procs)?;
        let mut placement = c.prepare_cached(
            "SELECT container_id, pod_uid, pod_name, pod_namespace, job_id, job_rank, parent_pid
             FROM processes WHERE id = ?1",
        )?;
        let mut pc = c.prepare_cached(
            "SELECT device, state, samples, dropped, heals FROM pc_sampling WHERE session = ?1 AND proc = ?2 ORDER BY device",
        )?;
        let mut parents: HashMap<u64, u32> = HashMap::new();
        for p in &mut s.processes {
            p.records = records.get(&p.process_id).copied().unwrap_or(0);
            p.dropped = drops.get(&p.process_id).copied().unwrap_or(0);
            if let Some(((cid, uid, name, ns), (job, rank, ppid))) = placement
                .query_row([p.process_id as i64], |r| {
                    Ok(((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?), (r.get(4)?, r.get(5)?, r.get(6)?)))
                })
                .optional()?
            {
                (p.container_id, p.pod_uid, p.pod_name, p.pod_namespace) = (cid, uid, name, ns);
                (p.job_id, p.rank) = (job, rank);
                parents.insert(p.process_id, ppid);
            }
            p.pc_sampling = pc
                .query_map(params![s.id as i64, p.process_id as i64], |r| {
                    Ok(pb::PcSamplingDevice {
                        device: r.get(0)?,
                        state: r.get(1)?,
                        samples: r.get::<_, i64>(2)? as u64,
                        dropped: r.get::<_, i64>(3)? as u64,
                        heals: r.get(4)?,
                    })
                })?
                .collect::<rusqlite::Result<_>>()?;
        }
        set_roles(&mut s.processes, &parents);
        s.records = records.values().sum();
    }
    Ok(())
}

/// Marks the session's ranks and the launchers of its ranks (among its members, from their
/// parent pids); a launcher without a job id of its own shows its ranks' job.
fn set_roles(procs: &mut [pb::SessionProcess], parents: &HashMap<u64, u32>) {
    let parent: Vec<[u32; 1]> = procs.iter().map(|p| [parents.get(&p.process_id).copied().unwrap_or(0)]).collect();
    let members: Vec<crate::job::Member<'_>> = procs
        .iter()
        .zip(&parent)
        .map(|(p, a)| crate::job::Member { pid: p.pid, ancestors: a, job_id: &p.job_id, rank: p.rank })
        .collect();
    let roles: Vec<(&'static str, String)> =
        crate::job::roles(&members).into_iter().map(|(r, j)| (r, j.to_string())).collect();
    for (p, (role, job)) in procs.iter_mut().zip(roles) {
        (p.role, p.job_id) = (role.into(), job);
    }
}

/// One page of ListSessions from the database, newest first: the sessions below id `before`,
/// of `owner` (all owners: `None`), whose name contains `name`, in one of `states` (any: empty);
/// and whether more follow.
pub(super) fn list_page(
    c: &Connection,
    before: i64,
    owner: Option<u32>,
    name: &str,
    states: &[&str],
    page: i64,
) -> ApiResult<(Vec<pb::Session>, bool)> {
    let state_list = serde_json::to_string(&states).map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut stmt = c.prepare(&format!(
        "SELECT {SESSION_COLS} FROM sessions
         WHERE id < ?1
           AND (?2 IS NULL OR owner_uid = ?2)
           AND (?3 = '' OR instr(name, ?3) > 0)
           AND (?4 = '[]' OR state IN (SELECT value FROM json_each(?4)))
         ORDER BY id DESC LIMIT ?5"
    ))?;
    let mut v = stmt
        .query_map(params![before, owner, name, state_list, page + 1], session_from_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let more = v.len() as i64 > page;
    v.truncate(page as usize);
    for s in &mut v {
        load_members(c, s)?;
    }
    Ok((v, more))
}

// ---------------------------------------------------------------- persister

pub(super) async fn persist(writer: WriterHandle, mut rx: mpsc::UnboundedReceiver<Op>, inner: Arc<Mutex<Inner>>) {
    let mut batch = Vec::new();
    while rx.recv_many(&mut batch, 256).await > 0 {
        let mut finished = Vec::new();
        let mut barriers = Vec::new();
        let mut writes = Vec::new();
        for op in batch.drain(..) {
            match op {
                Op::Finished { id, waiters } => finished.push((id, waiters)),
                Op::Barrier(tx) => barriers.push(tx),
                other => writes.push(other),
            }
        }
        if !writes.is_empty() {
            match writer.call(move |c| apply(c, writes)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "cannot record session state"),
                Err(_) => tracing::warn!("writer gone; session state changes not recorded"),
            }
        }
        {
            let mut g = inner.lock().unwrap_or_else(|e| e.into_inner());
            for (id, _) in &finished {
                if g.open.get(id).is_some_and(|l| !l.state.is_open()) {
                    g.open.remove(id);
                }
            }
        }
        for (_, waiters) in finished {
            for w in waiters {
                let _ = w.send(());
            }
        }
        for b in barriers {
            let _ = b.send(());
        }
    }
}

fn apply(c: &mut Connection, ops: Vec<Op>) -> rusqlite::Result<()> {
    let tx = c.transaction()?;
    for op in ops {
        match op {
            Op::State { id, state, started_ns, stopped_ns, reason } => {
                tx.execute(
                    "UPDATE sessions SET state = ?2, started_ns = coalesce(?3, started_ns),
                       stopped_ns = coalesce(?4, stopped_ns), stop_reason = coalesce(?5, stop_reason)
                     WHERE id = ?1",
                    params![
                        id as i64,
                        state.as_str(),
                        started_ns.map(|v| v as i64),
                        stopped_ns.map(|v| v as i64),
                        reason
                    ],
                )?;
            }
            Op::Join { session, proc, joined_ns, state, detail } => {
                tx.execute(
                    "INSERT INTO session_processes(session, proc, joined_ns, state, detail, drops_at_join)
                     VALUES (?1, ?2, ?3, ?4, ?5, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = ?2))
                     ON CONFLICT(session, proc) DO UPDATE SET state = excluded.state, detail = excluded.detail",
                    params![session as i64, proc as i64, joined_ns as i64, state.as_str(), detail],
                )?;
            }
            Op::Member { session, proc, state, detail, left_ns } => {
                tx.execute(
                    "UPDATE session_processes SET state = ?3, detail = ?4, left_ns = coalesce(left_ns, ?5),
                       drops_at_leave = CASE WHEN ?5 IS NULL THEN drops_at_leave
                         ELSE coalesce(drops_at_leave, (SELECT coalesce(sum(dropped), 0) FROM drops WHERE proc = ?2)) END
                     WHERE session = ?1 AND proc = ?2",
                    params![session as i64, proc as i64, state.as_str(), detail, left_ns.map(|v| v as i64)],
                )?;
            }
            Op::Detail { session, proc, detail } => {
                tx.execute(
                    "UPDATE session_processes SET detail = ?3 WHERE session = ?1 AND proc = ?2",
                    params![session as i64, proc as i64, detail],
                )?;
            }
            Op::PcState { session, proc, device, state, heals } => {
                tx.execute(
                    "INSERT INTO pc_sampling(session, proc, device, state, heals) VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT(session, proc, device) DO UPDATE SET state = excluded.state, heals = excluded.heals",
                    params![session as i64, proc as i64, device, state, heals],
                )?;
            }
            Op::Finished { .. } | Op::Barrier(_) => {}
        }
    }
    tx.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recover_marks_open_sessions_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::Config::from_toml("").unwrap().storage;
        let c = crate::store::open_writer(&dir.path().join("t.db"), &cfg).unwrap();
        for (i, st) in ["active", "completed", "pending", "stopping"].iter().enumerate() {
            c.execute(
                "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns,
                                      duration_ms, max_records, stop_reason) VALUES (?1, '', ?2, '[]', '{}', 0, 0, 0, 0, 0, '')",
                params![i as i64 + 1, st],
            )
            .unwrap();
        }
        assert_eq!(recover(&c).unwrap(), 3);
        let states: Vec<String> = c
            .prepare("SELECT state FROM sessions ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(states, ["interrupted", "completed", "interrupted", "interrupted"]);
    }
}
