//! Length-prefixed framing shared by agents (blocking I/O) and the daemon (async):
//! a frame is a u32 little-endian length followed by that many bytes of one
//! protobuf message.

use std::fmt;
use std::io::{self, Read, Write};

use prost::Message;

/// Default largest frame the daemon accepts (4 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 4 << 20;

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection cleanly between frames.
    Closed,
    /// The peer closed the connection in the middle of a frame: inside its length (`part`
    /// "frame length") or its body ("frame body").
    Truncated { part: &'static str, expected: usize, got: usize },
    /// The announced length is larger than allowed.
    Oversized { len: u32, max: u32 },
    /// The bytes are not a valid message.
    Decode(prost::DecodeError),
    /// Socket error.
    Io(io::Error),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Closed => write!(f, "connection closed"),
            FrameError::Truncated { part, expected, got } => {
                write!(f, "truncated frame: connection ended inside the {part} ({got} of {expected} bytes)")
            }
            FrameError::Oversized { len, max } => {
                write!(f, "frame of {len} bytes exceeds the maximum of {max} bytes")
            }
            FrameError::Decode(e) => write!(f, "malformed message: {e}"),
            FrameError::Io(e) => write!(f, "i/o error: {e}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// Appends one frame holding `msg` to `buf`.
pub fn encode_frame<M: Message>(msg: &M, buf: &mut Vec<u8>) {
    let len = msg.encoded_len();
    buf.reserve(4 + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    // Encoding into a Vec cannot fail: it grows as needed.
    msg.encode(buf).expect("Vec<u8> has unbounded capacity");
}

/// Writes one frame holding `msg` (blocking).
pub fn write_frame<M: Message, W: Write>(w: &mut W, msg: &M) -> io::Result<()> {
    let mut buf = Vec::new();
    encode_frame(msg, &mut buf);
    w.write_all(&buf)
}

/// The length a frame's prefix announces, if at most `max`.
fn frame_len(prefix: [u8; 4], max: u32) -> Result<u32, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    Ok(len)
}

/// Up to this much of a frame's body is reserved before it arrives: a peer that announces a
/// large frame and then stalls holds only the bytes it really sent.
const RESERVE: usize = 64 << 10;

fn body_truncated(len: u32, got: usize) -> FrameError {
    FrameError::Truncated { part: "frame body", expected: len as usize, got }
}

/// Reads a whole frame's payload into `buf` (blocking), the body as it arrives. `Closed`
/// means a clean end of stream.
pub fn read_frame_into<R: Read>(r: &mut R, buf: &mut Vec<u8>, max: u32) -> Result<(), FrameError> {
    let mut prefix = [0u8; 4];
    let n = read_full(r, &mut prefix)?;
    if n == 0 {
        return Err(FrameError::Closed);
    }
    if n < 4 {
        return Err(FrameError::Truncated { part: "frame length", expected: 4, got: n });
    }
    let len = frame_len(prefix, max)?;
    buf.clear();
    buf.reserve((len as usize).min(RESERVE));
    let got = r.take(u64::from(len)).read_to_end(buf)?;
    if got < len as usize {
        return Err(body_truncated(len, got));
    }
    Ok(())
}

/// [`read_frame_into`] for the daemon's async connections; `started` is set once the frame's
/// first byte has arrived (a peer stalled inside a frame is told apart from a silent one).
#[cfg(feature = "async")]
pub async fn read_frame_async<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: u32,
    started: &mut bool,
) -> Result<(), FrameError> {
    use tokio::io::AsyncReadExt;
    let mut prefix = [0u8; 4];
    if r.read(&mut prefix[..1]).await? == 0 {
        return Err(FrameError::Closed);
    }
    *started = true;
    let mut got = 1;
    while got < 4 {
        match r.read(&mut prefix[got..]).await? {
            0 => return Err(FrameError::Truncated { part: "frame length", expected: 4, got }),
            n => got += n,
        }
    }
    let len = frame_len(prefix, max)?;
    buf.clear();
    buf.reserve((len as usize).min(RESERVE));
    let got = (&mut *r).take(u64::from(len)).read_to_end(buf).await?;
    if got < len as usize {
        return Err(body_truncated(len, got));
    }
    Ok(())
}

/// Reads and decodes one message (blocking).
pub fn read_message<M: Message + Default, R: Read>(r: &mut R, max: u32) -> Result<M, FrameError> {
    let mut buf = Vec::new();
    read_frame_into(r, &mut buf, max)?;
    M::decode(buf.as_slice()).map_err(FrameError::Decode)
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut off = 0;
    while off < buf.len() {
        match r.read(&mut buf[off..]) {
            Ok(0) => break,
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{AgentMessage, Hello, agent_message::Msg};

    fn hello() -> AgentMessage {
        AgentMessage { msg: Some(Msg::Hello(Hello { pid: 42, exe: "/usr/bin/python3".into(), ..Default::default() })) }
    }

    #[test]
    fn round_trip() {
        let mut buf = Vec::new();
        encode_frame(&hello(), &mut buf);
        encode_frame(&hello(), &mut buf);
        let mut r = buf.as_slice();
        for _ in 0..2 {
            let m: AgentMessage = read_message(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap();
            assert_eq!(m, hello());
        }
        assert!(matches!(read_message::<AgentMessage, _>(&mut r, 1024), Err(FrameError::Closed)));
    }

    #[test]
    fn rejects_oversized_truncated_and_garbage() {
        let mut buf = Vec::new();
        encode_frame(&hello(), &mut buf);
        let err = read_message::<AgentMessage, _>(&mut buf.as_slice(), 4).unwrap_err();
        assert!(matches!(err, FrameError::Oversized { max: 4, .. }), "{err}");
        let err = read_message::<AgentMessage, _>(&mut &buf[..buf.len() - 1], 1024).unwrap_err();
        let body = buf.len() - 4;
        assert!(
            matches!(err, FrameError::Truncated { part: "frame body", expected, got } if expected == body && got == body - 1),
            "{err}"
        );
        let err = read_message::<AgentMessage, _>(&mut &buf[..2], 1024).unwrap_err();
        assert!(matches!(err, FrameError::Truncated { part: "frame length", expected: 4, got: 2 }), "{err}");
        let garbage = [5u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff];
        let err = read_message::<AgentMessage, _>(&mut &garbage[..], 1024).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err}");
    }
}
