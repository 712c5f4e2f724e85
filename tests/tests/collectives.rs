//! NCCL collectives as records (what the injector sends when NCCL loaded it as its profiler
//! plugin): stored, queried (`query --kind collective`, joined to the NCCL kernel that ran
//! each), exported as slices, counted per rank by `job top`, which matches them across ranks
//! by communicator, collective and sequence number, and whose step it finds in their sequence.
//! Two fake ranks of a torchrun job run an all-reduce a step on one communicator and an
//! all-gather every other step on a second one; rank 1 arrives 2 ms late at every collective.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gpuprof_proto::agent::{CollectiveRecord, KernelRecord, RecordBatch};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::fake_agent::torchrun_job;
use gpuprof_testkit::rank_agent::{Script, ScriptedAgent};
use serde_json::Value;

const MS: u64 = 1_000_000;
const STEPS: u64 = 12;
const PERIOD: u64 = 20 * MS;
const COMM_DP: u64 = 0x9f3a_0000_0000_0001;
const COMM_TP: u64 = 0x0000_0000_dead_beef;
/// String ids (1-based, in `strings` order).
const S_AR_KERNEL: u32 = 1;
const S_AG_KERNEL: u32 = 2;
const S_ALL_REDUCE: u32 = 3;
const S_ALL_GATHER: u32 = 4;
const S_F32: u32 = 5;
const S_BF16: u32 = 6;
const S_RING: u32 = 7;
const S_SIMPLE: u32 = 8;

/// A rank: per step an all-reduce (kernel 8..12 ms into the step, its run from 9 ms + `late`
/// as NCCL timed it) and every other step an all-gather on the second communicator (kernel
/// 14..16 ms). Correlation ids: 100 + step for the all-reduce, 200 + step for the all-gather.
fn rank(rank: u32, t0: u64, late: u64, clockless_first: bool) -> Script {
    let mut b = RecordBatch::default();
    for i in 0..STEPS {
        let t = t0 + i * PERIOD;
        let kernel = |name_id, corr: u64, s: u64, e: u64| KernelRecord {
            start_ns: t + s,
            end_ns: t + e,
            device_id: rank,
            context_id: 1,
            stream_id: 13,
            correlation_id: corr as u32,
            name_id,
            ..Default::default()
        };
        b.kernels.push(kernel(S_AR_KERNEL, 100 + i, 8 * MS, 12 * MS));
        let coll = |name_id, dtype, comm, seq, count, s: u64, gpu: (u64, u64)| CollectiveRecord {
            start_ns: t + s,
            end_ns: t + s + 20_000,
            gpu_start_ns: gpu.0,
            gpu_end_ns: gpu.1,
            name_id,
            datatype_id: dtype,
            algo_id: S_RING,
            proto_id: S_SIMPLE,
            seq,
            comm_hash: comm,
            count,
            bytes: count * if dtype == S_F32 { 4 } else { 2 },
            root: -1,
            rank: rank as i32,
            nranks: 2,
            channels: 2,
            thread_id: 77,
        };
        // The first all-reduce of rank 0 came with a run on another clock: left out.
        let run = if clockless_first && i == 0 { (5, 10) } else { (t + 9 * MS + late, t + 12 * MS) };
        b.collectives.push(coll(S_ALL_REDUCE, S_F32, COMM_DP, i, 1 << 20, 7 * MS, run));
        if i % 2 == 0 {
            b.kernels.push(kernel(S_AG_KERNEL, 200 + i, 14 * MS, 16 * MS));
            let run = (t + 14 * MS + late / 2, t + 16 * MS);
            b.collectives.push(coll(S_ALL_GATHER, S_BF16, COMM_TP, i / 2, 3 << 10, 13 * MS, run));
        }
    }
    let strings = [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "AllReduce",
        "AllGather",
        "ncclFloat32",
        "ncclBfloat16",
        "Ring",
        "Simple",
    ];
    Script {
        job: Some(torchrun_job("run-c", Some(rank), 2)),
        base_ns: t0,
        strings: strings.iter().map(|s| s.to_string()).collect(),
        records: b,
    }
}

/// The two ranks' agents, connected, their steps from 10 s ago (returned): rank 1 2 ms late;
/// `clockless_first`: rank 0's first all-reduce comes with a run on another clock.
fn two_ranks(d: &TestDaemon, clockless_first: bool) -> (u64, [ScriptedAgent; 2]) {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let t0 = now - 10_000 * MS;
    let agents = [
        ScriptedAgent::start(&d.agent_socket, rank(0, t0, 0, clockless_first)).unwrap(),
        ScriptedAgent::start(&d.agent_socket, rank(1, t0, 2 * MS, false)).unwrap(),
    ];
    (t0, agents)
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "gpuprofctl failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn collectives_are_stored_queried_joined_to_their_kernel_exported_and_compared() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let (t0, agents) = two_ranks(&d, true);
    let id: Value = serde_json::from_str(&ok(&d.ctl(&["session", "start", "--all", "--json"]))).unwrap();
    let id = id["id"].as_u64().unwrap();
    for a in &agents {
        assert_eq!(a.wait_started(Duration::from_secs(10)).unwrap(), id);
    }
    ok(&d.ctl(&["session", "stop", &id.to_string(), "--json"]));
    let sid = id.to_string();
    let per_rank = STEPS + STEPS / 2;
    let mut rows: Vec<Value> = Vec::new();
    for _ in 0..100 {
        let out = ok(&d.ctl(&["query", &sid, "--kind", "collective", "--limit", "0", "--json"]));
        rows = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        if rows.len() as u64 == 2 * per_rank {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(rows.len() as u64, 2 * per_rank, "{rows:#?}");

    // Every field as sent, the communicator in hex, each joined to the kernel that ran it.
    let of = |proc: u64, name: &str, seq: u64| {
        rows.iter()
            .find(|r| r["process_id"] == proc && r["name"] == name && r["seq"] == seq)
            .unwrap_or_else(|| panic!("no {name} #{seq} of process {proc}"))
            .clone()
    };
    let r = of(agents[1].process_id, "AllReduce", 3);
    assert_eq!(r["kind"], "collective");
    assert_eq!(r["communicator"], format!("{COMM_DP:016x}"));
    assert_eq!((&r["rank"], &r["nranks"], &r["count"]), (&1.into(), &2.into(), &(1u64 << 20).into()));
    assert_eq!(
        (&r["bytes"], &r["datatype"], &r["algorithm"]),
        (&(4u64 << 20).into(), &"ncclFloat32".into(), &"Ring".into())
    );
    assert_eq!((&r["protocol"], &r["root"], &r["channels"]), (&"Simple".into(), &(-1).into(), &2.into()));
    assert_eq!((&r["thread_id"], &r["start_ns"]), (&77.into(), &(t0 + 3 * PERIOD + 7 * MS).into()));
    assert_eq!(r["end_ns"], t0 + 3 * PERIOD + 7 * MS + 20_000);
    assert_eq!(r["gpu"]["start_ns"], t0 + 3 * PERIOD + 11 * MS);
    assert_eq!(r["gpu"]["end_ns"], t0 + 3 * PERIOD + 12 * MS);
    assert_eq!((&r["kernel_correlation_id"], &r["device_id"]), (&103.into(), &1.into()));
    let g = of(agents[1].process_id, "AllGather", 2);
    assert_eq!((&g["communicator"], &g["bytes"]), (&format!("{COMM_TP:016x}").into(), &(6u64 << 10).into()));
    assert_eq!(g["kernel_correlation_id"], 204);
    // A run timed on another clock is left out; the kernel is then the first after the enqueue.
    let first = of(agents[0].process_id, "AllReduce", 0);
    assert_eq!((&first["gpu"], &first["kernel_correlation_id"]), (&Value::Null, &100.into()), "{first:#}");

    // The name filter and the table.
    let gathers = ok(&d.ctl(&["query", &sid, "--kind", "collective", "--name", "AllG*", "--limit", "0", "--json"]));
    assert_eq!(gathers.lines().count() as u64, STEPS, "{gathers}");
    let table = ok(&d.ctl(&["query", &sid, "--kind", "collective", "--limit", "0"]));
    for want in [
        "AllReduce #0 4.0 MiB ncclFloat32 rank 0/2",
        "AllGather #5 6.0 KiB ncclBfloat16 rank 1/2 comm 00000000deadbeef",
    ] {
        assert!(table.lines().any(|l| l.starts_with("coll") && l.contains(want)), "{want}: {table}");
    }

    // job top: counted per rank, matched by sequence number, rank 1 the straggler.
    let s: Value = serde_json::from_str(&ok(&d.ctl(&["job", "top", &sid, "--json"]))).unwrap();
    assert_eq!(s["matched_by"], "sequence", "{s:#}");
    let ranks = s["ranks"].as_array().unwrap();
    for r in ranks {
        assert_eq!(
            r["collectives"],
            serde_json::json!([
                {"name": "AllReduce", "count": STEPS, "bytes": STEPS * (4 << 20)},
                {"name": "AllGather", "count": STEPS / 2, "bytes": STEPS / 2 * (6 << 10)},
            ]),
            "{s:#}"
        );
    }
    // The step from the collectives' sequence (in order of enqueue, across both communicators):
    // all-reduce, all-gather, all-reduce repeats, every 2 of the ranks' steps.
    for r in ranks {
        assert_eq!(
            (&r["step_source"], &r["step_name"]),
            (&"collectives".into(), &"AllReduce ×2, AllGather (3 collectives a step)".into()),
            "{s:#}"
        );
        assert_eq!((&r["step_ns"], &r["steps"]), (&(2 * PERIOD).into(), &(STEPS / 2).into()), "{s:#}");
    }
    // Rank 0's first all-reduce has no run: compared are the 11 others and the 6 all-gathers.
    assert_eq!(s["collectives"], STEPS - 1 + STEPS / 2, "{s:#}");
    assert_eq!(s["straggler"]["rank"], 1, "{s:#}");
    assert_eq!(ranks[0]["wait_ns"], (STEPS - 1) * 2 * MS + STEPS / 2 * MS, "{s:#}");
    let text = ok(&d.ctl(&["job", "top", &sid]));
    assert!(text.contains("collectives compared (matched by sequence)"), "{text}");
    assert!(text.lines().nth(1).unwrap().contains("COLLS"), "{text}");
    assert!(text.contains("collectives of rank 1: AllReduce 12 (48.0 MiB), AllGather 6 (36.0 KiB)"), "{text}");
    assert!(text.contains("step time from: collectives \"AllReduce ×2, AllGather (3 collectives a step)\""), "{text}");
    assert!(text.contains("40.00 ms"), "{text}");

    // Chrome JSON: one slice per collective on the enqueuing thread, with its sequence number,
    // communicator and bytes.
    let json_path = dir.path().join("t.json");
    ok(&d.ctl(&["export", &sid, "-o", json_path.to_str().unwrap()]));
    let trace: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let nccl: Vec<&Value> = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "nccl").collect();
    assert_eq!(nccl.len() as u64, 2 * per_rank);
    let e = nccl.iter().find(|e| e["name"] == "AllGather" && e["args"]["seq"] == 5).unwrap();
    assert_eq!((&e["args"]["communicator"], &e["args"]["bytes"]), (&format!("{COMM_TP:016x}").into(), &6144.into()));
    assert_eq!((&e["ph"], &e["tid"]), (&"X".into(), &77.into()));
    // Perfetto: the same slices, in category "nccl".
    let pf = dir.path().join("t.pftrace");
    ok(&d.ctl(&["export", &sid, "-o", pf.to_str().unwrap()]));
    let bytes = std::fs::read(&pf).unwrap();
    for needle in [&b"AllGather"[..], b"nccl", b"communicator"] {
        assert!(bytes.windows(needle.len()).any(|w| w == needle), "{:?} not in the Perfetto trace", needle);
    }
    // Parquet: collective.parquet, and every file's rows carry the job id and rank.
    let pq = dir.path().join("pq");
    ok(&d.ctl(&["export", &sid, "--format", "parquet", "-o", pq.to_str().unwrap()]));
    let read = gpuprof_testkit::python::parquet_check(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), &pq);
    assert_eq!(read["rows"]["collective"], 2 * per_rank, "{read:#}");
    let cols: Vec<&str> =
        read["columns"]["collective"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for col in ["job_id", "rank", "start_ns", "name", "seq", "communicator", "bytes", "datatype", "gpu_offset_ns"] {
        assert!(cols.contains(&col), "collective.parquet has no {col}: {cols:?}");
    }
    let ranks = serde_json::json!([[agents[0].process_id, "run-c", 0], [agents[1].process_id, "run-c", 1]]);
    assert_eq!((&read["ranks"]["collective"], &read["ranks"]["kernel"]), (&ranks, &ranks), "{read:#}");
    for a in agents {
        a.finish().unwrap();
    }
}

/// `gpuprofctl trace --job ID` on a running job: when the trace ends it shows, per rank, where
/// the step time goes (`job top`'s table) beside the usual summary.
#[test]
fn tracing_a_job_by_its_id_compares_its_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let (_, agents) = two_ranks(&d, false);
    // The trace's file in the format its name says: Perfetto here.
    let pf = dir.path().join("job.pftrace");
    let out = ok(&d.ctl(&["trace", "--job", "run-c", "--duration", "2s", "--json", "-o", pf.to_str().unwrap()]));
    let v: Value = serde_json::from_str(&out).unwrap();
    let job = &v["job"];
    assert_eq!((&job["job_id"], &job["matched_by"]), (&"run-c".into(), &"sequence".into()), "{v:#}");
    assert_eq!(job["ranks"].as_array().unwrap().len(), 2, "{v:#}");
    assert_eq!(job["straggler"]["rank"], 1, "{v:#}");
    assert_eq!(job["collectives"], STEPS + STEPS / 2, "{v:#}");
    let bytes = std::fs::read(&pf).unwrap();
    assert!(!bytes.is_empty() && bytes[0] != b'{', "a Perfetto trace, not JSON: {:?}", &bytes[..bytes.len().min(80)]);
    assert!(bytes.windows(9).any(|w| w == b"AllReduce"), "the collectives are in the Perfetto trace");
    // The table form (a scripted rank sends its records to the first session only: this second
    // trace has none to compare, and the table says so).
    let text = ok(&d.ctl(&["trace", "--job", "run-c", "--duration", "1s"]));
    assert!(text.contains("job run-c") && text.contains("RANK") && text.contains("no straggler"), "{text}");
    // A format trace cannot write is refused before anything starts.
    let svg = d.ctl(&["trace", "--job", "run-c", "--duration", "1s", "-o", "x.svg"]);
    assert_eq!(svg.status.code(), Some(2), "{}", String::from_utf8_lossy(&svg.stderr));
    assert!(String::from_utf8_lossy(&svg.stderr).contains("trace writes one file"));
    for a in agents {
        a.finish().unwrap();
    }
}
