//! Perfetto protobuf exports of several hosts as one trace (`gpuprofctl --host ... trace -o
//! run.pftrace`). A Perfetto trace is its packets one after another, so the hosts' packets are
//! decoded, kept apart and written out together:
//! - each host's packets are a sequence of their own (`trusted_packet_sequence_id` = its index
//!   + 1; the first packet of each still clears the incremental state);
//! - timestamps are moved from the host's clock onto the caller's (minus its clock offset);
//! - track uuids and flow ids of the i-th host get `i << 52` mixed in (gpuprofd numbers tracks
//!   from 1 and flows from correlation ids, far below 2^52);
//! - pids and tids of the i-th host are moved by `i << 22` (Linux ids are below 2^22), since
//!   Perfetto merges process tracks with equal pids; process names start with the host;
//! - a last sequence holds a track "clock alignment" with one instant per host at the trace's
//!   start: the host's clock offset and its error bound (half the round trip it was measured
//!   over), as the instant's name and arguments.

use anyhow::{Context, Result, bail};
use gpuprof_proto::perfetto::track_event::Type;
use gpuprof_proto::perfetto::{
    DebugAnnotation, Trace, TracePacket, TrackDescriptor, TrackEvent, debug_annotation, trace_packet::Data,
};
use prost::Message;

use crate::output::clock_text;

/// One host's export and its clock against the caller's.
pub struct HostTrace {
    pub host: String,
    pub session: u64,
    /// The host's clock minus the caller's (ns).
    pub clock_offset_ns: i64,
    /// How far that offset may be off (ns): half the round trip it was measured over.
    pub clock_error_ns: u64,
    /// The export (Chrome JSON or Perfetto protobuf).
    pub data: Vec<u8>,
}

/// Where a host's ids start: pids and tids `i << PID_BITS`, uuids and flows `i << ID_BITS`.
const PID_BITS: u32 = 22;
const ID_BITS: u32 = 52;
/// The clock-alignment track's uuid (above every host's ids).
const CLOCK_TRACK: u64 = u64::MAX;
/// Hosts whose pids still fit an `int32` after the move.
pub const MAX_HOSTS: usize = 1 << (31 - PID_BITS);

pub fn merge_perfetto(traces: &[HostTrace]) -> Result<Vec<u8>> {
    if traces.len() > MAX_HOSTS {
        bail!("{} hosts: a merged Perfetto trace holds at most {MAX_HOSTS}", traces.len());
    }
    let mut merged = Trace::default();
    for (i, t) in traces.iter().enumerate() {
        let trace = Trace::decode(t.data.as_slice())
            .with_context(|| format!("the trace from {} is not a Perfetto trace", t.host))?;
        let host_ids = (i as u64) << ID_BITS;
        let host_pids = (i as i32) << PID_BITS;
        let move_id = |id: &mut Option<u64>| {
            if let Some(v) = id {
                *v ^= host_ids;
            }
        };
        let move_pid = |pid: &mut Option<i32>| {
            if let Some(v) = pid
                && *v > 0
            {
                *v += host_pids;
            }
        };
        for mut p in trace.packet {
            p.trusted_packet_sequence_id = Some(i as u32 + 1);
            if let Some(ts) = p.timestamp {
                p.timestamp = Some((ts as i128 - t.clock_offset_ns as i128).max(0) as u64);
            }
            match &mut p.data {
                Some(Data::TrackDescriptor(d)) => {
                    move_id(&mut d.uuid);
                    move_id(&mut d.parent_uuid);
                    if let Some(proc_) = &mut d.process {
                        move_pid(&mut proc_.pid);
                        let name = proc_.process_name.take().unwrap_or_default();
                        proc_.process_name = Some(format!("{} · {name}", t.host));
                    }
                    if let Some(th) = &mut d.thread {
                        move_pid(&mut th.pid);
                        move_pid(&mut th.tid);
                    }
                }
                Some(Data::TrackEvent(e)) => {
                    move_id(&mut e.track_uuid);
                    for f in e.flow_ids.iter_mut().chain(e.terminating_flow_ids.iter_mut()) {
                        *f ^= host_ids;
                    }
                }
                None => {}
            }
            merged.packet.push(p);
        }
    }
    clock_alignment(&mut merged, traces);
    Ok(merged.encode_to_vec())
}

/// Appends the clock-alignment track and its instants (see the module's comment).
fn clock_alignment(merged: &mut Trace, traces: &[HostTrace]) {
    let start = merged.packet.iter().filter_map(|p| p.timestamp).min().unwrap_or(0);
    let seq = Some(traces.len() as u32 + 1);
    merged.packet.push(TracePacket {
        data: Some(Data::TrackDescriptor(TrackDescriptor {
            uuid: Some(CLOCK_TRACK),
            name: Some("clock alignment".into()),
            ..Default::default()
        })),
        trusted_packet_sequence_id: seq,
        sequence_flags: Some(1),
        ..Default::default()
    });
    for t in traces {
        let arg = |name: &str, value: debug_annotation::Value| DebugAnnotation {
            name: Some(name.into()),
            value: Some(value),
            ..Default::default()
        };
        merged.packet.push(TracePacket {
            timestamp: Some(start),
            data: Some(Data::TrackEvent(TrackEvent {
                r#type: Some(Type::Instant as i32),
                track_uuid: Some(CLOCK_TRACK),
                name: Some(format!("{}: clock {}", t.host, clock_text(t.clock_offset_ns, t.clock_error_ns))),
                debug_annotations: vec![
                    arg("host", debug_annotation::Value::StringValue(t.host.clone())),
                    arg("clock_offset_ns", debug_annotation::Value::IntValue(t.clock_offset_ns)),
                    arg("clock_error_ns", debug_annotation::Value::UintValue(t.clock_error_ns)),
                ],
                ..Default::default()
            })),
            trusted_packet_sequence_id: seq,
            ..Default::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpuprof_proto::perfetto::{ProcessDescriptor, ThreadDescriptor, TracePacket, TrackDescriptor, TrackEvent};

    fn host_trace(ts: u64) -> Vec<u8> {
        let packet = |ts: Option<u64>, data: Data| TracePacket {
            timestamp: ts,
            data: Some(data),
            trusted_packet_sequence_id: Some(1),
            ..Default::default()
        };
        Trace {
            packet: vec![
                packet(
                    None,
                    Data::TrackDescriptor(TrackDescriptor {
                        uuid: Some(1),
                        process: Some(ProcessDescriptor { pid: Some(42), process_name: Some("python3".into()) }),
                        ..Default::default()
                    }),
                ),
                packet(
                    None,
                    Data::TrackDescriptor(TrackDescriptor {
                        uuid: Some(2),
                        parent_uuid: Some(1),
                        thread: Some(ThreadDescriptor { pid: Some(42), tid: Some(43), thread_name: None }),
                        ..Default::default()
                    }),
                ),
                packet(
                    Some(ts),
                    Data::TrackEvent(TrackEvent {
                        track_uuid: Some(2),
                        name: Some("cudaLaunchKernel".into()),
                        flow_ids: vec![7],
                        ..Default::default()
                    }),
                ),
            ],
        }
        .encode_to_vec()
    }

    #[test]
    fn hosts_stay_apart_on_the_callers_clock() {
        let ht = |host: &str, off: i64, ts: u64| HostTrace {
            host: host.into(),
            session: 1,
            clock_offset_ns: off,
            clock_error_ns: 1_500,
            data: host_trace(ts),
        };
        // The same pid, uuids and flow on both; h2's clock is 4 ms ahead.
        let m = Trace::decode(
            merge_perfetto(&[ht("h1", 0, 10_000_000), ht("h2", 4_000_000, 14_000_000)]).unwrap().as_slice(),
        )
        .unwrap();
        assert_eq!(m.packet.len(), 9);
        let seqs: Vec<_> = m.packet.iter().map(|p| p.trusted_packet_sequence_id).collect();
        assert_eq!(seqs, [Some(1), Some(1), Some(1), Some(2), Some(2), Some(2), Some(3), Some(3), Some(3)]);
        // The clock alignment: a track, then one instant per host at the trace's start.
        let Some(Data::TrackDescriptor(clock)) = &m.packet[6].data else { panic!() };
        assert_eq!(clock.name.as_deref(), Some("clock alignment"));
        let Some(Data::TrackEvent(h2)) = &m.packet[8].data else { panic!() };
        assert_eq!(h2.track_uuid, clock.uuid);
        assert_eq!(m.packet[8].timestamp, Some(10_000_000));
        assert_eq!(h2.name.as_deref(), Some("h2: clock +4.000 ms ± 1.5 µs"));
        let args: Vec<_> = h2.debug_annotations.iter().map(|a| (a.name.clone().unwrap(), a.value.clone())).collect();
        assert_eq!(args[1], ("clock_offset_ns".into(), Some(debug_annotation::Value::IntValue(4_000_000))));
        assert_eq!(args[2], ("clock_error_ns".into(), Some(debug_annotation::Value::UintValue(1_500))));
        let Some(Data::TrackDescriptor(p2)) = &m.packet[3].data else { panic!() };
        let proc2 = p2.process.as_ref().unwrap();
        assert_eq!((proc2.pid, proc2.process_name.as_deref()), (Some(42 + (1 << 22)), Some("h2 · python3")));
        assert_eq!(p2.uuid, Some(1 | (1 << 52)));
        let Some(Data::TrackDescriptor(t2)) = &m.packet[4].data else { panic!() };
        assert_eq!(t2.parent_uuid, Some(1 | (1 << 52)));
        assert_eq!(t2.thread.as_ref().unwrap().tid, Some(43 + (1 << 22)));
        let (Some(Data::TrackEvent(e1)), Some(Data::TrackEvent(e2))) = (&m.packet[2].data, &m.packet[5].data) else {
            panic!()
        };
        assert_eq!((e1.track_uuid, e1.flow_ids.as_slice()), (Some(2), [7u64].as_slice()));
        assert_eq!((e2.track_uuid, e2.flow_ids.as_slice()), (Some(2 | (1 << 52)), [7 | (1u64 << 52)].as_slice()));
        assert_eq!((m.packet[2].timestamp, m.packet[5].timestamp), (Some(10_000_000), Some(10_000_000)), "one instant");
        assert!(
            merge_perfetto(&[HostTrace {
                host: "h".into(),
                session: 1,
                clock_offset_ns: 0,
                clock_error_ns: 0,
                data: vec![0xff, 0xff]
            }])
            .is_err()
        );
    }
}
