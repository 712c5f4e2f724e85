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
    /// The peer closed the connection in the middle of a frame.
    Truncated { expected: usize, got: usize },
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
            FrameError::Truncated { expected, got } => {
                write!(f, "truncated frame: expected {expected} bytes, got {got} before end of stream")
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

/// Reads a whole frame's payload into `buf` (blocking). `Closed` means a clean end of stream.
pub fn read_frame_into<R: Read>(r: &mut R, buf: &mut Vec<u8>, max: u32) -> Result<(), FrameError> {
    let mut len_bytes = [0u8; 4];
    let n = read_full(r, &mut len_bytes)?;
    if n == 0 {
        return Err(FrameError::Closed);
    }
    if n < 4 {
        return Err(FrameError::Truncated { expected: 4, got: n });
    }
    let len = u32::from_le_bytes(len_bytes);
    if len > max {
        return Err(FrameError::Oversized { len, max });
    }
    buf.clear();
    buf.resize(len as usize, 0);
    let got = read_full(r, buf)?;
    if got < len as usize {
        return Err(FrameError::Truncated { expected: len as usize, got });
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
        assert!(matches!(err, FrameError::Truncated { .. }), "{err}");
        let err = read_message::<AgentMessage, _>(&mut &buf[..2], 1024).unwrap_err();
        assert!(matches!(err, FrameError::Truncated { expected: 4, got: 2 }), "{err}");
        let garbage = [5u8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff];
        let err = read_message::<AgentMessage, _>(&mut &garbage[..], 1024).unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err}");
    }
}
