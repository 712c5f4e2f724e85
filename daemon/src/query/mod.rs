//! Reading a session's records: filtered record streams and summaries.
//!
//! Everything here runs on read-only connections in blocking threads. A session's rows
//! are found by rowid range (each session's first and last rowid per table come from the
//! rollup, see [`crate::rollup`]), so a query touches only the pages of that session,
//! never the whole table, and no index on the hot record tables is needed.

use std::collections::HashMap;

use gpuprof_proto::api as pb;
use rusqlite::Connection;
use tokio::sync::mpsc;

use crate::access::{Caller, SessionOwners};
use crate::error::{ApiError, ApiResult};
use crate::ingest::WriterHandle;
use crate::rollup::Rollup;

mod collectives;
mod diff;
mod filter;
mod inventory;
mod job;
mod names;
pub mod pc;
mod pc_diff;
mod records;
pub mod rollups;
mod summary;

pub use diff::diff_summary;
pub use filter::{Cols, Where, check_filter, cols, where_for};
pub use inventory::{list_devices, list_processes};
pub use job::get_job_summary;
pub use names::{NAME_GLOB, Strings, copy_kind_name, names, string, sync_type_name};
pub use pc::query_pc_samples;
pub use pc_diff::diff_pc_samples;
use records::stream_records;
pub use summary::{kernels_by_shape, summary};

/// What the calls that read a session use: the database, the rollup they bring up to date
/// first, the writer (flushed before reading what it writes itself), and who owns the session
/// asked for, to check the caller against.
pub struct Reads<'a> {
    pub db_path: &'a std::path::Path,
    pub rollup: &'a Rollup,
    pub writer: &'a WriterHandle,
    pub owners: SessionOwners<'a>,
}

impl Reads<'_> {
    /// Checks that session `id` (the one `owners` describes) exists and `caller` may read it.
    pub async fn authorize(&self, caller: &Caller, id: u64) -> ApiResult<()> {
        crate::access::authorize_session(self.owners, caller, id).await
    }
}

/// Records stored for a session, per process.
pub fn session_record_counts(c: &Connection, session: u64) -> rusqlite::Result<HashMap<u64, u64>> {
    rollups::session_counts(c, session)
}

// ---------------------------------------------------------------- requests

/// Largest `top` accepted by GetSummary.
const MAX_TOP: u32 = 1000;
pub use crate::catalog::QUERY_KINDS;

/// GetSummary.
pub async fn get_summary(
    d: Reads<'_>,
    caller: &Caller,
    req: pb::GetSummaryRequest,
) -> ApiResult<pb::GetSummaryResponse> {
    let top = match req.top {
        0 => 20,
        n if n > MAX_TOP => return Err(ApiError::invalid("top", format!("{n} is above the maximum of {MAX_TOP}"))),
        n => n,
    } as usize;
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    d.authorize(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
    let path = d.db_path.to_path_buf();
    let id = req.session_id;
    tokio::task::spawn_blocking(move || {
        let c = crate::store::open_reader(&path)?;
        summary(&c, id, &f, top)
    })
    .await?
}

/// QueryRecords: checks the request, then streams from a blocking reader thread.
pub async fn query_records(
    d: Reads<'_>,
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
    d.authorize(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
    let (tx, rx) = mpsc::channel(4);
    let path = d.db_path.to_path_buf();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The reading calls built from their parts, no daemon: the caller checked against the
    /// session's owner, the rollup brought up to date, the rows read.
    #[tokio::test(flavor = "multi_thread")]
    async fn reads_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap();
        let conn = crate::store::open_writer(&db, &cfg.storage).unwrap();
        conn.execute_batch(
            "INSERT INTO sessions(id, name, state, targets, collect, owner_uid, created_ns, start_at_ns, duration_ms,
               max_records) VALUES (5, 'ended', 'completed', '[]', '{}', 1000, 1, 1, 0, 0);
             INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
               connected_ns) VALUES (1, 42, 1000, 1000, 'injector', 'x', '[]', '', 0, 1000000000, 0);
             INSERT INTO strings(id, value) VALUES (1, 'gemm');
             INSERT INTO tracks(session, proc, dev, ctx, stream, tid, base) VALUES (5, 1, 0, 1, 7, 0, 0);
             INSERT INTO kernel_shapes VALUES (1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
             INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (1, 1, 1, 100, 40, 1);
             INSERT INTO kernel_data(track, corr, shape, start, dur, gx) VALUES (1, 2, 1, 200, 60, 1);",
        )
        .unwrap();
        let writer =
            crate::ingest::TestWriter::start(crate::store::open_writer(&db, &cfg.storage).unwrap(), &cfg.ingest);
        let rollup = Rollup::new(db.clone(), writer.handle.clone());
        let reads = || Reads {
            db_path: &db,
            rollup: &rollup,
            writer: &writer.handle,
            owners: SessionOwners { live: None, db_path: &db, admin_group: "gpuprof" },
        };
        let user = |uid| Caller { uid, gid: uid, pid: None, admin: false, authenticated: true };
        let req = |session_id| pb::GetSummaryRequest { session_id, ..Default::default() };
        let s = get_summary(reads(), &user(1000), req(5)).await.unwrap();
        assert_eq!(s.top_kernels.iter().map(|k| k.count).sum::<u64>(), 2, "{s:?}");
        assert!(matches!(get_summary(reads(), &user(1001), req(5)).await, Err(ApiError::PermissionDenied(_))));
        assert!(matches!(get_summary(reads(), &user(1000), req(9)).await, Err(ApiError::NotFound(_))));
        drop(rollup);
        writer.stop().await;
    }
}
