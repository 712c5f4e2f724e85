//! Container and pod attribution from a process's cgroup.
//!
//! The daemon reads `/proc/PID/cgroup` itself for every agent (the pid comes from
//! `SO_PEERCRED`), so attribution does not rest on what the process claims, and it sees the
//! host's path even when the process sits in its own cgroup namespace (where its own file says
//! `0::/`). The path is then taken apart into a container id and a Kubernetes pod UID. The
//! formats handled, each with a sample in the tests:
//!
//! - cgroupfs driver: `/kubepods/burstable/pod<uid>/<container id>` (containerd, Docker),
//!   `.../pod<uid>/crio-<id>` (CRI-O), `/docker/<id>` (plain Docker);
//! - systemd driver: `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with
//!   underscores>.slice/cri-containerd-<id>.scope` (or `crio-<id>.scope`, `docker-<id>.scope`),
//!   `/system.slice/docker-<id>.scope`, `/machine.slice/libpod-<id>.scope` (Podman), kind's
//!   `/kubelet.slice/kubelet-kubepods.slice/...`;
//! - cgroup v2 (the `0::` line) is preferred; on v1 the first hierarchy whose path names a pod or
//!   a container, else the first one below the root (`name=systemd` included);
//! - read from inside another cgroup namespace (gpuprofd in a pod on cgroup v2), paths that
//!   start with `/../..`: the segments that name the pod and container are still there.
//!
//! Pod UIDs are returned in the API's form (lower case, with dashes); static pods' UIDs are 32
//! hex digits without dashes and stay so. Container ids are the runtime's full 64 hex digits.

/// What a cgroup path says about the process's container and pod.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The cgroup path, as the daemon sees it (host view).
    pub cgroup: String,
    /// Full container id (64 hex digits), or empty.
    pub container_id: String,
    /// The container runtime the path names: "containerd", "cri-o", "docker", "podman", or
    /// empty when the path does not say (cgroupfs Kubernetes paths).
    pub runtime: &'static str,
    /// Kubernetes pod UID (e.g. `1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c`), or empty.
    pub pod_uid: String,
}

impl From<Attribution> for crate::registry::Placement {
    fn from(a: Attribution) -> Self {
        crate::registry::Placement {
            container_id: a.container_id,
            container_runtime: a.runtime,
            pod_uid: a.pod_uid,
            ..Default::default()
        }
    }
}

/// Reads and parses `/proc/PID/cgroup`; `None` if the file cannot be read (the process is gone
/// or lives in a pid namespace the daemon does not see).
pub fn of_pid(pid: u32) -> Option<Attribution> {
    if pid == 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    Some(parse_path(&pick_path(&text)))
}

/// The path to attribute from the contents of a `/proc/PID/cgroup` file: the unified (v2)
/// hierarchy's when it is not the root, else the first v1 hierarchy that names a pod or
/// container, else the first one below the root, else the root.
pub fn pick_path(text: &str) -> String {
    let mut paths = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrl.is_empty() && path != "/" {
            return path.to_string();
        }
        paths.push(path);
    }
    paths
        .iter()
        .find(|p| {
            let a = parse_path(p);
            !a.container_id.is_empty() || !a.pod_uid.is_empty()
        })
        .or_else(|| paths.iter().find(|p| !p.is_empty() && **p != "/"))
        .or_else(|| paths.iter().find(|p| !p.is_empty()))
        .map(|p| p.to_string())
        .unwrap_or_default()
}

/// Takes a cgroup path apart. The last segment naming a container wins (a container's own
/// sub-cgroups, e.g. Podman's `/container`, sit below it).
pub fn parse_path(path: &str) -> Attribution {
    let mut a = Attribution { cgroup: path.to_string(), ..Default::default() };
    let mut parent = "";
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if let Some(uid) = pod_uid(seg) {
            a.pod_uid = uid;
        } else if let Some((id, runtime)) = container(seg, parent) {
            a.container_id = id;
            a.runtime = runtime;
        }
        parent = seg;
    }
    a
}

/// `pod<uid>` at the end of a segment (`pod1f0a...`, `kubepods-besteffort-pod1f0a_9d3c....slice`).
fn pod_uid(seg: &str) -> Option<String> {
    let s = seg.strip_suffix(".slice").unwrap_or(seg);
    let at = s.rfind("pod")?;
    let before = &s[..at];
    if !(before.is_empty() || before.ends_with('-')) {
        return None;
    }
    let uid = s[at + 3..].replace('_', "-").to_ascii_lowercase();
    is_uid(&uid).then_some(uid)
}

/// A UUID (8-4-4-4-12 hex digits) or 32 hex digits (static pods' config hash).
fn is_uid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    let hex = |g: &str| g.bytes().all(|b| b.is_ascii_hexdigit());
    match groups.as_slice() {
        [one] => one.len() == 32 && hex(one),
        [a, b, c, d, e] => {
            [a.len(), b.len(), c.len(), d.len(), e.len()] == [8, 4, 4, 4, 12] && groups.iter().all(|g| hex(g))
        }
        _ => false,
    }
}

/// A container segment: `<id>`, `cri-containerd-<id>.scope`, `crio-<id>[.scope]`,
/// `docker-<id>.scope`, `libpod-<id>.scope`; conmon scopes (CRI-O's and Podman's monitor
/// processes) are not containers.
fn container(seg: &str, parent: &str) -> Option<(String, &'static str)> {
    let s = seg.strip_suffix(".scope").unwrap_or(seg);
    let (id, runtime) = if let Some(id) = s.strip_prefix("cri-containerd-") {
        (id, "containerd")
    } else if let Some(id) = s.strip_prefix("crio-") {
        (id, "cri-o")
    } else if let Some(id) = s.strip_prefix("docker-") {
        (id, "docker")
    } else if let Some(id) = s.strip_prefix("libpod-") {
        (id, "podman")
    } else if parent == "docker" {
        (s, "docker")
    } else {
        (s, "")
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| (id.to_ascii_lowercase(), runtime))
}

/// A container id as a user may write it: full or a prefix of at least 12 hex digits, with or
/// without the runtime scheme Kubernetes shows (`containerd://...`, `cri-o://...`,
/// `docker://...`). Returns it in lower case without the scheme.
pub fn normalize_container_id(s: &str) -> Option<String> {
    let id = s.rsplit_once("://").map_or(s, |(_, id)| id).to_ascii_lowercase();
    (id.len() >= 12 && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// A pod UID as a user may write it (either case, dashes or the systemd driver's underscores).
pub fn normalize_pod_uid(s: &str) -> Option<String> {
    let uid = s.trim().replace('_', "-").to_ascii_lowercase();
    is_uid(&uid).then_some(uid)
}

/// The parent chain of `pid` from `/proc` (nearest first, pid 1 and 0 left out; at most 64),
/// empty when the process is not visible there.
pub fn ancestors(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut p = pid;
    while out.len() < 64 {
        let Some(parent) = std::fs::read_to_string(format!("/proc/{p}/stat")).ok().and_then(|s| parent_of(&s)) else {
            break;
        };
        if parent <= 1 || out.contains(&parent) {
            break;
        }
        out.push(parent);
        p = parent;
    }
    out
}

/// The parent pid in a `/proc/PID/stat` line (`pid (comm) state ppid ...`; comm may hold
/// spaces and parentheses).
fn parent_of(stat: &str) -> Option<u32> {
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_chains_come_from_proc() {
        assert_eq!(parent_of("4242 (python3 (rank 0)) S 4100 4242 4100 0 -1"), Some(4100));
        assert_eq!(parent_of("garbage"), None);
        // This test's own chain: its parent first, no pid 1, no loop.
        let me = std::process::id();
        let chain = ancestors(me);
        let stat = std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        let parent = parent_of(&stat).unwrap();
        if parent > 1 {
            assert_eq!(chain.first(), Some(&parent));
        }
        assert!(!chain.contains(&1) && !chain.contains(&me), "{chain:?}");
        assert!(ancestors(u32::MAX).is_empty());
    }

    const CID: &str = "7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a";
    const UID: &str = "1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c";

    fn check(path: &str, pod: &str, cid: &str, runtime: &str) {
        let a = parse_path(path);
        assert_eq!((a.pod_uid.as_str(), a.container_id.as_str(), a.runtime), (pod, cid, runtime), "{path}");
        assert_eq!(a.cgroup, path);
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        // containerd or Docker via cri-dockerd, cgroup v1 or v2, the three QoS classes.
        check(&format!("/kubepods/burstable/pod{UID}/{CID}"), UID, CID, "");
        check(&format!("/kubepods/besteffort/pod{UID}/{CID}"), UID, CID, "");
        check(&format!("/kubepods/pod{UID}/{CID}"), UID, CID, "");
        // CRI-O with cgroupfs.
        check(&format!("/kubepods/burstable/pod{UID}/crio-{CID}"), UID, CID, "cri-o");
        // The pod's own cgroup (the pause container's parent): a pod, no container.
        check(&format!("/kubepods/burstable/pod{UID}"), UID, "", "");
    }

    #[test]
    fn kubernetes_systemd_driver() {
        let u = UID.replace('-', "_");
        check(
            &format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CID}.scope"
            ),
            UID,
            CID,
            "containerd",
        );
        check(
            &format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{CID}.scope"),
            UID,
            CID,
            "cri-o",
        );
        check(&format!("/kubepods.slice/kubepods-pod{u}.slice/docker-{CID}.scope"), UID, CID, "docker");
        // kind nodes (kubelet under its own slice), a process in a sub-cgroup of the container.
        check(
            &format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope/init"
            ),
            UID,
            CID,
            "containerd",
        );
        // Read from inside another cgroup namespace (gpuprofd in a pod of its own on cgroup v2):
        // the path climbs out of the reader's namespace root first.
        check(&format!("/../../kubepods-besteffort-pod{u}.slice/cri-containerd-{CID}.scope"), UID, CID, "containerd");
        // CRI-O's conmon is not the container.
        check(&format!("/kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{CID}.scope"), UID, "", "");
    }

    #[test]
    fn static_pod_uid_without_dashes() {
        let hash = "6f8e6f7d3b1c4e2a9d0b5c7e8f1a2b3c";
        check(&format!("/kubepods/burstable/pod{hash}/{CID}"), hash, CID, "");
    }

    #[test]
    fn docker_and_podman() {
        check(&format!("/docker/{CID}"), "", CID, "docker");
        check(&format!("/system.slice/docker-{CID}.scope"), "", CID, "docker");
        check(&format!("/machine.slice/libpod-{CID}.scope/container"), "", CID, "podman");
        check(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container"),
            "",
            CID,
            "podman",
        );
    }

    #[test]
    fn plain_hosts_and_lookalikes() {
        check("/user.slice/user-1000.slice/session-3.scope", "", "", "");
        check("/system.slice/gpuprofd.service", "", "", "");
        check("/", "", "", "");
        check("", "", "", "");
        // "pod" inside a word, a short hex name, a uid with a wrong group length.
        check("/system.slice/ipod1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c.service", "", "", "");
        check("/kubepods/podabc/deadbeef", "", "", "");
        check("/kubepods/pod1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4/x", "", "", "");
    }

    #[test]
    fn picks_the_hierarchy_that_says_most() {
        let v2 = format!("0::/kubepods/burstable/pod{UID}/{CID}\n");
        assert_eq!(pick_path(&v2), format!("/kubepods/burstable/pod{UID}/{CID}"));
        // cgroup v1 (a real file's order: numbered controllers, name=systemd, an empty unified line).
        let v1 = format!(
            "12:hugetlb:/\n11:cpuset:/kubepods/burstable/pod{UID}/{CID}\n10:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/\n"
        );
        assert_eq!(pick_path(&v1), format!("/kubepods/burstable/pod{UID}/{CID}"));
        // A plain host on v1: the first hierarchy below the root.
        assert_eq!(pick_path("3:cpu,cpuacct:/user.slice\n1:name=systemd:/user.slice/session-1.scope\n"), "/user.slice");
        assert_eq!(
            pick_path("9:name=systemd:/\n4:memory:/process_api/910e475e\n1:cpu:/\n0::/\n"),
            "/process_api/910e475e"
        );
        // Inside a cgroup namespace the file says only "/".
        assert_eq!(pick_path("0::/\n"), "/");
        assert_eq!(pick_path(""), "");
    }

    #[test]
    fn user_input() {
        assert_eq!(normalize_container_id(&format!("containerd://{CID}")).as_deref(), Some(CID));
        assert_eq!(normalize_container_id(&CID[..12].to_uppercase()).as_deref(), Some(&CID[..12]));
        assert_eq!(normalize_container_id(&CID[..11]), None, "too short to be unique");
        assert_eq!(normalize_container_id("not-a-container"), None);
        assert_eq!(normalize_pod_uid(&UID.replace('-', "_").to_uppercase()).as_deref(), Some(UID));
        assert_eq!(normalize_pod_uid("web-0"), None, "a pod name is not a UID");
    }

    /// This test process's own cgroup, read the way the daemon reads an agent's: whatever the
    /// machine (a plain host, a container, a pod), the path is the one in the file and the
    /// attribution agrees with parsing that path.
    #[test]
    fn live_own_cgroup() {
        let text = std::fs::read_to_string("/proc/self/cgroup").expect("Linux with /proc mounted");
        let a = of_pid(std::process::id()).expect("own cgroup readable");
        assert_eq!(a.cgroup, pick_path(&text));
        assert!(!a.cgroup.is_empty(), "every process is in some cgroup: {text:?}");
        assert_eq!(a, parse_path(&a.cgroup));
        assert_eq!(of_pid(0), None);
        assert_eq!(of_pid(u32::MAX), None, "no such process");
    }
}
