//! The agent handshake and per-connection state machine: the bytes are a stream of frames, the
//! first one the connection's Hello (checked by `agent::check::hello` under the handshake's
//! frame limit), the others messages fed to `agent::check::Checker` as `agent.rs` does, until
//! the first one refused (which closes a real connection). What the connection task keeps
//! besides (the strings' names, PC sample rows with demangled names, cubins) is mirrored, and
//! what was accepted must hold up: string ids in order and defined before use, messages only
//! from the agent kind allowed to send them, drop totals equal to the increases counted, whole
//! cubins of their announced size, cubin queries and reports of bounded lists of
//! well-formed hashes.
#![no_main]

use std::collections::HashMap;

use gpuprof_proto::agent::{AgentMessage, PROTOCOL_VERSION, agent_message::Msg};
use gpuprof_proto::frame::{DEFAULT_MAX_FRAME_BYTES, read_message};
use gpuprofd::agent::MAX_HELLO_BYTES;
use gpuprofd::agent::check::{Checker, hello};
use gpuprofd::catalog::Kind;
use gpuprofd::pcsamp::names::ConnNames;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    let Ok(first) = read_message::<AgentMessage, _>(&mut r, MAX_HELLO_BYTES) else { return };
    let Ok((h, kind)) = hello(first) else { return };
    assert_eq!(h.protocol_version, PROTOCOL_VERSION);
    assert!(kind == "injector" || kind == "sampler");
    let mut check = Checker::new(kind);
    let mut names = ConnNames::default();
    let mut defined: u32 = 0;
    let mut dropped: HashMap<Option<Kind>, u64> = HashMap::new();
    while let Ok(m) = read_message::<AgentMessage, _>(&mut r, DEFAULT_MAX_FRAME_BYTES) {
        let Some(msg) = m.msg else { break };
        if check.message(&msg).is_err() {
            break;
        }
        match msg {
            Msg::Hello(_) => panic!("a second Hello was accepted"),
            Msg::Strings(t) => {
                for s in t.strings {
                    defined += 1;
                    assert_eq!(s.id, defined, "string ids are defined in order from 1");
                    names.push(&s.value);
                    // The writer interns every string with its demangled form.
                    let _ = gpuprofd::demangle::demangle(&s.value);
                }
                assert_eq!(check.next_string(), defined + 1);
            }
            Msg::Records(b) => {
                assert_eq!(kind, "injector");
                assert!(b.kernels.iter().all(|k| k.name_id <= defined));
                assert!(b.markers.iter().all(|m| m.name_id <= defined && m.domain_id <= defined));
                let _ = gpuprofd::catalog::batch_len(&b);
            }
            Msg::PmSamples(b) => {
                assert_eq!(kind, "sampler");
                assert!(b.samples.iter().all(|s| s.values.len() == b.metrics.len()));
            }
            Msg::PcSamples(b) => {
                assert_eq!(kind, "injector");
                // The rows pushed to stream subscribers, with names.
                let rows = names.rows(1, &b);
                assert_eq!(rows.len(), b.samples.len());
            }
            Msg::SamplerState(_) => assert_eq!(kind, "sampler"),
            Msg::PcSamplingState(_) => assert_eq!(kind, "injector"),
            Msg::DeviceActivity(a) => {
                assert_eq!(kind, "injector");
                assert!(a.devices.len() <= 256, "the device list is bounded");
            }
            Msg::Drops(d) => {
                let Ok(counts) = check.drops(&d, |k, n| {
                    let total = dropped.entry(k).or_default();
                    *total = total.checked_add(n).expect("drop increases add up to a u64 total");
                }) else {
                    break;
                };
                let last: HashMap<Option<Kind>, u64> = counts.into_iter().collect();
                for (k, total) in last {
                    assert_eq!(dropped.get(&k).copied().unwrap_or(0), total, "{k:?}: increases add up to the total");
                }
            }
            Msg::Cubin(c) => {
                assert_eq!(kind, "injector");
                let size = c.size;
                // Known (stored already) for some hashes, so that both paths are taken.
                match check.cubin(c, |h| h.ends_with('0')) {
                    Ok(Some((hash, bytes))) => {
                        assert!(!hash.ends_with('0'));
                        assert_eq!(bytes.len() as u64, size, "a whole cubin has its announced size");
                    }
                    Ok(None) => {}
                    Err(_) => break,
                }
            }
            Msg::CubinQuery(gpuprof_proto::agent::CubinQuery { hashes })
            | Msg::CubinsNotFound(gpuprof_proto::agent::CubinsNotFound { hashes }) => {
                assert_eq!(kind, "injector");
                assert!(hashes.len() <= gpuprofd::agent::check::MAX_CUBIN_HASHES, "the hash list is bounded");
                assert!(hashes.iter().all(|h| gpuprofd::pcsamp::cubin::valid_hash(h)), "accepted hashes are well formed");
            }
            Msg::Goodbye(_) => break,
            Msg::TraceState(_) | Msg::Heartbeat(_) => {}
        }
    }
});
