//! The record kinds of the agent protocol in one place: their number, their names (the
//! daemon's table names, as in its API and `drops.kind`) and how many of each a
//! [`RecordBatch`] carries. The daemon's catalogue, the injector's counters and the test kit
//! build on these instead of listing the kinds again.

use crate::agent::{RecordBatch, RecordKind};

/// Record kinds, not counting `RECORD_KIND_UNSPECIFIED`.
pub const COUNT: usize = 15;

/// Length of an array indexed by `RecordKind as usize` (slot 0 is UNSPECIFIED's).
pub const SLOTS: usize = COUNT + 1;

/// The record kinds in wire order: `ALL[i] as usize == i + 1`.
pub const ALL: [RecordKind; COUNT] = [
    RecordKind::Kernel,
    RecordKind::Memcpy,
    RecordKind::Memset,
    RecordKind::Api,
    RecordKind::Sync,
    RecordKind::Overhead,
    RecordKind::Marker,
    RecordKind::ExternalCorrelation,
    RecordKind::Device,
    RecordKind::Context,
    RecordKind::Stream,
    RecordKind::Graph,
    RecordKind::PmSample,
    RecordKind::PcSample,
    RecordKind::Collective,
];

/// The name of the kind ("" for UNSPECIFIED).
pub const fn name(k: RecordKind) -> &'static str {
    match k {
        RecordKind::Unspecified => "",
        RecordKind::Kernel => "kernel",
        RecordKind::Memcpy => "memcpy",
        RecordKind::Memset => "memset",
        RecordKind::Api => "api",
        RecordKind::Sync => "sync",
        RecordKind::Overhead => "overhead",
        RecordKind::Marker => "marker",
        RecordKind::ExternalCorrelation => "external_correlation",
        RecordKind::Device => "device",
        RecordKind::Context => "context",
        RecordKind::Stream => "stream",
        RecordKind::Graph => "graph",
        RecordKind::PmSample => "pm_sample",
        RecordKind::PcSample => "pc_sample",
        RecordKind::Collective => "collective",
    }
}

/// The kind of that name.
pub fn by_name(name: &str) -> Option<RecordKind> {
    ALL.into_iter().find(|k| self::name(*k) == name)
}

/// The kinds a [`RecordBatch`] carries, in the order of its fields.
pub const IN_BATCH: usize = 13;

/// How many records of each kind a batch carries (zeros included), in field order.
pub fn batch_counts(b: &RecordBatch) -> [(RecordKind, usize); IN_BATCH] {
    [
        (RecordKind::Kernel, b.kernels.len()),
        (RecordKind::Memcpy, b.memcpys.len()),
        (RecordKind::Memset, b.memsets.len()),
        (RecordKind::Api, b.api_calls.len()),
        (RecordKind::Sync, b.syncs.len()),
        (RecordKind::Overhead, b.overheads.len()),
        (RecordKind::Marker, b.markers.len()),
        (RecordKind::ExternalCorrelation, b.external_correlations.len()),
        (RecordKind::Device, b.devices.len()),
        (RecordKind::Context, b.contexts.len()),
        (RecordKind::Stream, b.streams.len()),
        (RecordKind::Graph, b.graphs.len()),
        (RecordKind::Collective, b.collectives.len()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_every_kind_in_wire_order() {
        for (i, k) in ALL.iter().enumerate() {
            assert_eq!(*k as usize, i + 1);
            assert_eq!(by_name(name(*k)), Some(*k));
        }
        assert!(RecordKind::try_from(SLOTS as i32).is_err(), "a kind was added: extend ALL and COUNT");
    }
}
