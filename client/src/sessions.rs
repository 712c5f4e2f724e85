//! `gpuprofctl devices`, `procs` and `session start|stop|list|show` (`trace` is in `trace.rs`).

use std::time::Duration;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use gpuprofctl::{Client, pb};

use crate::output::{
    Usage, human_bytes, human_ns, now_ns, rank_text, session_json, shorten, state_name, table, target_text, wall,
};

/// Which processes a session covers (at least one).
#[derive(Args, Debug, Clone, Default)]
pub struct TargetArgs {
    /// A process and its descendants (repeatable), e.g. a torchrun launcher and its ranks.
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Executable base name, exact (repeatable), e.g. python3.
    #[arg(long = "exe", value_name = "NAME")]
    pub exes: Vec<String>,
    /// Glob over the executable path or command line (repeatable), e.g. '*train*.py'.
    #[arg(long = "pattern", value_name = "GLOB")]
    pub patterns: Vec<String>,
    /// Substring of the cgroup path as gpuprofd reads it from /proc/PID/cgroup (repeatable).
    #[arg(long = "cgroup", value_name = "PATH")]
    pub cgroups: Vec<String>,
    /// Every process of a Kubernetes pod, by UID (repeatable), e.g. from
    /// `kubectl get pod NAME -o jsonpath='{.metadata.uid}'`.
    #[arg(long = "pod", value_name = "UID")]
    pub pods: Vec<String>,
    /// Every process of a container (repeatable): its id or a prefix of at least 12 hex digits,
    /// with or without a scheme like containerd://.
    #[arg(long = "container", value_name = "ID")]
    pub containers: Vec<String>,
    /// Every GPU process (yours only, unless you are root or in the admin group).
    #[arg(long)]
    pub all: bool,
    /// The processes of a distributed job, by TORCHELASTIC_RUN_ID or SLURM_JOB_ID (the JOB
    /// column of `gpuprofctl procs`); ranks that start later join.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// Only these global ranks of --job (comma-separated or repeated), e.g. 0,3.
    #[arg(long = "rank", value_name = "N,M", value_delimiter = ',', requires = "job")]
    pub ranks: Vec<u32>,
}

impl TargetArgs {
    pub fn to_pb(&self) -> Result<Vec<pb::Target>> {
        use pb::target::Target as T;
        let mut v: Vec<pb::Target> = Vec::new();
        v.extend(self.pids.iter().map(|p| T::Pid(*p)).map(|t| pb::Target { target: Some(t) }));
        v.extend(self.exes.iter().map(|p| pb::Target { target: Some(T::ExeName(p.clone())) }));
        v.extend(self.patterns.iter().map(|p| pb::Target { target: Some(T::ExePattern(p.clone())) }));
        v.extend(self.cgroups.iter().map(|p| pb::Target { target: Some(T::Cgroup(p.clone())) }));
        v.extend(self.pods.iter().map(|p| pb::Target { target: Some(T::PodUid(p.clone())) }));
        v.extend(self.containers.iter().map(|p| pb::Target { target: Some(T::ContainerId(p.clone())) }));
        if self.all {
            v.push(pb::Target { target: Some(T::All(true)) });
        }
        if let Some(job_id) = &self.job {
            v.push(pb::Target {
                target: Some(T::Job(pb::JobTarget { job_id: job_id.clone(), ranks: self.ranks.clone() })),
            });
        }
        if v.is_empty() {
            bail!(Usage(
                "say which processes to trace: --pid, --exe, --pattern, --cgroup, --pod, --container, --job or --all"
                    .into()
            ));
        }
        Ok(v)
    }
}

/// What and how long to collect.
#[derive(Args, Debug, Clone)]
pub struct CollectArgs {
    /// What to collect: kernels, default (kernels, copies, sets, launch/copy/sync/alloc API calls, NVTX, graphs),
    /// full (also sync and external-correlation records, overhead, driver API) or pc (only PC samples; with
    /// --pc-sampling).
    #[arg(long, default_value = "default")]
    pub preset: String,
    /// Stop after this long (e.g. 10s, 2m, 1h30m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    pub max_records: Option<u64>,
    /// Start at this time instead of now: RFC 3339 UTC ("2026-05-01T12:00:00Z") or a delay ("+30s").
    #[arg(long, value_name = "TIME")]
    pub start_at: Option<String>,
    /// A label for the session.
    #[arg(long, default_value = "")]
    pub name: String,
    /// Also sample the PCs of the traced processes' kernels (needs each GPU's performance
    /// monitor: a pause or an outside profiler holds it back). Processes sharing a GPU take
    /// turns; by default each samples in short windows kept under a cost budget.
    #[arg(long)]
    pub pc_sampling: bool,
    /// "windows" (short windows under --pc-budget; gpuprofd's default) or "continuous"
    /// (sampled all the time the process holds its GPU's turn; costlier, for a focused look).
    #[arg(long, value_name = "MODE", requires = "pc_sampling")]
    pub pc_mode: Option<String>,
    /// Windows: the most PC sampling may cost each process, in % of its time (default: gpuprofd's
    /// [pc] cost_budget_pct, 0.5).
    #[arg(long, value_name = "PCT", requires = "pc_sampling")]
    pub pc_budget: Option<f64>,
    /// PC sampling period, a power of two of SM cycles (5..31; default 15).
    #[arg(long, value_name = "LOG2", requires = "pc_sampling")]
    pub pc_period: Option<u32>,
    /// Only these stall reasons (comma-separated CUPTI names, with or without the
    /// smsp__pcsamp_warps_issue_ prefix), e.g. stalled_long_scoreboard,stalled_barrier.
    #[arg(long, value_name = "R,R", value_delimiter = ',', requires = "pc_sampling")]
    pub pc_stall: Vec<String>,
    /// How often processes send their PC samples, in ms (100..60000; default 1000).
    #[arg(long, value_name = "N", requires = "pc_sampling")]
    pub pc_flush_ms: Option<u32>,
    /// Also run CUPTI PM sampling on every GPU while the session is active, at this rate
    /// (e.g. "1khz", at most 10 kHz; stored with the device metrics, source cupti_pm). Needs
    /// operator rights: it takes the GPUs' performance monitors.
    #[arg(long, value_name = "RATE", value_parser = crate::profile::parse_rate)]
    pub pm_rate: Option<u32>,
}

impl CollectArgs {
    pub fn request(&self, targets: Vec<pb::Target>) -> Result<pb::StartSessionRequest> {
        let start_at_ns = match &self.start_at {
            None => 0,
            Some(s) => parse_start(s)?,
        };
        Ok(pb::StartSessionRequest {
            name: self.name.clone(),
            targets,
            collect: Some(pb::CollectOptions {
                preset: self.preset.clone(),
                pc_sampling: self.pc_sampling,
                pc_sampling_period_log2: self.pc_period.unwrap_or(0),
                pc_stall_reasons: self.pc_stall.clone(),
                pc_flush_interval_ms: self.pc_flush_ms.unwrap_or(0),
                pm_sampling_rate_hz: self.pm_rate.unwrap_or(0),
                pc_mode: self.pc_mode.clone().unwrap_or_default(),
                pc_cost_budget_pct: self.pc_budget.unwrap_or(0.0),
                ..Default::default()
            }),
            start_at_ns,
            duration_ms: self.duration.map(|d| d.as_millis() as u64).unwrap_or(0),
            max_records: self.max_records.unwrap_or(0),
        })
    }
}

fn parse_start(s: &str) -> Result<u64> {
    if let Some(delay) = s.strip_prefix('+') {
        let d = humantime::parse_duration(delay).map_err(|e| Usage(format!("--start-at {s}: {e}")))?;
        return Ok(now_ns() + d.as_nanos() as u64);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| Usage(format!("--start-at {s}: {e} (use RFC 3339 like 2026-05-01T12:00:00Z, or +30s)")))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0))
}

#[derive(Subcommand, Debug)]
pub enum SessionCmd {
    /// Start a session; prints its id.
    #[command(after_help = "--json: one JSON object, the session.")]
    Start {
        #[command(flatten)]
        targets: Box<TargetArgs>,
        #[command(flatten)]
        collect: CollectArgs,
    },
    /// Stop a session and wait until its processes have flushed.
    #[command(after_help = "--json: one JSON object, the session as it ended.")]
    Stop { session: u64 },
    /// List sessions, newest first.
    #[command(after_help = "--json: one JSON array, an object per session.")]
    List {
        /// Only sessions in this state (repeatable): pending, active, stopping, completed, failed, interrupted.
        #[arg(long = "state")]
        states: Vec<String>,
        /// Only sessions whose name contains this.
        #[arg(long)]
        name: Option<String>,
        /// At most this many sessions.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// One session with its processes.
    #[command(after_help = "--json: one JSON object, the session.")]
    Show { session: u64 },
}

#[derive(Args, Debug)]
pub struct ProcsArgs {
    /// Also list processes that have disconnected.
    #[arg(long)]
    pub all: bool,
}

pub async fn devices(c: &mut Client, json: bool) -> Result<()> {
    let r = c.list_devices(pb::ListDevicesRequest {}).await?.into_inner();
    if json {
        let v: Vec<_> = r
            .devices
            .iter()
            .map(|d| {
                serde_json::json!({
                    "index": d.index, "uuid": d.uuid, "name": d.name,
                    "compute_capability": format!("{}.{}", d.compute_major, d.compute_minor),
                    "sm_count": d.sm_count, "global_memory_bytes": d.global_memory_bytes,
                    "monitor_state": d.monitor_state, "pci_bus_id": d.pci_bus_id, "mig_mode": d.mig_mode,
                    "power_limit_watts": d.power_limit_watts, "gpm_supported": d.gpm_supported,
                    "driver_version": d.driver_version, "cuda_version": d.cuda_version, "origin": d.origin,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    if r.devices.is_empty() {
        let note = c.get_status(pb::GetStatusRequest {}).await.map(|s| s.into_inner().gpu_note).unwrap_or_default();
        if note.is_empty() {
            println!("no GPUs reported yet (they appear once a sampler or an injected process connects)");
        } else {
            println!("no GPUs: {note}");
        }
        return Ok(());
    }
    if let Some(d) = r.devices.iter().find(|d| !d.driver_version.is_empty()) {
        println!("driver {}, CUDA {}", d.driver_version, d.cuda_version);
    }
    let rows: Vec<Vec<String>> = r
        .devices
        .iter()
        .map(|d| {
            vec![
                d.index.to_string(),
                d.name.clone(),
                format!("{}.{}", d.compute_major, d.compute_minor),
                d.sm_count.to_string(),
                human_bytes(d.global_memory_bytes),
                d.uuid.clone(),
                if d.pci_bus_id.is_empty() { "-".into() } else { d.pci_bus_id.clone() },
                if d.mig_mode.is_empty() { "-".into() } else { d.mig_mode.clone() },
                if d.power_limit_watts > 0.0 { format!("{:.0} W", d.power_limit_watts) } else { "-".into() },
                if d.gpm_supported { "yes".into() } else { "no".into() },
                if d.monitor_state.is_empty() { "-".into() } else { d.monitor_state.clone() },
            ]
        })
        .collect();
    table(
        &[">INDEX", "NAME", ">CC", ">SMS", ">MEMORY", "UUID", "PCI BUS", "MIG", ">POWER LIMIT", "GPM", "MONITOR"],
        &rows,
    );
    Ok(())
}

pub async fn procs(c: &mut Client, args: ProcsArgs, json: bool) -> Result<()> {
    let r = c.list_processes(pb::ListProcessesRequest { include_exited: args.all }).await?.into_inner();
    if json {
        let v: Vec<_> = r
            .processes
            .iter()
            .map(|p| {
                serde_json::json!({
                    "id": p.id, "pid": p.pid, "uid": p.uid, "exe": p.exe, "cmdline": p.cmdline,
                    "cgroup": p.cgroup, "agent_kind": p.agent_kind, "connected_at_ns": p.connected_at_ns,
                    "disconnected_at_ns": p.disconnected_at_ns, "trace_state": p.trace_state,
                    "cupti_version": p.cupti_version, "container_id": p.container_id,
                    "container_runtime": p.container_runtime, "pod_uid": p.pod_uid, "pod_name": p.pod_name,
                    "pod_namespace": p.pod_namespace, "job_id": p.job_id, "rank": p.rank, "local_rank": p.local_rank,
                    "world_size": p.world_size, "job_launcher": p.job_launcher, "role": p.role, "parent_pid": p.parent_pid,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = r
        .processes
        .iter()
        .map(|p| {
            vec![
                p.id.to_string(),
                p.pid.to_string(),
                p.uid.to_string(),
                p.agent_kind.clone(),
                p.trace_state.clone(),
                wall(p.connected_at_ns),
                rank_text(&p.role, p.rank, p.world_size),
                if p.job_id.is_empty() { "-".into() } else { shorten(&p.job_id, 24) },
                pod_text(&p.pod_namespace, &p.pod_name, &p.pod_uid),
                container_text(&p.container_id),
                shorten(&p.cmdline.join(" "), 60),
            ]
        })
        .collect();
    let head =
        [">ID", ">PID", ">UID", "KIND", "STATE", "CONNECTED (UTC)", "RANK", "JOB", "POD", "CONTAINER", "COMMAND"];
    table(&head, &rows);
    Ok(())
}

pub async fn session(c: &mut Client, cmd: SessionCmd, json: bool) -> Result<()> {
    match cmd {
        SessionCmd::Start { targets, collect } => {
            let req = collect.request(targets.to_pb()?)?;
            let s = c.start_session(req).await?.into_inner();
            if json {
                println!("{}", serde_json::to_string_pretty(&session_json(&s))?);
            } else {
                println!(
                    "session {} {} ({} process{} joined)",
                    s.id,
                    state_name(s.state),
                    s.processes.len(),
                    if s.processes.len() == 1 { "" } else { "es" }
                );
            }
        }
        SessionCmd::Stop { session } => {
            let s = c.stop_session(pb::StopSessionRequest { session_id: session }).await?.into_inner();
            print_session(&s, json)?;
        }
        SessionCmd::Show { session } => {
            let s = c.get_session(pb::GetSessionRequest { session_id: session }).await?.into_inner();
            print_session(&s, json)?;
        }
        SessionCmd::List { states, name, limit } => {
            let mut st = Vec::new();
            for s in &states {
                let v = pb::SessionState::from_str_name(&format!("SESSION_STATE_{}", s.to_uppercase()))
                    .filter(|v| *v != pb::SessionState::Unspecified)
                    .ok_or_else(|| {
                        Usage(format!("--state {s}: use pending, active, stopping, completed, failed or interrupted"))
                    })?;
                st.push(v as i32);
            }
            let mut out = Vec::new();
            let mut token = String::new();
            while out.len() < limit as usize {
                let r = c
                    .list_sessions(pb::ListSessionsRequest {
                        states: st.clone(),
                        name_contains: name.clone().unwrap_or_default(),
                        page_size: (limit as usize - out.len()).min(1000) as u32,
                        page_token: token,
                    })
                    .await?
                    .into_inner();
                out.extend(r.sessions);
                token = r.next_page_token;
                if token.is_empty() {
                    break;
                }
            }
            if json {
                let v: Vec<_> = out.iter().map(session_json).collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                let rows: Vec<Vec<String>> = out
                    .iter()
                    .map(|s| {
                        vec![
                            s.id.to_string(),
                            state_name(s.state),
                            s.name.clone(),
                            s.owner_uid.to_string(),
                            wall(s.created_at_ns),
                            s.processes.len().to_string(),
                            s.records.to_string(),
                            s.targets.iter().map(target_text).collect::<Vec<_>>().join(","),
                        ]
                    })
                    .collect();
                table(&[">ID", "STATE", "NAME", ">OWNER", "CREATED (UTC)", ">PROCS", ">RECORDS", "TARGETS"], &rows);
            }
        }
    }
    Ok(())
}

fn print_session(s: &pb::Session, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(&session_json(s))?);
        return Ok(());
    }
    let c = s.collect.clone().unwrap_or_default();
    println!("session      {}{}", s.id, if s.name.is_empty() { String::new() } else { format!(" ({})", s.name) });
    println!("state        {}", state_name(s.state));
    if !s.stop_reason.is_empty() {
        println!("reason       {}", s.stop_reason);
    }
    println!("targets      {}", s.targets.iter().map(target_text).collect::<Vec<_>>().join(", "));
    let pc = if c.pc_sampling {
        format!(" + PC sampling (period 2^{} cycles, flush {} ms)", c.pc_sampling_period_log2, c.pc_flush_interval_ms)
    } else {
        String::new()
    };
    let pm = if c.pm_sampling_rate_hz > 0 {
        format!(" + CUPTI PM sampling at {} Hz", c.pm_sampling_rate_hz)
    } else {
        String::new()
    };
    println!("collect      {}{pc}{pm}", c.preset);
    println!("owner uid    {}", s.owner_uid);
    println!("created      {}", wall(s.created_at_ns));
    println!("started      {}", wall(s.started_at_ns));
    println!("stopped      {}", wall(s.stopped_at_ns));
    if s.started_at_ns > 0 {
        let end = if s.stopped_at_ns > 0 { s.stopped_at_ns } else { now_ns() };
        println!("elapsed      {}", human_ns(end.saturating_sub(s.started_at_ns)));
    }
    if s.duration_ms > 0 {
        println!("duration     {}", human_ns(s.duration_ms * 1_000_000));
    }
    if s.max_records > 0 {
        println!("max records  {}", s.max_records);
    }
    println!("records      {}", s.records);
    if !s.processes.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .processes
            .iter()
            .map(|p| {
                vec![
                    p.process_id.to_string(),
                    p.pid.to_string(),
                    p.state.clone(),
                    p.records.to_string(),
                    p.dropped.to_string(),
                    wall(p.joined_at_ns),
                    rank_text(&p.role, p.rank, None),
                    pod_text(&p.pod_namespace, &p.pod_name, &p.pod_uid),
                    container_text(&p.container_id),
                    shorten(&p.exe, 50),
                    shorten(&p.detail, 60),
                ]
            })
            .collect();
        table(
            &[
                ">ID",
                ">PID",
                "STATE",
                ">RECORDS",
                ">DROPPED",
                "JOINED (UTC)",
                "RANK",
                "POD",
                "CONTAINER",
                "EXE",
                "DETAIL",
            ],
            &rows,
        );
        crate::pc::print_session_pc(s);
    }
    Ok(())
}

/// A pod as `namespace/name` when the daemon knows the name, else its UID; "-" outside pods.
fn pod_text(namespace: &str, name: &str, uid: &str) -> String {
    match (namespace, name, uid) {
        (_, _, "") => "-".into(),
        ("", "", uid) => uid.into(),
        (ns, name, _) => format!("{ns}/{name}"),
    }
}

/// A container id shortened the way `docker ps` and `crictl ps` show it; "-" outside containers.
fn container_text(id: &str) -> String {
    if id.is_empty() { "-".into() } else { id.chars().take(12).collect() }
}
