//! The agent's PC-sampling leases end to end over a real Unix socket, against the fake
//! backend of [`super::e2e`]: what a lease sends, how soon, and at exit.

use std::time::{Duration, Instant};

use gpuprof_proto::agent as pb;
use gpuprof_proto::agent::agent_message::Msg as Out;
use gpuprof_proto::agent::daemon_message::Msg as In;

use super::e2e::{accept_welcomed, daemon_send, next, start_agent, start_tracing, until};

/// Grants the agent a PC-sampling lease on `device` for `session`, collected every `flush_ms`.
fn lease(s: &mut std::os::unix::net::UnixStream, session: u64, device: u32, flush_ms: u32) {
    let l = pb::StartPcSampling {
        session_id: session,
        device_id: device,
        flush_interval_ms: flush_ms,
        ..Default::default()
    };
    daemon_send(s, In::StartPcSampling(l));
}

#[test]
fn pc_lease_sends_cubins_strings_batches_and_states() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    // A lease for a session the process is not tracing is refused.
    daemon_send(&mut s, In::StartPcSampling(pb::StartPcSampling { session_id: 5, device_id: 0, ..Default::default() }));
    let seen = until(&mut s, |m| matches!(m, Out::PcSamplingState(_)));
    let Some(Out::PcSamplingState(st)) = seen.last() else { panic!() };
    assert_eq!(st.status, pb::PcSamplingStatus::Failed as i32);

    start_tracing(&mut s, 5);
    daemon_send(&mut s, In::StartPcSampling(pb::StartPcSampling { session_id: 5, device_id: 7, ..Default::default() }));
    daemon_send(
        &mut s,
        In::StartPcSampling(pb::StartPcSampling {
            session_id: 5,
            device_id: 0,
            period_log2: 12,
            flush_interval_ms: 100,
            ..Default::default()
        }),
    );
    let mut strings = std::collections::HashMap::new();
    let mut cubin = Vec::new();
    let mut batches = Vec::new();
    let mut states = Vec::new();
    while batches.len() < 3 {
        match next(&mut s) {
            Out::Strings(t) => {
                for x in t.strings {
                    strings.insert(x.id, x.value);
                }
            }
            Out::Cubin(c) => {
                assert_eq!(c.offset as usize, cubin.len(), "pieces in order");
                assert!(c.data.len() <= super::pc::CUBIN_CHUNK);
                assert_eq!((c.hash.as_str(), c.size), ("00000000deadbeef", (5 << 20) / 2));
                assert!(batches.is_empty(), "a cubin precedes the samples naming it");
                cubin.extend(c.data);
            }
            Out::PcSamples(b) => batches.push(b),
            Out::PcSamplingState(st) => states.push(st),
            _ => {}
        }
    }
    assert_eq!(cubin.len(), (5 << 20) / 2, "the cubin is sent whole, once");
    assert_eq!(states[0].device_id, 7);
    assert_eq!(states[0].status, pb::PcSamplingStatus::Failed as i32);
    assert_eq!(states[0].detail, "no device 7");
    assert_eq!((states[1].device_id, states[1].status), (0, pb::PcSamplingStatus::Sampling as i32));
    let b = &batches[0];
    assert_eq!((b.session_id, b.device_id, b.total_samples, b.dropped_samples), (5, 0, 45, 5));
    assert_eq!(b.samples.len(), 2);
    let name = |id: u32| strings.get(&id).cloned().unwrap_or_default();
    assert_eq!(name(b.samples[0].function_name_id), "_Z4axpyPfS_f");
    assert_eq!(name(b.samples[0].stall_reason_id), "stalled_long_scoreboard");
    assert_eq!(name(b.samples[0].module_id), "00000000deadbeef");
    assert_eq!((name(b.samples[0].file_id).as_str(), b.samples[0].line), ("/src/axpy.cu", 12));
    assert_eq!(b.samples.iter().map(|x| x.count).sum::<u64>(), 40);

    // The trace stop ends the lease: a last batch, then STOPPED with the totals, then idle.
    daemon_send(&mut s, In::StopTrace(pb::StopTrace { session_id: 5 }));
    let rest = until(&mut s, |m| matches!(m, Out::TraceState(t) if t.status == pb::TraceStatus::Idle as i32));
    let stopped = rest
        .iter()
        .find_map(|m| if let Out::PcSamplingState(st) = m { Some(st.clone()) } else { None })
        .expect("a STOPPED state before idle");
    assert_eq!(stopped.status, pb::PcSamplingStatus::Stopped as i32);
    assert_eq!(stopped.detail, "trace stopped");
    let batches_total: u64 =
        batches.len() as u64 * 45 + rest.iter().filter(|m| matches!(m, Out::PcSamples(_))).count() as u64 * 45;
    assert_eq!(stopped.samples, batches_total, "totals count every batch sent");
    assert!(!rest.iter().any(|m| matches!(m, Out::Cubin(_))), "a cubin goes once per connection");
    control.request_exit(&wake, Duration::from_millis(10));
    h.join().unwrap();
}

#[test]
fn the_first_samples_of_a_lease_do_not_wait_for_the_flush_interval() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    start_tracing(&mut s, 8);
    let t0 = Instant::now();
    lease(&mut s, 8, 2, 60_000);
    let seen = until(&mut s, |m| matches!(m, Out::PcSamples(b) if b.total_samples > 0));
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "the first samples came {:?} after the lease, with a 60 s flush interval",
        t0.elapsed()
    );
    assert!(
        seen.iter()
            .any(|m| matches!(m, Out::PcSamplingState(st) if st.status == pb::PcSamplingStatus::Sampling as i32))
    );
    control.request_exit(&wake, Duration::from_millis(10));
    h.join().unwrap();
}

#[test]
fn pc_samples_read_at_exit_are_sent_before_goodbye() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    start_tracing(&mut s, 6);
    lease(&mut s, 6, 0, 60_000);
    until(&mut s, |m| matches!(m, Out::PcSamples(_)));
    assert!(control.request_exit(&wake, Duration::from_secs(5)));
    let rest = until(&mut s, |m| matches!(m, Out::Goodbye(_)));
    let last = rest
        .iter()
        .filter_map(|m| if let Out::PcSamples(b) = m { Some(b) } else { None })
        .next_back()
        .expect("the samples read at exit are sent");
    assert_eq!((last.session_id, last.total_samples, last.samples[0].count), (6, 99, 99));
    let stopped = rest
        .iter()
        .find_map(|m| match m {
            Out::PcSamplingState(st) if st.status == pb::PcSamplingStatus::Stopped as i32 => Some(st.clone()),
            _ => None,
        })
        .expect("the lease's end is reported before goodbye");
    assert_eq!(stopped.detail, "process exit");
    h.join().unwrap();
}

/// A process attached late asks gpuprofd for the cubins of modules loaded before sampling and
/// reports those it found in no mapped file; the cubins of the answer reach the backend whole,
/// one whose pieces came out of order counts as unknown (looked for in the files instead).
#[test]
fn late_cubins_are_asked_of_gpuprofd_and_its_answer_reaches_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let mut s = accept_welcomed(&listener);
    start_tracing(&mut s, 9);
    lease(&mut s, 9, 3, 50);
    let seen = until(&mut s, |m| matches!(m, Out::CubinsNotFound(_)));
    let query = seen.iter().find_map(|m| if let Out::CubinQuery(q) = m { Some(q.hashes.clone()) } else { None });
    assert_eq!(query.expect("a query before the report"), ["00000000000000aa", "00000000000000bb", "00000000000000cc"]);
    let Some(Out::CubinsNotFound(n)) = seen.last() else { panic!() };
    assert_eq!(n.hashes, ["00000000000000dd"]);

    let cubin: Vec<u8> = (0..(600 << 10) + 100).map(|i| (i % 249) as u8).collect();
    let piece = |hash: &str, offset: usize, data: &[u8], size: usize| {
        In::Cubin(pb::CubinChunk { hash: hash.into(), size: size as u64, offset: offset as u64, data: data.to_vec() })
    };
    daemon_send(&mut s, piece("00000000000000cc", 5, b"late", 9));
    daemon_send(&mut s, piece("00000000000000ee", 0, b"not asked", 9));
    daemon_send(&mut s, piece("00000000000000aa", 0, &cubin[..512 << 10], cubin.len()));
    daemon_send(&mut s, piece("00000000000000aa", 512 << 10, &cubin[512 << 10..], cubin.len()));
    let answer = pb::CubinAnswer {
        sent: vec!["00000000000000aa".into(), "00000000000000cc".into()],
        nowhere: vec!["00000000000000bb".into()],
        unknown: vec![],
    };
    daemon_send(&mut s, In::CubinAnswer(answer));
    let seen = until(&mut s, |m| matches!(m, Out::PcSamplingState(st) if st.detail.starts_with("answer")));
    let Some(Out::PcSamplingState(st)) = seen.last() else { panic!() };
    assert_eq!(
        st.detail,
        format!(
            "answer: [(\"00000000000000aa\", {})] nowhere [\"00000000000000bb\"] unknown [\"00000000000000cc\"]",
            cubin.len()
        )
    );
    control.request_exit(&wake, Duration::from_millis(10));
    h.join().unwrap();
}

/// A daemon that does not say it keeps cubins (an older one closes a connection that sends
/// the queries) is asked nothing: the backend looks in the mapped files at once.
#[test]
fn late_cubins_are_not_asked_of_a_daemon_without_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, control, wake, h, _) = start_agent(dir.path(), false);
    let (mut s, _) = listener.accept().unwrap();
    assert!(matches!(next(&mut s), Out::Hello(_)));
    let welcome = pb::Welcome { protocol_version: 1, process_id: 1, max_frame_bytes: 4 << 20, ..Default::default() };
    daemon_send(&mut s, In::Welcome(welcome));
    start_tracing(&mut s, 9);
    lease(&mut s, 9, 3, 50);
    let seen = until(&mut s, |m| matches!(m, Out::PcSamplingState(st) if st.detail.starts_with("answer")));
    assert!(!seen.iter().any(|m| matches!(m, Out::CubinQuery(_) | Out::CubinsNotFound(_))), "{seen:?}");
    let Some(Out::PcSamplingState(st)) = seen.last() else { panic!() };
    assert_eq!(
        st.detail,
        "answer: [] nowhere [] unknown [\"00000000000000aa\", \"00000000000000bb\", \"00000000000000cc\"]"
    );
    control.request_exit(&wake, Duration::from_millis(10));
    h.join().unwrap();
}
