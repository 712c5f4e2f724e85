//! `gpuprofctl diff` and `pc diff` (DiffSummary, DiffPcSamples) end to end without a GPU: a
//! real gpuprofd, fake injectors on the real protocol sending sessions that differ in known
//! ways (a kernel slowed 2×, one added, one removed, one unchanged but noisy), two ranks of one
//! job, PC samples of two sessions and of two time ranges of the always-on profile; and the
//! errors a person gets for sides that do not exist, are not theirs or hold nothing to compare.
#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use gpuprof_proto::agent::{CollectiveRecord, KernelRecord, MemcpyRecord, PcSamplingStatus, RecordBatch};
use gpuprof_testkit::fake_agent::torchrun_job;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, start_daemon, start_daemon_config, start_session};
use gpuprof_testkit::rank_agent::{Script, ScriptedAgent};
use gpuprof_testkit::{TestDaemon, bin_path};
use serde_json::Value;

const US: u64 = 1_000;
const LSB: &str = "smsp__pcsamp_warps_issue_stalled_long_scoreboard";

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

/// Kernels one after another from `t0`: for each (name id, durations), one launch per duration;
/// then ten 1 MiB copies of `copy_ns` each.
fn kernels(t0: u64, launches: &[(u32, Vec<u64>)], copy_ns: u64) -> RecordBatch {
    with_collectives(t0, launches, copy_ns, &[])
}

/// [`kernels`], then NCCL collectives: for each (name id, how many, time in the kernel).
fn with_collectives(t0: u64, launches: &[(u32, Vec<u64>)], copy_ns: u64, colls: &[(u32, u64, u64)]) -> RecordBatch {
    let mut b = RecordBatch::default();
    let mut t = t0;
    let mut corr = 1;
    for (name_id, durs) in launches {
        for d in durs {
            b.kernels.push(KernelRecord {
                start_ns: t,
                end_ns: t + d,
                device_id: 0,
                context_id: 1,
                stream_id: 7,
                correlation_id: corr,
                name_id: *name_id,
                grid_x: 4,
                grid_y: 1,
                grid_z: 1,
                block_x: 128,
                block_y: 1,
                block_z: 1,
                ..Default::default()
            });
            t += d + US;
            corr += 1;
        }
    }
    for _ in 0..10 {
        b.memcpys.push(MemcpyRecord {
            start_ns: t,
            end_ns: t + copy_ns,
            device_id: 0,
            context_id: 1,
            stream_id: 7,
            correlation_id: corr,
            bytes: 1 << 20,
            copy_kind: 1,
            ..Default::default()
        });
        t += copy_ns + US;
        corr += 1;
    }
    for &(name_id, n, gpu_ns) in colls {
        for seq in 0..n {
            b.collectives.push(CollectiveRecord {
                start_ns: t,
                end_ns: t + US,
                gpu_start_ns: t + 2 * US,
                gpu_end_ns: t + 2 * US + gpu_ns,
                name_id,
                seq,
                comm_hash: 7,
                count: 256,
                bytes: 1024,
                root: -1,
                nranks: 2,
                channels: 1,
                thread_id: 1,
                ..Default::default()
            });
            t += gpu_ns + 3 * US;
        }
    }
    b
}

fn script(strings: &[&str], records: RecordBatch, job: Option<(u32, &str)>) -> Script {
    Script {
        job: job.map(|(rank, id)| torchrun_job(id, Some(rank), 2)),
        base_ns: now_ns() - 10_000_000_000,
        strings: strings.iter().map(|s| s.to_string()).collect(),
        records,
    }
}

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "gpuprofctl failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

fn fails(o: &Output, code: i32, says: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "stdout {} stderr {err}", String::from_utf8_lossy(&o.stdout));
    assert!(err.contains(says), "{err:?} does not say {says:?}");
}

/// A session over every process that the agents in `agents` record into, stopped unless `open`.
fn session(d: &TestDaemon, agents: &[&ScriptedAgent], open: bool) -> u64 {
    let id = ok_json(&d.ctl(&["session", "start", "--all", "--json"]))["id"].as_u64().unwrap();
    for a in agents {
        assert_eq!(a.wait_started(Duration::from_secs(10)).unwrap(), id);
    }
    if !open {
        ok_json(&d.ctl(&["session", "stop", &id.to_string(), "--json"]));
    }
    id
}

/// `gpuprofctl --json diff ARGS` once the two sides hold `launches` kernels in all.
fn diff_when(d: &TestDaemon, args: &[&str], launches: u64) -> Value {
    let mut a = vec!["--json", "diff"];
    a.extend_from_slice(args);
    let t = Instant::now();
    loop {
        let v = ok_json(&d.ctl(&a));
        let n: u64 = v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["count_a"].as_u64().unwrap() + k["count_b"].as_u64().unwrap())
            .sum();
        if n == launches {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn changes(v: &Value, key: &str, field: &str) -> Vec<(String, String)> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k[field].as_str().unwrap().to_string(), k["change"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn diff_names_the_slowed_added_and_removed_kernels_and_calls_the_noisy_one_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    // Open to another user (the access check at the end).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = dir.path().join("gpuprofd.toml");
    std::fs::write(&cfg, "[api]\nsocket_mode = 0o666\n").unwrap();
    let d = TestDaemon::start_with(&dir.path().join("state"), &["--config", cfg.to_str().unwrap()]).unwrap();
    std::fs::set_permissions(dir.path().join("state"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let t0 = now_ns() - 10_000_000_000;
    // a: gemm 100 × ~100 µs, old 40 × 50 µs, noisy 100 × 20 or 180 µs (mean 100 µs, sd 80 µs).
    let alternate = |lo: u64, hi: u64| (0..100).map(|i| if i % 2 == 0 { lo } else { hi } * US).collect::<Vec<_>>();
    let near = |mean: u64| (0..100).map(|i| (mean + i % 3) * US).collect::<Vec<_>>();
    // NCCL: 5 all-reduces of 100 µs and 2 broadcasts.
    let launches = [(1, near(100)), (2, vec![50 * US; 40]), (3, alternate(20, 180))];
    let a_records = with_collectives(t0, &launches, 100 * US, &[(4, 5, 100 * US), (5, 2, 10 * US)]);
    let names = ["gemm", "old_kernel", "noisy", "AllReduce", "Broadcast"];
    let agent_a = ScriptedAgent::start(&d.agent_socket, script(&names, a_records, None)).unwrap();
    let a = session(&d, &[&agent_a], false);
    // b: gemm twice as slow, old gone, new 50 × 100 µs, noisy 100 × 40 or 180 µs (mean 110 µs:
    // +1 ms in all, well within its spread); copies twice as slow.
    // b's all-reduces take 300 µs; no broadcasts.
    let launches = [(1, near(200)), (2, vec![100 * US; 50]), (3, alternate(40, 180))];
    let b_records = with_collectives(t0, &launches, 200 * US, &[(4, 5, 300 * US)]);
    let names = ["gemm", "new_kernel", "noisy", "AllReduce"];
    let agent_b = ScriptedAgent::start(&d.agent_socket, script(&names, b_records, None)).unwrap();
    let b = session(&d, &[&agent_b], true);
    let (sa, sb) = (a.to_string(), b.to_string());

    // While b runs: compared so far, and said so.
    let v = diff_when(&d, &[&sa, &sb], 490);
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes.iter().any(|n| n.starts_with(&format!("session {b} is still running"))), "{notes:?}");
    ok_json(&d.ctl(&["session", "stop", &sb, "--json"]));

    let v = diff_when(&d, &[&sa, &sb], 490);
    assert_eq!(
        changes(&v, "kernels", "name"),
        [
            ("gemm".to_string(), "slower".to_string()),
            ("new_kernel".into(), "added".into()),
            ("old_kernel".into(), "removed".into()),
            ("noisy".into(), "unchanged".into())
        ],
        "{v:#}"
    );
    assert_eq!(
        (&v["a"], &v["b"], &v["findings"]),
        (&format!("session {a}").into(), &format!("session {b}").into(), &3.into())
    );
    assert_eq!(v["notes"], serde_json::json!(["NCCL collectives only in a, not compared: Broadcast ×2"]), "{v:#}");
    let c = &v["collectives"];
    assert_eq!(c.as_array().unwrap().len(), 1, "{v:#}");
    assert_eq!(
        (&c[0]["name"], &c[0]["count_a"], &c[0]["count_b"], &c[0]["total_ns_a"], &c[0]["total_ns_b"]),
        (&"AllReduce".into(), &5.into(), &5.into(), &(500 * US).into(), &(1500 * US).into())
    );
    let k = &v["kernels"];
    assert_eq!((&k[0]["count_a"], &k[0]["count_b"]), (&100.into(), &100.into()));
    assert_eq!(k[0]["delta_total_ns"], 100 * 100 * US as i64);
    assert_eq!((&k[1]["total_ns_b"], &k[2]["total_ns_a"]), (&(5_000 * US).into(), &(2_000 * US).into()));
    let noisy = &k[3];
    assert_eq!(noisy["delta_total_ns"], 1_000 * US as i64);
    let sd = noisy["stddev_ns_a"].as_f64().unwrap();
    assert!((sd - 80_402.0).abs() < 3_000.0, "sd of 20/180 µs from the rollup's buckets: {sd}");
    assert!(noisy["noise_ns"].as_f64().unwrap() > noisy["delta_mean_ns"].as_f64().unwrap(), "{noisy:#}");
    assert!(v["noise_rule"].as_str().unwrap().contains("standard deviation"));
    // Device busy time and copies, each side.
    let dev = &v["devices"][0];
    assert!(dev["busy_ns_b"].as_u64().unwrap() > dev["busy_ns_a"].as_u64().unwrap(), "{dev:#}");
    let copy = &v["copies"][0];
    assert_eq!((&copy["direction"], &copy["count_a"], &copy["count_b"]), (&"HtoD".into(), &10.into(), &10.into()));
    let (ga, gb) = (copy["bandwidth_gbps_a"].as_f64().unwrap(), copy["bandwidth_gbps_b"].as_f64().unwrap());
    assert!((ga / gb - 2.0).abs() < 1e-6, "{copy:#}");

    // As text, and as a differential flame graph.
    let text = String::from_utf8(d.ctl(&["diff", &sa, &sb]).stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[2].starts_with("kernels: ") && lines[2].contains("3 of 4 kernels changed beyond their noise"),
        "{text}"
    );
    let row = lines.iter().position(|l| l.starts_with("slower")).expect(&text);
    assert!(lines[row].ends_with("gemm") && lines[row + 3].starts_with("unchanged"), "{text}");
    let svg = dir.path().join("diff.svg");
    let o = d.ctl(&["diff", &sa, &sb, "-o", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("new_kernel") && svg.contains("gemm"), "{svg}");
    assert!(!svg.contains(">old_kernel<"), "a kernel b does not have has no width in b's picture");
    // By launch shape: the same verdicts, the shape in the name.
    let v = diff_when(&d, &[&sa, &sb, "--by-shape"], 490);
    assert_eq!(v["kernels"][0]["name"], "gemm [grid 4×1×1, block 128×1×1]", "{v:#}");
    assert_eq!(
        changes(&v, "kernels", "change").iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
        ["slower", "added", "removed", "unchanged"]
    );
    let help = String::from_utf8(d.ctl(&["diff", "--help"]).stdout).unwrap();
    assert!(help.contains("standard deviation") && help.contains("3 standard errors"), "{help}");

    // Two ranks of one job session: rank 1's gemm is twice as slow.
    let r0 = ScriptedAgent::start(
        &d.agent_socket,
        script(&["gemm"], kernels(t0, &[(1, near(100))], 100 * US), Some((0, "job-7"))),
    )
    .unwrap();
    let r1 = ScriptedAgent::start(
        &d.agent_socket,
        script(&["gemm"], kernels(t0, &[(1, near(200))], 100 * US), Some((1, "job-7"))),
    )
    .unwrap();
    let j = session(&d, &[&r0, &r1], false).to_string();
    let v = diff_when(&d, &[&j, "--rank-a", "0", "--rank-b", "1"], 200);
    assert_eq!(changes(&v, "kernels", "name"), [("gemm".to_string(), "slower".to_string())]);
    assert_eq!((&v["a"], &v["b"]), (&format!("session {j} rank 0").into(), &format!("session {j} rank 1").into()));

    // Bad sides.
    fails(&d.ctl(&["diff", &sa, "999"]), 4, "b.session_id: no session 999");
    fails(&d.ctl(&["diff", &sa, &sa]), 2, "the two sides are the same");
    fails(&d.ctl(&["diff", &j, "--rank-a", "0", "--rank-b", "5"]), 4, &format!("session {j} has no process of rank 5"));
    fails(&d.ctl(&["diff", "--since-a", "1h", "--since-b", "2h"]), 2, "the always-on profile holds PC samples only");
    // No PC samples on either side: nothing to compare, said so.
    fails(&d.ctl(&["pc", "diff", &sa, &sb]), 4, &format!("neither session {a} nor session {b} has PC samples"));
    // Another user may not read these sessions (root's).
    assert_eq!(unsafe_geteuid(), 0, "this test runs a client as another user: run it as root");
    let other = Command::new(bin_path("gpuprofctl"))
        .arg("--socket")
        .arg(&d.api_socket)
        .args(["diff", &sa, &sb])
        .uid(23_011)
        .gid(23_011)
        .output()
        .unwrap();
    fails(&other, 5, "a.session_id: ");
    for x in [agent_a, agent_b, r0, r1] {
        x.finish().unwrap();
    }
}

/// Waits for a StartPcSampling of `session` (answering any other command), then acknowledges it.
fn started(a: &PcAgent, session: impl Fn(u64) -> bool) -> u64 {
    let t = Instant::now();
    loop {
        assert!(t.elapsed() < Duration::from_secs(10), "no StartPcSampling");
        match a.try_command(Duration::from_millis(20)) {
            Some(PcCommand::Start(s)) => {
                a.state(s.session_id, s.device_id, PcSamplingStatus::Sampling, "", 0).unwrap();
                if session(s.session_id) {
                    return s.session_id;
                }
            }
            Some(PcCommand::Stop(s)) => a.state(s.session_id, s.device_id, PcSamplingStatus::Stopped, "", 0).unwrap(),
            None => {}
        }
    }
}

/// Samples per function: gemm at gemm.cu:10 stalled on long scoreboard, the others each on a
/// stall reason of their own.
fn samples(rows: &[(&str, u64)]) -> Vec<FakePc> {
    rows.iter()
        .map(|(f, n)| {
            let stall = match *f {
                "gemm" => LSB.to_string(),
                other => format!("smsp__pcsamp_warps_issue_stalled_{other}"),
            };
            FakePc::new(f, 0x10, &stall, *n, &format!("/src/{f}.cu"), 10)
        })
        .collect()
}

/// `gpuprofctl --json pc diff ARGS` once the sides hold `a` and `b` samples.
fn pc_diff_when(d: &TestDaemon, args: &[&str], a: u64, b: u64) -> Value {
    let mut all = vec!["--json", "pc", "diff"];
    all.extend_from_slice(args);
    let t = Instant::now();
    loop {
        let o = d.ctl(&all);
        if o.status.success() {
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            if v["total_samples_a"] == a && v["total_samples_b"] == b {
                return v;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// a: gemm 15 %, old 25 %, noisy 60 % of 1000; b: gemm 30 %, new 10 %, noisy 60.2 % of 1005.
const PC_A: [(&str, u64); 3] = [("gemm", 150), ("old", 250), ("noisy", 600)];
const PC_B: [(&str, u64); 3] = [("gemm", 300), ("new", 100), ("noisy", 605)];

fn expect_pc(v: &Value, field: &str, names: [&str; 4]) {
    let want: Vec<(String, String)> = names
        .iter()
        .zip(["removed", "more", "added", "unchanged"])
        .map(|(n, c)| (n.to_string(), c.to_string()))
        .collect();
    assert_eq!(changes(v, "rows", field), want, "{v:#}");
    assert_eq!(v["findings"], 3);
    let flags: Vec<bool> = v["rows"].as_array().unwrap().iter().map(|r| r["significant"].as_bool().unwrap()).collect();
    assert_eq!(flags, [true, true, true, false]);
}

#[test]
fn pc_diff_compares_shares_of_two_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let d = start_daemon(dir.path()).unwrap();
    let mut agent = PcAgent::connect(&d.agent_socket, "/usr/bin/pcapp", 1).unwrap();
    let a = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    started(&agent, |s| s == a);
    agent.batch(a, 0, &samples(&PC_A), 0).unwrap();
    let _ = pc_diff_when; // (sides read once both are committed, below)
    ok_json(&d.ctl(&["session", "stop", &a.to_string(), "--json"]));
    let b = start_session(&d, &["--exe", "pcapp", "--pc-sampling"]);
    started(&agent, |s| s == b);
    agent.batch(b, 0, &samples(&PC_B), 0).unwrap();
    let (sa, sb) = (a.to_string(), b.to_string());
    let v = pc_diff_when(&d, &[&sa, &sb], 1000, 1005);
    expect_pc(&v, "function", ["old", "gemm", "new", "noisy"]);
    assert!((v["rows"][1]["share_a"].as_f64().unwrap() - 0.15).abs() < 1e-9);
    let notes: Vec<&str> = v["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(notes.iter().any(|n| n.starts_with(&format!("session {b} is still running"))), "{notes:?}");
    ok_json(&d.ctl(&["session", "stop", &sb, "--json"]));
    // Per stall reason and per source line, the same story.
    let v = pc_diff_when(&d, &[&sa, &sb, "--by", "stall"], 1000, 1005);
    expect_pc(&v, "stall_reason", ["stalled_old", "stalled_long_scoreboard", "stalled_new", "stalled_noisy"]);
    let v = pc_diff_when(&d, &[&sa, &sb, "--by", "line"], 1000, 1005);
    expect_pc(&v, "file", ["/src/old.cu", "/src/gemm.cu", "/src/new.cu", "/src/noisy.cu"]);
    assert_eq!(v["rows"][0]["line"], 10);
    // Text, and a differential flame graph.
    let text = String::from_utf8(d.ctl(&["pc", "diff", &sa, &sb]).stdout).unwrap();
    assert!(text.contains("3 of 4 rows changed beyond their sampling noise"), "{text}");
    let svg = dir.path().join("pc.svg");
    let o = d.ctl(&["pc", "diff", &sa, &sb, "--by", "line", "-o", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("gemm.cu:10"), "{svg}");
    // Bad input.
    fails(&d.ctl(&["pc", "diff", &sa, &sb, "--by", "pc"]), 2, "PC offsets differ between builds");
    fails(&d.ctl(&["pc", "diff", &sa, "77"]), 4, "b.session_id: no session 77");
    agent.goodbye().unwrap();
}

#[test]
fn pc_diff_compares_two_time_ranges_of_the_always_on_profile() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = "[pc]\nalways_on = true\nturn = \"300ms\"\nmax_wait = \"1s\"\nactive_for = \"1s\"\n";
    let d = start_daemon_config(dir.path(), "0", cfg).unwrap();
    let mut trainer = PcAgent::connect(&d.agent_socket, "/opt/app/trainer", 1).unwrap();
    let mut other = PcAgent::connect(&d.agent_socket, "/usr/bin/other", 1).unwrap();
    let node = started(&trainer, |_| true);
    // Two hours ago and ten minutes ago; another program's samples in both, left out by --exe.
    let now = now_ns();
    trainer.batch_ending(node, 0, &samples(&PC_A), 0, now - 7_200_000_000_000).unwrap();
    trainer.batch_ending(node, 0, &samples(&PC_B), 0, now - 600_000_000_000).unwrap();
    let noise = [("elsewhere", 5000)];
    let node_other = started(&other, |s| s == node);
    other.batch_ending(node_other, 0, &samples(&noise), 0, now - 7_200_000_000_000).unwrap();
    other.batch_ending(node_other, 0, &samples(&noise), 0, now - 600_000_000_000).unwrap();
    let args = ["--since-a", "3h", "--until-a", "1h", "--since-b", "30m", "--exe", "trainer"];
    let v = pc_diff_when(&d, &args, 1000, 1005);
    expect_pc(&v, "function", ["old", "gemm", "new", "noisy"]);
    assert!(v["a"].as_str().unwrap().starts_with("always-on profile ["), "{v:#}");
    // Without --exe, the other program's samples are there on both sides.
    let v = pc_diff_when(&d, &args[..6], 6000, 6005);
    assert_eq!(v["rows"][0]["function"], "old", "{v:#}");
    // A range with nothing in it is named as empty; both empty is an error.
    let v = pc_diff_when(&d, &["--since-a", "6h", "--until-a", "5h", "--since-b", "30m", "--exe", "trainer"], 0, 1005);
    assert!(v["notes"][0].as_str().unwrap().contains("has no PC samples"), "{v:#}");
    fails(
        &d.ctl(&["pc", "diff", "--since-a", "6h", "--until-a", "5h", "--since-b", "5h", "--until-b", "4h"]),
        4,
        "has PC samples",
    );
    trainer.goodbye().unwrap();
    other.goodbye().unwrap();
}

#[allow(unsafe_code)]
fn unsafe_geteuid() -> u32 {
    // Safety: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[test]
fn diff_across_two_nodes_reads_the_other_side_there() {
    let dir = tempfile::tempdir().unwrap();
    let here = TestDaemon::start(&dir.path().join("here")).unwrap();
    let port = gpuprof_testkit::tls_node::free_port().unwrap();
    gpuprof_testkit::tls_node::write_tls_and_token(dir.path()).unwrap();
    let there = gpuprof_testkit::tls_node::start_node(dir.path(), "node", port).unwrap();
    let t0 = now_ns() - 10_000_000_000;
    let near = |mean: u64| (0..100).map(|i| (mean + i % 3) * US).collect::<Vec<_>>();
    let a = ScriptedAgent::start(&here.agent_socket, script(&["gemm"], kernels(t0, &[(1, near(100))], 100 * US), None))
        .unwrap();
    let b_records = kernels(t0, &[(1, near(200)), (2, vec![10 * US; 5])], 100 * US);
    let b = ScriptedAgent::start(&there.agent_socket, script(&["gemm", "only_there"], b_records, None)).unwrap();
    let sa = session(&here, &[&a], false);
    let sb = session(&there, &[&b], false);
    let host = format!("127.0.0.1:{port}");
    let (sa, sb) = (sa.to_string(), sb.to_string());
    let ca = dir.path().join("server.pem");
    let token = dir.path().join("token");
    let args = [
        "--ca",
        ca.to_str().unwrap(),
        "--token-file",
        token.to_str().unwrap(),
        "--json",
        "diff",
        &sa,
        &sb,
        "--host-b",
        &host,
    ];
    let t = Instant::now();
    let v = loop {
        let v = ok_json(&here.ctl(&args));
        if v["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["count_a"].as_u64().unwrap() + k["count_b"].as_u64().unwrap())
            .sum::<u64>()
            == 205
        {
            break v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{v:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["b"], format!("{host} session {sb}"));
    assert_eq!(
        changes(&v, "kernels", "name"),
        [("gemm".to_string(), "slower".to_string()), ("only_there".into(), "added".into())],
        "{v:#}"
    );
    // A side that is not there says where it looked.
    let mut bad = args;
    bad[7] = "4242";
    fails(&here.ctl(&bad), 4, &format!("reading {host} session 4242"));
    a.finish().unwrap();
    b.finish().unwrap();
}
