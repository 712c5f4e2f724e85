//! ExportTrace: a session as Chrome trace JSON (Perfetto UI, chrome://tracing), as a Perfetto
//! protobuf trace, as a standalone SQLite file, as Parquet files (one per record kind), or its
//! PC samples as a gzipped pprof profile, streamed to the client in chunks.
//!
//! Chrome JSON layout:
//! - one trace process per gpuprof process (its host threads: API calls and NVTX ranges
//!   on the calling thread, plus "CUDA synchronization" and "CUPTI overhead" tracks), and
//!   one per (process, GPU) whose threads are the CUDA streams (kernels, copies, sets,
//!   graph launches);
//! - flow arrows from each launch/copy API call to the device activities with the same
//!   correlation id (one arrow per activity, so a graph launch fans out);
//! - `ts`/`dur` in µs relative to the session's first record (`otherData.t0_ns`), written
//!   from integers with ns precision;
//! - records are merged across tables in (process, start) order, so every track's events
//!   appear with non-decreasing timestamps.
//!
//! The file is assembled on a blocking thread from a read connection and never touches a
//! path the client chose; the SQLite export is built in the daemon's state directory and
//! removed once sent.
//!
//! Where things are: `chrome` writes the Chrome trace from `records` (the session's rows,
//! read by `scan` from the `_data` tables, put in order by `sort`, merged) and `flows` (launch
//! arrows), with the helpers in `json`; `perfetto` writes the
//! same records and flows as Perfetto track events; `sqlite` builds the SQLite file;
//! `parquet_files` writes one Parquet file per record kind as the rows stream (the chunk that
//! starts each file names it); `pprof` the PC-sampling profile; `out` sends any of them to the
//! client in chunks.

mod chrome;
mod flows;
mod json;
mod out;
mod parquet_files;
mod parquet_rows;
mod perfetto;
mod perfetto_wire;
pub mod pprof;
mod rec;
mod records;
mod scan;
mod sort;
mod sqlite;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

use gpuprof_proto::api as pb;
use tokio::sync::mpsc;

use crate::access::Caller;
use crate::error::{ApiError, ApiResult};
use crate::query::check_filter;
use chrome::chrome;
use out::Stop;
use parquet_files::parquet_files;
use perfetto::perfetto;
use pprof::pprof;
use sqlite::sqlite;

pub use records::EVENT_TABLES;

/// gzip level of a gzipped Chrome export that names none: level 1 compresses as fast as the
/// trace is written, to about an eighth of its size.
pub const DEFAULT_GZIP_LEVEL: u32 = 1;

/// ExportTrace: checks the request, then produces the file on a blocking thread.
pub async fn export(
    d: crate::query::Reads<'_>,
    caller: &Caller,
    req: pb::ExportTraceRequest,
) -> ApiResult<mpsc::Receiver<Result<pb::ExportTraceResponse, tonic::Status>>> {
    let format = pb::ExportFormat::try_from(req.format)
        .map_err(|_| ApiError::invalid("format", format!("{} is not an export format", req.format)))?;
    let gzip = match (format, req.gzip_level) {
        (pb::ExportFormat::ChromeJsonGz, 0) => Some(DEFAULT_GZIP_LEVEL),
        (pb::ExportFormat::ChromeJsonGz, l @ 1..=9) => Some(l),
        (pb::ExportFormat::ChromeJsonGz, l) => {
            return Err(ApiError::invalid(
                "gzip_level",
                format!(
                    "{l} is not a gzip level: use 1 (fastest) to 9 (smallest), or 0 for the default, {DEFAULT_GZIP_LEVEL}"
                ),
            ));
        }
        (_, 0) => None,
        (f, l) => {
            return Err(ApiError::invalid(
                "gzip_level",
                format!(
                    "gzip_level {l} applies to EXPORT_FORMAT_CHROME_JSON_GZ only, and this export is {}",
                    f.as_str_name()
                ),
            ));
        }
    };
    let f = req.filter.unwrap_or_default();
    check_filter(&f)?;
    d.authorize(caller, req.session_id).await?;
    d.rollup.catch_up().await?;
    let (tx, rx) = mpsc::channel(8);
    let db = d.db_path.to_path_buf();
    let session = req.session_id;
    let tmp_dir = db.parent().map(|p| p.join("exports")).unwrap_or_else(|| PathBuf::from("exports"));
    tokio::task::spawn_blocking(move || {
        let r = match format {
            pb::ExportFormat::Unspecified | pb::ExportFormat::ChromeJson | pb::ExportFormat::ChromeJsonGz => {
                chrome(&db, session, &f, &tx, gzip)
            }
            pb::ExportFormat::Sqlite => sqlite(&db, &tmp_dir, session, &f, &tx),
            pb::ExportFormat::Perfetto => perfetto(&db, session, &f, &tx),
            pb::ExportFormat::Pprof => pprof(&db, session, &f, &tx),
            pb::ExportFormat::Parquet => parquet_files(&db, session, &f, &tx),
        };
        match r {
            Ok(()) => {}
            Err(Stop::ClientGone) => tracing::debug!(session, "export cancelled by the client"),
            Err(Stop::Failed(e)) => {
                let _ = tx.blocking_send(Err(e.into()));
            }
        }
    });
    Ok(rx)
}
