//! Decoding CUPTI 13.0 activity records from raw bytes.
//!
//! Pure, safe code over `&[u8]`: every field is read at the offset the generated bindings give
//! (`offset_of!` on `src/sys/cupti.rs`), little-endian, bounds-checked. Strings (kernel names,
//! NVTX messages) stay raw addresses here; [`crate::convert`] resolves them. The tests lay out
//! buffers byte by byte at offsets copied from `cupti_activity.h`, which checks the bindings too.

use std::mem::{offset_of, size_of};

use gpuprof_cupti::sys::cupti as sys;

/// One decoded activity record. Addresses of C strings are kept as `u64` (0 = none).
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    Kernel(Kernel),
    Memcpy(Memcpy),
    Memset(Memset),
    Api(Api),
    Sync(Sync),
    Overhead(Overhead),
    Marker(Marker),
    ExternalCorrelation(ExternalCorrelation),
    Device(Device),
    Context(Context),
    Stream(Stream),
    Graph(Graph),
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Kernel {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub name: u64,
    pub grid: [i32; 3],
    pub block: [i32; 3],
    pub registers_per_thread: u16,
    pub static_shared: i32,
    pub dynamic_shared: i32,
    pub graph_node_id: u64,
    pub graph_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memcpy {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub bytes: u64,
    pub copy_kind: u8,
    pub src_kind: u8,
    pub dst_kind: u8,
    pub is_async: bool,
    /// Peer copies (MEMCPY2) only.
    pub src_device_id: u32,
    pub dst_device_id: u32,
    pub graph_node_id: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Memset {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub bytes: u64,
    pub value: u32,
    pub memory_kind: u16,
    pub graph_node_id: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Api {
    /// True for `CUPTI_ACTIVITY_KIND_DRIVER`, false for `RUNTIME`.
    pub driver: bool,
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    pub process_id: u32,
    pub thread_id: u32,
    pub correlation_id: u32,
    pub return_value: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sync {
    pub sync_type: u32,
    pub start: u64,
    pub end: u64,
    pub correlation_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub event_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overhead {
    pub overhead_kind: u32,
    pub object_kind: u32,
    /// Thread id for thread objects, process id for processes, `device << 32 | context` for
    /// device/context/stream objects.
    pub object_id: u64,
    pub start: u64,
    pub end: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marker {
    pub flags: u32,
    pub timestamp: u64,
    pub id: u32,
    pub thread_id: u32,
    pub name: u64,
    pub domain: u64,
}

impl Marker {
    pub fn is_start(&self) -> bool {
        self.flags & sys::CUPTI_ACTIVITY_FLAG_MARKER_START != 0
    }
    pub fn is_end(&self) -> bool {
        self.flags & sys::CUPTI_ACTIVITY_FLAG_MARKER_END != 0
    }
    pub fn is_instant(&self) -> bool {
        self.flags & sys::CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS != 0
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExternalCorrelation {
    pub external_kind: u32,
    pub external_id: u64,
    pub correlation_id: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    pub id: u32,
    pub uuid: [u8; 16],
    pub name: u64,
    pub compute_major: u32,
    pub compute_minor: u32,
    pub sm_count: u32,
    pub global_memory: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Context {
    pub context_id: u32,
    pub device_id: u32,
    pub null_stream_id: u16,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stream {
    pub context_id: u32,
    pub stream_id: u32,
    pub priority: u32,
    pub flags: u32,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    pub start: u64,
    pub end: u64,
    pub device_id: u32,
    pub context_id: u32,
    pub stream_id: u32,
    pub correlation_id: u32,
    pub graph_id: u32,
}

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
        sys::CUPTI_ACTIVITY_KIND_KERNEL | sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => {
            size_of::<sys::CUpti_ActivityKernel10>()
        }
        sys::CUPTI_ACTIVITY_KIND_MEMCPY => size_of::<sys::CUpti_ActivityMemcpy6>(),
        sys::CUPTI_ACTIVITY_KIND_MEMCPY2 => size_of::<sys::CUpti_ActivityMemcpyPtoP4>(),
        sys::CUPTI_ACTIVITY_KIND_MEMSET => size_of::<sys::CUpti_ActivityMemset4>(),
        sys::CUPTI_ACTIVITY_KIND_RUNTIME | sys::CUPTI_ACTIVITY_KIND_DRIVER => size_of::<sys::CUpti_ActivityAPI>(),
        sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => size_of::<sys::CUpti_ActivitySynchronization2>(),
        sys::CUPTI_ACTIVITY_KIND_OVERHEAD => size_of::<sys::CUpti_ActivityOverhead3>(),
        sys::CUPTI_ACTIVITY_KIND_MARKER => size_of::<sys::CUpti_ActivityMarker2>(),
        sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => size_of::<sys::CUpti_ActivityExternalCorrelation>(),
        sys::CUPTI_ACTIVITY_KIND_DEVICE => size_of::<sys::CUpti_ActivityDevice5>(),
        sys::CUPTI_ACTIVITY_KIND_CONTEXT => size_of::<sys::CUpti_ActivityContext3>(),
        sys::CUPTI_ACTIVITY_KIND_STREAM => size_of::<sys::CUpti_ActivityStream>(),
        sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => size_of::<sys::CUpti_ActivityGraphTrace2>(),
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
        offset_of!(sys::$t, $f)
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
        sys::CUPTI_ACTIVITY_KIND_KERNEL | sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL => Record::Kernel(Kernel {
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
        sys::CUPTI_ACTIVITY_KIND_MEMCPY => Record::Memcpy(Memcpy {
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
            is_async: u32::from(r.u8(at!(CUpti_ActivityMemcpy6, flags))) & sys::CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC != 0,
            src_device_id: 0,
            dst_device_id: 0,
            graph_node_id: r.u64(at!(CUpti_ActivityMemcpy6, graphNodeId)),
        }),
        sys::CUPTI_ACTIVITY_KIND_MEMCPY2 => Record::Memcpy(Memcpy {
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
            is_async: u32::from(r.u8(at!(CUpti_ActivityMemcpyPtoP4, flags))) & sys::CUPTI_ACTIVITY_FLAG_MEMCPY_ASYNC
                != 0,
            src_device_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, srcDeviceId)),
            dst_device_id: r.u32(at!(CUpti_ActivityMemcpyPtoP4, dstDeviceId)),
            graph_node_id: r.u64(at!(CUpti_ActivityMemcpyPtoP4, graphNodeId)),
        }),
        sys::CUPTI_ACTIVITY_KIND_MEMSET => Record::Memset(Memset {
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
        sys::CUPTI_ACTIVITY_KIND_RUNTIME | sys::CUPTI_ACTIVITY_KIND_DRIVER => Record::Api(Api {
            driver: kind == sys::CUPTI_ACTIVITY_KIND_DRIVER,
            cbid: r.u32(at!(CUpti_ActivityAPI, cbid)),
            start: r.u64(at!(CUpti_ActivityAPI, start)),
            end: r.u64(at!(CUpti_ActivityAPI, end)),
            process_id: r.u32(at!(CUpti_ActivityAPI, processId)),
            thread_id: r.u32(at!(CUpti_ActivityAPI, threadId)),
            correlation_id: r.u32(at!(CUpti_ActivityAPI, correlationId)),
            return_value: r.u32(at!(CUpti_ActivityAPI, returnValue)),
        }),
        sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION => Record::Sync(Sync {
            sync_type: r.u32(at!(CUpti_ActivitySynchronization2, type_)),
            start: r.u64(at!(CUpti_ActivitySynchronization2, start)),
            end: r.u64(at!(CUpti_ActivitySynchronization2, end)),
            correlation_id: r.u32(at!(CUpti_ActivitySynchronization2, correlationId)),
            context_id: r.u32(at!(CUpti_ActivitySynchronization2, contextId)),
            stream_id: r.u32(at!(CUpti_ActivitySynchronization2, streamId)),
            event_id: r.u32(at!(CUpti_ActivitySynchronization2, cudaEventId)),
        }),
        sys::CUPTI_ACTIVITY_KIND_OVERHEAD => {
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
        sys::CUPTI_ACTIVITY_KIND_MARKER => {
            let base = at!(CUpti_ActivityMarker2, objectId);
            Record::Marker(Marker {
                flags: r.u32(at!(CUpti_ActivityMarker2, flags)),
                timestamp: r.u64(at!(CUpti_ActivityMarker2, timestamp)),
                id: r.u32(at!(CUpti_ActivityMarker2, id)),
                thread_id: r.u32(base + offset_of!(sys::CUpti_ActivityObjectKindId__bindgen_ty_1, threadId)),
                name: r.u64(at!(CUpti_ActivityMarker2, name)),
                domain: r.u64(at!(CUpti_ActivityMarker2, domain)),
            })
        }
        sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION => Record::ExternalCorrelation(ExternalCorrelation {
            external_kind: r.u32(at!(CUpti_ActivityExternalCorrelation, externalKind)),
            external_id: r.u64(at!(CUpti_ActivityExternalCorrelation, externalId)),
            correlation_id: r.u32(at!(CUpti_ActivityExternalCorrelation, correlationId)),
        }),
        sys::CUPTI_ACTIVITY_KIND_DEVICE => {
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
        sys::CUPTI_ACTIVITY_KIND_CONTEXT => Record::Context(Context {
            context_id: r.u32(at!(CUpti_ActivityContext3, contextId)),
            device_id: r.u32(at!(CUpti_ActivityContext3, deviceId)),
            null_stream_id: r.u16(at!(CUpti_ActivityContext3, nullStreamId)),
        }),
        sys::CUPTI_ACTIVITY_KIND_STREAM => Record::Stream(Stream {
            context_id: r.u32(at!(CUpti_ActivityStream, contextId)),
            stream_id: r.u32(at!(CUpti_ActivityStream, streamId)),
            priority: r.u32(at!(CUpti_ActivityStream, priority)),
            flags: r.u32(at!(CUpti_ActivityStream, flag)),
        }),
        sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE => Record::Graph(Graph {
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
    type Pt = sys::CUpti_ActivityObjectKindId__bindgen_ty_1;
    type Dcs = sys::CUpti_ActivityObjectKindId__bindgen_ty_2;
    match object_kind {
        sys::CUPTI_ACTIVITY_OBJECT_PROCESS => u64::from(r.u32(base + offset_of!(Pt, processId))),
        sys::CUPTI_ACTIVITY_OBJECT_THREAD => u64::from(r.u32(base + offset_of!(Pt, threadId))),
        _ => {
            (u64::from(r.u32(base + offset_of!(Dcs, deviceId))) << 32)
                | u64::from(r.u32(base + offset_of!(Dcs, contextId)))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A byte buffer written at offsets copied by hand from CUPTI 13.0's `cupti_activity.h`.
    pub(crate) struct W(pub Vec<u8>);
    impl W {
        pub(crate) fn new(kind: u32, size: usize) -> W {
            let mut w = W(vec![0xAA; size]); // garbage where nothing is written
            w.u32(0, kind);
            w
        }
        pub(crate) fn u8(&mut self, off: usize, v: u8) -> &mut Self {
            self.0[off] = v;
            self
        }
        pub(crate) fn u16(&mut self, off: usize, v: u16) -> &mut Self {
            self.0[off..off + 2].copy_from_slice(&v.to_le_bytes());
            self
        }
        pub(crate) fn u32(&mut self, off: usize, v: u32) -> &mut Self {
            self.0[off..off + 4].copy_from_slice(&v.to_le_bytes());
            self
        }
        pub(crate) fn u64(&mut self, off: usize, v: u64) -> &mut Self {
            self.0[off..off + 8].copy_from_slice(&v.to_le_bytes());
            self
        }
    }

    /// The sizes and offsets the decoder relies on, as computed by hand from the C header.
    /// A mismatch means the bindings and the header disagree (or the header changed).
    #[test]
    fn bindings_match_cupti_13_0_layouts() {
        use sys::*;
        assert_eq!(size_of::<CUpti_ActivityKernel10>(), 216);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, registersPerThread), 6);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, start), 16);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, end), 24);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, deviceId), 40);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, streamId), 48);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, gridX), 52);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, blockZ), 72);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, correlationId), 92);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, name), 104);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, graphNodeId), 144);
        assert_eq!(offset_of!(CUpti_ActivityKernel10, graphId), 156);

        assert_eq!(size_of::<CUpti_ActivityMemcpy6>(), 96);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, copyKind), 4);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, flags), 7);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, bytes), 8);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, start), 16);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, correlationId), 44);
        assert_eq!(offset_of!(CUpti_ActivityMemcpy6, graphNodeId), 64);

        assert_eq!(size_of::<CUpti_ActivityMemcpyPtoP4>(), 96);
        assert_eq!(offset_of!(CUpti_ActivityMemcpyPtoP4, srcDeviceId), 44);
        assert_eq!(offset_of!(CUpti_ActivityMemcpyPtoP4, dstDeviceId), 52);
        assert_eq!(offset_of!(CUpti_ActivityMemcpyPtoP4, correlationId), 60);

        assert_eq!(size_of::<CUpti_ActivityMemset4>(), 88);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, value), 4);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, correlationId), 44);
        assert_eq!(offset_of!(CUpti_ActivityMemset4, memoryKind), 50);

        assert_eq!(size_of::<CUpti_ActivityAPI>(), 40);
        assert_eq!(offset_of!(CUpti_ActivityAPI, cbid), 4);
        assert_eq!(offset_of!(CUpti_ActivityAPI, threadId), 28);
        assert_eq!(offset_of!(CUpti_ActivityAPI, correlationId), 32);
        assert_eq!(offset_of!(CUpti_ActivityAPI, returnValue), 36);

        assert_eq!(size_of::<CUpti_ActivitySynchronization2>(), 56);
        assert_eq!(offset_of!(CUpti_ActivitySynchronization2, cudaEventId), 36);

        assert_eq!(size_of::<CUpti_ActivityOverhead3>(), 56);
        assert_eq!(offset_of!(CUpti_ActivityOverhead3, objectId), 12);
        assert_eq!(offset_of!(CUpti_ActivityOverhead3, start), 24);

        assert_eq!(size_of::<CUpti_ActivityMarker2>(), 56);
        assert_eq!(offset_of!(CUpti_ActivityMarker2, timestamp), 8);
        assert_eq!(offset_of!(CUpti_ActivityMarker2, id), 16);
        assert_eq!(offset_of!(CUpti_ActivityMarker2, objectId), 24);
        assert_eq!(offset_of!(CUpti_ActivityMarker2, name), 40);
        assert_eq!(offset_of!(CUpti_ActivityMarker2, domain), 48);

        assert_eq!(size_of::<CUpti_ActivityExternalCorrelation>(), 24);
        assert_eq!(size_of::<CUpti_ActivityContext3>(), 32);
        assert_eq!(size_of::<CUpti_ActivityStream>(), 24);
        assert_eq!(size_of::<CUpti_ActivityGraphTrace2>(), 56);
        assert_eq!(size_of::<CUpti_ActivityDevice5>(), 184);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, globalMemorySize), 16);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, numMultiprocessors), 44);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, computeCapabilityMajor), 104);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, id), 112);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, uuid), 120);
        assert_eq!(offset_of!(CUpti_ActivityDevice5, name), 136);
        assert_eq!(offset_of!(CUpti_ActivityMemcpyPtoP4, graphNodeId), 72);
        assert_eq!(offset_of!(CUpti_ActivityContext3, nullStreamId), 14);
        assert_eq!(offset_of!(CUpti_ActivityStream, flag), 16);
        assert_eq!(offset_of!(CUpti_ActivityGraphTrace2, graphId), 28);
    }

    pub(crate) fn kernel_bytes(corr: u32, start: u64, end: u64, name: u64) -> Vec<u8> {
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, 216);
        w.u16(6, 128)
            .u64(16, start)
            .u64(24, end)
            .u32(40, 0)
            .u32(44, 1)
            .u32(48, 7)
            .u32(52, 64)
            .u32(56, 2)
            .u32(60, 1)
            .u32(64, 256)
            .u32(68, 1)
            .u32(72, 1)
            .u32(76, 1024)
            .u32(80, 4096)
            .u32(92, corr)
            .u64(104, name)
            .u64(144, 0)
            .u32(156, 0);
        w.0
    }

    #[test]
    fn decodes_a_concurrent_kernel() {
        let b = kernel_bytes(42, 1_700_000_000_000_000_000, 1_700_000_000_000_100_000, 0xdead_beef);
        let Record::Kernel(k) = decode(&b).unwrap() else { panic!() };
        assert_eq!(k.start, 1_700_000_000_000_000_000);
        assert_eq!(k.end - k.start, 100_000);
        assert_eq!((k.device_id, k.context_id, k.stream_id, k.correlation_id), (0, 1, 7, 42));
        assert_eq!(k.grid, [64, 2, 1]);
        assert_eq!(k.block, [256, 1, 1]);
        assert_eq!(k.registers_per_thread, 128);
        assert_eq!((k.static_shared, k.dynamic_shared), (1024, 4096));
        assert_eq!(k.name, 0xdead_beef);
    }

    pub(crate) fn memcpy_bytes(corr: u32, bytes: u64, copy_kind: u8, is_async: bool) -> Vec<u8> {
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_MEMCPY, 96);
        w.u8(4, copy_kind)
            .u8(5, 1)
            .u8(6, 3)
            .u8(7, is_async as u8)
            .u64(8, bytes)
            .u64(16, 100)
            .u64(24, 250)
            .u32(32, 0)
            .u32(36, 1)
            .u32(40, 7)
            .u32(44, corr)
            .u64(64, 0);
        w.0
    }

    #[test]
    fn decodes_memcpy_and_peer_memcpy() {
        let b = memcpy_bytes(9, 1 << 28, 1, true);
        let Record::Memcpy(m) = decode(&b).unwrap() else { panic!() };
        assert_eq!((m.bytes, m.copy_kind, m.src_kind, m.dst_kind, m.is_async), (1 << 28, 1, 1, 3, true));
        assert_eq!((m.start, m.end, m.stream_id, m.correlation_id), (100, 250, 7, 9));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_MEMCPY2, 96);
        w.u8(4, 10).u8(7, 0).u64(8, 4096).u64(16, 5).u64(24, 6).u32(44, 0).u32(52, 1).u32(60, 77).u64(72, 0);
        let Record::Memcpy(p) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((p.copy_kind, p.bytes, p.src_device_id, p.dst_device_id, p.correlation_id), (10, 4096, 0, 1, 77));
        assert!(!p.is_async);
    }

    #[test]
    fn decodes_memset_api_sync_overhead() {
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_MEMSET, 88);
        w.u32(4, 0x5a).u64(8, 1 << 20).u64(16, 1).u64(24, 2).u32(44, 11).u16(48, 0).u16(50, 3).u64(64, 0);
        let Record::Memset(m) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((m.value, m.bytes, m.correlation_id, m.memory_kind), (0x5a, 1 << 20, 11, 3));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_RUNTIME, 40);
        w.u32(4, sys::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)
            .u64(8, 10)
            .u64(16, 20)
            .u32(24, 1234)
            .u32(28, 5678)
            .u32(32, 42)
            .u32(36, 0);
        let Record::Api(a) = decode(&w.0).unwrap() else { panic!() };
        assert!(!a.driver);
        assert_eq!((a.cbid, a.thread_id, a.correlation_id), (211, 5678, 42));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_DRIVER, 40);
        w.u32(4, 7).u32(32, 43);
        let Record::Api(d) = decode(&w.0).unwrap() else { panic!() };
        assert!(d.driver);

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, 56);
        w.u32(4, 3).u64(8, 1).u64(16, 9).u32(24, 12).u32(28, 1).u32(32, 0xffff_ffff).u32(36, 0);
        let Record::Sync(s) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((s.sync_type, s.correlation_id, s.stream_id), (3, 12, 0xffff_ffff));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_OVERHEAD, 56);
        w.u32(4, sys::CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH)
            .u32(8, sys::CUPTI_ACTIVITY_OBJECT_THREAD)
            .u32(12, 100)
            .u32(16, 4242)
            .u64(24, 5)
            .u64(32, 8);
        let Record::Overhead(o) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((o.object_id, o.start, o.end), (4242, 5, 8));
    }

    #[test]
    fn decodes_marker_external_correlation_context_stream_graph_device() {
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_MARKER, 56);
        w.u32(4, sys::CUPTI_ACTIVITY_FLAG_MARKER_START)
            .u64(8, 77)
            .u32(16, 5)
            .u32(20, sys::CUPTI_ACTIVITY_OBJECT_THREAD)
            .u32(24, 1)
            .u32(28, 99)
            .u64(40, 0x1000)
            .u64(48, 0);
        let Record::Marker(m) = decode(&w.0).unwrap() else { panic!() };
        assert!(m.is_start() && !m.is_end());
        assert_eq!((m.timestamp, m.id, m.thread_id, m.name, m.domain), (77, 5, 99, 0x1000, 0));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, 24);
        w.u32(4, sys::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0).u64(8, 1 << 40).u32(16, 3);
        let Record::ExternalCorrelation(e) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((e.external_kind, e.external_id, e.correlation_id), (3, 1 << 40, 3));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_CONTEXT, 32);
        w.u32(4, 1).u32(8, 0).u16(12, 1).u16(14, 7);
        assert_eq!(decode(&w.0).unwrap(), Record::Context(Context { context_id: 1, device_id: 0, null_stream_id: 7 }));

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_STREAM, 24);
        w.u32(4, 1).u32(8, 13).u32(12, 0).u32(16, 1).u32(20, 0);
        assert_eq!(
            decode(&w.0).unwrap(),
            Record::Stream(Stream { context_id: 1, stream_id: 13, priority: 0, flags: 1 })
        );

        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_GRAPH_TRACE, 56);
        w.u32(4, 50).u64(8, 1).u64(16, 2).u32(24, 0).u32(28, 4).u32(32, 1).u32(36, 7);
        let Record::Graph(g) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((g.correlation_id, g.graph_id, g.context_id, g.stream_id), (50, 4, 1, 7));

        let size = size_of::<sys::CUpti_ActivityDevice5>();
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_DEVICE, size);
        w.u64(16, 80 << 30).u32(44, 132).u32(104, 9).u32(108, 0).u32(112, 0).u64(136, 0x2000);
        for i in 0..16 {
            w.u8(120 + i, i as u8);
        }
        let Record::Device(d) = decode(&w.0).unwrap() else { panic!() };
        assert_eq!((d.global_memory, d.sm_count, d.compute_major, d.name), (80 << 30, 132, 9, 0x2000));
        assert_eq!(d.uuid[15], 15);
    }

    #[test]
    fn rejects_short_and_unknown() {
        let b = kernel_bytes(1, 0, 0, 0);
        assert_eq!(
            decode(&b[..100]),
            Err(DecodeError::Truncated { kind: sys::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, need: 216, got: 100 })
        );
        assert!(matches!(decode(&[1, 0]), Err(DecodeError::Truncated { .. })));
        let mut w = W::new(sys::CUPTI_ACTIVITY_KIND_PC_SAMPLING, 64);
        w.u32(4, 0);
        assert_eq!(decode(&w.0), Err(DecodeError::Unhandled(sys::CUPTI_ACTIVITY_KIND_PC_SAMPLING)));
    }
}
