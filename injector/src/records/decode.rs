//! Reading CUPTI 13.0 record bytes into [`Record`]s at the offsets the bindings give.

use std::mem::{offset_of, size_of};

use gpuprof_cupti::ids;

use super::types::{
    Api, Context, Device, ExternalCorrelation, Graph, Kernel, Marker, Memcpy, Memset, Overhead, Record, Stream, Sync,
};

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the record kind's struct.
    Truncated { kind: u32, need: usize, got: usize },
    /// A kind gpuprof does not decode (it is counted, not sent).
    Unhandled(u32),
}

/// Size in bytes of the CUPTI 13.0 struct for `kind`, if gpuprof decodes that kind.
pub fn record_size(kind: u32) -> Option<usize> {
    Some(match kind {
        ids::CUPTI_ACTIVITY_KIND_KERNEL | ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => {
            size_of::<ids::CUpti_ActivityKernel10>()
        }
        ids::CUPTI_ACTIVITY_KIND_MEMCPY => size_of::<ids::CUpti_ActivityMemcpy6>(),
        ids::CUPTI_ACTIVITY_KIND_MEMCPY2 => size_of::<ids::CUpti_ActivityMemcpyPtoP4>(),
        ids::CUPTI_ACTIVITY_KIND_MEMSET => size_of::<ids::CUpti_ActivityMemset4>(),
        ids::CUPTI_ACTIVITY_KIND_RUNTIME | ids::CUPTI_ACTIVITY_KIND_DRIVER => size_of::<ids::CUpti_ActivityAPI>(),
        ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => size_of::<ids::CUpti_ActivitySynchronization2>(),
        ids::CUPTI_ACTIVITY_KIND_OVERHEAD => size_of::<ids::CUpti_ActivityOverhead3>(),
        ids::CUPTI_ACTIVITY_KIND_MARKER => size_of::<ids::CUpti_ActivityMarker2>(),
        ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => size_of::<ids::CUpti_ActivityExternalCorrelation>(),
        ids::CUPTI_ACTIVITY_KIND_DEVICE => size_of::<ids::CUpti_ActivityDevice5>(),
        ids::CUPTI_ACTIVITY_KIND_CONTEXT => size_of::<ids::CUpti_ActivityContext3>(),
        ids::CUPTI_ACTIVITY_KIND_STREAM => size_of::<ids::CUpti_ActivityStream>(),
        ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => size_of::<ids::CUpti_ActivityGraphTrace2>(),
        _ => return None,
    })
}

/// The record kind stored in the first four bytes, if there are four.
pub fn peek_kind(buf: &[u8]) -> Option<u32> {
    buf.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Little-endian reads at struct offsets; callers checked the length against the struct size.
struct Rd<'a>(&'a [u8]);

impl Rd<'_> {
    fn u8(&self, off: usize) -> u8 {
        self.0[off]
    }
    fn u16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.0[off], self.0[off + 1]])
    }
    fn u32(&self, off: usize) -> u32 {
        let b = &self.0[off..off + 4];
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
    fn i32(&self, off: usize) -> i32 {
        self.u32(off) as i32
    }
    fn u64(&self, off: usize) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.0[off..off + 8]);
        u64::from_le_bytes(a)
    }
}

macro_rules! at {
    ($t:ident, $f:ident) => {
        offset_of!(ids::$t, $f)
    };
}

/// Decodes one record laid out as CUPTI 13.0 writes it. `buf` starts at the record and may run
/// past its end (the rest is ignored).
pub fn decode(buf: &[u8]) -> Result<Record, DecodeError> {
    let kind = peek_kind(buf).ok_or(DecodeError::Truncated { kind: 0, need: 4, got: buf.len() })?;
    let need = record_size(kind).ok_or(DecodeError::Unhandled(kind))?;
    if buf.len() < need {
        return Err(DecodeError::Truncated { kind, need, got: buf.len() });
    }
    let r = Rd(&buf[..need]);
    Ok(match kind {
        ids::CUPTI_ACTIVITY_KIND_KERNEL | ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => Record::Kernel(Kernel {
            start: r.u64(at!(CUpti_ActivityKernel10, start)),
            end: r.u64(at!(CUpti_ActivityKernel10, end)),
            device_id: r.u32(at!(CUpti_ActivityKernel10, deviceId)),
            context_id: r.u32(at!(CUpti_ActivityKernel10, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityKernel10, streamId)),
            correlation_id: r.u32(at!(CUpti_ActivityKernel10, correlationId)),
            name: r.u64(at!(CUpti_ActivityKernel10, name)),
            grid: [
                r.i32(at!(CUpti_ActivityKernel10, gridX)),
                r.i32(at!(CUpti_ActivityKernel10, gridY)),
                r.i32(at!(CUpti_ActivityKernel10, gridZ)),
            ],
            block: [
                r.i32(at!(CUpti_ActivityKernel10, blockX)),
                r.i32(at!(CUpti_ActivityKernel10, blockY)),
                r.i32(at!(CUpti_ActivityKernel10, blockZ)),
            ],
            registers_per_thread: r.u16(at!(CUpti_ActivityKernel10, registersPerThread)),
            static_shared: r.i32(at!(CUpti_ActivityKernel10, staticSharedMemory)),
            dynamic_shared: r.i32(at!(CUpti_ActivityKernel10, dynamicSharedMemory)),
            graph_node_id: r.u64(at!(CUpti_ActivityKernel10, graphNodeId)),
            graph_id: r.u32(at!(CUpti_ActivityKernel10, graphId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_MEMCPY => Record::Memcpy(Memcpy {
            start: r.u64(at!(CUpti_ActivityMemcpy6, start)),
            end: r.u64(at!(CUpti_ActivityMemcpy6, end)),
            device_id: r.u32(at!(CUpti_ActivityMemcpy6, deviceId)),
            context_id: r.u32(at!(CUpti_ActivityMemcpy6, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityMemcpy6, streamId)),
            correlation_id: r.u32(at!(CUpti_ActivityMemcpy6, correlationId)),
            bytes: r.u64(at!(CUpti_ActivityMemcpy6, bytes)),
            copy_kind: r.u8(at!(CUpti_ActivityMemcpy6, copyKind)),
            src_kind: r.u8(at!(CUpti_ActivityMemcpy6, srcKind)),
            dst_kind: r.u8(at!(CUpti_ActivityMemcpy6, dstKind)),
            is_async: u32::from(r.u8(at!(CUpti_ActivityMemcpy6, flags))) & ids::CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC != 0,
            src_device_id: 0,
            dst_device_id: 0,
            graph_node_id: r.u64(at!(CUpti_ActivityMemcpy6, graphNodeId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_MEMCPY2 => Record::Memcpy(Memcpy {
            start: r.u64(at!(CUpti_ActivityMemcpyPtoP4, start)),
            end: r.u64(at!(CUpti_ActivityMemcpyPtoP4, end)),
            device_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, deviceId)),
            context_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, streamId)),
            correlation_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, correlationId)),
            bytes: r.u64(at!(CUpti_ActivityMemcpyPtoP4, bytes)),
            copy_kind: r.u8(at!(CUpti_ActivityMemcpyPtoP4, copyKind)),
            src_kind: r.u8(at!(CUpti_ActivityMemcpyPtoP4, srcKind)),
            dst_kind: r.u8(at!(CUpti_ActivityMemcpyPtoP4, dstKind)),
            is_async: u32::from(r.u8(at!(CUpti_ActivityMemcpyPtoP4, flags))) & ids::CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC
                != 0,
            src_device_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, srcDeviceId)),
            dst_device_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, dstDeviceId)),
            graph_node_id: r.u64(at!(CUpti_ActivityMemcpyPtoP4, graphNodeId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_MEMSET => Record::Memset(Memset {
            start: r.u64(at!(CUpti_ActivityMemset4, start)),
            end: r.u64(at!(CUpti_ActivityMemset4, end)),
            device_id: r.u32(at!(CUpti_ActivityMemset4, deviceId)),
            context_id: r.u32(at!(CUpti_ActivityMemset4, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityMemset4, streamId)),
            correlation_id: r.u32(at!(CUpti_ActivityMemset4, correlationId)),
            bytes: r.u64(at!(CUpti_ActivityMemset4, bytes)),
            value: r.u32(at!(CUpti_ActivityMemset4, value)),
            memory_kind: r.u16(at!(CUpti_ActivityMemset4, memoryKind)),
            graph_node_id: r.u64(at!(CUpti_ActivityMemset4, graphNodeId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_RUNTIME | ids::CUPTI_ACTIVITY_KIND_DRIVER => Record::Api(Api {
            driver: kind == ids::CUPTI_ACTIVITY_KIND_DRIVER,
            cbid: r.u32(at!(CUpti_ActivityAPI, cbid)),
            start: r.u64(at!(CUpti_ActivityAPI, start)),
            end: r.u64(at!(CUpti_ActivityAPI, end)),
            process_id: r.u32(at!(CUpti_ActivityAPI, processId)),
            thread_id: r.u32(at!(CUpti_ActivityAPI, threadId)),
            correlation_id: r.u32(at!(CUpti_ActivityAPI, correlationId)),
            return_value: r.u32(at!(CUpti_ActivityAPI, returnValue)),
        }),
        ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => Record::Sync(Sync {
            sync_type: r.u32(at!(CUpti_ActivitySynchronization2, type_)),
            start: r.u64(at!(CUpti_ActivitySynchronization2, start)),
            end: r.u64(at!(CUpti_ActivitySynchronization2, end)),
            correlation_id: r.u32(at!(CUpti_ActivitySynchronization2, correlationId)),
            context_id: r.u32(at!(CUpti_ActivitySynchronization2, contextId)),
            stream_id: r.u32(at!(CUpti_ActivitySynchronization2, streamId)),
            event_id: r.u32(at!(CUpti_ActivitySynchronization2, cudaEventId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_OVERHEAD => {
            let object_kind = r.u32(at!(CUpti_ActivityOverhead3, objectKind));
            let base = at!(CUpti_ActivityOverhead3, objectId);
            Record::Overhead(Overhead {
                overhead_kind: r.u32(at!(CUpti_ActivityOverhead3, overheadKind)),
                object_kind,
                object_id: object_id(&r, base, object_kind),
                start: r.u64(at!(CUpti_ActivityOverhead3, start)),
                end: r.u64(at!(CUpti_ActivityOverhead3, end)),
            })
        }
        ids::CUPTI_ACTIVITY_KIND_MARKER => {
            let base = at!(CUpti_ActivityMarker2, objectId);
            Record::Marker(Marker {
                flags: r.u32(at!(CUpti_ActivityMarker2, flags)),
                timestamp: r.u64(at!(CUpti_ActivityMarker2, timestamp)),
                id: r.u32(at!(CUpti_ActivityMarker2, id)),
                thread_id: r.u32(base + offset_of!(ids::CUpti_ActivityObjectKindId__bindgen_ty_1, threadId)),
                name: r.u64(at!(CUpti_ActivityMarker2, name)),
                domain: r.u64(at!(CUpti_ActivityMarker2, domain)),
            })
        }
        ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => Record::ExternalCorrelation(ExternalCorrelation {
            external_kind: r.u32(at!(CUpti_ActivityExternalCorrelation, externalKind)),
            external_id: r.u64(at!(CUpti_ActivityExternalCorrelation, externalId)),
            correlation_id: r.u32(at!(CUpti_ActivityExternalCorrelation, correlationId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_DEVICE => {
            let mut uuid = [0u8; 16];
            let off = at!(CUpti_ActivityDevice5, uuid);
            uuid.copy_from_slice(&r.0[off..off + 16]);
            Record::Device(Device {
                id: r.u32(at!(CUpti_ActivityDevice5, id)),
                uuid,
                name: r.u64(at!(CUpti_ActivityDevice5, name)),
                compute_major: r.u32(at!(CUpti_ActivityDevice5, computeCapabilityMajor)),
                compute_minor: r.u32(at!(CUpti_ActivityDevice5, computeCapabilityMinor)),
                sm_count: r.u32(at!(CUpti_ActivityDevice5, numMultiprocessors)),
                global_memory: r.u64(at!(CUpti_ActivityDevice5, globalMemorySize)),
            })
        }
        ids::CUPTI_ACTIVITY_KIND_CONTEXT => Record::Context(Context {
            context_id: r.u32(at!(CUpti_ActivityContext3, contextId)),
            device_id: r.u32(at!(CUpti_ActivityContext3, deviceId)),
            null_stream_id: r.u16(at!(CUpti_ActivityContext3, nullStreamId)),
        }),
        ids::CUPTI_ACTIVITY_KIND_STREAM => Record::Stream(Stream {
            context_id: r.u32(at!(CUpti_ActivityStream, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityStream, streamId)),
            priority: r.u32(at!(CUpti_ActivityStream, priority)),
            flags: r.u32(at!(CUpti_ActivityStream, flag)),
        }),
        ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => Record::Graph(Graph {
            start: r.u64(at!(CUpti_ActivityGraphTrace2, start)),
            end: r.u64(at!(CUpti_ActivityGraphTrace2, end)),
            device_id: r.u32(at!(CUpti_ActivityGraphTrace2, deviceId)),
            context_id: r.u32(at!(CUpti_ActivityGraphTrace2, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityGraphTrace2, streamId)),
            correlation_id: r.u32(at!(CUpti_ActivityGraphTrace2, correlationId)),
            graph_id: r.u32(at!(CUpti_ActivityGraphTrace2, graphId)),
        }),
        other => return Err(DecodeError::Unhandled(other)),
    })
}

fn object_id(r: &Rd<'_>, base: usize, object_kind: u32) -> u64 {
    type Pt = ids::CUpti_ActivityObjectKindId__bindgen_ty_1;
    type Dcs = ids::CUpti_ActivityObjectKindId__bindgen_ty_2;
    match object_kind {
        ids::CUPTI_ACTIVITY_OBJECT_PROCESS => u64::from(r.u32(base + offset_of!(Pt, processId))),
        ids::CUPTI_ACTIVITY_OBJECT_THREAD => u64::from(r.u32(base + offset_of!(Pt, threadId))),
        _ => {
            (u64::from(r.u32(base + offset_of!(Dcs, deviceId))) << 32)
                | u64::from(r.u32(base + offset_of!(Dcs, contextId)))
        }
    }
}
