//! `gpuprofctl job top` and GetJobSummary: the ranks of a distributed job compared. Three fake
//! ranks of one torchrun job send kernels whose timings the test chose: each step a compute
//! kernel, then an NCCL all-reduce that ends at the same time on every rank. Rank 1 computes
//! 2 ms longer than rank 0 and rank 2 0.5 ms longer, so ranks 0 and 2 wait for rank 1 inside
//! their all-reduce: rank 1 is the straggler.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use gpuprof_proto::agent::{KernelRecord, MarkerRecord, RecordBatch};
use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::fake_agent::torchrun_job;
use gpuprof_testkit::rank_agent::{Script, ScriptedAgent};
use gpuprofctl::pb;
use serde_json::Value;
use tonic::Code;

const MS: u64 = 1_000_000;
/// Steps each rank runs, one every `PERIOD`.
const STEPS: u64 = 30;
const PERIOD: u64 = 20 * MS;
const COMPUTE: &str = "ampere_sgemm_128x64_tn";
const ALL_REDUCE: &str = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)";

/// A rank's script: `STEPS` steps from `t0`, computing 10 ms + `late`, then an all-reduce
/// that ends 13 ms into the step (1 ms after rank 1's, the latest, starts); `steps` of them
/// (fewer: a rank that ran fewer collectives); with `markers`, a ProfilerStep#N range a step.
fn rank_script(job: &str, rank: Option<u32>, t0: u64, late: u64, steps: u64, markers: bool) -> Script {
    let mut b = RecordBatch::default();
    let dev = rank.unwrap_or(0) % 2;
    for i in 0..STEPS {
        let t = t0 + i * PERIOD;
        let kernel = |name_id, start_ns, end_ns| KernelRecord {
            start_ns,
            end_ns,
            device_id: dev,
            context_id: 1,
            stream_id: 7,
            correlation_id: i as u32 + 1,
            name_id,
            ..Default::default()
        };
        b.kernels.push(kernel(1, t, t + 10 * MS + late));
        if i < steps {
            b.kernels.push(kernel(2, t + 10 * MS + late, t + 13 * MS));
        }
        if markers {
            b.markers.push(MarkerRecord {
                id: i + 1,
                start_ns: t,
                end_ns: t + 19 * MS,
                name_id: 3 + i as u32,
                thread_id: 1,
                ..Default::default()
            });
        }
    }
    let mut strings = vec![COMPUTE.to_string(), ALL_REDUCE.to_string()];
    strings.extend((0..STEPS).map(|i| format!("ProfilerStep#{i}")));
    Script { job: Some(torchrun_job(job, rank, 3)), base_ns: t0, strings, records: b }
}

fn ok_json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "gpuprofctl failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn job_top_names_the_late_rank_and_what_the_others_waited() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    // Times in the past: 10 s ago.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let t0 = now - 10_000 * MS;
    let agents = [
        ScriptedAgent::start(&d.agent_socket, rank_script("run-9", Some(0), t0, 0, STEPS, true)).unwrap(),
        ScriptedAgent::start(&d.agent_socket, rank_script("run-9", Some(1), t0, 2 * MS, STEPS, false)).unwrap(),
        // Rank 2 is 0.5 ms late and its last all-reduce is missing.
        ScriptedAgent::start(&d.agent_socket, rank_script("run-9", Some(2), t0, MS / 2, STEPS - 1, false)).unwrap(),
        // A process of the job without a rank, and another job's only rank.
        ScriptedAgent::start(&d.agent_socket, rank_script("run-9", None, t0, 0, STEPS, false)).unwrap(),
        ScriptedAgent::start(&d.agent_socket, rank_script("other", Some(0), t0, 0, STEPS, false)).unwrap(),
        // Rank 0 again (a restart), with fewer all-reduces: not the one compared.
        ScriptedAgent::start(&d.agent_socket, rank_script("run-9", Some(0), t0, 0, 5, false)).unwrap(),
    ];
    let id = ok_json(&d.ctl(&["session", "start", "--all", "--json"]))["id"].as_u64().unwrap();
    for a in &agents {
        assert_eq!(a.wait_started(Duration::from_secs(10)).unwrap(), id);
    }
    ok_json(&d.ctl(&["session", "stop", &id.to_string(), "--json"]));
    let sid = id.to_string();
    // Every kernel stored (the stop waits for the agents' last batches; give the writer time).
    let mut s = Value::Null;
    for _ in 0..100 {
        s = ok_json(&d.ctl(&["job", "top", &sid, "--job", "run-9", "--json"]));
        if s["ranks"].as_array().unwrap().iter().map(|r| r["kernel_count"].as_u64().unwrap()).sum::<u64>()
            == 4 * 2 * STEPS - 1 + STEPS + 5
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let ranks = s["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 5, "{s:#}");
    let rank_of: Vec<Value> = ranks.iter().map(|r| r["rank"].clone()).collect();
    assert_eq!(rank_of, vec![Value::from(0), 0.into(), 1.into(), 2.into(), Value::Null], "by rank, the rank-less last");
    assert_eq!(
        (&ranks[0]["process_id"], &ranks[1]["process_id"]),
        (&agents[0].process_id.into(), &agents[5].process_id.into())
    );
    assert_eq!(ranks[4]["process_id"], agents[3].process_id);
    // The restarted rank 0 is listed, not compared.
    assert_eq!(
        (&ranks[1]["nccl_count"], &ranks[1]["wait_ns"], &ranks[1]["last_count"]),
        (&5.into(), &0.into(), &0.into())
    );
    let ranks: Vec<&Value> = ranks.iter().enumerate().filter(|(i, _)| *i != 1).map(|(_, r)| r).collect();

    // The straggler, with its evidence: rank 1 started all 29 compared all-reduces last.
    assert_eq!(s["collectives"], STEPS - 1, "{s:#}");
    let st = &s["straggler"];
    assert_eq!((&st["rank"], &st["process_id"]), (&1.into(), &agents[1].process_id.into()), "{s:#}");
    assert_eq!((&st["last_count"], &st["collectives"]), (&(STEPS - 1).into(), &(STEPS - 1).into()));
    // Ranks 0 and 2 waited 2 ms and 1.5 ms per all-reduce.
    let waits: Vec<u64> = ranks.iter().map(|r| r["wait_ns"].as_u64().unwrap()).collect();
    assert_eq!(waits, vec![(STEPS - 1) * 2 * MS, 0, (STEPS - 1) * 3 * MS / 2, 0], "{s:#}");
    assert_eq!(st["others_wait_ns"], (STEPS - 1) * 7 * MS / 2);
    assert_eq!(st["median_wait_ns"], 2 * MS);
    let evidence = st["evidence"].as_str().unwrap();
    assert!(evidence.starts_with("rank 1 started last in 100 % of 29 collectives"), "{evidence}");
    assert!(evidence.contains("101.50 ms in total"), "{evidence}");
    assert_eq!(s["no_straggler"], "");
    let notes: Vec<&str> = s["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes.iter().any(|n| n.contains("rank 2 29") && n.contains("compared the first 29")), "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains(&format!("process {} ", agents[3].process_id)) && n.contains("no rank")),
        "{notes:?}"
    );
    let restart = format!(
        "rank 0 ran in several processes: compared process {}, the one with the most NCCL kernels; not {}",
        agents[0].process_id, agents[5].process_id
    );
    assert!(notes.iter().any(|n| n.starts_with(&restart)), "{notes:?}");

    // Per rank: step time (rank 0 from its ProfilerStep ranges, the others from their
    // all-reduces), busy share, NCCL time, devices.
    let field = |r: usize, k: &str| ranks[r][k].clone();
    assert_eq!(
        (field(0, "step_ns"), field(0, "step_source"), field(0, "step_name")),
        (PERIOD.into(), "marker".into(), "ProfilerStep#*".into())
    );
    assert_eq!(field(0, "steps"), STEPS - 1);
    assert_eq!((field(1, "step_ns"), field(1, "step_source")), (PERIOD.into(), "nccl".into()));
    assert!(field(1, "step_name").as_str().unwrap().starts_with("ncclDevKernel_AllReduce"), "{s:#}");
    assert_eq!((field(0, "nccl_count"), field(0, "nccl_ns")), (STEPS.into(), (STEPS * 3 * MS).into()));
    assert_eq!((field(1, "nccl_count"), field(1, "nccl_ns")), (STEPS.into(), (STEPS * MS).into()));
    assert_eq!(field(2, "nccl_count"), STEPS - 1);
    // Busy 13 ms of each 20 ms step; the span ends 13 ms into the last step.
    let span = (STEPS - 1) * PERIOD + 13 * MS;
    assert_eq!((field(0, "start_ns"), field(0, "end_ns")), (t0.into(), (t0 + span).into()));
    assert_eq!(field(0, "busy_ns"), STEPS * 13 * MS);
    let share = field(0, "busy_share").as_f64().unwrap();
    assert!((share - (STEPS * 13 * MS) as f64 / span as f64).abs() < 1e-9, "{share}");
    assert_eq!(field(1, "device_ids"), serde_json::json!([1]));
    assert_eq!(field(3, "wait_ns"), 0);

    // The table: a row per process, the straggler marked, its evidence below.
    let out = d.ctl(&["job", "top", &sid, "--job", "run-9"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text.lines().nth(1).unwrap();
    for col in ["RANK", "PID", "DEVICE", "STEP", "BUSY", "NCCL", "WAIT"] {
        assert!(header.contains(col), "{text}");
    }
    assert!(text.lines().any(|l| l.trim_start().starts_with("1 *")), "{text}");
    assert!(text.contains("straggler: rank 1 started last in 100 % of 29 collectives"), "{text}");
    assert!(text.contains("20.00 ms") && text.contains("58.00 ms") && text.contains("43.50 ms"), "{text}");

    // The other job's only rank: nothing to compare it with.
    let o = ok_json(&d.ctl(&["job", "top", &sid, "--job", "other", "--json"]));
    assert_eq!((o["ranks"].as_array().unwrap().len(), &o["straggler"]), (1, &Value::Null), "{o:#}");
    assert!(o["no_straggler"].as_str().unwrap().contains("one rank"), "{o:#}");

    // Refused, with a reason a person can act on.
    let refused = |args: &[&str], code: i32, want: &str| {
        let o = d.ctl(args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    refused(&["job", "top", &sid], 2, "name one");
    refused(&["job", "top", &sid, "--job", ""], 2, "job id is empty");
    refused(&["job", "top", "999", "--job", "run-9"], 4, "no session 999");
    refused(&["job", "top", &sid, "--job", "run-1"], 4, "its jobs: \"other\", \"run-9\"");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let req = |session_id, job_id: &str| pb::GetJobSummaryRequest { session_id, job_id: job_id.into() };
        for (r, code, want) in [
            (req(id, ""), Code::InvalidArgument, "job_id: session"),
            (req(0, "run-9"), Code::InvalidArgument, "session_id"),
            (req(id, &"j".repeat(129)), Code::InvalidArgument, "job_id: 129 bytes"),
            (req(id, "run\u{7}"), Code::InvalidArgument, "control characters"),
            (req(999, "run-9"), Code::NotFound, "no session 999"),
            (req(id, "run-1"), Code::NotFound, "no process of job \"run-1\""),
        ] {
            let e = c.get_job_summary(r).await.unwrap_err();
            assert_eq!(e.code(), code, "{e:?}");
            assert!(e.message().contains(want), "{e:?}");
        }
    });
    for a in agents {
        a.finish().unwrap();
    }
}

#[test]
fn a_session_without_ranks_has_no_job_to_compare() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut script = rank_script("", None, now - 10_000 * MS, 0, STEPS, false);
    script.job = None;
    let a = ScriptedAgent::start(&d.agent_socket, script).unwrap();
    let id = ok_json(&d.ctl(&["session", "start", "--all", "--json"]))["id"].as_u64().unwrap();
    assert_eq!(a.wait_started(Duration::from_secs(10)).unwrap(), id);
    ok_json(&d.ctl(&["session", "stop", &id.to_string(), "--json"]));
    let o = d.ctl(&["job", "top", &id.to_string()]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(6), "FAILED_PRECONDITION: {err}");
    assert!(err.contains("no rank of a distributed job"), "{err}");
    a.finish().unwrap();
}
