//! A session's PC samples, from fake injectors' batches to what users read: QueryPcSamples by
//! function, line, stall reason and PC, StreamPcSamples pushed per batch (100 subscribers, a
//! slow one dropped), `gpuprofctl pc top`, and the pprof export decoded back.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_proto::pprof::Profile;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, ctl_ok, start_daemon, start_session};
use gpuprofctl::pb;
use prost::Message;

const GEMM: &str = "_Z9gemm_tileILi128EEvPKfS1_Pfi";
const ADD: &str = "_Z10add_kernelPfS_i";
const LSB: &str = "smsp__pcsamp_warps_issue_stalled_long_scoreboard";
const BAR: &str = "smsp__pcsamp_warps_issue_stalled_barrier";
const SEL: &str = "smsp__pcsamp_warps_issue_selected";

/// A client whose HTTP/2 windows are small (64 KiB), so a stream it does not read backs up
/// to the server quickly instead of filling megabytes of client buffers first.
async fn connect_small_window(
    sock: &std::path::Path,
) -> Result<gpuprof_proto::api::gpuprof_client::GpuprofClient<tonic::transport::Channel>> {
    let path = sock.to_path_buf();
    let ch = tonic::transport::Endpoint::try_from("http://gpuprofd.local")?
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?;
    Ok(gpuprof_proto::api::gpuprof_client::GpuprofClient::new(ch))
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

/// Two batches: gemm with line info at two PCs, add without.
fn batches() -> [Vec<FakePc>; 2] {
    [
        vec![
            FakePc::new(GEMM, 0x100, LSB, 600, "/src/gemm.cu", 42),
            FakePc::new(GEMM, 0x100, SEL, 100, "/src/gemm.cu", 42),
            FakePc::new(GEMM, 0x180, BAR, 200, "/src/gemm.cu", 57),
            FakePc::new(ADD, 0x20, SEL, 50, "", 0),
        ],
        vec![FakePc::new(GEMM, 0x100, LSB, 400, "/src/gemm.cu", 42), FakePc::new(ADD, 0x20, LSB, 50, "", 0)],
    ]
}

async fn query(
    c: &mut gpuprof_proto::api::gpuprof_client::GpuprofClient<tonic::transport::Channel>,
    id: u64,
    by: pb::PcGroupBy,
    kernel: &str,
) -> Result<pb::QueryPcSamplesResponse> {
    Ok(c.query_pc_samples(pb::QueryPcSamplesRequest {
        session_id: id,
        group_by: by as i32,
        kernel: kernel.into(),
        limit: 0,
        ..Default::default()
    })
    .await?
    .into_inner())
}

#[test]
fn batches_are_pushed_queried_shown_and_exported_as_pprof() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let rt = rt();
    let sock = d.api_socket.clone();
    let t0 = Instant::now();
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling", "--pc-period", "11"]);
    let (mut c, mut all, mut gemm) = rt.block_on(async {
        let c = gpuprofctl::connect(&sock).await?;
        let sub = |kernel: &str| {
            let req = pb::StreamPcSamplesRequest { session_id: id, kernel: kernel.into() };
            let mut c = c.clone();
            async move { Ok::<_, anyhow::Error>(c.stream_pc_samples(req).await?.into_inner()) }
        };
        let all = sub("").await?;
        let gemm = sub("*gemm_tile<*").await?;
        Ok::<_, anyhow::Error>((c, all, gemm))
    })?;
    assert!(matches!(a.command(Duration::from_secs(5))?, PcCommand::Start(_)));
    let [b1, b2] = batches();
    a.batch(id, 0, &b1, 7)?;
    let (m1, g1) = rt.block_on(async {
        let m = tokio::time::timeout(Duration::from_secs(5), all.message()).await??;
        let g = tokio::time::timeout(Duration::from_secs(5), gemm.message()).await??;
        Ok::<_, anyhow::Error>((m, g))
    })?;
    let first_row = t0.elapsed();
    let m1 = m1.expect("a pushed batch");
    assert_eq!(m1.samples.len(), 4);
    assert_eq!(m1.dropped_samples, 7);
    assert!(m1.end_ns > m1.start_ns);
    let r = &m1.samples[0];
    assert_eq!(
        (r.function_name.as_str(), r.mangled_name.as_str()),
        ("void gemm_tile<128>(float const*, float const*, float*, int)", GEMM)
    );
    assert_eq!((r.file.as_str(), r.line, r.pc_offset, r.count, r.device), ("/src/gemm.cu", 42, 0x100, 600, 0));
    assert_eq!(r.stall_reason, LSB);
    assert_eq!(r.process_id, a.process_id);
    let g1 = g1.expect("a pushed batch");
    assert_eq!(g1.samples.len(), 3, "the kernel filter keeps gemm's rows only: {g1:?}");
    a.batch(id, 0, &b2, 0)?;
    let m2 = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), all.message()).await })??;
    assert_eq!(m2.map(|m| m.samples.len()), Some(2));

    // QueryPcSamples, once both batches are committed.
    let t = Instant::now();
    let f = loop {
        let f = rt.block_on(query(&mut c, id, pb::PcGroupBy::Function, ""))?;
        if f.total_samples == 1400 {
            break f;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{f:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(f.dropped_samples, 7);
    assert_eq!(f.total_rows, 2);
    // The node's always-on profile is asked for by time, never together with a session.
    for (req, says) in [
        (pb::QueryPcSamplesRequest { session_id: id, since_ns: 1, ..Default::default() }, "leave session_id 0"),
        (pb::QueryPcSamplesRequest { pod: "web-*".into(), ..Default::default() }, "pod and exe need since_ns"),
        (pb::QueryPcSamplesRequest { since_ns: u64::MAX, ..Default::default() }, "in the future"),
        (pb::QueryPcSamplesRequest { since_ns: 1, exe: "[".into(), ..Default::default() }, "\"[\""),
    ] {
        let e = rt.block_on(c.query_pc_samples(req)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(says), "{says}: {}", e.message());
    }
    assert_eq!((f.rows[0].mangled_name.as_str(), f.rows[0].samples), (GEMM, 1300));
    let st: Vec<(&str, u64)> = f.rows[0].stalls.iter().map(|s| (s.reason.as_str(), s.count)).collect();
    assert_eq!(st, [(LSB, 1000), (BAR, 200), (SEL, 100)]);
    assert_eq!((f.rows[1].function_name.as_str(), f.rows[1].samples), ("add_kernel(float*, float*, int)", 100));
    let l = rt.block_on(query(&mut c, id, pb::PcGroupBy::Line, ""))?;
    let lines: Vec<(&str, u32, u64)> = l.rows.iter().map(|r| (r.file.as_str(), r.line, r.samples)).collect();
    assert_eq!(lines, [("/src/gemm.cu", 42, 1100), ("/src/gemm.cu", 57, 200), ("", 0, 100)]);
    let s = rt.block_on(query(&mut c, id, pb::PcGroupBy::Stall, ""))?;
    let stalls: Vec<(&str, u64)> = s.rows.iter().map(|r| (r.stall_reason.as_str(), r.samples)).collect();
    assert_eq!(stalls, [(LSB, 1050), (BAR, 200), (SEL, 150)]);
    let p = rt.block_on(query(&mut c, id, pb::PcGroupBy::Pc, "*add_kernel*"))?;
    assert_eq!(p.total_samples, 100, "the kernel filter applies to the totals");
    assert_eq!((p.rows.len(), p.rows[0].pc_offset, p.rows[0].samples), (1, 0x20, 100));
    let p = rt.block_on(query(&mut c, id, pb::PcGroupBy::Pc, "_Z9gemm*"))?;
    assert_eq!(p.rows.iter().map(|r| (r.pc_offset, r.samples)).collect::<Vec<_>>(), [(0x100, 1100), (0x180, 200)]);

    // The CLI.
    let out = ctl_ok(&d, &["pc", "top", &id.to_string(), "--by", "line"]);
    assert!(out.contains("1400 PC samples, 7 lost"), "{out}");
    assert!(!out.contains("have no row"), "every counted sample is in a row or lost: {out}");
    assert!(out.contains("/src/gemm.cu:42") && out.contains("stalled_long_scoreboard 91%"), "{out}");
    assert!(!out.contains("smsp__pcsamp"), "stall reasons are shortened: {out}");
    eprintln!("gpuprofctl pc top {id} --by line:\n{out}");
    let j: serde_json::Value = serde_json::from_str(&ctl_ok(&d, &["--json", "pc", "top", &id.to_string()]))?;
    assert_eq!(j["total_samples"], 1400);
    assert_eq!(j["rows"][0]["function"], "void gemm_tile<128>(float const*, float const*, float*, int)");
    assert_eq!(j["rows"][0]["stalls"][0]["reason"], "stalled_long_scoreboard");
    let out = ctl_ok(&d, &["pc", "top", &id.to_string(), "--by", "stall"]);
    assert!(out.lines().nth(2).is_some_and(|l| l.contains("stalled_long_scoreboard") && l.contains("75.0")), "{out}");

    // pprof.
    let path = dir.path().join("prof.pb.gz");
    ctl_ok(&d, &["export", &id.to_string(), "-o", path.to_str().unwrap_or_default()]);
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path)?).read_to_end(&mut raw)?;
    let prof = Profile::decode(raw.as_slice())?;
    let s = |i: i64| prof.string_table[i as usize].as_str();
    assert_eq!(s(0), "");
    let types: Vec<(&str, &str)> = prof.sample_type.iter().map(|t| (s(t.r#type), s(t.unit))).collect();
    assert_eq!(
        types,
        [
            ("samples", "count"),
            ("stalled_long_scoreboard", "count"),
            ("stalled_barrier", "count"),
            ("selected", "count")
        ]
    );
    assert_eq!(s(prof.default_sample_type), "samples");
    assert_eq!(prof.period, 1 << 11);
    assert_eq!(prof.sample.len(), 3, "one sample per (function, PC)");
    for i in 0..4 {
        let sum: i64 = prof.sample.iter().map(|x| x.value[i]).sum();
        assert_eq!(sum, [1400, 1050, 200, 150][i], "sample type {i}");
    }
    let funcs: HashMap<u64, (&str, &str, &str)> =
        prof.function.iter().map(|f| (f.id, (s(f.name), s(f.system_name), s(f.filename)))).collect();
    let loc = |addr: u64| prof.location.iter().find(|l| l.address == addr).expect("location");
    let hot = loc(0x100);
    assert_eq!(hot.line[0].line, 42);
    assert_eq!(
        funcs[&hot.line[0].function_id],
        ("void gemm_tile<128>(float const*, float const*, float*, int)", GEMM, "/src/gemm.cu")
    );
    let hot_sample = prof.sample.iter().find(|x| x.location_id == [hot.id]).expect("sample");
    assert_eq!(hot_sample.value, [1100, 1000, 0, 100]);

    // Perfetto: a counter track per (kernel, stall reason) with the samples per second.
    let path = dir.path().join("t.pftrace");
    ctl_ok(&d, &["export", &id.to_string(), "-o", path.to_str().unwrap_or_default()]);
    let trace = gpuprof_proto::perfetto::Trace::decode(std::fs::read(&path)?.as_slice())?;
    use gpuprof_proto::perfetto::trace_packet::Data;
    let counters: HashMap<u64, String> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(Data::TrackDescriptor(t)) if t.counter.is_some() => Some((t.uuid?, t.name.clone()?)),
            _ => None,
        })
        .collect();
    assert_eq!(counters.len(), 5, "(gemm, add) x their stall reasons: {counters:?}");
    let lsb = counters.iter().filter(|(_, n)| n.contains("gemm_tile<128>") && n.ends_with(": stalled_long_scoreboard"));
    let lsb: Vec<u64> = lsb.map(|(u, _)| *u).collect();
    assert_eq!(lsb.len(), 1, "{counters:?}");
    let values: Vec<i64> = trace
        .packet
        .iter()
        .filter_map(|p| match &p.data {
            Some(Data::TrackEvent(e)) if e.track_uuid == Some(lsb[0]) => e.counter_value,
            _ => None,
        })
        .collect();
    assert_eq!(values.iter().sum::<i64>(), 1000, "gemm's long-scoreboard samples over time: {values:?}");
    assert_eq!(values.last(), Some(&0), "back to 0 after the last second with samples");

    // The session ends: so do its streams.
    ctl_ok(&d, &["session", "stop", &id.to_string()]);
    let end = rt.block_on(async { tokio::time::timeout(Duration::from_secs(5), all.message()).await })??;
    assert!(end.is_none(), "the stream ends with the session: {end:?}");
    eprintln!("first PC row pushed {first_row:?} after session start");
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn trace_ends_with_a_pc_top_and_pc_watch_prints_each_batch() -> Result<()> {
    use std::io::BufRead;
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let sock = d.api_socket.to_str().unwrap_or_default().to_string();
    let ctl = gpuprof_testkit::bin_path("gpuprofctl");
    let trace = std::process::Command::new(&ctl)
        .args(["--socket", &sock, "trace", "--exe", "pcapp", "--pc-sampling", "--duration", "4s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let PcCommand::Start(st) = a.command(Duration::from_secs(10))? else { panic!("expected StartPcSampling") };
    let id = st.session_id.to_string();
    let mut watch = std::process::Command::new(&ctl)
        .args(["--socket", &sock, "--json", "pc", "watch", &id])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let out = watch.stdout.take().expect("stdout");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    // Batches until the watcher shows one (it subscribes at its own pace).
    let [b1, _] = batches();
    let t = Instant::now();
    let first = loop {
        a.batch(st.session_id, 0, &b1, 0)?;
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            break l;
        }
        assert!(t.elapsed() < Duration::from_secs(3), "pc watch printed nothing");
    };
    let v: serde_json::Value = serde_json::from_str(&first)?;
    assert_eq!(v["samples"].as_array().map(Vec::len), Some(4), "{v}");
    assert_eq!(v["samples"][0]["stall_reason"], "stalled_long_scoreboard");
    assert_eq!(v["samples"][0]["line"], 42);
    // The trace ends with its duration: so does the watch, and trace prints the PC top.
    let traced = trace.wait_with_output()?;
    let text = String::from_utf8_lossy(&traced.stdout);
    assert!(traced.status.success(), "{text}{}", String::from_utf8_lossy(&traced.stderr));
    assert!(text.contains("PC samples") && text.contains("gemm_tile<128>"), "{text}");
    assert!(text.contains("stalled_long_scoreboard"), "{text}");
    eprintln!("gpuprofctl trace --pc-sampling:\n{text}");
    assert!(watch.wait()?.success());
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(rest.iter().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{rest:?}");
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}

#[test]
fn hundred_subscribers_get_every_batch_and_a_slow_one_is_dropped() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon(dir.path())?;
    let mut a = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1)?;
    let id = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    assert!(matches!(a.command(Duration::from_secs(5))?, PcCommand::Start(_)));
    // Rows with long names (about 1.5 KiB a batch), so that what the slow one leaves unread
    // fills its connection's buffers and then the ring (stream_queue = 512 batches).
    let names: Vec<String> = (0..6).map(|i| format!("kernel_{i}_{}", "x".repeat(120))).collect();
    let rows: Vec<FakePc> = names.iter().map(|n| FakePc::new(n, 0x10, LSB, 1, "/src/k.cu", 3)).collect();
    const N: usize = 1200;
    let rt = rt();
    let sock = d.api_socket.clone();
    let (readers, slow) = rt.block_on(async {
        let mut readers = Vec::new();
        for _ in 0..100 {
            let mut c = gpuprofctl::connect(&sock).await?;
            let mut s = c
                .stream_pc_samples(pb::StreamPcSamplesRequest { session_id: id, kernel: String::new() })
                .await?
                .into_inner();
            readers.push(tokio::spawn(async move {
                let mut n = 0usize;
                while n < N {
                    let Some(m) = s.message().await? else { anyhow::bail!("stream ended after {n} batches") };
                    anyhow::ensure!(m.samples.len() == 6, "batch {n}: {} rows", m.samples.len());
                    n += 1;
                }
                Ok::<_, anyhow::Error>(n)
            }));
        }
        let mut c = connect_small_window(&sock).await?;
        let slow = c
            .stream_pc_samples(pb::StreamPcSamplesRequest { session_id: id, kernel: String::new() })
            .await?
            .into_inner();
        Ok::<_, anyhow::Error>((readers, (c, slow)))
    })?;
    let t = Instant::now();
    for _ in 0..N {
        a.batch(id, 0, &rows, 0)?;
        std::thread::sleep(Duration::from_millis(3));
    }
    let sent_in = t.elapsed();
    let counts = rt.block_on(async {
        let mut v = Vec::new();
        for r in readers {
            v.push(tokio::time::timeout(Duration::from_secs(60), r).await??);
        }
        Ok::<_, anyhow::Error>(v)
    })?;
    for (i, c) in counts.into_iter().enumerate() {
        assert_eq!(c?, N, "subscriber {i}");
    }
    let (_c, mut slow) = slow;
    let (got, err) = rt.block_on(gpuprof_testkit::read_to_end(&mut slow, Duration::from_secs(10)));
    let got = got as usize;
    let err = err.expect("the slow subscriber's stream must end with an error");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err}");
    assert!(got < N, "slow subscriber got {got} of {N}");
    assert!(d.log_text().contains("dropping a slow PC stream subscriber"));
    eprintln!("100 subscribers got all {N} batches sent in {sent_in:?}; the slow one got {got} then {}", err.message());
    a.goodbye()?;
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
