//! Perfetto event packets written straight into the output: the begin and end events of the
//! records, most of a trace, encoded field by field in prost's order (ascending field numbers)
//! instead of built as `TracePacket` and `TrackEvent` messages, encoded by prost and dropped,
//! which took about half of the writer's time. A test holds the bytes equal to prost's for the
//! same messages.

use gpuprof_proto::perfetto::InternedData;
use prost::Message;
use prost::encoding::{encode_varint, encoded_len_varint};

/// An argument's value.
pub(super) enum Val {
    Uint(u64),
    Int(i64),
    /// "x×y×z" from a stored x * 10^6 + y * 10^3 + z.
    Dim3(i64),
    Text(String),
}

/// One event of a record: a slice's begin or end, or an instant.
pub(super) struct Event<'a> {
    /// `TrackEvent.type`.
    pub(super) kind: i32,
    pub(super) track_uuid: u64,
    /// Category iid and name iid (none on a slice's end).
    pub(super) named: Option<(u64, u64)>,
    /// Argument name iid and value.
    pub(super) args: &'a [(u64, Val)],
    pub(super) flow_ids: &'a [u64],
    pub(super) terminating_flow_ids: &'a [u64],
}

/// The packet's other fields.
pub(super) struct Packet<'a> {
    pub(super) timestamp: u64,
    pub(super) sequence: u32,
    pub(super) interned: Option<&'a InternedData>,
    pub(super) flags: Option<u32>,
}

/// Tags (field number << 3 | wire type) of the fields written here.
mod tag {
    /// `Trace.packet`.
    pub const PACKET: u8 = 1 << 3 | 2;
    pub const TIMESTAMP: u8 = 8 << 3;
    pub const SEQUENCE_ID: u8 = 10 << 3;
    pub const TRACK_EVENT: u8 = 11 << 3 | 2;
    pub const INTERNED_DATA: u8 = 12 << 3 | 2;
    pub const SEQUENCE_FLAGS: u8 = 13 << 3;
    pub const CATEGORY_IIDS: u8 = 3 << 3;
    pub const DEBUG_ANNOTATIONS: u8 = 4 << 3 | 2;
    pub const TYPE: u8 = 9 << 3;
    pub const NAME_IID: u8 = 10 << 3;
    pub const TRACK_UUID: u8 = 11 << 3;
    /// 47 and 48, fixed64: two-byte varints.
    pub const FLOW_IDS: u64 = 47 << 3 | 1;
    pub const TERMINATING_FLOW_IDS: u64 = 48 << 3 | 1;
    /// `DebugAnnotation` fields.
    pub const ARG_NAME_IID: u8 = 1 << 3;
    pub const ARG_UINT: u8 = 3 << 3;
    pub const ARG_INT: u8 = 4 << 3;
    pub const ARG_STRING: u8 = 6 << 3 | 2;
}

/// Buffers kept between events.
#[derive(Default)]
pub(super) struct Scratch {
    event: Vec<u8>,
    text: String,
}

fn varint(buf: &mut Vec<u8>, tag: u8, v: u64) {
    buf.push(tag);
    encode_varint(v, buf);
}

fn bytes(buf: &mut Vec<u8>, tag: u8, b: &[u8]) {
    buf.push(tag);
    encode_varint(b.len() as u64, buf);
    buf.extend_from_slice(b);
}

fn fixed(buf: &mut Vec<u8>, tag: u64, ids: &[u64]) {
    for id in ids {
        encode_varint(tag, buf);
        buf.extend_from_slice(&id.to_le_bytes());
    }
}

fn dim3(text: &mut String, v: i64) {
    let mut b = itoa::Buffer::new();
    text.clear();
    text.push_str(b.format(v / 1_000_000));
    text.push('×');
    text.push_str(b.format(v / 1000 % 1000));
    text.push('×');
    text.push_str(b.format(v % 1000));
}

/// Appends `TrackEvent` `e` in a `TracePacket` as field 1 of `Trace`.
pub(super) fn write(buf: &mut Vec<u8>, s: &mut Scratch, e: &Event<'_>, p: &Packet<'_>) {
    let ev = &mut s.event;
    ev.clear();
    if let Some((cat, _)) = e.named {
        varint(ev, tag::CATEGORY_IIDS, cat);
    }
    for (name, v) in e.args {
        let value: (u8, u64, &[u8]) = match v {
            Val::Uint(u) => (tag::ARG_UINT, *u, &[]),
            Val::Int(i) => (tag::ARG_INT, *i as u64, &[]),
            Val::Dim3(d) => {
                dim3(&mut s.text, *d);
                (tag::ARG_STRING, 0, s.text.as_bytes())
            }
            Val::Text(t) => (tag::ARG_STRING, 0, t.as_bytes()),
        };
        let value_len = match value.0 {
            tag::ARG_STRING => encoded_len_varint(value.2.len() as u64) + value.2.len(),
            _ => encoded_len_varint(value.1),
        };
        ev.push(tag::DEBUG_ANNOTATIONS);
        encode_varint((2 + encoded_len_varint(*name) + value_len) as u64, ev);
        varint(ev, tag::ARG_NAME_IID, *name);
        match value.0 {
            tag::ARG_STRING => bytes(ev, tag::ARG_STRING, value.2),
            t => varint(ev, t, value.1),
        }
    }
    varint(ev, tag::TYPE, e.kind as u64);
    if let Some((_, name)) = e.named {
        varint(ev, tag::NAME_IID, name);
    }
    varint(ev, tag::TRACK_UUID, e.track_uuid);
    fixed(ev, tag::FLOW_IDS, e.flow_ids);
    fixed(ev, tag::TERMINATING_FLOW_IDS, e.terminating_flow_ids);

    let interned_len = p.interned.map(|d| d.encoded_len());
    let len = 1
        + encoded_len_varint(p.timestamp)
        + 1
        + encoded_len_varint(u64::from(p.sequence))
        + 1
        + encoded_len_varint(ev.len() as u64)
        + ev.len()
        + interned_len.map_or(0, |n| 1 + encoded_len_varint(n as u64) + n)
        + p.flags.map_or(0, |f| 1 + encoded_len_varint(u64::from(f)));
    buf.push(tag::PACKET);
    encode_varint(len as u64, buf);
    varint(buf, tag::TIMESTAMP, p.timestamp);
    varint(buf, tag::SEQUENCE_ID, u64::from(p.sequence));
    bytes(buf, tag::TRACK_EVENT, ev);
    if let Some(d) = p.interned {
        buf.push(tag::INTERNED_DATA);
        // Encoding into a Vec cannot run out of room.
        let _ = d.encode_length_delimited(buf);
    }
    if let Some(f) = p.flags {
        varint(buf, tag::SEQUENCE_FLAGS, u64::from(f));
    }
}

#[cfg(test)]
mod tests {
    use gpuprof_proto::perfetto::{
        DebugAnnotation, EventName, InternedData, TracePacket, TrackEvent, debug_annotation, trace_packet,
    };
    use prost::Message;

    use super::*;

    /// The same event and packet as prost's messages, encoded by prost.
    fn by_prost(e: &Event<'_>, p: &Packet<'_>) -> Vec<u8> {
        let args = e
            .args
            .iter()
            .map(|(name, v)| {
                let mut text = String::new();
                let value = match v {
                    Val::Uint(u) => debug_annotation::Value::UintValue(*u),
                    Val::Int(i) => debug_annotation::Value::IntValue(*i),
                    Val::Dim3(d) => {
                        dim3(&mut text, *d);
                        debug_annotation::Value::StringValue(text)
                    }
                    Val::Text(t) => debug_annotation::Value::StringValue(t.clone()),
                };
                DebugAnnotation { name_iid: Some(*name), name: None, value: Some(value) }
            })
            .collect();
        let event = TrackEvent {
            r#type: Some(e.kind),
            track_uuid: Some(e.track_uuid),
            category_iids: e.named.map(|(c, _)| c).into_iter().collect(),
            name_iid: e.named.map(|(_, n)| n),
            debug_annotations: args,
            flow_ids: e.flow_ids.to_vec(),
            terminating_flow_ids: e.terminating_flow_ids.to_vec(),
            ..Default::default()
        };
        let packet = TracePacket {
            timestamp: Some(p.timestamp),
            trusted_packet_sequence_id: Some(p.sequence),
            interned_data: p.interned.cloned(),
            sequence_flags: p.flags,
            data: Some(trace_packet::Data::TrackEvent(event)),
        };
        let mut buf = vec![0x0a];
        packet.encode_length_delimited(&mut buf).unwrap();
        buf
    }

    #[test]
    fn events_are_the_bytes_prost_writes() {
        let long = "k".repeat(300);
        let interned = InternedData {
            event_names: vec![EventName { iid: Some(3), name: Some(long.clone()) }],
            ..Default::default()
        };
        let args = vec![
            (1, Val::Uint(0)),
            (1, Val::Uint(u64::MAX)),
            (2, Val::Dim3(2_171_001_001)),
            (3, Val::Dim3(512_001_001)),
            (4, Val::Int(-1)),
            (5, Val::Int(300)),
            (7, Val::Text("HtoD".into())),
            (200, Val::Text(long.clone())),
            (12, Val::Text(String::new())),
        ];
        let mut s = Scratch::default();
        let mut n = 0;
        for named in [None, Some((1, 1)), Some((9, 200_000))] {
            for args in [&args[..0], &args[..1], &args[2..4], &args[..]] {
                for (flows, ends) in [(&[][..], &[][..]), (&[1, u64::MAX][..], &[][..]), (&[][..], &[77][..])] {
                    for (timestamp, interned, flags) in
                        [(0, None, None), (1 << 40, Some(&interned), Some(2)), (u64::MAX, None, Some(3))]
                    {
                        for kind in [1, 2, 3] {
                            let e = Event {
                                kind,
                                track_uuid: 130,
                                named,
                                args,
                                flow_ids: flows,
                                terminating_flow_ids: ends,
                            };
                            let p = Packet { timestamp, sequence: 1, interned, flags };
                            let mut buf = vec![9, 9];
                            write(&mut buf, &mut s, &e, &p);
                            assert_eq!(buf[..2], [9, 9], "appended");
                            assert_eq!(
                                buf[2..],
                                by_prost(&e, &p),
                                "{named:?} {} args {flows:?} {ends:?} {timestamp}",
                                args.len()
                            );
                            n += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(n, 3 * 4 * 3 * 3 * 3);
    }
}
