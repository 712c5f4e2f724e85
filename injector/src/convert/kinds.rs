//! The protocol's record kind of a decoded record or of a raw CUPTI activity kind.

use gpuprof_proto::agent as pb;

use crate::records::Record;
use gpuprof_cupti::ids;

/// Index into the per-kind counters.
pub fn kind_of(r: &Record) -> pb::RecordKind {
    match r {
        Record::Kernel(_) => pb::RecordKind::Kernel,
        Record::Memcpy(_) => pb::RecordKind::Memcpy,
        Record::Memset(_) => pb::RecordKind::Memset,
        Record::Api(_) => pb::RecordKind::Api,
        Record::Sync(_) => pb::RecordKind::Sync,
        Record::Overhead(_) => pb::RecordKind::Overhead,
        Record::Marker(_) => pb::RecordKind::Marker,
        Record::ExternalCorrelation(_) => pb::RecordKind::ExternalCorrelation,
        Record::Device(_) => pb::RecordKind::Device,
        Record::Context(_) => pb::RecordKind::Context,
        Record::Stream(_) => pb::RecordKind::Stream,
        Record::Graph(_) => pb::RecordKind::Graph,
    }
}

/// The RecordKind of a raw CUPTI activity kind (for drop counting without decoding).
pub fn kind_of_activity(kind: u32) -> pb::RecordKind {
    match kind {
        ids::CUPTI_ACTIVITY_KIND_KERNEL | ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => pb::RecordKind::Kernel,
        ids::CUPTI_ACTIVITY_KIND_MEMCPY | ids::CUPTI_ACTIVITY_KIND_MEMCPY2 => pb::RecordKind::Memcpy,
        ids::CUPTI_ACTIVITY_KIND_MEMSET => pb::RecordKind::Memset,
        ids::CUPTI_ACTIVITY_KIND_RUNTIME | ids::CUPTI_ACTIVITY_KIND_DRIVER => pb::RecordKind::Api,
        ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => pb::RecordKind::Sync,
        ids::CUPTI_ACTIVITY_KIND_OVERHEAD => pb::RecordKind::Overhead,
        ids::CUPTI_ACTIVITY_KIND_MARKER => pb::RecordKind::Marker,
        ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => pb::RecordKind::ExternalCorrelation,
        ids::CUPTI_ACTIVITY_KIND_DEVICE => pb::RecordKind::Device,
        ids::CUPTI_ACTIVITY_KIND_CONTEXT => pb::RecordKind::Context,
        ids::CUPTI_ACTIVITY_KIND_STREAM => pb::RecordKind::Stream,
        ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => pb::RecordKind::Graph,
        _ => pb::RecordKind::Unspecified,
    }
}
