//! The agent frame decoder (`gpuprof_proto::frame`) over arbitrary bytes: a stream of
//! length-prefixed frames read as `AgentMessage`s until the first error. Every message that
//! decodes must encode again to a frame that decodes to the same message (compared by its
//! encoding, so that NaN values compare equal), and errors must describe the bytes.
#![no_main]

use gpuprof_proto::agent::AgentMessage;
use gpuprof_proto::frame::{DEFAULT_MAX_FRAME_BYTES, FrameError, encode_frame, read_message};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    loop {
        let before = r.len();
        match read_message::<AgentMessage, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
            Ok(m) => {
                let consumed = before - r.len();
                assert!(consumed >= 4, "a frame is at least its length");
                let mut frame = Vec::new();
                encode_frame(&m, &mut frame);
                assert_eq!(frame.len(), 4 + m.encoded_len());
                let again: AgentMessage =
                    read_message(&mut frame.as_slice(), u32::MAX).expect("a re-encoded frame decodes");
                assert_eq!(again.encode_to_vec(), m.encode_to_vec(), "decode(encode(m)) == m");
                // The same frame under a limit just below its length is refused as oversized.
                let len = (frame.len() - 4) as u32;
                if len > 0 {
                    let err = read_message::<AgentMessage, _>(&mut frame.as_slice(), len - 1).unwrap_err();
                    assert!(matches!(err, FrameError::Oversized { .. }), "{err}");
                }
            }
            Err(FrameError::Closed) => {
                assert_eq!(before, 0, "Closed only at the end of the bytes");
                break;
            }
            Err(FrameError::Truncated { expected, got, .. }) => {
                assert!(got < expected, "truncated: got {got} of {expected}");
                break;
            }
            Err(FrameError::Oversized { len, max }) => {
                assert!(len > max);
                break;
            }
            Err(FrameError::Decode(_)) => break,
            Err(FrameError::Io(e)) => panic!("a byte slice gave an i/o error: {e}"),
        }
    }
});
