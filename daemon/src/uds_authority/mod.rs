//! Lets any gRPC client call the API over the Unix socket, whatever `:authority` it sends.
//!
//! gRPC C-core (Python's grpcio, Ruby, C++, ...) dialling `unix:///run/gpuprof/api.sock` sends
//! the socket path, percent-encoded, as the request's `:authority` (`run%2Fgpuprof%2Fapi.sock`).
//! That is not a valid URI authority, and the HTTP/2 server (h2) resets such a stream before any
//! service sees it, so the client gets INTERNAL "RST_STREAM with error code 1". The authority
//! means nothing on a Unix socket, so each api socket connection is read through [`UdsConn`],
//! which rewrites every client header block: an `:authority` that does not parse as one becomes
//! `localhost`, everything else is kept.
//!
//! HPACK is stateful (header blocks refer to a table built by earlier blocks), so every header
//! block is decoded with a decoder that follows the client's table, and re-encoded as plain
//! literals that never touch the server's table. All other frames pass through unchanged.
//! Anything that is not well-formed HTTP/2 is passed on as it came from that point on, for the
//! server to reject as it would have.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use loona_hpack::Decoder;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface of HTTP/2.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Largest frame payload every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value).
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is passed on untouched (the server refuses it anyway).
const MAX_BLOCK: usize = 1 << 20;
/// What replaces an `:authority` that is not one.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// An api socket connection whose client header blocks go through a [`Rewriter`].
pub struct UdsConn<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to the server, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    scratch: Box<[u8]>,
    eof: bool,
}

impl<S> UdsConn<S> {
    pub fn new(inner: S) -> UdsConn<S> {
        UdsConn {
            inner,
            rewriter: Rewriter::default(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; 64 * 1024].into_boxed_slice(),
            eof: false,
        }
    }
}

impl<S: Connected> Connected for UdsConn<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for UdsConn<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = buf.remaining().min(this.out.len() - this.out_pos);
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof || buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut read = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            let n = read.filled().len();
            if n == 0 {
                // The client closed: hand over what is left, a cut-off frame included.
                this.eof = true;
                this.rewriter.finish(&mut this.out);
            } else {
                this.rewriter.push(&this.scratch[..n], &mut this.out);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for UdsConn<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// This many bytes of the connection preface are still to come.
    Preface(usize),
    Frames,
    /// Not HTTP/2 as expected: everything passes unchanged.
    Passthrough,
}

/// A header block whose HEADERS frame came, waiting for its CONTINUATION frames.
struct Pending {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
    /// The frames as received, passed on if the block cannot be rewritten.
    original: Vec<u8>,
}

/// The client-to-server byte stream of one HTTP/2 connection, header blocks rewritten.
pub struct Rewriter {
    stage: Stage,
    raw: Vec<u8>,
    decoder: Decoder<'static>,
    pending: Option<Pending>,
    /// Authorities rewritten on this connection (logged once).
    rewritten: u64,
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            stage: Stage::Preface(PREFACE.len()),
            raw: Vec::new(),
            decoder: Decoder::new(),
            pending: None,
            rewritten: 0,
        }
    }
}

impl Rewriter {
    /// Takes bytes from the client; appends what the server should read to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.stage == Stage::Passthrough {
            out.extend_from_slice(input);
            return;
        }
        self.raw.extend_from_slice(input);
        let mut at = 0;
        loop {
            match self.stage {
                Stage::Passthrough => {
                    out.extend_from_slice(&self.raw[at..]);
                    at = self.raw.len();
                    break;
                }
                Stage::Preface(left) => {
                    let n = left.min(self.raw.len() - at);
                    let from = PREFACE.len() - left;
                    if self.raw[at..at + n] != PREFACE[from..from + n] {
                        self.stage = Stage::Passthrough;
                        continue;
                    }
                    out.extend_from_slice(&self.raw[at..at + n]);
                    at += n;
                    self.stage = if n == left { Stage::Frames } else { Stage::Preface(left - n) };
                    if n < left {
                        break;
                    }
                }
                Stage::Frames => {
                    let rest = &self.raw[at..];
                    if rest.len() < FRAME_HEADER {
                        break;
                    }
                    let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
                    if rest.len() < FRAME_HEADER + len {
                        break;
                    }
                    let frame = rest[..FRAME_HEADER + len].to_vec();
                    at += frame.len();
                    self.frame(frame, out);
                }
            }
        }
        self.raw.drain(..at);
    }

    /// The client closed: whatever was held back goes to the server as it came.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Some(p) = self.pending.take() {
            out.extend_from_slice(&p.original);
        }
        out.append(&mut self.raw);
        self.stage = Stage::Passthrough;
    }

    fn frame(&mut self, frame: Vec<u8>, out: &mut Vec<u8>) {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        if self.pending.is_some() && kind != CONTINUATION {
            return self.give_up(frame, out);
        }
        match kind {
            HEADERS => {
                let payload = &frame[FRAME_HEADER..];
                let mut start = 0;
                let mut pad = 0;
                if flags & PADDED != 0 {
                    let Some(&p) = payload.first() else { return self.give_up(frame, out) };
                    pad = usize::from(p);
                    start = 1;
                }
                let mut priority = None;
                if flags & PRIORITY != 0 {
                    let Some(p) = payload.get(start..start + 5) else { return self.give_up(frame, out) };
                    priority = Some([p[0], p[1], p[2], p[3], p[4]]);
                    start += 5;
                }
                if start + pad > payload.len() {
                    return self.give_up(frame, out);
                }
                let block = payload[start..payload.len() - pad].to_vec();
                self.pending =
                    Some(Pending { stream, end_stream: flags & END_STREAM != 0, priority, block, original: frame });
            }
            CONTINUATION => {
                let Some(p) = self.pending.as_mut().filter(|p| p.stream == stream) else {
                    return self.give_up(frame, out);
                };
                p.block.extend_from_slice(&frame[FRAME_HEADER..]);
                p.original.extend_from_slice(&frame);
                if p.block.len() > MAX_BLOCK {
                    let original = std::mem::take(&mut p.original);
                    self.pending = None;
                    return self.give_up(original, out);
                }
            }
            _ => {
                out.extend_from_slice(&frame);
                return;
            }
        }
        if flags & END_HEADERS != 0 {
            self.finish_block(out);
        }
    }

    fn finish_block(&mut self, out: &mut Vec<u8>) {
        let Some(p) = self.pending.take() else { return };
        let headers = match self.decoder.decode(&p.block) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(error = ?e, "api socket: undecodable header block passed on as it came");
                return self.give_up(p.original, out);
            }
        };
        let mut block = Vec::with_capacity(p.block.len() + 64);
        for (name, value) in &headers {
            let value = if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                self.rewritten += 1;
                if self.rewritten == 1 {
                    tracing::debug!(
                        authority = %String::from_utf8_lossy(value),
                        "api socket: a client sent an :authority that is not one; serving it as localhost"
                    );
                }
                LOCAL_AUTHORITY
            } else {
                value.as_slice()
            };
            encode_literal(name, value, &mut block);
        }
        let mut flags = if p.end_stream { END_STREAM } else { 0 };
        let mut first = Vec::with_capacity(MAX_FRAME);
        if let Some(prio) = p.priority {
            flags |= PRIORITY;
            first.extend_from_slice(&prio);
        }
        let n = block.len().min(MAX_FRAME - first.len());
        first.extend_from_slice(&block[..n]);
        let mut rest = block[n..].chunks(MAX_FRAME).peekable();
        if rest.peek().is_none() {
            flags |= END_HEADERS;
        }
        write_frame(HEADERS, flags, p.stream, &first, out);
        while let Some(chunk) = rest.next() {
            let flags = if rest.peek().is_none() { END_HEADERS } else { 0 };
            write_frame(CONTINUATION, flags, p.stream, chunk, out);
        }
    }

    /// Passes `frame` and everything after it on unchanged.
    fn give_up(&mut self, frame: Vec<u8>, out: &mut Vec<u8>) {
        if let Some(p) = self.pending.take() {
            out.extend_from_slice(&p.original);
        }
        out.extend_from_slice(&frame);
        self.stage = Stage::Passthrough;
    }
}

/// HPACK "literal header field without indexing, new name", no Huffman coding: the server's
/// dynamic table is never used, so it cannot drift from the client's.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0);
    for s in [name, value] {
        out.extend_from_slice(&loona_hpack::encoder::encode_integer(s.len(), 7));
        out.extend_from_slice(s);
    }
}

fn write_frame(kind: u8, flags: u8, stream: u32, payload: &[u8], out: &mut Vec<u8>) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests;
