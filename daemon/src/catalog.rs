//! The catalogue of what gpuprof stores, the one definition of the record kinds: for each,
//! its table, the values the writer stores per row, how rows pair records, whether it is timed,
//! and the lists it is in (record tables, QueryRecords kinds, trace events, Parquet files).
//! The kinds, their names and a batch's counts come from [`gpuprof_proto::kinds`]; the stats
//! arrays are [`Kind::COUNT`] long. A leaf: it uses no other daemon module.

use gpuprof_proto::agent::{RecordBatch, RecordKind as WireKind};
use gpuprof_proto::kinds;

/// The record kinds gpuprof stores, one table each, in wire order (`index() + 1` is the wire
/// value); the index is the kind's slot in the stats arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Kernel,
    Memcpy,
    Memset,
    Api,
    Sync,
    Overhead,
    Marker,
    ExternalCorrelation,
    Device,
    Context,
    Stream,
    Graph,
    PmSample,
    PcSample,
    Collective,
}

impl Kind {
    /// How many kinds there are: the length of per-kind arrays.
    pub const COUNT: usize = kinds::COUNT;

    pub const ALL: [Kind; Kind::COUNT] = {
        let mut all = [Kind::Kernel; Kind::COUNT];
        let mut i = 0;
        while i < Kind::COUNT {
            assert!(SPECS[i].kind as usize == i, "SPECS is in Kind order");
            all[i] = SPECS[i].kind;
            i += 1;
        }
        all
    };

    /// Name used in the API, in `drops.kind` and as the table name.
    pub const fn name(self) -> &'static str {
        kinds::name(self.wire())
    }

    pub const fn index(self) -> usize {
        self as usize
    }

    /// The wire enum's value for the kind.
    pub const fn wire(self) -> WireKind {
        kinds::ALL[self.index()]
    }

    /// What the catalogue says of the kind.
    pub const fn spec(self) -> &'static Spec {
        &SPECS[self.index()]
    }

    /// Maps the wire enum; `None` for UNSPECIFIED or unknown values.
    pub fn from_wire(v: i32) -> Option<Kind> {
        let i = usize::try_from(v).ok()?.checked_sub(1)?;
        Kind::ALL.get(i).copied()
    }

    /// The kind whose table is `table`.
    pub fn of_table(table: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == table)
    }
}

/// What gpuprof stores of a record kind, and where the kind is listed.
#[derive(Debug)]
pub struct Spec {
    pub kind: Kind,
    /// The `_data` table a record table's rows are stored in: the record tables with a `track`
    /// column are views of the kind's name over `<name>_data` joined to `tracks` (migration
    /// 0008), and writes and deletions go to the `_data` table; `context` and `stream` are
    /// tables themselves (None), as are the kinds that are no record tables.
    pub data: Option<&'static str>,
    /// Values per row the writer inserts (`rows.rs`; 0: not written from a record batch's rows).
    pub cols: usize,
    /// How a row holds two records of a track (see [`Second`]); empty: one record a row.
    pub pair: &'static [(&'static str, Second)],
    /// A record table: carries a `session` and a `proc` column.
    pub record: bool,
    /// Has `start` and `dur` (times relative to `processes.base_ns`).
    pub timed: bool,
    /// Served by QueryRecords.
    pub query: bool,
    /// Place among the tables whose rows become trace events.
    pub event: Option<usize>,
    /// Place among the files of a Parquet export.
    pub parquet: Option<usize>,
}

/// A record table stored in `<name>_data`, timed, one record a row, in no list but the record
/// tables.
const fn data(kind: Kind, data: &'static str, cols: usize) -> Spec {
    Spec {
        kind,
        data: Some(data),
        cols,
        pair: &[],
        record: true,
        timed: true,
        query: false,
        event: None,
        parquet: None,
    }
}

/// A kind stored outside the record tables (devices, PM and PC samples).
const fn other(kind: Kind) -> Spec {
    Spec { kind, data: None, cols: 0, pair: &[], record: false, timed: false, query: false, event: None, parquet: None }
}

/// The catalogue, in [`Kind`] order.
pub const SPECS: [Spec; Kind::COUNT] = [
    Spec {
        cols: 1 + 2 * KERNEL_PAIR.len(),
        pair: KERNEL_PAIR,
        query: true,
        event: Some(0),
        parquet: Some(0),
        ..data(Kind::Kernel, "kernel_data", 0)
    },
    Spec { query: true, event: Some(1), parquet: Some(1), ..data(Kind::Memcpy, "memcpy_data", 6) },
    Spec { query: true, event: Some(2), parquet: Some(2), ..data(Kind::Memset, "memset_data", 8) },
    Spec {
        cols: 1 + 2 * API_PAIR.len(),
        pair: API_PAIR,
        query: true,
        event: Some(4),
        parquet: Some(4),
        ..data(Kind::Api, "api_data", 0)
    },
    Spec { query: true, event: Some(6), parquet: Some(5), ..data(Kind::Sync, "sync_data", 6) },
    Spec { event: Some(7), parquet: Some(7), ..data(Kind::Overhead, "overhead_data", 6) },
    Spec { query: true, event: Some(5), parquet: Some(6), ..data(Kind::Marker, "marker_data", 7) },
    Spec { timed: false, parquet: Some(8), ..data(Kind::ExternalCorrelation, "external_correlation_data", 4) },
    other(Kind::Device),
    Spec { data: None, timed: false, parquet: Some(9), ..data(Kind::Context, "", 5) },
    Spec { data: None, timed: false, parquet: Some(10), ..data(Kind::Stream, "", 6) },
    Spec { event: Some(3), parquet: Some(3), ..data(Kind::Graph, "graph_data", 5) },
    other(Kind::PmSample),
    // pc_sample: samples per (process, function, PC, stall reason), summed over the session.
    Spec { parquet: Some(11), ..other(Kind::PcSample) },
    // NCCL collectives: enqueue on the host (start, dur) and execution in the kernel.
    Spec { query: true, event: Some(8), parquet: Some(12), ..data(Kind::Collective, "collective_data", 17) },
];

/// The lists of kinds the catalogue makes.
#[derive(Clone, Copy)]
enum List {
    Record,
    Query,
    Event,
    Parquet,
}

/// Where a kind is in `list`, given how many kinds before it are; None: not in it.
const fn place(s: &Spec, list: List, before: usize) -> Option<usize> {
    match list {
        List::Record if s.record => Some(before),
        List::Query if s.query => Some(before),
        List::Event => s.event,
        List::Parquet => s.parquet,
        _ => None,
    }
}

const fn list_len(list: List) -> usize {
    let (mut i, mut n) = (0, 0);
    while i < Kind::COUNT {
        if place(&SPECS[i], list, n).is_some() {
            n += 1;
        }
        i += 1;
    }
    n
}

/// The table names of `list`, in its order.
const fn names<const N: usize>(list: List) -> [&'static str; N] {
    let mut out = [""; N];
    let (mut i, mut n) = (0, 0);
    while i < Kind::COUNT {
        if let Some(at) = place(&SPECS[i], list, n) {
            out[at] = SPECS[i].kind.name();
            n += 1;
        }
        i += 1;
    }
    out
}

/// Record tables that carry a `session` and a `proc` column.
pub const RECORD_TABLES: &[&str] = &names::<{ list_len(List::Record) }>(List::Record);

/// Record kinds QueryRecords serves.
pub const QUERY_KINDS: &[&str] = &names::<{ list_len(List::Query) }>(List::Query);

/// Tables whose rows become trace events, in the order the exports read them.
pub const EVENT_TABLES: &[&str] = &names::<{ list_len(List::Event) }>(List::Event);

/// The record kinds (tables) that become Parquet files, in file order.
pub const PARQUET_KINDS: &[&str] = &names::<{ list_len(List::Parquet) }>(List::Parquet);

/// How the second record of a paired row (migration 0012) stores one of the record's values:
/// in the column of the same name with a `2` after it, as it is or less the first record's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Second {
    /// `<col>2` = the second record's value - the first's (a few bytes instead of several).
    Delta,
    /// `<col>2` = the second record's value.
    Own,
}

/// The columns of `kernel_data` after `track`, in order, with how a row's second record stores
/// each; the `2` columns follow in the same order.
pub const KERNEL_PAIR: &[(&str, Second)] = &[
    ("corr", Second::Delta),
    ("shape", Second::Own),
    ("start", Second::Delta),
    ("dur", Second::Own),
    ("gx", Second::Own),
];

/// The columns of `api_data` after `track`, as [`KERNEL_PAIR`].
pub const API_PAIR: &[(&str, Second)] =
    &[("corr", Second::Delta), ("kind", Second::Own), ("start", Second::Delta), ("dur", Second::Own)];

/// The record's columns of a `_data` table whose rows hold up to two records of a track
/// (migration 0012), with how the second is stored; empty for the kinds stored one to a row.
/// `dur2` is NULL in a row that holds one record.
pub fn pair_columns(table: &str) -> &'static [(&'static str, Second)] {
    Kind::of_table(table).map_or(&[], |k| k.spec().pair)
}

/// Whether a row of the record kind's `_data` table holds up to two records (migration 0012).
pub fn paired(table: &str) -> bool {
    !pair_columns(table).is_empty()
}

/// Where a record table's rows are stored (see [`Spec::data`]).
pub fn data_table(table: &str) -> Option<&'static str> {
    Kind::of_table(table)?.spec().data
}

/// Whether a record table has `start` and `dur` (times relative to `processes.base_ns`).
pub fn timed(table: &str) -> bool {
    Kind::of_table(table).is_none_or(|k| k.spec().timed)
}

/// Records in a batch, per kind (only non-zero kinds).
pub fn batch_counts(b: &RecordBatch) -> impl Iterator<Item = (Kind, u64)> {
    kinds::batch_counts(b)
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .filter_map(|(k, n)| Some((Kind::from_wire(k as i32)?, n as u64)))
}

/// Total records in a batch.
pub fn batch_len(b: &RecordBatch) -> u64 {
    batch_counts(b).map(|(_, n)| n).sum()
}

#[cfg(test)]
mod tests;
