//! The per-GPU PC-sampling scheduler end to end without a GPU: a real `gpuprofd`, fake
//! injectors that report the devices they work on (DeviceActivity), answer
//! StartPcSampling/StopPcSampling with their states, and a `gpuprofctl` session over all of
//! them: a launcher that never works on a GPU, two processes sharing GPU 0, one alone on GPU 1.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpuprof_proto::agent::PcSamplingStatus;
use gpuprof_testkit::pc_agent::{PcAgent, PcCommand, pc_state, start_daemon_config, start_session};

const CONFIG: &str = "[pc]\nturn = \"300ms\"\nmax_wait = \"1s\"\nactive_for = \"1s\"\nhandover_timeout = \"3s\"\n";

/// What one fake process saw.
#[derive(Default, Debug)]
struct Seen {
    /// (device, start time) of each StartPcSampling.
    starts: Vec<(u32, Instant)>,
    stops: Vec<(u32, Instant)>,
    /// Devices it samples now.
    holding: Vec<u32>,
}

/// Answers every agent's commands for `dur`: a start is acknowledged at once (SAMPLING), a
/// stop after 20 ms (STOPPED). Checks that no two processes ever sample one GPU at once.
fn serve(agents: &[(&str, &PcAgent)], seen: &mut BTreeMap<String, Seen>, session: u64, dur: Duration) {
    serve_logged(agents, seen, session, dur, None)
}

fn serve_logged(
    agents: &[(&str, &PcAgent)],
    seen: &mut BTreeMap<String, Seen>,
    session: u64,
    dur: Duration,
    log: Option<&std::path::Path>,
) {
    let end = Instant::now() + dur;
    while Instant::now() < end {
        for (name, a) in agents {
            let Some(c) = a.try_command(Duration::from_millis(5)) else { continue };
            let now = Instant::now();
            match c {
                PcCommand::Start(s) => {
                    for (other, o) in seen.iter() {
                        assert!(
                            other == name || !o.holding.contains(&s.device_id),
                            "{name} was started on device {} while {other} still sampled it; gpuprofd's log: {}",
                            s.device_id,
                            log.map(|p| std::fs::read_to_string(p).unwrap_or_default()).unwrap_or_default()
                        );
                    }
                    let me = seen.entry(name.to_string()).or_default();
                    me.starts.push((s.device_id, now));
                    me.holding.push(s.device_id);
                    a.state(session, s.device_id, PcSamplingStatus::Sampling, "", 0).unwrap();
                }
                PcCommand::Stop(s) => {
                    std::thread::sleep(Duration::from_millis(20));
                    let me = seen.entry(name.to_string()).or_default();
                    me.holding.retain(|d| *d != s.device_id);
                    me.stops.push((s.device_id, Instant::now()));
                    a.state(session, s.device_id, PcSamplingStatus::Stopped, "lease revoked", 0).unwrap();
                }
            }
        }
    }
}

#[test]
fn only_processes_working_on_a_gpu_sample_it_and_those_sharing_one_take_turns() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let d = start_daemon_config(dir.path(), "0, 1", CONFIG)?;
    let launcher = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 2)?;
    launcher.work_on(&[]);
    let w0 = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 2)?;
    w0.work_on(&[0]);
    let w1 = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 2)?;
    w1.work_on(&[1]);
    let shared = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 1)?;
    let id = start_session(&d, &["--exe", "python3", "--pc-sampling"]);
    let agents = [("launcher", &launcher), ("w0", &w0), ("w1", &w1), ("shared", &shared)];
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    serve_logged(&agents, &mut seen, id, Duration::from_millis(1500), Some(&d.log));
    // While one of the two on GPU 0 samples, the other says why it does not.
    let (s_w0, s_sh) = (pc_state(&d, id, w0.process_id, 0).0, pc_state(&d, id, shared.process_id, 0).0);
    let waiting = if s_w0 == "sampling" { &s_sh } else { &s_w0 };
    assert!(
        waiting.starts_with("waiting for its turn (GPU 0 is") || waiting.starts_with("waiting for the lease"),
        "w0: {s_w0}; shared: {s_sh}"
    );
    serve_logged(&agents, &mut seen, id, Duration::from_millis(2500), Some(&d.log));

    assert!(seen.get("launcher").is_none_or(|s| s.starts.is_empty()), "the launcher never samples: {seen:?}");
    for dev in [0, 1] {
        let (s, _) = pc_state(&d, id, launcher.process_id, dev);
        assert_eq!(s, format!("not sampled (no CUDA work seen on GPU {dev} yet)"));
    }
    let w1s = &seen["w1"];
    assert_eq!(w1s.starts.iter().map(|s| s.0).collect::<Vec<_>>(), [1], "w1 alone on GPU 1 keeps it: {w1s:?}");
    assert!(w1s.stops.is_empty());
    assert!(seen["w0"].starts.iter().all(|s| s.0 == 0), "w0 works on GPU 0 only");
    let (n0, ns) = (seen["w0"].starts.len(), seen["shared"].starts.len());
    assert!(n0 >= 4 && ns >= 4, "300 ms turns over 4 s: w0 {n0} turns, shared {ns}");
    let order: Vec<&str> = {
        let mut v: Vec<(Instant, &str)> =
            ["w0", "shared"].iter().flat_map(|n| seen[*n].starts.iter().map(move |s| (s.1, *n))).collect();
        v.sort();
        v.into_iter().map(|x| x.1).collect()
    };
    assert!(
        n0.abs_diff(ns) <= 2,
        "equal work, turns about equal (the checks above hold the answers up a while): {n0} vs {ns}: {order:?}"
    );
    // Hand-over: the next turn begins soon after the last holder said it stopped.
    let mut starts: Vec<(Instant, &str)> =
        ["w0", "shared"].iter().flat_map(|n| seen[*n].starts.iter().map(move |s| (s.1, *n))).collect();
    starts.sort();
    let stops: Vec<Instant> = ["w0", "shared"].iter().flat_map(|n| seen[*n].stops.iter().map(|s| s.1)).collect();
    let mut worst = Duration::ZERO;
    for (t, _) in starts.iter().skip(1) {
        let before = stops.iter().filter(|s| *s <= t).max().copied().unwrap();
        worst = worst.max(t.duration_since(before));
    }
    assert!(worst < Duration::from_millis(250), "longest hand-over {worst:?}");

    // The holder of GPU 0 exits: the other gets the GPU at once.
    let (holder, holder_name, other, other_name) =
        if seen["w0"].holding.contains(&0) { (&w0, "w0", &shared, "shared") } else { (&shared, "shared", &w0, "w0") };
    let before = seen[other_name].starts.len();
    let t = Instant::now();
    holder.goodbye()?;
    seen.get_mut(holder_name).unwrap().holding.clear();
    let rest = [(other_name, other)];
    while seen[other_name].starts.len() == before {
        assert!(t.elapsed() < Duration::from_secs(2), "{other_name} never got GPU 0 after the holder left");
        serve(&rest, &mut seen, id, Duration::from_millis(20));
    }
    let took = t.elapsed();
    assert!(took < Duration::from_millis(400), "hand-over after an exit took {took:?}");
    assert_eq!(d.terminate()?, 0);
    Ok(())
}
