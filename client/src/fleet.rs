//! `gpuprofctl --host H1:PORT --host H2:PORT trace ...`: one session per host started for the
//! same instant, waited for together, summarized per host, and with `-o` their traces
//! merged into one file on a common time axis (Chrome JSON, gzipped or not, or Perfetto
//! protobuf: [`crate::fleet_perfetto`]). Each host's clock offset against the caller is
//! estimated first (the daemon's clock in `GetStatus`, NTP-style: the reply with the shortest
//! round trip of [`OFFSET_PROBES`], assumed to be stamped halfway through it); start times are
//! given to each host in its own clock and its trace is moved onto the caller's; the merged
//! trace says each offset and its error bound (half that round trip).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpuprofctl::pb;
use serde_json::{Value, json};

use crate::export::Format;
use gpuprofctl::Client;

use crate::fleet_perfetto::{HostTrace, merge_perfetto};
use crate::output::{clock_text, print_summary, session_json, session_line, summary_json};
use crate::trace::TraceArgs;

/// Sessions on hosts that have not said when to start begin this long after the command, so
/// that every host starts at the same instant (corrected by each host's clock offset).
const COMMON_START: Duration = Duration::from_secs(1);

/// Session polls (every 200 ms) a host may fail in a row, unreachable, before the trace fails.
const POLL_RETRIES: u32 = 25;

/// Whether a call failed because the host could not be reached: no connection
/// (`Unavailable`), or a connection that broke while the call was in flight (tonic reports that
/// as `Unknown` "transport error", with the transport error as its source).
fn unreachable(e: &tonic::Status) -> bool {
    e.code() == tonic::Code::Unavailable
        || (e.code() == tonic::Code::Unknown
            && std::iter::successors(std::error::Error::source(e), |s| s.source())
                .any(|s| s.is::<tonic::transport::Error>()))
}

/// `GetStatus` calls per host for its clock offset.
pub const OFFSET_PROBES: usize = 5;

/// A host's clock minus the caller's, in ns, from `(sent, host_now, received)` samples (the
/// caller's clock at sending and receiving, the host's in the reply): the sample with the
/// shortest round trip, the host's time taken as halfway through it. Also that round trip.
pub fn clock_offset(samples: &[(u64, u64, u64)]) -> Option<(i64, u64)> {
    samples
        .iter()
        .filter(|(sent, now, received)| received >= sent && *now > 0)
        .min_by_key(|(sent, _, received)| received - sent)
        .map(|&(sent, now, received)| {
            let mid = sent as i128 + (received - sent) as i128 / 2;
            ((now as i128 - mid) as i64, received - sent)
        })
}

async fn host_offset(c: &mut Client, host: &str) -> Result<(i64, u64)> {
    let mut samples = Vec::with_capacity(OFFSET_PROBES);
    for _ in 0..OFFSET_PROBES {
        let sent = crate::output::now_ns();
        let st = c
            .get_status(pb::GetStatusRequest {})
            .await
            .with_context(|| format!("reading the clock of {host}"))?
            .into_inner();
        samples.push((sent, st.now_ns, crate::output::now_ns()));
    }
    clock_offset(&samples)
        .with_context(|| format!("{host} did not report its clock (a gpuprofd older than this gpuprofctl?)"))
}

pub async fn trace(hosts: Vec<(String, Client)>, args: TraceArgs, json: bool) -> Result<()> {
    // What the merged trace will be, refused before any session starts when it cannot be.
    let format = match &args.output {
        None => None,
        Some(p) => match crate::export::format_of(p)? {
            f @ (Format::Chrome | Format::ChromeGz | Format::Perfetto) => Some(f),
            Format::Sqlite | Format::Pprof | Format::Parquet | Format::Svg => {
                return Err(crate::output::Usage(format!(
                    "-o {}: a trace over several hosts is merged as Chrome JSON (.json, .json.gz) or \
                     Perfetto (.pftrace, .perfetto-trace); each host's session can still be exported \
                     as SQLite or pprof on its own with `gpuprofctl --host H export`",
                    p.display()
                ))
                .into());
            }
        },
    };
    let mut req = args.collect.request(args.targets.to_pb()?)?;
    if req.start_at_ns == 0 {
        req.start_at_ns = crate::output::now_ns() + COMMON_START.as_nanos() as u64;
    }
    let mut offsets = Vec::with_capacity(hosts.len());
    let mut hosts = hosts;
    for (host, c) in &mut hosts {
        offsets.push(host_offset(c, host).await?);
    }
    let mut started: Vec<(String, Client, u64)> = Vec::new();
    for ((host, mut c), (offset, _)) in hosts.into_iter().zip(offsets.iter().copied()) {
        let mut host_req = req.clone();
        host_req.start_at_ns = (host_req.start_at_ns as i64).saturating_add(offset).max(1) as u64;
        match c.start_session(host_req).await {
            Ok(s) => started.push((host, c, s.into_inner().id)),
            Err(e) => {
                for (_, c, id) in &mut started {
                    let _ = c.stop_session(pb::StopSessionRequest { session_id: *id }).await;
                }
                return Err(anyhow::Error::from(e).context(format!("starting the session on {host}")));
            }
        }
    }
    if !json {
        let ids: Vec<String> = started
            .iter()
            .zip(&offsets)
            .map(|((h, _, id), (off, rtt))| format!("{h}: session {id}, clock {}", clock_text(*off, rtt / 2)))
            .collect();
        eprintln!("tracing on {} hosts ({})", started.len(), ids.join(", "));
    }
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut done: BTreeMap<usize, pb::Session> = BTreeMap::new();
    // Polls that failed in a row per host: a host unreachable for a moment (a dropped
    // connection is reconnected by the next call) does not end the whole trace.
    let mut failed_polls = vec![0u32; started.len()];
    while done.len() < started.len() {
        tokio::select! {
            r = &mut ctrl_c => {
                r.context("waiting for Ctrl-C")?;
                for (i, (host, c, id)) in started.iter_mut().enumerate() {
                    if let std::collections::btree_map::Entry::Vacant(slot) = done.entry(i) {
                        let s = c.stop_session(pb::StopSessionRequest { session_id: *id }).await
                            .with_context(|| format!("stopping session {id} on {host}"))?;
                        slot.insert(s.into_inner());
                    }
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(200)) => {
                for (i, (host, c, id)) in started.iter_mut().enumerate() {
                    if done.contains_key(&i) {
                        continue;
                    }
                    let s = match c.get_session(pb::GetSessionRequest { session_id: *id }).await {
                        Ok(s) => {
                            failed_polls[i] = 0;
                            s.into_inner()
                        }
                        Err(e) if unreachable(&e) && failed_polls[i] < POLL_RETRIES => {
                            failed_polls[i] += 1;
                            continue;
                        }
                        Err(e) => return Err(anyhow::Error::from(e).context(format!("session {id} on {host}"))),
                    };
                    let st = pb::SessionState::try_from(s.state).unwrap_or_default();
                    if matches!(st, pb::SessionState::Completed | pb::SessionState::Failed | pb::SessionState::Interrupted) {
                        done.insert(i, s);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (i, (host, c, id)) in started.iter_mut().enumerate() {
        let summary = c
            .get_summary(pb::GetSummaryRequest { session_id: *id, filter: None, top: args.top })
            .await
            .with_context(|| format!("summary of session {id} on {host}"))?
            .into_inner();
        let s = &done[&i];
        if json {
            out.push(json!({
                "host": host,
                "clock_offset_ns": offsets[i].0,
                "clock_error_ns": offsets[i].1 / 2,
                "session": session_json(s),
                "summary": summary_json(&summary),
            }));
        } else {
            println!("== {host}: {}", session_line(s));
            print_summary(&summary, 80, false);
            println!();
        }
    }
    if let (Some(path), Some(format)) = (&args.output, format) {
        let exported =
            if format == Format::Perfetto { pb::ExportFormat::Perfetto } else { pb::ExportFormat::ChromeJson };
        let mut traces = Vec::new();
        for ((host, c, id), (offset, rtt)) in started.iter_mut().zip(&offsets) {
            let data = crate::records::export_bytes(c, *id, exported)
                .await
                .with_context(|| format!("exporting session {id} from {host}"))?;
            traces.push(HostTrace {
                host: host.clone(),
                session: *id,
                clock_offset_ns: *offset,
                clock_error_ns: rtt / 2,
                data,
            });
        }
        let mut merged = if format == Format::Perfetto { merge_perfetto(&traces)? } else { merge_chrome(&traces)? };
        if format == Format::ChromeGz {
            use std::io::Write;
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(crate::export::GZIP_LEVEL));
            gz.write_all(&merged)?;
            merged = gz.finish()?;
        }
        crate::outfile::write_file(path, &merged)?;
        if !json {
            eprintln!("wrote {} ({} hosts, {} bytes)", path.display(), traces.len(), merged.len());
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    let failed: Vec<String> = started
        .iter()
        .enumerate()
        .filter(|(i, _)| pb::SessionState::try_from(done[i].state) == Ok(pb::SessionState::Failed))
        .map(|(i, (h, _, id))| format!("{h} session {id}: {}", done[&i].stop_reason))
        .collect();
    if !failed.is_empty() {
        bail!("failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Chrome trace JSON exports of several hosts as one trace: each export's t0 (its `ts` count
/// µs from its own `otherData.t0_ns`, in the host's clock) moved onto the caller's clock, and
/// times onto the earliest of those; the trace processes of each host renumbered after the
/// previous host's (in their order) with the host in their names, and flow ids kept apart per
/// host.
pub fn merge_chrome(traces: &[HostTrace]) -> Result<Vec<u8>> {
    let mut parsed = Vec::new();
    for t in traces {
        let host = &t.host;
        let v: Value = serde_json::from_slice(&t.data).with_context(|| format!("the trace from {host} is not JSON"))?;
        let t0 = v["otherData"]["t0_ns"].as_i64().with_context(|| format!("the trace from {host} has no t0_ns"))?;
        parsed.push((host, t.session, t0 - t.clock_offset_ns, (t.clock_offset_ns, t.clock_error_ns), v));
    }
    let t0_min = parsed.iter().map(|p| p.2).min().unwrap_or(0);
    let mut events = Vec::new();
    let mut hosts = Vec::new();
    let mut next_pid = 1i64;
    for (i, (host, session, t0, (offset, error), v)) in parsed.into_iter().enumerate() {
        let mut evs = match v.get("traceEvents").cloned() {
            Some(Value::Array(a)) => a,
            _ => bail!("the trace from {host} has no traceEvents"),
        };
        let mut pids: Vec<i64> = evs.iter().filter_map(|e| e["pid"].as_i64()).collect();
        pids.sort_unstable();
        pids.dedup();
        let renumber: BTreeMap<i64, i64> = pids.iter().enumerate().map(|(k, p)| (*p, next_pid + k as i64)).collect();
        next_pid += pids.len() as i64;
        let shift_us = (t0 - t0_min) as f64 / 1000.0;
        for e in &mut evs {
            let Some(obj) = e.as_object_mut() else { continue };
            if let Some(pid) = obj.get("pid").and_then(Value::as_i64) {
                let new = renumber[&pid];
                obj.insert("pid".into(), json!(new));
                if obj.get("ph").and_then(Value::as_str) == Some("M") {
                    match obj.get("name").and_then(Value::as_str) {
                        Some("process_name") => {
                            if let Some(args) = obj.get_mut("args").and_then(Value::as_object_mut) {
                                let name = args.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
                                args.insert("name".into(), json!(format!("{host} · {name}")));
                            }
                        }
                        Some("process_sort_index") => {
                            if let Some(args) = obj.get_mut("args").and_then(Value::as_object_mut) {
                                args.insert("sort_index".into(), json!(new));
                            }
                        }
                        _ => {}
                    }
                }
            }
            if let Some(ts) = obj.get("ts").and_then(Value::as_f64) {
                obj.insert("ts".into(), json!(ts + shift_us));
            }
            if let Some(id) = obj.get("id").and_then(Value::as_u64) {
                obj.insert("id".into(), json!(id + ((i as u64) << 40)));
            }
        }
        events.extend(evs);
        hosts.push(json!({
            "host": host, "session": session, "t0_ns": t0, "clock_offset_ns": offset, "clock_error_ns": error,
        }));
    }
    let merged = json!({
        "displayTimeUnit": "ns",
        "otherData": {"t0_ns": t0_min, "gpuprof_hosts": hosts},
        "traceEvents": events,
    });
    Ok(serde_json::to_vec(&merged)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(t0: i64, events: Value) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"displayTimeUnit": "ns", "otherData": {"gpuprof_session": 1, "t0_ns": t0}, "traceEvents": events}),
        )
        .unwrap()
    }

    fn ht(host: &str, session: u64, clock_offset_ns: i64, data: Vec<u8>) -> HostTrace {
        HostTrace { host: host.into(), session, clock_offset_ns, clock_error_ns: 250, data }
    }

    #[test]
    fn a_broken_connection_counts_as_unreachable() {
        assert!(unreachable(&tonic::Status::unavailable("tcp connect error")));
        let transport = tonic::transport::Endpoint::from_shared("not a uri".to_string()).unwrap_err();
        let broken = tonic::Status::from_error(Box::new(transport));
        assert_eq!(broken.code(), tonic::Code::Unknown, "as a call whose connection broke in flight");
        assert!(unreachable(&broken));
        assert!(!unreachable(&tonic::Status::unknown("transport error")), "an answer of the daemon's own");
        assert!(!unreachable(&tonic::Status::not_found("session 1 not found")));
        assert!(!unreachable(&tonic::Status::internal("database is locked")));
    }

    #[test]
    fn clock_offset_from_the_shortest_round_trip() {
        // Host 3 ms ahead; the second probe has the shortest round trip (2 µs).
        let s =
            [(1_000_000, 4_100_000, 1_200_000), (2_000_000, 5_000_001, 2_000_002), (3_000_000, 6_090_000, 3_100_000)];
        assert_eq!(clock_offset(&s), Some((3_000_000, 2)));
        // Behind: negative; a reply without a clock (older daemon) or a backwards local clock
        // is no sample.
        assert_eq!(clock_offset(&[(10_000, 5_000, 10_000)]), Some((-5_000, 0)));
        assert_eq!(clock_offset(&[(10_000, 0, 10_010), (10_000, 9, 9_000)]), None);
    }

    #[test]
    fn host_clocks_are_moved_onto_the_callers() {
        let ev = json!([{"ph": "X", "cat": "kernel", "name": "k", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0}]);
        // Both started at the caller's 10 ms; h2's clock runs 4 ms ahead, so it says 14 ms.
        let merged: Value = serde_json::from_slice(
            &merge_chrome(&[
                ht("h1", 1, 0, trace(10_000_000, ev.clone())),
                ht("h2", 2, 4_000_000, trace(14_000_000, ev)),
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(merged["otherData"]["t0_ns"], 10_000_000);
        assert_eq!(merged["otherData"]["gpuprof_hosts"][1]["clock_offset_ns"], 4_000_000);
        assert_eq!(merged["otherData"]["gpuprof_hosts"][1]["clock_error_ns"], 250);
        let e = merged["traceEvents"].as_array().unwrap();
        assert_eq!((e[0]["ts"].as_f64(), e[1]["ts"].as_f64()), (Some(0.0), Some(0.0)), "the same instant");
    }

    #[test]
    fn merges_hosts_on_one_time_axis() {
        let a = trace(
            5_000_000,
            json!([
                {"ph": "X", "cat": "kernel", "name": "k", "pid": 1001, "tid": 7, "ts": 1.5, "dur": 2.0},
                {"ph": "s", "cat": "flow", "name": "launch", "pid": 1000, "tid": 3, "ts": 1.0, "id": 4},
                {"ph": "M", "name": "process_name", "pid": 1000, "args": {"name": "python3 (pid 42)"}},
                {"ph": "M", "name": "process_sort_index", "pid": 1000, "args": {"sort_index": 1000}},
            ]),
        );
        // Started 2 ms earlier: its t0 becomes the merged one, and the same pids as host a.
        let b = trace(
            3_000_000,
            json!([
                {"ph": "X", "cat": "kernel", "name": "k", "pid": 1001, "tid": 7, "ts": 1.5, "dur": 2.0},
                {"ph": "M", "name": "process_name", "pid": 1001, "args": {"name": "GPU 0 · python3 (pid 42)"}},
                {"ph": "s", "cat": "flow", "name": "launch", "pid": 1000, "tid": 3, "ts": 1.0, "id": 4},
            ]),
        );
        let merged: Value =
            serde_json::from_slice(&merge_chrome(&[ht("h1:7461", 7, 0, a), ht("h2:7461", 9, 0, b)]).unwrap()).unwrap();
        assert_eq!(merged["otherData"]["t0_ns"], 3_000_000);
        assert_eq!(merged["otherData"]["gpuprof_hosts"][1]["session"], 9);
        let ev = merged["traceEvents"].as_array().unwrap();
        assert_eq!(ev.len(), 7);
        // Host a: pids 1000, 1001 → 1, 2, times 2 ms (2000 µs) later; host b: 3, 4, unchanged.
        assert_eq!((ev[0]["pid"].as_i64(), ev[0]["ts"].as_f64()), (Some(2), Some(2001.5)));
        assert_eq!((ev[1]["pid"].as_i64(), ev[1]["id"].as_u64()), (Some(1), Some(4)));
        assert_eq!(ev[2]["args"]["name"], "h1:7461 · python3 (pid 42)");
        assert_eq!(ev[3]["args"]["sort_index"], 1);
        assert_eq!((ev[4]["pid"].as_i64(), ev[4]["ts"].as_f64()), (Some(4), Some(1.5)));
        assert_eq!(ev[5]["args"]["name"], "h2:7461 · GPU 0 · python3 (pid 42)");
        assert_eq!((ev[6]["pid"].as_i64(), ev[6]["id"].as_u64()), (Some(3), Some(4 + (1 << 40))));
        assert!(merge_chrome(&[ht("h", 1, 0, b"{}".to_vec())]).is_err(), "no t0");
    }
}
