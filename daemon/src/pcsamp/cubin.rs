//! Reassembling the cubins an agent sends in pieces (`CubinChunk`), checked as they come.
//!
//! Pieces of one cubin arrive in order (each starts where the previous one ended); pieces of
//! different cubins may interleave. The buffer grows with the bytes received, never to the
//! announced size up front, and a cubin already stored is only followed, not kept.

use std::collections::HashMap;

use gpuprof_proto::agent::CubinChunk;

/// Largest cubin accepted.
pub const MAX_CUBIN_BYTES: u64 = 256 << 20;
/// Largest piece accepted.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;
/// Cubins one connection may have half sent at once.
pub const MAX_OPEN: usize = 8;

struct Partial {
    size: u64,
    received: u64,
    /// None: already stored, the bytes are not kept.
    data: Option<Vec<u8>>,
}

/// One connection's cubins in progress.
#[derive(Default)]
pub struct Assembler {
    open: HashMap<String, Partial>,
}

/// Whether `hash` is CUPTI's cubin CRC as the protocol spells it: 16 hex digits.
pub fn valid_hash(hash: &str) -> bool {
    hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

impl Assembler {
    /// Takes one piece. `known` says whether the cubin is stored already. Returns the whole
    /// cubin (hash, bytes) once its last piece arrived and it is to be stored; an error is a
    /// protocol error.
    pub fn chunk(&mut self, c: CubinChunk, known: impl Fn(&str) -> bool) -> Result<Option<(String, Vec<u8>)>, String> {
        if !valid_hash(&c.hash) {
            return Err(format!("cubin hash {:?} is not 16 hex digits", c.hash.chars().take(40).collect::<String>()));
        }
        if c.size == 0 || c.size > MAX_CUBIN_BYTES {
            return Err(format!("cubin {} has size {} (1 byte to {} MiB)", c.hash, c.size, MAX_CUBIN_BYTES >> 20));
        }
        if c.data.len() > MAX_CHUNK_BYTES {
            return Err(format!("cubin {} piece of {} bytes (at most 1 MiB)", c.hash, c.data.len()));
        }
        let end = c.offset.checked_add(c.data.len() as u64).filter(|e| *e <= c.size);
        let Some(end) = end else {
            return Err(format!(
                "cubin {} piece [{}, +{}) goes past its size {}",
                c.hash,
                c.offset,
                c.data.len(),
                c.size
            ));
        };
        if !self.open.contains_key(&c.hash) {
            if c.offset != 0 {
                return Err(format!("cubin {} starts at offset {} (pieces come in order from 0)", c.hash, c.offset));
            }
            if self.open.len() >= MAX_OPEN {
                return Err(format!("more than {MAX_OPEN} cubins half sent at once"));
            }
            let data = if known(&c.hash) { None } else { Some(Vec::new()) };
            self.open.insert(c.hash.clone(), Partial { size: c.size, received: 0, data });
        }
        let Some(p) = self.open.get_mut(&c.hash) else {
            return Ok(None);
        };
        if p.size != c.size {
            return Err(format!("cubin {} announced as {} bytes, then {}", c.hash, p.size, c.size));
        }
        if c.offset != p.received {
            return Err(format!("cubin {} piece at offset {}, expected {}", c.hash, c.offset, p.received));
        }
        if let Some(d) = p.data.as_mut() {
            d.extend_from_slice(&c.data);
        }
        p.received = end;
        if end < p.size {
            return Ok(None);
        }
        let done = self.open.remove(&c.hash).and_then(|p| p.data);
        Ok(done.map(|d| (c.hash, d)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(hash: &str, size: u64, offset: u64, data: &[u8]) -> CubinChunk {
        CubinChunk { hash: hash.into(), size, offset, data: data.to_vec() }
    }

    #[test]
    fn pieces_make_a_cubin_and_bad_ones_are_refused() {
        let mut a = Assembler::default();
        let h = "0123456789abcdef";
        assert_eq!(a.chunk(piece(h, 5, 0, b"abc"), |_| false), Ok(None));
        assert_eq!(a.chunk(piece(h, 5, 3, b"de"), |_| false), Ok(Some((h.to_string(), b"abcde".to_vec()))));
        // Known: followed, not kept.
        assert_eq!(a.chunk(piece(h, 2, 0, b"xy"), |_| true), Ok(None));
        for bad in [
            piece("0123", 5, 0, b"a"),
            piece("0123456789abcdeg", 5, 0, b"a"),
            piece(h, 4, 2, b"abc"),
            piece(h, MAX_CUBIN_BYTES + 1, 0, b"a"),
            piece(h, 0, 0, b""),
            piece(h, 8, 4, b"a"),
            piece(h, u64::MAX, u64::MAX - 1, b"ab"),
        ] {
            assert!(Assembler::default().chunk(bad.clone(), |_| false).is_err(), "{bad:?}");
        }
        let mut a = Assembler::default();
        a.chunk(piece(h, 6, 0, b"ab"), |_| false).unwrap();
        assert!(a.chunk(piece(h, 6, 4, b"ef"), |_| false).is_err(), "a gap");
        assert!(a.chunk(piece(h, 7, 2, b"cd"), |_| false).is_err(), "another size");
    }
}
