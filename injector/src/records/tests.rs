//! Decoder tests over buffers laid out by hand, and the byte builders other modules' tests use.

use std::mem::{offset_of, size_of};

use gpuprof_cupti::ids;

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
    use ids::*;
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
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, 216);
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
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_MEMCPY, 96);
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

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_MEMCPY2, 96);
    w.u8(4, 10).u8(7, 0).u64(8, 4096).u64(16, 5).u64(24, 6).u32(44, 0).u32(52, 1).u32(60, 77).u64(72, 0);
    let Record::Memcpy(p) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((p.copy_kind, p.bytes, p.src_device_id, p.dst_device_id, p.correlation_id), (10, 4096, 0, 1, 77));
    assert!(!p.is_async);
}

#[test]
fn decodes_memset_api_sync_overhead() {
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_MEMSET, 88);
    w.u32(4, 0x5a).u64(8, 1 << 20).u64(16, 1).u64(24, 2).u32(44, 11).u16(48, 0).u16(50, 3).u64(64, 0);
    let Record::Memset(m) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((m.value, m.bytes, m.correlation_id, m.memory_kind), (0x5a, 1 << 20, 11, 3));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_RUNTIME, 40);
    w.u32(4, ids::CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)
        .u64(8, 10)
        .u64(16, 20)
        .u32(24, 1234)
        .u32(28, 5678)
        .u32(32, 42)
        .u32(36, 0);
    let Record::Api(a) = decode(&w.0).unwrap() else { panic!() };
    assert!(!a.driver);
    assert_eq!((a.cbid, a.thread_id, a.correlation_id), (211, 5678, 42));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_DRIVER, 40);
    w.u32(4, 7).u32(32, 43);
    let Record::Api(d) = decode(&w.0).unwrap() else { panic!() };
    assert!(d.driver);

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_SYNCHRONIZATION, 56);
    w.u32(4, 3).u64(8, 1).u64(16, 9).u32(24, 12).u32(28, 1).u32(32, 0xffff_ffff).u32(36, 0);
    let Record::Sync(s) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((s.sync_type, s.correlation_id, s.stream_id), (3, 12, 0xffff_ffff));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_OVERHEAD, 56);
    w.u32(4, ids::CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH)
        .u32(8, ids::CUPTI_ACTIVITY_OBJECT_THREAD)
        .u32(12, 100)
        .u32(16, 4242)
        .u64(24, 5)
        .u64(32, 8);
    let Record::Overhead(o) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((o.object_id, o.start, o.end), (4242, 5, 8));
}

#[test]
fn decodes_marker_external_correlation_context_stream_graph_device() {
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_MARKER, 56);
    w.u32(4, ids::CUPTI_ACTIVITY_FLAG_MARKER_START)
        .u64(8, 77)
        .u32(16, 5)
        .u32(20, ids::CUPTI_ACTIVITY_OBJECT_THREAD)
        .u32(24, 1)
        .u32(28, 99)
        .u64(40, 0x1000)
        .u64(48, 0);
    let Record::Marker(m) = decode(&w.0).unwrap() else { panic!() };
    assert!(m.is_start() && !m.is_end());
    assert_eq!((m.timestamp, m.id, m.thread_id, m.name, m.domain), (77, 5, 99, 0x1000, 0));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, 24);
    w.u32(4, ids::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0).u64(8, 1 << 40).u32(16, 3);
    let Record::ExternalCorrelation(e) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((e.external_kind, e.external_id, e.correlation_id), (3, 1 << 40, 3));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_CONTEXT, 32);
    w.u32(4, 1).u32(8, 0).u16(12, 1).u16(14, 7);
    assert_eq!(decode(&w.0).unwrap(), Record::Context(Context { context_id: 1, device_id: 0, null_stream_id: 7 }));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_STREAM, 24);
    w.u32(4, 1).u32(8, 13).u32(12, 0).u32(16, 1).u32(20, 0);
    assert_eq!(decode(&w.0).unwrap(), Record::Stream(Stream { context_id: 1, stream_id: 13, priority: 0, flags: 1 }));

    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_GRAPH_TRACE, 56);
    w.u32(4, 50).u64(8, 1).u64(16, 2).u32(24, 0).u32(28, 4).u32(32, 1).u32(36, 7);
    let Record::Graph(g) = decode(&w.0).unwrap() else { panic!() };
    assert_eq!((g.correlation_id, g.graph_id, g.context_id, g.stream_id), (50, 4, 1, 7));

    let size = size_of::<ids::CUpti_ActivityDevice5>();
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_DEVICE, size);
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
        Err(DecodeError::Truncated { kind: ids::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, need: 216, got: 100 })
    );
    assert!(matches!(decode(&[1, 0]), Err(DecodeError::Truncated { .. })));
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_PC_SAMPLING, 64);
    w.u32(4, 0);
    assert_eq!(decode(&w.0), Err(DecodeError::Unhandled(ids::CUPTI_ACTIVITY_KIND_PC_SAMPLING)));
}
