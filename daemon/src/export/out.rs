//! Sending an export to the client: output buffered and sent in chunks with progress.

use gpuprof_proto::api as pb;
use rusqlite::Connection;
use tokio::sync::mpsc;

use crate::error::ApiError;

/// Bytes per ExportTraceResponse.
pub(super) const CHUNK: usize = 256 << 10;

pub(super) type Tx = mpsc::Sender<Result<pb::ExportTraceResponse, tonic::Status>>;

/// Why an export ended early.
pub(super) enum Stop {
    ClientGone,
    Failed(ApiError),
}

impl<E: Into<ApiError>> From<E> for Stop {
    fn from(e: E) -> Stop {
        Stop::Failed(e.into())
    }
}

/// Buffers output and sends it in chunks with progress.
pub(super) struct Out<'a> {
    pub(super) tx: &'a Tx,
    pub(super) buf: Vec<u8>,
    pub(super) written: u64,
    pub(super) total: u64,
    /// Sent with the next chunk, then cleared: the name of the file that chunk starts
    /// (multi-file exports).
    pub(super) file_name: String,
}

impl Out<'_> {
    pub(super) fn maybe_send(&mut self) -> Result<(), Stop> {
        if self.buf.len() >= CHUNK { self.send() } else { Ok(()) }
    }

    pub(super) fn send(&mut self) -> Result<(), Stop> {
        let m = pb::ExportTraceResponse {
            data: std::mem::take(&mut self.buf),
            events_written: self.written,
            events_total: self.total.max(self.written),
            file_name: std::mem::take(&mut self.file_name),
        };
        self.buf.reserve(CHUNK + 4096);
        self.tx.blocking_send(Ok(m)).map_err(|_| Stop::ClientGone)
    }
}

/// Rows an export will hold, from the rollup (exact without filters, an upper bound with).
pub(super) fn total_rows(c: &Connection, session: u64, tables: &[&str]) -> rusqlite::Result<u64> {
    let mut n = 0;
    for t in tables {
        n += crate::query::rollups::table_count(c, t, session)?;
    }
    Ok(n)
}
