//! The record kinds and the daemon's lists of them, imported from its catalogue (and the
//! protocol's list of kinds) rather than copied into each test.

pub use gpuprof_proto::kinds::{COUNT, batch_counts, name};
pub use gpuprofd::catalog::{EVENT_TABLES, PARQUET_KINDS, QUERY_KINDS, RECORD_TABLES};

/// The record tables a fake agent's [`crate::Mix`] fills: all but contexts, streams, graphs and
/// NCCL collectives (which `tests/collectives.rs` sends itself), in catalogue order.
pub fn mix_tables() -> Vec<&'static str> {
    RECORD_TABLES.iter().copied().filter(|t| !matches!(*t, "context" | "stream" | "graph" | "collective")).collect()
}
