//! ListDevices and ListProcesses: the GPUs and the processes gpuprofd knows about.

use gpuprof_proto::api as pb;

use std::path::Path;

use crate::NvmlState;
use crate::access::Caller;
use crate::arbiter::Arbiter;
use crate::error::ApiResult;
use crate::job::Member;
use crate::registry::Registry;
use crate::sampler::Gpus;

/// ListDevices: the GPUs this daemon manages (found by the driver, in PCI order, which is
/// the daemon-wide index that samplers and reservations use), completed with what agents
/// reported about them; then GPUs only agents reported (e.g. in containers without the
/// driver's /proc view), numbered after those.
pub async fn list_devices(
    db_path: &Path,
    nvml: &NvmlState,
    gpus: &Gpus,
    arbiter: &Arbiter,
) -> ApiResult<pb::ListDevicesResponse> {
    let path = db_path.to_path_buf();
    let reported = tokio::task::spawn_blocking(move || -> ApiResult<Vec<(pb::Device, String)>> {
        let c = crate::store::open_reader(&path)?;
        let mut stmt = c.prepare(
            "SELECT uuid, name, compute_major, compute_minor, sm_count, global_memory_bytes, pci_bus_id
             FROM devices ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                pb::Device {
                    index: 0,
                    uuid: r.get(0)?,
                    name: r.get(1)?,
                    compute_major: r.get(2)?,
                    compute_minor: r.get(3)?,
                    sm_count: r.get(4)?,
                    global_memory_bytes: r.get::<_, i64>(5)?.max(0) as u64,
                    pci_bus_id: r.get(6)?,
                    origin: "agents".into(),
                    ..Default::default()
                },
                r.get::<_, String>(6)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    })
    .await??;
    let same = |a: &str, b: &str| !a.is_empty() && a.eq_ignore_ascii_case(b);
    let mut used = vec![false; reported.len()];
    let mut devices = Vec::new();
    let inv = &nvml.inventory;
    for g in &gpus.found {
        let mut dev = pb::Device {
            index: g.index,
            uuid: g.uuid.clone(),
            name: g.model.clone(),
            monitor_state: arbiter.monitor_state(g.index),
            pci_bus_id: g.pci_bus_id.clone(),
            origin: "driver".into(),
            ..Default::default()
        };
        if let Some(n) = nvml.device(g.index).filter(|n| n.uuid == g.uuid) {
            dev.origin = "nvml".into();
            dev.global_memory_bytes = n.memory_total_bytes;
            dev.mig_mode = n.mig_mode.clone();
            dev.power_limit_watts = n.power_limit_watts;
            dev.gpm_supported = n.gpm_supported;
            dev.compute_major = n.compute_major;
            dev.compute_minor = n.compute_minor;
            dev.driver_version = inv.driver_version.clone();
            dev.cuda_version = inv.cuda_version.clone();
        }
        if let Some(i) = reported.iter().position(|(r, bus)| same(&r.uuid, &g.uuid) || same(bus, &g.pci_bus_id)) {
            used[i] = true;
            let r = &reported[i].0;
            if r.compute_major > 0 {
                dev.compute_major = r.compute_major;
                dev.compute_minor = r.compute_minor;
            }
            dev.sm_count = r.sm_count;
            if dev.global_memory_bytes == 0 {
                dev.global_memory_bytes = r.global_memory_bytes;
            }
            if dev.name.is_empty() {
                dev.name = r.name.clone();
            }
        }
        devices.push(dev);
    }
    let mut next = gpus.found.iter().map(|g| g.index + 1).max().unwrap_or(0);
    for (i, (r, _)) in reported.into_iter().enumerate() {
        if used[i] {
            continue;
        }
        devices.push(pb::Device { index: next, monitor_state: "unmanaged".into(), ..r });
        next += 1;
    }
    Ok(pb::ListDevicesResponse { devices })
}

/// ListProcesses: connected agents (and, if asked, past connections). Users other than
/// root and the admin group see their own processes only.
pub async fn list_processes(
    db_path: &Path,
    registry: &Registry,
    caller: &Caller,
    req: pb::ListProcessesRequest,
) -> ApiResult<pb::ListProcessesResponse> {
    let agents = registry.all();
    let members: Vec<Member<'_>> = agents
        .iter()
        .map(|a| Member { pid: a.pid, ancestors: &a.ancestors, job_id: &a.job.job_id, rank: a.job.rank })
        .collect();
    let roles = crate::job::roles(&members);
    let mut processes: Vec<pb::Process> = agents
        .iter()
        .zip(&roles)
        .filter(|(a, _)| caller.may_access(a.uid))
        .map(|(a, (role, job))| pb::Process {
            id: a.id,
            pid: a.pid,
            uid: a.uid,
            exe: a.exe.clone(),
            cmdline: a.cmdline.clone(),
            cgroup: a.cgroup.clone(),
            agent_kind: a.kind.to_string(),
            connected_at_ns: a.connected_at_ns,
            disconnected_at_ns: 0,
            trace_state: a.trace_state(),
            cupti_version: a.cupti_version,
            container_id: a.placement.container_id.clone(),
            container_runtime: a.placement.container_runtime.to_string(),
            pod_uid: a.placement.pod_uid.clone(),
            pod_name: a.placement.pod_name.clone(),
            pod_namespace: a.placement.pod_namespace.clone(),
            job_id: job.to_string(),
            rank: a.job.rank,
            local_rank: a.job.local_rank,
            world_size: a.job.world_size,
            job_launcher: a.job.launcher.clone(),
            role: role.to_string(),
            parent_pid: a.job.parent_pid,
        })
        .collect();
    if req.include_exited {
        let path = db_path.to_path_buf();
        let (admin, uid) = (caller.admin, caller.uid);
        let past = tokio::task::spawn_blocking(move || -> ApiResult<Vec<pb::Process>> {
            let c = crate::store::open_reader(&path)?;
            let mut stmt = c.prepare(
                "SELECT id, pid, uid, exe, cmdline, cgroup, agent_kind, connected_ns, disconnected_ns, cupti_version,
                        container_id, container_runtime, pod_uid, pod_name, pod_namespace,
                        job_id, job_rank, job_local_rank, job_world_size, job_launcher, parent_pid
                 FROM processes WHERE disconnected_ns IS NOT NULL AND (?1 OR uid = ?2)
                 ORDER BY id DESC LIMIT 1000",
            )?;
            let rows = stmt.query_map(rusqlite::params![admin, uid], |r| {
                let cmdline: String = r.get(4)?;
                Ok(pb::Process {
                    id: r.get::<_, i64>(0)? as u64,
                    pid: r.get(1)?,
                    uid: r.get(2)?,
                    exe: r.get(3)?,
                    cmdline: serde_json::from_str(&cmdline).unwrap_or_default(),
                    cgroup: r.get(5)?,
                    agent_kind: r.get(6)?,
                    connected_at_ns: r.get::<_, i64>(7)?.max(0) as u64,
                    disconnected_at_ns: r.get::<_, i64>(8)?.max(0) as u64,
                    trace_state: "exited".into(),
                    cupti_version: r.get(9)?,
                    container_id: r.get(10)?,
                    container_runtime: r.get(11)?,
                    pod_uid: r.get(12)?,
                    pod_name: r.get(13)?,
                    pod_namespace: r.get(14)?,
                    job_id: r.get(15)?,
                    rank: r.get(16)?,
                    local_rank: r.get(17)?,
                    world_size: r.get(18)?,
                    job_launcher: r.get(19)?,
                    role: String::new(),
                    parent_pid: r.get(20)?,
                })
            })?;
            let mut past: Vec<pb::Process> = rows.collect::<rusqlite::Result<_>>()?;
            set_roles(&mut past);
            Ok(past)
        })
        .await??;
        let live: std::collections::HashSet<u64> = processes.iter().map(|p| p.id).collect();
        processes.extend(past.into_iter().filter(|p| !live.contains(&p.id)));
        processes.sort_by_key(|p| p.id);
    }
    Ok(pb::ListProcessesResponse { processes })
}

/// Roles of exited processes, among themselves, from their parent pids.
fn set_roles(procs: &mut [pb::Process]) {
    let parents: Vec<[u32; 1]> = procs.iter().map(|p| [p.parent_pid]).collect();
    let members: Vec<Member<'_>> = procs
        .iter()
        .zip(&parents)
        .map(|(p, parent)| Member { pid: p.pid, ancestors: parent, job_id: &p.job_id, rank: p.rank })
        .collect();
    let roles: Vec<(&'static str, String)> =
        crate::job::roles(&members).into_iter().map(|(r, j)| (r, j.to_string())).collect();
    for (p, (role, job)) in procs.iter_mut().zip(roles) {
        p.role = role.into();
        p.job_id = job;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ListProcesses from the registry and the database alone, no daemon: exited processes
    /// when asked, each user seeing their own, the launcher found among exited ranks.
    #[tokio::test(flavor = "multi_thread")]
    async fn processes_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let cfg = crate::config::Config::from_toml("").unwrap();
        let c = crate::store::open_writer(&db, &cfg.storage).unwrap();
        c.execute_batch(
            "INSERT INTO processes(id, pid, uid, gid, agent_kind, exe, cmdline, cgroup, cupti_version, base_ns,
               connected_ns, disconnected_ns, job_id, job_rank, parent_pid)
             VALUES (1, 100, 1000, 1000, 'injector', 'torchrun', '[\"torchrun\"]', '', 0, 0, 1, 5, '', NULL, 1),
                    (2, 101, 1000, 1000, 'injector', 'python3', '[]', '', 0, 0, 2, 6, 'run-1', 0, 100),
                    (3, 200, 2000, 2000, 'injector', 'other', '[]', '', 0, 0, 3, 7, '', NULL, 1);",
        )
        .unwrap();
        let registry = Registry::default();
        let user = |uid| Caller { uid, gid: uid, pid: None, admin: false, authenticated: true };
        let req = |include_exited| pb::ListProcessesRequest { include_exited };
        let none = list_processes(&db, &registry, &user(1000), req(false)).await.unwrap();
        assert!(none.processes.is_empty(), "nothing connected");
        let mine = list_processes(&db, &registry, &user(1000), req(true)).await.unwrap().processes;
        let ids: Vec<u64> = mine.iter().map(|p| p.id).collect();
        assert_eq!(ids, [1, 2], "uid 1000 sees its own");
        assert!(mine.iter().all(|p| p.trace_state == "exited"));
        assert_eq!((mine[0].role.as_str(), mine[0].job_id.as_str()), ("launcher", "run-1"), "{mine:?}");
        let all = list_processes(&db, &registry, &Caller::root(), req(true)).await.unwrap().processes;
        assert_eq!(all.len(), 3);
    }
}
