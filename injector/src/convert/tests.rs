//! Converter and interner tests over records laid out by `records::tests`.

use std::collections::HashMap;

use gpuprof_cupti::ids;
use gpuprof_proto::agent as pb;

use super::*;
use crate::records::tests::{W, kernel_bytes, memcpy_bytes};

fn strings<'a>(map: &'a HashMap<u64, &'static str>) -> impl Fn(u64) -> Option<String> + 'a {
    move |a| map.get(&a).map(|s| s.to_string())
}

#[test]
fn kernels_intern_names_once_and_strings_precede_records() {
    let names: HashMap<u64, &str> = [(0x10, "ampere_sgemm_128x64_nn"), (0x20, "elementwise_kernel")].into();
    let rd = strings(&names);
    let mut c = Converter::new();
    c.set_session(7);
    for i in 0..5 {
        c.push_raw(&kernel_bytes(i, 100 + u64::from(i), 200 + u64::from(i), 0x10), &rd);
    }
    c.push_raw(&kernel_bytes(9, 1, 2, 0x20), &rd);
    c.push_raw(&memcpy_bytes(10, 1 << 20, 1, false), &rd);
    let msgs = c.take_messages();
    assert_eq!(msgs.len(), 2);
    let Some(pb::agent_message::Msg::Strings(t)) = &msgs[0].msg else { panic!("{msgs:?}") };
    assert_eq!(
        t.strings.iter().map(|s| (s.id, s.value.as_str())).collect::<Vec<_>>(),
        vec![(1, "ampere_sgemm_128x64_nn"), (2, "elementwise_kernel")]
    );
    let Some(pb::agent_message::Msg::Records(b)) = &msgs[1].msg else { panic!() };
    assert_eq!(b.session_id, 7);
    assert_eq!(b.kernels.len(), 6);
    assert!(b.kernels[..5].iter().all(|k| k.name_id == 1));
    assert_eq!(b.kernels[5].name_id, 2);
    assert_eq!(b.memcpys[0].bytes, 1 << 20);
    // Nothing new: no string table the second time.
    c.push_raw(&kernel_bytes(11, 1, 2, 0x10), &rd);
    let msgs = c.take_messages();
    assert_eq!(msgs.len(), 1);
    assert!(matches!(msgs[0].msg, Some(pb::agent_message::Msg::Records(_))));
    assert_eq!(c.sent[pb::RecordKind::Kernel as usize], 7);
}

#[test]
fn a_large_buffer_becomes_several_bounded_batches() {
    use prost::Message;
    let names: HashMap<u64, &str> = [(0x10, "k")].into();
    let rd = strings(&names);
    let mut c = Converter::new();
    c.set_session(3);
    let n = BATCH_RECORDS * 2 + 100;
    assert_eq!(n, (BATCH_RECORDS - 2) + BATCH_RECORDS + 102);
    for i in 0..n as u32 {
        c.push_raw(&kernel_bytes(i, 10, 20, 0x10), &rd);
    }
    assert!(c.full());
    assert_eq!(c.len(), n + 2, "the kernels and the derived context and stream");
    let msgs = c.take_messages();
    assert!(matches!(msgs[0].msg, Some(pb::agent_message::Msg::Strings(_))), "strings first");
    let sizes: Vec<usize> = msgs[1..]
        .iter()
        .map(|m| match &m.msg {
            Some(pb::agent_message::Msg::Records(b)) => {
                assert_eq!(b.session_id, 3);
                b.kernels.len()
            }
            other => panic!("{other:?}"),
        })
        .collect();
    // The first batch also carries the context and stream derived from the first kernel.
    assert_eq!(sizes, vec![BATCH_RECORDS - 2, BATCH_RECORDS, 102]);
    let biggest = msgs.iter().map(|m| m.encoded_len()).max().unwrap();
    assert!(biggest < gpuprof_proto::frame::DEFAULT_MAX_FRAME_BYTES as usize / 2, "{biggest} bytes");
    assert!(c.is_empty() && !c.full());
}

#[test]
fn contexts_and_streams_from_before_the_trace_are_derived_once() {
    let rd = |_| None;
    let mut c = Converter::new();
    c.set_session(4);
    // kernel_bytes: device 0, context 1, stream 7 (see records::tests).
    c.push_raw(&kernel_bytes(1, 10, 20, 0), &rd);
    c.push_raw(&kernel_bytes(2, 30, 40, 0), &rd);
    c.push_raw(&memcpy_bytes(3, 64, 1, false), &rd);
    let msgs = c.take_messages();
    let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!("{msgs:?}") };
    let k = &b.kernels[0];
    assert_eq!(
        b.contexts,
        vec![pb::ContextRecord { context_id: k.context_id, device_id: k.device_id, null_stream_id: u32::MAX }]
    );
    let m = &b.memcpys[0];
    let mut want =
        vec![pb::StreamRecord { stream_id: k.stream_id, context_id: k.context_id, priority: 0, flags: u32::MAX }];
    if (m.context_id, m.stream_id) != (k.context_id, k.stream_id) {
        want.push(pb::StreamRecord { stream_id: m.stream_id, context_id: m.context_id, priority: 0, flags: u32::MAX });
    }
    assert_eq!(b.streams, want, "one derived stream per (context, stream)");
    // Known now: later activity derives nothing, and a reconnect replays what was learned.
    c.push_raw(&kernel_bytes(4, 50, 60, 0), &rd);
    let msgs = c.take_messages();
    let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!() };
    assert!(b.contexts.is_empty() && b.streams.is_empty());
    c.reset_connection();
    c.replay_topology();
    let msgs = c.take_messages();
    let Some(pb::agent_message::Msg::Records(b)) = &msgs.last().unwrap().msg else { panic!() };
    assert_eq!((b.contexts.len(), b.streams.len()), (1, want.len()));
}

#[test]
fn incomplete_kernels_are_counted_not_sent() {
    let rd = |_| None;
    let mut c = Converter::new();
    c.push_raw(&kernel_bytes(1, 0, 0, 0), &rd);
    assert!(c.is_empty());
    let r = c.drop_report(3);
    assert_eq!(r.counts, vec![pb::DropCount { kind: pb::RecordKind::Kernel as i32, dropped: 1 }]);
    assert_eq!(r.cupti_dropped, 3);
}

#[test]
fn nvtx_ranges_are_paired_and_marks_pass_through() {
    let names: HashMap<u64, &str> = [(0x1, "forward"), (0x2, "step"), (0x3, "my.domain")].into();
    let rd = strings(&names);
    let marker = |flags: u32, ts: u64, id: u32, name: u64, domain: u64| {
        let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_MARKER, 56);
        w.u32(4, flags).u64(8, ts).u32(16, id).u32(20, ids::CUPTI_ACTIVITY_OBJECT_THREAD).u32(24, 1).u32(28, 42);
        w.u64(40, name).u64(48, domain);
        w.0
    };
    let mut c = Converter::new();
    c.push_raw(&marker(ids::CUPTI_ACTIVITY_FLAG_MARKER_START, 100, 5, 0x1, 0x3), &rd);
    c.push_raw(&marker(ids::CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, 150, 6, 0x2, 0), &rd);
    c.push_raw(&marker(ids::CUPTI_ACTIVITY_FLAG_MARKER_END, 300, 5, 0, 0), &rd);
    c.push_raw(&marker(ids::CUPTI_ACTIVITY_FLAG_MARKER_END, 301, 99, 0, 0), &rd); // unknown id
    let msgs = c.take_messages();
    let Some(pb::agent_message::Msg::Records(b)) = &msgs[1].msg else { panic!() };
    assert_eq!(b.markers.len(), 2);
    assert!(b.markers[0].is_mark && b.markers[0].start_ns == 150);
    let r = &b.markers[1];
    assert_eq!((r.start_ns, r.end_ns, r.thread_id, r.is_mark), (100, 300, 42, false));
    assert_eq!((r.name_id, r.domain_id), (1, 2));
}

#[test]
fn topology_is_cached_and_replayed() {
    let rd = |_| Some("NVIDIA H100 80GB HBM3".to_string());
    let mut c = Converter::new();
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_CONTEXT, 32);
    w.u32(4, 1).u32(8, 0).u16(12, 1).u16(14, 7);
    c.push_raw(&w.0, &rd);
    let mut w = W::new(ids::CUPTI_ACTIVITY_KIND_DEVICE, 184);
    w.u64(16, 80 << 30).u32(44, 132).u32(104, 9).u32(112, 0).u64(136, 0x99);
    for i in 0..16 {
        w.u8(120 + i, 0xab);
    }
    c.push_raw(&w.0, &rd);
    let _ = c.take_messages();
    c.reset_connection();
    c.replay_topology();
    let msgs = c.take_messages();
    let Some(pb::agent_message::Msg::Records(b)) = &msgs[0].msg else { panic!("{msgs:?}") };
    assert_eq!(b.contexts, vec![pb::ContextRecord { context_id: 1, device_id: 0, null_stream_id: 7 }]);
    assert_eq!(b.devices[0].uuid, "GPU-abababab-abab-abab-abab-abababababab");
    assert_eq!(b.devices[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(b.devices[0].sm_count, 132);
}

#[test]
fn interner_caps() {
    let mut i = Interner::default();
    assert_eq!(i.intern("a"), 1);
    assert_eq!(i.intern("b"), 2);
    assert_eq!(i.intern("a"), 1);
    assert_eq!(i.take_pending().unwrap().strings.len(), 2);
    assert!(i.take_pending().is_none());
}
