//! One record of any event table as the exports' reading threads and merge see it ([`Rec`]),
//! for `records.rs` (which reads and merges), `scan.rs`, `sort.rs` and `flows.rs`.

pub use crate::catalog::EVENT_TABLES;

/// One record from any table, as the merge sees it.
#[derive(Clone)]
pub(super) struct Rec {
    pub(super) proc: i64,
    pub(super) start: i64,
    /// Index into [`EVENT_TABLES`].
    pub(super) table: usize,
    /// Columns after proc/start, as in `select_cols`.
    pub(super) v: [i64; 8],
}
