//! The per-connection string table.

use std::collections::HashMap;

use gpuprof_proto::agent as pb;

/// Most distinct strings interned on one connection; past it records carry id 0 (no string)
/// rather than letting unique NVTX messages grow the table without bound.
pub const MAX_STRINGS: usize = 1 << 20;

/// Per-connection string table: ids 1, 2, 3, ... in definition order.
#[derive(Default)]
pub struct Interner {
    ids: HashMap<Box<str>, u32>,
    pending: Vec<pb::InternedString>,
    overflowed: u64,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        if self.ids.len() >= MAX_STRINGS {
            self.overflowed += 1;
            return 0;
        }
        let id = self.ids.len() as u32 + 1;
        self.ids.insert(s.into(), id);
        self.pending.push(pb::InternedString { id, value: s.to_string() });
        id
    }

    /// Definitions not yet sent.
    pub fn take_pending(&mut self) -> Option<pb::StringTable> {
        if self.pending.is_empty() {
            None
        } else {
            Some(pb::StringTable { strings: std::mem::take(&mut self.pending) })
        }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}
