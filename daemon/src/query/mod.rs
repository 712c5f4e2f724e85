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

use crate::Daemon;
use crate::access::Caller;
use crate::error::{ApiError, ApiResult};

mod collectives;
mod filter;
mod inventory;
mod job;
mod names;
pub mod pc;
mod records;
pub mod rollups;
mod summary;

pub use filter::{Cols, Where, check_filter, cols, where_for};
pub use inventory::{list_devices, list_processes};
pub use job::get_job_summary;
pub use names::{NAME_GLOB, Strings, copy_kind_name, names, string, sync_type_name};
pub use pc::query_pc_samples;
use records::stream_records;
pub use summary::summary;

/// Records stored for a session, per process.
pub fn session_record_counts(c: &Connection, session: u64) -> rusqlite::Result<HashMap<u64, u64>> {
    rollups::session_counts(c, session)
}

// ---------------------------------------------------------------- requests

/// Largest `top` accepted by GetSummary.
const MAX_TOP: u32 = 1000;
pub use crate::catalog::QUERY_KINDS;

/// GetSummary.
pub async fn get_summary(d: &Daemon, caller: &Caller, req: pb::GetSummaryRequest) -> ApiResult<pb::GetSummaryResponse> {
    let top = match req.top {
        0 => 20,
        n if n > MAX_TOP => return Err(ApiError::invalid("top", format!("{n} is above the maximum of {MAX_TOP}"))),
        n => n,
    } as usize;
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    d.authorize_session(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
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
    d.authorize_session(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
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
