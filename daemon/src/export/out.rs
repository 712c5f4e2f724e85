//! Sending an export to the client: output buffered and sent in chunks with progress, gzipped
//! on a thread of its own when the format asks for it.

use std::io::Write as _;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

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
    /// Set when the output is gzipped: the chunks go to the gzip thread instead.
    gzip: Option<Gzip>,
}

impl<'a> Out<'a> {
    /// Output of an export of `total` events (an estimate: progress only).
    pub(super) fn new(tx: &'a Tx, total: u64) -> Out<'a> {
        Out { tx, buf: Vec::with_capacity(CHUNK + 4096), written: 0, total, file_name: String::new(), gzip: None }
    }

    /// The same, gzipped at `level` (1 to 9) on a thread of its own.
    pub(super) fn gzipped(tx: &'a Tx, total: u64, level: u32) -> Result<Out<'a>, Stop> {
        let gzip = Gzip::start(tx.clone(), level)
            .map_err(|e| ApiError::Internal(format!("starting the export's gzip thread: {e}")))?;
        Ok(Out { gzip: Some(gzip), ..Out::new(tx, total) })
    }

    pub(super) fn maybe_send(&mut self) -> Result<(), Stop> {
        if self.buf.len() >= CHUNK { self.send() } else { Ok(()) }
    }

    pub(super) fn send(&mut self) -> Result<(), Stop> {
        let data = std::mem::take(&mut self.buf);
        self.buf.reserve(CHUNK + 4096);
        let (written, total) = (self.written, self.total.max(self.written));
        if let Some(g) = &self.gzip {
            return g.chunks.send(Piece::Data(data, written, total)).map_err(|_| Stop::ClientGone);
        }
        let m = pb::ExportTraceResponse {
            data,
            events_written: written,
            events_total: total,
            file_name: std::mem::take(&mut self.file_name),
        };
        self.tx.blocking_send(Ok(m)).map_err(|_| Stop::ClientGone)
    }

    /// Sends what is buffered and, gzipped, ends the gzip stream (its trailer sent last).
    pub(super) fn finish(mut self) -> Result<(), Stop> {
        self.send()?;
        match self.gzip.take() {
            Some(mut g) => {
                g.chunks.send(Piece::End).map_err(|_| Stop::ClientGone)?;
                g.join()
            }
            None => Ok(()),
        }
    }
}

/// A piece of the output for the gzip thread: bytes with the progress they bring it to, or the
/// end of the stream. The thread stops without a trailer when the sender goes before `End`
/// (the export failed: its error follows the last chunk sent).
enum Piece {
    Data(Vec<u8>, u64, u64),
    End,
}

/// Chunks waiting for the gzip thread.
const GZIP_QUEUE: usize = 8;

/// The gzip thread of an export and the channel to it.
struct Gzip {
    chunks: SyncSender<Piece>,
    thread: Option<JoinHandle<Result<(), Stop>>>,
}

impl Gzip {
    fn start(tx: Tx, level: u32) -> std::io::Result<Gzip> {
        let (chunks, rx) = sync_channel(GZIP_QUEUE);
        let thread = std::thread::Builder::new().name("export-gzip".into()).spawn(move || gzip(&tx, &rx, level))?;
        Ok(Gzip { chunks, thread: Some(thread) })
    }

    fn join(&mut self) -> Result<(), Stop> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Stop::Failed(ApiError::Internal("the export's gzip thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for Gzip {
    /// An export that failed or was cancelled: the thread sees the channel close and stops.
    fn drop(&mut self) {
        let (dead, _) = sync_channel(0);
        drop(std::mem::replace(&mut self.chunks, dead));
        let _ = self.join();
    }
}

/// The gzip thread: compresses the pieces into chunks of about [`CHUNK`] bytes, each sent
/// with the progress of the last piece in it.
fn gzip(tx: &Tx, rx: &Receiver<Piece>, level: u32) -> Result<(), Stop> {
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(CHUNK + 4096), flate2::Compression::new(level));
    let (mut written, mut total) = (0, 0);
    let send = |data: Vec<u8>, written: u64, total: u64| {
        let m =
            pb::ExportTraceResponse { data, events_written: written, events_total: total, file_name: String::new() };
        tx.blocking_send(Ok(m)).map_err(|_| Stop::ClientGone)
    };
    loop {
        match rx.recv() {
            Ok(Piece::Data(data, w, t)) => {
                (written, total) = (w, t);
                gz.write_all(&data).map_err(|e| ApiError::Internal(format!("gzip: {e}")))?;
                if gz.get_ref().len() >= CHUNK {
                    let full = std::mem::replace(gz.get_mut(), Vec::with_capacity(CHUNK + 4096));
                    send(full, written, total)?;
                }
            }
            Ok(Piece::End) => {
                let rest = gz.finish().map_err(|e| ApiError::Internal(format!("gzip: {e}")))?;
                return send(rest, written, total);
            }
            Err(_) => return Err(Stop::ClientGone),
        }
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

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// Output that compresses poorly enough to fill several chunks at level 1.
    fn text(n: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.extend_from_slice(format!("{{\"ts\":{},\"dur\":{}}},\n", x % 1_000_000_007, x >> 40).as_bytes());
        }
        v
    }

    fn drain(rx: &mut mpsc::Receiver<Result<pb::ExportTraceResponse, tonic::Status>>) -> Vec<pb::ExportTraceResponse> {
        std::iter::from_fn(|| rx.try_recv().ok()).map(|m| m.unwrap()).collect()
    }

    fn gunzip(data: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(data).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn gzipped_output_gunzips_to_what_was_written_with_its_progress() {
        let (tx, mut rx) = mpsc::channel(1024);
        let input = text(3 * CHUNK * 8);
        let mut out = Out::gzipped(&tx, 100, 1).unwrap_or_else(|_| panic!("gzip thread"));
        for (i, piece) in input.chunks(CHUNK / 3).enumerate() {
            out.buf.extend_from_slice(piece);
            out.written = i as u64 + 1;
            out.maybe_send().unwrap_or_else(|_| panic!("send {i}"));
        }
        let pieces = input.chunks(CHUNK / 3).count() as u64;
        out.finish().unwrap_or_else(|_| panic!("finish"));
        let msgs = drain(&mut rx);
        assert!(msgs.len() > 2, "{} chunks", msgs.len());
        let lens: Vec<usize> = msgs.iter().map(|m| m.data.len()).collect();
        // A chunk is sent once it reaches CHUNK bytes: at most one piece's output beyond it.
        let (body, tail) = lens.split_at(lens.len() - 1);
        assert!(body.iter().all(|&n| (CHUNK..CHUNK + CHUNK / 3 + 4096).contains(&n)), "chunk sizes {lens:?}");
        assert!(tail[0] < CHUNK + CHUNK / 3 + 4096, "chunk sizes {lens:?}");
        assert!(msgs.windows(2).all(|w| w[0].events_written <= w[1].events_written), "progress only grows");
        let last = msgs.last().unwrap();
        assert_eq!((last.events_written, last.events_total), (pieces, pieces.max(100)), "the last chunk's progress");
        let gz: Vec<u8> = msgs.iter().flat_map(|m| m.data.iter().copied()).collect();
        assert!(gunzip(&gz).unwrap() == input, "gunzips to the output written");
    }

    #[test]
    fn a_failed_export_ends_without_a_trailer_and_a_gone_client_stops_it() {
        // The export fails after some output: what was sent is a gzip stream cut short, so the
        // client cannot take it for a whole trace (the error follows it).
        let (tx, mut rx) = mpsc::channel(1024);
        let input = text(4 * CHUNK * 8);
        let mut out = Out::gzipped(&tx, 0, 1).unwrap_or_else(|_| panic!("gzip thread"));
        for piece in input.chunks(CHUNK) {
            out.buf.extend_from_slice(piece);
            out.send().unwrap_or_else(|_| panic!("send"));
        }
        drop(out);
        let gz: Vec<u8> = drain(&mut rx).iter().flat_map(|m| m.data.iter().copied()).collect();
        assert!(!gz.is_empty());
        let e = gunzip(&gz).expect_err("a stream without its trailer");
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");

        // The client is gone: the export stops with ClientGone instead of compressing on.
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let mut out = Out::gzipped(&tx, 0, 1).unwrap_or_else(|_| panic!("gzip thread"));
        let stopped = input.chunks(CHUNK).any(|piece| {
            out.buf.extend_from_slice(piece);
            matches!(out.send(), Err(Stop::ClientGone))
        });
        assert!(stopped || matches!(out.finish(), Err(Stop::ClientGone)), "ClientGone");
    }
}
