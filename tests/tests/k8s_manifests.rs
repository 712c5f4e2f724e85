//! deploy/k8s/ says what deploy/k8s/README.md says: the DaemonSet shares the host's pid
//! namespace, mounts the socket directory from the host, probes with `gpuprofctl status`, has
//! resource limits and no capabilities; its config puts the agent socket in the directory that
//! workloads mount and is a valid gpuprofd config; RBAC grants only what the kubelet's pod list
//! needs; the workload recipe mounts the library and the socket directory and points
//! CUDA_INJECTION64_PATH at the library.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

use serde_yaml::Value;

fn k8s_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s")
}

/// Every document of a manifest file.
fn docs(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(k8s_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text).map(|d| serde::Deserialize::deserialize(d).unwrap()).collect()
}

fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

fn seq(v: &Value) -> &Vec<Value> {
    v.as_sequence().unwrap_or_else(|| panic!("not a list: {v:?}"))
}

/// The hostPath of the volume mounted at `mount` in `container`.
fn host_path_at<'a>(pod: &'a Value, container: &Value, mount: &str) -> &'a str {
    let m = seq(&container["volumeMounts"]).iter().find(|m| m["mountPath"] == mount).unwrap();
    let v = seq(&pod["volumes"]).iter().find(|v| v["name"] == m["name"]).unwrap();
    s(&v["hostPath"]["path"])
}

#[test]
fn daemonset() {
    let d = docs("gpuprofd.yaml");
    let ds = kind(&d, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "peer credentials and /proc need the host's pid namespace");
    assert_eq!(s(&ds["metadata"]["namespace"]), s(&kind(&d, "Namespace")["metadata"]["name"]));
    let c = &seq(&pod["containers"])[0];
    assert_eq!(seq(&pod["containers"]).len(), 1);

    // Sockets and database on the host.
    assert_eq!(host_path_at(pod, c, "/run/gpuprof"), "/run/gpuprof");
    assert_eq!(host_path_at(pod, c, "/var/lib/gpuprof"), "/var/lib/gpuprof");

    // Probes: `gpuprofctl status` on the api socket the config names.
    let cfg_text = s(&kind(&d, "ConfigMap")["data"]["gpuprofd.toml"]);
    let cfg: toml::Table = toml::from_str(cfg_text).unwrap();
    let api = cfg["api_socket"].as_str().unwrap();
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        let cmd: Vec<&str> = seq(&c[probe]["exec"]["command"]).iter().map(s).collect();
        assert_eq!(cmd, ["gpuprofctl", "--socket", api, "status"], "{probe}");
        assert!(c[probe]["timeoutSeconds"].as_u64().unwrap() >= 5, "{probe}");
    }

    // Limits and requests.
    for what in ["requests", "limits"] {
        for r in ["cpu", "memory"] {
            assert!(c["resources"][what][r].is_string(), "resources.{what}.{r}");
        }
    }
    // No capabilities, no escalation; GPUs through the runtime, not the device plugin.
    let sc = &c["securityContext"];
    assert_eq!(seq(&sc["capabilities"]["drop"]), &vec![Value::from("ALL")]);
    assert!(sc["capabilities"]["add"].is_null(), "capabilities are added only where the driver needs them");
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert!(c["resources"]["limits"]["nvidia.com/gpu"].is_null(), "must not take GPUs from the workloads");
    assert!(seq(&c["env"]).iter().any(|e| e["name"] == "NVIDIA_VISIBLE_DEVICES" && e["value"] == "all"));
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 30, "gpuprofd drains within 30 s");

    // The agent socket in the directory the DaemonSet shares, below the host socket directory.
    let agent = cfg["agent_socket"].as_str().unwrap();
    assert!(agent.starts_with("/run/gpuprof/agent/"), "{agent}");
    assert!(!api.starts_with("/run/gpuprof/agent/"), "workloads must not see the api socket");

    // The injector lands where the workload recipe mounts it from.
    let init = &seq(&pod["initContainers"])[0];
    assert_eq!(host_path_at(pod, init, "/host-lib"), "/opt/gpuprof/lib");
    let script = seq(&init["command"]).iter().map(s).collect::<Vec<_>>().join(" ");
    assert!(script.contains("/usr/lib/gpuprof/libgpuprof_inject.so") && script.contains("mv "), "{script}");
}

/// The ConfigMap's gpuprofd.toml passes the daemon's own check.
#[test]
fn daemonset_config_passes_check_config() {
    let d = docs("gpuprofd.yaml");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpuprofd.toml");
    std::fs::write(&file, s(&kind(&d, "ConfigMap")["data"]["gpuprofd.toml"])).unwrap();
    let out = Command::new(gpuprof_testkit::bin_path("gpuprofd")).arg("check-config").arg(&file).output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn rbac_only_reads_the_kubelet_pod_list() {
    let d = docs("rbac.yaml");
    let role = kind(&d, "ClusterRole");
    let rules = seq(&role["rules"]);
    assert_eq!(rules.len(), 1);
    assert_eq!(seq(&rules[0]["resources"]), &vec![Value::from("nodes/proxy")]);
    assert_eq!(seq(&rules[0]["verbs"]), &vec![Value::from("get")]);
    let b = kind(&d, "ClusterRoleBinding");
    assert_eq!(b["roleRef"]["name"], role["metadata"]["name"]);
    let ds = kind(&docs("gpuprofd.yaml"), "DaemonSet").clone();
    let sa = &seq(&b["subjects"])[0];
    assert_eq!(sa["name"], ds["spec"]["template"]["spec"]["serviceAccountName"]);
    assert_eq!(sa["namespace"], ds["metadata"]["namespace"]);
}

#[test]
fn workload_recipe() {
    let d = docs("workload-example.yaml");
    let pod = &kind(&d, "Pod")["spec"];
    let c = &seq(&pod["containers"])[0];
    let env = |name: &str| s(&seq(&c["env"]).iter().find(|e| e["name"] == name).unwrap()["value"]).to_string();
    let lib = env("CUDA_INJECTION64_PATH");
    let (lib_dir, file) = lib.rsplit_once('/').unwrap();
    assert_eq!(file, "libgpuprof_inject.so");
    assert_eq!(host_path_at(pod, c, lib_dir), "/opt/gpuprof/lib");
    let sock = env("GPUPROF_AGENT_SOCKET");
    let (sock_dir, _) = sock.rsplit_once('/').unwrap();
    // The same path the daemon's config gives the agent socket, through the same host directory.
    let ds_docs = docs("gpuprofd.yaml");
    let cfg: toml::Table = toml::from_str(s(&kind(&ds_docs, "ConfigMap")["data"]["gpuprofd.toml"])).unwrap();
    assert_eq!(sock, cfg["agent_socket"].as_str().unwrap());
    assert_eq!(host_path_at(pod, c, sock_dir), sock_dir);
    let lib_mount = seq(&c["volumeMounts"]).iter().find(|m| m["mountPath"] == lib_dir).unwrap();
    assert_eq!(lib_mount["readOnly"], true);
    // No webhook, no privileges.
    assert!(c["securityContext"].is_null() || c["securityContext"]["privileged"] != true);
}
