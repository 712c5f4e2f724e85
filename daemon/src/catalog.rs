//! The catalogue of what gpuprof stores: the record kinds, the tables they live in, and how
//! many of each a wire batch carries. A leaf: it uses no other daemon module.

use gpuprof_proto::agent::{RecordBatch, RecordKind as WireKind};

/// The record kinds gpuprof stores, one table each.
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
}

impl Kind {
    pub const ALL: [Kind; 14] = [
        Kind::Kernel,
        Kind::Memcpy,
        Kind::Memset,
        Kind::Api,
        Kind::Sync,
        Kind::Overhead,
        Kind::Marker,
        Kind::ExternalCorrelation,
        Kind::Device,
        Kind::Context,
        Kind::Stream,
        Kind::Graph,
        Kind::PmSample,
        Kind::PcSample,
    ];

    /// Name used in the API, in `drops.kind` and as the table name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kernel => "kernel",
            Kind::Memcpy => "memcpy",
            Kind::Memset => "memset",
            Kind::Api => "api",
            Kind::Sync => "sync",
            Kind::Overhead => "overhead",
            Kind::Marker => "marker",
            Kind::ExternalCorrelation => "external_correlation",
            Kind::Device => "device",
            Kind::Context => "context",
            Kind::Stream => "stream",
            Kind::Graph => "graph",
            Kind::PmSample => "pm_sample",
            Kind::PcSample => "pc_sample",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Maps the wire enum; `None` for UNSPECIFIED or unknown values.
    pub fn from_wire(v: i32) -> Option<Kind> {
        let w = WireKind::try_from(v).ok()?;
        Some(match w {
            WireKind::Unspecified => return None,
            WireKind::Kernel => Kind::Kernel,
            WireKind::Memcpy => Kind::Memcpy,
            WireKind::Memset => Kind::Memset,
            WireKind::Api => Kind::Api,
            WireKind::Sync => Kind::Sync,
            WireKind::Overhead => Kind::Overhead,
            WireKind::Marker => Kind::Marker,
            WireKind::ExternalCorrelation => Kind::ExternalCorrelation,
            WireKind::Device => Kind::Device,
            WireKind::Context => Kind::Context,
            WireKind::Stream => Kind::Stream,
            WireKind::Graph => Kind::Graph,
            WireKind::PmSample => Kind::PmSample,
            WireKind::PcSample => Kind::PcSample,
        })
    }
}

/// Record tables that carry a `session` and a `proc` column.
pub const RECORD_TABLES: &[&str] = &[
    "kernel",
    "memcpy",
    "memset",
    "api",
    "sync",
    "overhead",
    "marker",
    "external_correlation",
    "context",
    "stream",
    "graph",
];

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
    match table {
        "kernel" => KERNEL_PAIR,
        "api" => API_PAIR,
        _ => &[],
    }
}

/// Whether a row of the record kind's `_data` table holds up to two records (migration 0012).
pub fn paired(table: &str) -> bool {
    !pair_columns(table).is_empty()
}

/// Where a record table's rows are stored: the record tables with a `track` column are views
/// of the same name over `<name>_data` joined to `tracks` (migration 0008), and writes and
/// deletions go to the `_data` table; `context` and `stream` are tables themselves (None).
pub fn data_table(table: &str) -> Option<&'static str> {
    Some(match table {
        "kernel" => "kernel_data",
        "memcpy" => "memcpy_data",
        "memset" => "memset_data",
        "api" => "api_data",
        "sync" => "sync_data",
        "overhead" => "overhead_data",
        "marker" => "marker_data",
        "external_correlation" => "external_correlation_data",
        "graph" => "graph_data",
        _ => return None,
    })
}

/// Records in a batch, per kind (only non-zero kinds).
pub fn batch_counts(b: &RecordBatch) -> impl Iterator<Item = (Kind, u64)> {
    [
        (Kind::Kernel, b.kernels.len()),
        (Kind::Memcpy, b.memcpys.len()),
        (Kind::Memset, b.memsets.len()),
        (Kind::Api, b.api_calls.len()),
        (Kind::Sync, b.syncs.len()),
        (Kind::Overhead, b.overheads.len()),
        (Kind::Marker, b.markers.len()),
        (Kind::ExternalCorrelation, b.external_correlations.len()),
        (Kind::Device, b.devices.len()),
        (Kind::Context, b.contexts.len()),
        (Kind::Stream, b.streams.len()),
        (Kind::Graph, b.graphs.len()),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .map(|(k, n)| (k, n as u64))
}

/// Total records in a batch.
pub fn batch_len(b: &RecordBatch) -> u64 {
    batch_counts(b).map(|(_, n)| n).sum()
}
