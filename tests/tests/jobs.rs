//! Distributed jobs: processes report their job identity (torchrun's run id and rank) in their
//! Hello; `procs` and `session show` show ranks, the job and its launcher, and sessions target a
//! job, all or some of its ranks.
//!
//! The launcher is an agent in this test process; the ranks are agent processes it starts, so
//! gpuprofd sees them descend from it in /proc as torchrun's ranks descend from torchrun.
//! Another job's rank runs in this process too (a process is not its own launcher).

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::process::Output;
use std::time::Duration;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::fake_agent::torchrun_job;
use gpuprof_testkit::traced_agent::{AgentProcess, Event, TracedAgent, TracedConfig, spawn_process};
use gpuprofctl::pb;
use serde_json::Value;
use tonic::Code;

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "gpuprofctl failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rank_process(d: &TestDaemon, job: &str, rank: u32, seed: u64) -> AgentProcess {
    let cfg = TracedConfig {
        cmdline: vec!["python3".into(), "train.py".into()],
        job: Some(torchrun_job(job, Some(rank), 2)),
        rate: 2_000.0,
        seed,
        ..Default::default()
    };
    spawn_process(&d.agent_socket, &cfg, None).unwrap()
}

/// The session's members: process id → (rank, role, job id).
fn members(d: &TestDaemon, session: u64) -> Vec<(u64, Value, String, String)> {
    let s = json(&d.ctl(&["session", "show", &session.to_string(), "--json"]));
    let mut v: Vec<_> = s["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let s = |k: &str| p[k].as_str().unwrap().to_string();
            (p["process_id"].as_u64().unwrap(), p["rank"].clone(), s("role"), s("job_id"))
        })
        .collect();
    v.sort_by_key(|m| m.0);
    v
}

fn stop(d: &TestDaemon, session: u64) {
    json(&d.ctl(&["session", "stop", &session.to_string(), "--json"]));
}

#[test]
fn ranks_launcher_and_job_targets() {
    let dir = tempfile::tempdir().unwrap();
    let d = TestDaemon::start(&dir.path().join("state")).unwrap();
    // torchrun: the launcher has none of the job's variables (it sets them for its ranks only).
    let launcher = TracedAgent::start(&d.agent_socket, TracedConfig { rate: 2_000.0, ..Default::default() }).unwrap();
    let r0 = rank_process(&d, "run-42", 0, 2);
    let r1 = rank_process(&d, "run-42", 1, 3);
    // Another job's rank, in this process: not a descendant of the launcher.
    let other_cfg = TracedConfig { rate: 2_000.0, job: Some(torchrun_job("run-7", Some(0), 1)), ..Default::default() };
    let other = TracedAgent::start(&d.agent_socket, other_cfg).unwrap();

    let ps = json(&d.ctl(&["procs", "--json"]));
    let find = |id: u64| ps.as_array().unwrap().iter().find(|p| p["id"] == id).unwrap().clone();
    let (pl, p0, p1, po) =
        (find(launcher.process_id), find(r0.process_id), find(r1.process_id), find(other.process_id));
    assert_eq!((&p0["rank"], &p0["job_id"], &p0["role"]), (&0.into(), &"run-42".into(), &"rank".into()), "{p0}");
    assert_eq!((&p1["rank"], &p1["world_size"], &p1["local_rank"]), (&1.into(), &2.into(), &1.into()), "{p1}");
    assert_eq!((&p1["job_launcher"], &p1["parent_pid"]), (&"torchelastic".into(), &std::process::id().into()));
    assert_eq!((&po["job_id"], &po["role"]), (&"run-7".into(), &"rank".into()), "{po}");
    assert_eq!(pl["rank"], Value::Null, "the launcher has no rank: {pl}");
    assert_eq!(
        (&pl["role"], &pl["job_id"]),
        (&"launcher".into(), &"run-42".into()),
        "the ranks of run-42 descend from it: {pl}"
    );
    let table = String::from_utf8(d.ctl(&["procs"]).stdout).unwrap();
    let line = |id: u64| table.lines().find(|l| l.trim_start().starts_with(&format!("{id} "))).unwrap().to_string();
    assert!(table.lines().next().unwrap().contains("RANK") && table.contains("JOB"), "{table}");
    assert!(line(r1.process_id).contains(" 1/2 ") && line(r1.process_id).contains("run-42"), "{table}");
    assert!(line(launcher.process_id).contains(" launcher "), "{table}");

    // One rank of the job: only rank 1 joins.
    let s1 = json(&d.ctl(&["session", "start", "--job", "run-42", "--rank", "1", "--json"]));
    let s1 = s1["id"].as_u64().unwrap();
    assert_eq!(r1.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s1));
    assert_eq!(members(&d, s1), vec![(r1.process_id, 1.into(), "rank".into(), "run-42".into())]);
    assert!(r0.wait_event(Duration::from_millis(500)).is_err(), "rank 0 is not traced");
    assert!(other.events.recv_timeout(Duration::from_millis(100)).is_err(), "another job's rank 0 is not traced");
    assert_eq!(json(&d.ctl(&["session", "show", &s1.to_string(), "--json"]))["targets"][0], "job=run-42 rank=1");
    stop(&d, s1);
    assert!(matches!(r1.wait_event(Duration::from_secs(10)).unwrap(), Event::Stopped(s, _) if s == s1));

    // The whole job: both ranks, and a rank that starts later joins. The launcher, without the
    // job's variables, is not covered; neither is the other job.
    let s2 = json(&d.ctl(&["session", "start", "--job", "run-42", "--json"]))["id"].as_u64().unwrap();
    for r in [&r0, &r1] {
        assert_eq!(r.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s2));
    }
    let late = rank_process(&d, "run-42", 2, 5);
    assert_eq!(late.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s2), "a later rank joins");
    assert!(other.events.recv_timeout(Duration::from_millis(300)).is_err(), "run-7 is another job");
    let m: Vec<(u64, Value)> = members(&d, s2).into_iter().map(|(id, rank, _, _)| (id, rank)).collect();
    assert_eq!(m, vec![(r0.process_id, 0.into()), (r1.process_id, 1.into()), (late.process_id, 2.into())]);
    let shown = String::from_utf8(d.ctl(&["session", "show", &s2.to_string()]).stdout).unwrap();
    assert!(shown.contains("RANK") && shown.contains("job=run-42"), "{shown}");
    stop(&d, s2);
    // The exports name each rank's process by its rank.
    let dir2 = tempfile::tempdir().unwrap();
    let file = dir2.path().join("job.json");
    let out = d.ctl(&["export", &s2.to_string(), "-o", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = std::fs::read_to_string(&file).unwrap();
    for r in 0..3 {
        assert!(trace.contains(&format!("rank {r} · ")), "rank {r} is not named in the export");
    }

    // The launcher's pid covers it and its ranks: session show marks it the launcher.
    let me = std::process::id().to_string();
    let s3 = json(&d.ctl(&["session", "start", "--pid", &me, "--json"]))["id"].as_u64().unwrap();
    assert_eq!(launcher.events.recv_timeout(Duration::from_secs(10)).unwrap(), Event::Started(s3));
    for r in [&r0, &r1, &late] {
        let e = r.wait_event(Duration::from_secs(10)).unwrap();
        let e = if matches!(e, Event::Stopped(s, _) if s == s2) {
            r.wait_event(Duration::from_secs(10)).unwrap()
        } else {
            e
        };
        assert_eq!(e, Event::Started(s3));
    }
    let m = members(&d, s3);
    let role = |id: u64| m.iter().find(|x| x.0 == id).map(|x| (x.2.clone(), x.3.clone())).unwrap();
    assert_eq!(role(launcher.process_id), ("launcher".into(), "run-42".into()), "{m:?}");
    assert_eq!(role(late.process_id), ("rank".into(), "run-42".into()), "{m:?}");
    assert_eq!(role(other.process_id), ("rank".into(), "run-7".into()), "{m:?}");
    stop(&d, s3);

    // Bad arguments, refused with a reason a person can act on.
    let refused = |args: &[&str], want: &str| {
        let o = d.ctl(args);
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    refused(&["session", "start", "--job", ""], "job id is empty");
    refused(&["session", "start", "--exe", "python3", "--rank", "1"], "--job");
    refused(&["trace", "--rank", "0", "--duration", "1s"], "--job");
    refused(&["session", "start", "--job", "run-42", "--rank", "one"], "one");
    let long = "j".repeat(129);
    refused(&["trace", "--job", &long, "--duration", "1s"], "at most 128");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut c = gpuprofctl::connect(&d.api_socket).await.unwrap();
        let job = |job_id: &str, ranks: Vec<u32>| pb::StartSessionRequest {
            targets: vec![pb::Target {
                target: Some(pb::target::Target::Job(pb::JobTarget { job_id: job_id.into(), ranks })),
            }],
            ..Default::default()
        };
        for (req, want) in
            [(job("", vec![1]), "targets.job.job_id"), (job("run-42", vec![0; 5000]), "targets.job.ranks")]
        {
            let e = c.start_session(req).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(want), "{e:?}");
        }
    });

    let (pids, ids) = ([r0.pid, r1.pid, late.pid], [launcher.process_id, r0.process_id, late.process_id]);
    for a in [r0, r1, late] {
        a.finish().unwrap();
    }
    other.finish().unwrap();
    launcher.finish().unwrap();

    // Stored with the process: after they exit, ranks and the launcher (their parent) still show.
    let gone = |ps: &Value| ids.iter().all(|id| ps.as_array().unwrap().iter().all(|p| p["id"] != *id));
    let mut ps = json(&d.ctl(&["procs", "--json"]));
    for _ in 0..100 {
        if gone(&ps) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        ps = json(&d.ctl(&["procs", "--json"]));
    }
    assert!(gone(&ps), "{ps}");
    let all = json(&d.ctl(&["procs", "--all", "--json"]));
    let find = |id: u64| all.as_array().unwrap().iter().find(|p| p["id"] == id).unwrap().clone();
    let (pl, p0, pn) = (find(ids[0]), find(ids[1]), find(ids[2]));
    assert_eq!(
        (&pl["role"], &pl["job_id"], &pl["trace_state"]),
        (&"launcher".into(), &"run-42".into(), &"exited".into())
    );
    assert_eq!((&p0["rank"], &p0["role"], &p0["world_size"]), (&0.into(), &"rank".into(), &2.into()), "{p0}");
    assert_eq!((&pn["rank"], &pn["job_launcher"], &pn["pid"]), (&2.into(), &"torchelastic".into(), &pids[2].into()));
}
