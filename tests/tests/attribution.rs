//! Container and pod attribution end to end: gpuprofd reads each agent's /proc/PID/cgroup
//! (never the path the agent claims), `gpuprofctl procs` and sessions show the container and
//! pod, sessions target them, the Prometheus process metrics carry them as labels, and pod
//! names come from a kubelet pod list.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

#[path = "../src/expo.rs"]
mod expo;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use gpuprof_testkit::TestDaemon;
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig, spawn_process};
use serde_json::Value;

const POD_UID: &str = "1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c";
const CID_A: &str = "7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a";
const CID_B: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn json(out: &Output) -> Value {
    assert!(out.status.success(), "gpuprofctl failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn start(dir: &Path, extra: &str) -> TestDaemon {
    let cfg = dir.join("gpuprofd.toml");
    std::fs::write(&cfg, format!("[sampler]\nspawn = false\n{extra}")).unwrap();
    TestDaemon::start_with(&dir.join("state"), &["--config", cfg.to_str().unwrap()]).unwrap()
}

fn procs(d: &TestDaemon) -> Vec<Value> {
    json(&d.ctl(&["procs", "--json"])).as_array().unwrap().clone()
}

fn scrape(port: u16) -> String {
    expo::scrape(port).expect("scraping /metrics")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The agent claims a pod path in its Hello; gpuprofd shows the cgroup it read from this test
/// process's /proc entry instead (the in-process agent's pid is this process's).
#[test]
fn the_daemon_reads_the_cgroup_itself() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = start(dir.path(), &format!("[prometheus]\nlisten = \"127.0.0.1:{port}\"\n"));
    let claimed = "/kubepods/burstable/pod1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c/".to_string() + CID_A;
    let a =
        TracedAgent::start(&d.agent_socket, TracedConfig { cgroup: claimed.clone(), ..Default::default() }).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let ps = procs(&d);
    assert_eq!(ps.len(), 1, "{ps:?}");
    let p = &ps[0];
    assert_eq!(p["pid"], std::process::id());
    let cgroup = p["cgroup"].as_str().unwrap();
    assert_ne!(cgroup, claimed, "the claimed path must not be trusted");
    assert!(own.lines().any(|l| l.splitn(3, ':').nth(2) == Some(cgroup)), "{cgroup:?} is not a line of {own:?}");
    assert_ne!(p["pod_uid"], POD_UID, "{p}");
    assert_ne!(p["container_id"], CID_A, "{p}");
    // The process row keeps it too (the database is the session's record of it).
    let c = rusqlite::Connection::open(d.db_path()).unwrap();
    let row: String =
        c.query_row("SELECT cgroup FROM processes WHERE id = ?1", [a.process_id as i64], |r| r.get(0)).unwrap();
    assert_eq!(row, cgroup);
    let text = scrape(port);
    let series = format!("gpuprof_process_tracing{{process_id=\"{}\",pid=\"{}\",", a.process_id, std::process::id());
    assert!(text.contains(&series), "{text}");
    a.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
}

/// cgroups made here (and removed at the end) with Kubernetes' names.
struct Cgroups(Vec<PathBuf>);

impl Cgroups {
    /// `rel` under the v1 `pids` hierarchy, or under the unified one when that is all there is.
    fn make(&mut self, rel: &str) -> PathBuf {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let root = if v1.join("cgroup.procs").exists() { v1 } else { Path::new("/sys/fs/cgroup") };
        let dir = root.join(rel);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        let mut p = dir.clone();
        while p != root {
            if !self.0.contains(&p) {
                self.0.push(p.clone());
            }
            p.pop();
        }
        dir
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.0.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for p in &self.0 {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// A kubelet stand-in serving a pod list on 127.0.0.1; returns its URL.
fn fake_kubelet(body: String) -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/pods", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { break };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// Two agent processes in cgroups named the way the kubelet names them (cgroupfs driver, a
/// containerd container in a burstable pod; systemd driver, a CRI-O container in another pod),
/// a kubelet pod list naming the first pod: `procs`, `session start --pod/--container`, the
/// session's processes and the Prometheus labels.
#[test]
#[ignore = "needs root and a writable cgroup file system (it creates cgroups); .ci/run runs it as root: \
            cargo test -p gpuprof-testkit --test attribution -- --ignored"]
fn pods_and_containers_of_real_cgroups() {
    let mut cg = Cgroups(Vec::new());
    let a_dir = cg.make(&format!("kubepods/burstable/pod{POD_UID}/{CID_A}"));
    let other_uid = "9b8a7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    let b_dir = cg.make(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/crio-{CID_B}.scope",
        other_uid.replace('-', "_")
    ));
    let kubelet = fake_kubelet(format!(
        r#"{{"kind":"PodList","items":[{{"metadata":{{"name":"trainer-0","namespace":"ml","uid":"{POD_UID}"}},
            "status":{{"containerStatuses":[{{"name":"pytorch","containerID":"containerd://{CID_A}"}}]}}}}]}}"#
    ));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let d = start(
        dir.path(),
        &format!("[prometheus]\nlisten = \"127.0.0.1:{port}\"\n[kubernetes]\nkubelet_url = \"{kubelet}\"\n"),
    );
    let cfg = |dir: &Path, seed| TracedConfig {
        cgroup: "/claimed".into(),
        join_cgroup: Some(dir.to_path_buf()),
        rate: 2000.0,
        seed,
        ..Default::default()
    };
    let a = spawn_process(&d.agent_socket, &cfg(&a_dir, 1), None).unwrap();
    let b = spawn_process(&d.agent_socket, &cfg(&b_dir, 2), None).unwrap();

    let ps = procs(&d);
    let find = |id: u64| ps.iter().find(|p| p["id"] == id).unwrap().clone();
    let (pa, pb) = (find(a.process_id), find(b.process_id));
    assert_eq!(
        (&pa["pod_uid"], &pa["pod_name"], &pa["pod_namespace"], &pa["container_id"]),
        (&POD_UID.into(), &"trainer-0".into(), &"ml".into(), &CID_A.into()),
        "{pa}"
    );
    assert!(pa["cgroup"].as_str().unwrap().ends_with(&format!("pod{POD_UID}/{CID_A}")), "{pa}");
    assert_eq!(
        (&pb["pod_uid"], &pb["container_id"], &pb["container_runtime"]),
        (&other_uid.into(), &CID_B.into(), &"cri-o".into())
    );
    assert_eq!(pb["pod_name"], "", "not in the kubelet's list");
    let table = String::from_utf8(d.ctl(&["procs"]).stdout).unwrap();
    assert!(table.contains("ml/trainer-0") && table.contains(&CID_A[..12]) && table.contains(other_uid), "{table}");

    // A session on the first pod traces only the first agent; one on the second container's
    // short id, written as Kubernetes shows it, only the second.
    let s1 = json(&d.ctl(&["session", "start", "--pod", &POD_UID.replace('-', "_"), "--json"]));
    assert_eq!(a.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s1["id"].as_u64().unwrap()));
    let s2 = json(&d.ctl(&["session", "start", "--container", &format!("cri-o://{}", &CID_B[..12]), "--json"]));
    assert_eq!(b.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(s2["id"].as_u64().unwrap()));
    for (s, p) in [(&s1, &pa), (&s2, &pb)] {
        let id = s["id"].as_u64().unwrap().to_string();
        let shown = json(&d.ctl(&["session", "show", &id, "--json"]));
        let members = shown["processes"].as_array().unwrap();
        assert_eq!(members.len(), 1, "{shown}");
        assert_eq!(members[0]["process_id"], p["id"]);
        assert_eq!((&members[0]["pod_uid"], &members[0]["container_id"]), (&p["pod_uid"], &p["container_id"]));
    }
    let text = scrape(port);
    let labels = format!(
        "container_id=\"{CID_A}\",pod_uid=\"{POD_UID}\",pod=\"trainer-0\",namespace=\"ml\",container=\"pytorch\",job_id=\"\",rank=\"\"}} 1"
    );
    assert!(text.contains(&labels), "{text}");
    assert!(text.contains(&format!(
        "container_id=\"{CID_B}\",pod_uid=\"{other_uid}\",pod=\"\",namespace=\"\",container=\"\",job_id=\"\",rank=\"\"}} 1"
    )));
    for s in [&s1, &s2] {
        json(&d.ctl(&["session", "stop", &s["id"].as_u64().unwrap().to_string(), "--json"]));
    }
    a.finish().unwrap();
    b.finish().unwrap();
    assert_eq!(d.terminate().unwrap(), 0);
    drop(cg);
}
