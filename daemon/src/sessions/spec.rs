//! What a session is asked for: its targets (which processes) and what it collects, as
//! validated from the API and stored (JSON) in the `sessions` row.

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;
use serde::{Deserialize, Serialize};

use crate::error::{ApiError, ApiResult};
use crate::registry::Agent;

/// One target, as stored (JSON) in `sessions.targets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetSpec {
    Pid(u32),
    ExeName(String),
    ExePattern(String),
    Cgroup(String),
    All,
    /// Normalized pod UID (lower case, dashes).
    PodUid(String),
    /// Normalized container id or prefix (lower case hex, at least 12 digits).
    ContainerId(String),
    /// The processes of a distributed job (their reported job id), only `ranks` when not empty
    /// (sorted, no duplicates).
    Job {
        id: String,
        ranks: Vec<u32>,
    },
}

/// Most ranks a job target may list.
const MAX_JOB_RANKS: usize = 4096;

impl TargetSpec {
    pub(super) fn from_pb(t: &pb::Target) -> ApiResult<TargetSpec> {
        use pb::target::Target as T;
        Ok(match &t.target {
            None => {
                return Err(ApiError::invalid(
                    "targets",
                    "a target has none of pid, exe_name, exe_pattern, cgroup, all, pod_uid, container_id, job",
                ));
            }
            Some(T::Pid(0)) => return Err(ApiError::invalid("targets.pid", "pid 0 is not a process")),
            Some(T::Pid(p)) => TargetSpec::Pid(*p),
            Some(T::ExeName(n)) if n.is_empty() || n.contains('/') => {
                return Err(ApiError::invalid(
                    "targets.exe_name",
                    format!("{n:?} is not an executable base name (e.g. \"python3\"); use exe_pattern for paths"),
                ));
            }
            Some(T::ExeName(n)) => TargetSpec::ExeName(n.clone()),
            Some(T::ExePattern(p)) => {
                if p.is_empty() {
                    return Err(ApiError::invalid("targets.exe_pattern", "the pattern is empty"));
                }
                if let Err(e) = gpuprof_proto::glob::check(p) {
                    return Err(ApiError::invalid("targets.exe_pattern", format!("{p:?}: {e}")));
                }
                TargetSpec::ExePattern(p.clone())
            }
            Some(T::Cgroup(c)) if c.is_empty() => {
                return Err(ApiError::invalid("targets.cgroup", "the cgroup substring is empty"));
            }
            Some(T::Cgroup(c)) => TargetSpec::Cgroup(c.clone()),
            Some(T::All(true)) => TargetSpec::All,
            Some(T::PodUid(u)) => TargetSpec::PodUid(crate::cgroup::normalize_pod_uid(u).ok_or_else(|| {
                ApiError::invalid(
                    "targets.pod_uid",
                    format!(
                        "{u:?} is not a pod UID (e.g. 1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c; \
                         kubectl get pod NAME -o jsonpath='{{.metadata.uid}}')"
                    ),
                )
            })?),
            Some(T::ContainerId(c)) => {
                TargetSpec::ContainerId(crate::cgroup::normalize_container_id(c).ok_or_else(|| {
                    ApiError::invalid(
                        "targets.container_id",
                        format!("{c:?} is not a container id (hex digits, at least the first 12)"),
                    )
                })?)
            }
            Some(T::Job(j)) => job_target(j)?,
            Some(T::All(false)) => {
                return Err(ApiError::invalid("targets.all", "all must be true when given (it selects every process)"));
            }
        })
    }

    pub fn to_pb(&self) -> pb::Target {
        use pb::target::Target as T;
        pb::Target {
            target: Some(match self {
                TargetSpec::Pid(p) => T::Pid(*p),
                TargetSpec::ExeName(n) => T::ExeName(n.clone()),
                TargetSpec::ExePattern(p) => T::ExePattern(p.clone()),
                TargetSpec::Cgroup(c) => T::Cgroup(c.clone()),
                TargetSpec::All => T::All(true),
                TargetSpec::PodUid(u) => T::PodUid(u.clone()),
                TargetSpec::ContainerId(c) => T::ContainerId(c.clone()),
                TargetSpec::Job { id, ranks } => T::Job(pb::JobTarget { job_id: id.clone(), ranks: ranks.clone() }),
            }),
        }
    }

    /// Whether the connected agent is covered by this target.
    pub fn matches(&self, a: &Agent) -> bool {
        match self {
            TargetSpec::Pid(p) => a.pid == *p || a.ancestors.contains(p),
            TargetSpec::ExeName(n) => gpuprof_proto::hint::exe_name_matches(n, &a.exe, &a.cmdline),
            TargetSpec::ExePattern(p) => gpuprof_proto::hint::exe_pattern_matches(p, &a.exe, &a.cmdline),
            TargetSpec::Cgroup(c) => a.cgroup.contains(c.as_str()),
            TargetSpec::All => true,
            TargetSpec::PodUid(u) => a.placement.pod_uid == *u,
            TargetSpec::ContainerId(c) => a.placement.container_id.starts_with(c.as_str()),
            TargetSpec::Job { id, ranks } => {
                a.job.job_id == *id && (ranks.is_empty() || a.job.rank.is_some_and(|r| ranks.contains(&r)))
            }
        }
    }
}

fn job_target(j: &pb::JobTarget) -> ApiResult<TargetSpec> {
    if j.job_id.is_empty() {
        return Err(ApiError::invalid(
            "targets.job.job_id",
            "the job id is empty: give the job's TORCHELASTIC_RUN_ID or SLURM_JOB_ID (the JOB column of gpuprofctl procs)",
        ));
    }
    if let Err(e) = crate::job::check_job_id(&j.job_id) {
        return Err(ApiError::invalid("targets.job.job_id", format!("not a job id: {e}")));
    }
    if j.ranks.len() > MAX_JOB_RANKS {
        return Err(ApiError::invalid(
            "targets.job.ranks",
            format!("{} ranks listed, at most {MAX_JOB_RANKS} (none: every rank)", j.ranks.len()),
        ));
    }
    let mut ranks = j.ranks.clone();
    ranks.sort_unstable();
    ranks.dedup();
    Ok(TargetSpec::Job { id: j.job_id.clone(), ranks })
}

/// What a session collects, as stored (JSON) in `sessions.collect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Collect {
    pub preset: String,
    #[serde(default)]
    pub pc_sampling: bool,
    #[serde(default)]
    pub pc_sampling_period_log2: u32,
    #[serde(default)]
    pub pm_metrics: Vec<String>,
    /// Stall reasons without CUPTI's prefix (empty: all).
    #[serde(default)]
    pub pc_stall_reasons: Vec<String>,
    #[serde(default)]
    pub pc_flush_interval_ms: u32,
    #[serde(default)]
    pub pc_hw_buffer_mib: u32,
    #[serde(default)]
    pub pc_scratch_buffer_mib: u32,
    /// CUPTI PM sampling while the session is active, Hz (0: off).
    #[serde(default)]
    pub pm_sampling_rate_hz: u32,
    /// "windows" or "continuous" ("": gpuprofd's `[pc] mode`, read when a lease is asked for).
    #[serde(default)]
    pub pc_mode: String,
    /// Windows: the cost budget in parts per million (0: gpuprofd's `[pc] cost_budget_pct`).
    #[serde(default)]
    pub pc_cost_budget_ppm: u32,
}

/// Highest PC-sampling cost budget a session may set, in %.
pub const MAX_PC_COST_BUDGET_PCT: f64 = 10.0;

/// Highest CUPTI PM sampling rate a session may ask for (100 us).
pub const MAX_PM_RATE_HZ: u32 = 10_000;

/// The PC sampling period when a session names none: 2^15 cycles (at 2^10 and 2^13 a busy H100
/// filled CUPTI's hardware buffer within seconds; see the injector's PC sampler).
pub const DEFAULT_PC_PERIOD_LOG2: u32 = 15;
/// Largest CUPTI PC-sampling hardware buffer accepted, MiB.
const MAX_PC_HW_BUFFER_MIB: u32 = 4096;
/// Largest CUPTI PC-sampling scratch buffer accepted, MiB.
const MAX_PC_SCRATCH_MIB: u32 = 1024;
/// Most stall reasons a session may name (GH100 has 40).
const MAX_STALL_REASONS: usize = 64;

/// Stall reasons as CUPTI names them, with or without the "smsp__pcsamp_warps_issue_" prefix,
/// normalized to the form without it, deduplicated, in the order given.
fn stall_reasons(v: &[String]) -> ApiResult<Vec<String>> {
    if v.len() > MAX_STALL_REASONS {
        return Err(ApiError::invalid(
            "collect.pc_stall_reasons",
            format!("{} reasons named, at most {MAX_STALL_REASONS}", v.len()),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for r in v {
        let t = r.trim().to_ascii_lowercase();
        let short = crate::pcsamp::short_stall(&t).to_string();
        let ok = short.len() <= 128
            && short.starts_with(|c: char| c.is_ascii_lowercase())
            && short.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(ApiError::invalid(
                "collect.pc_stall_reasons",
                format!(
                    "{r:?} is not a stall reason name; use CUPTI's names such as \"stalled_long_scoreboard\" \
                     (with or without the \"{}\" prefix)",
                    crate::pcsamp::STALL_PREFIX
                ),
            ));
        }
        if !out.contains(&short) {
            out.push(short);
        }
    }
    Ok(out)
}

impl Collect {
    pub(super) fn from_pb(c: Option<&pb::CollectOptions>) -> ApiResult<Collect> {
        let c = c.cloned().unwrap_or_default();
        let preset = if c.preset.is_empty() { "default".to_string() } else { c.preset };
        if !matches!(preset.as_str(), "kernels" | "default" | "full" | "pc") {
            return Err(ApiError::invalid(
                "collect.preset",
                format!("unknown preset {preset:?}; use \"kernels\", \"default\", \"full\" or \"pc\""),
            ));
        }
        if preset == "pc" && !c.pc_sampling {
            return Err(ApiError::invalid(
                "collect.preset",
                "preset \"pc\" collects nothing but PC samples; turn collect.pc_sampling on (--pc-sampling) or pick another preset",
            ));
        }
        // Refused rather than silently ignored: PM metrics come from the device samplers
        // ([sampler] metrics, StreamPmSamples).
        if !c.pm_metrics.is_empty() {
            return Err(ApiError::invalid(
                "collect.pm_metrics",
                "per-session PM metrics are not supported yet; the device samplers collect the metrics in \
                 [sampler] metrics for every GPU (gpuprofctl pm watch, StreamPmSamples)",
            ));
        }
        let p = c.pc_sampling_period_log2;
        if p != 0 && !(5..=31).contains(&p) {
            return Err(ApiError::invalid("collect.pc_sampling_period_log2", format!("{p} is outside 5..31 (0: 15)")));
        }
        if c.pm_metrics.iter().any(|m| m.trim().is_empty()) {
            return Err(ApiError::invalid("collect.pm_metrics", "a metric name is empty"));
        }
        let pc_options = [
            ("collect.pc_sampling_period_log2", p != 0),
            ("collect.pc_stall_reasons", !c.pc_stall_reasons.is_empty()),
            ("collect.pc_flush_interval_ms", c.pc_flush_interval_ms != 0),
            ("collect.pc_hw_buffer_mib", c.pc_hw_buffer_mib != 0),
            ("collect.pc_scratch_buffer_mib", c.pc_scratch_buffer_mib != 0),
            ("collect.pc_mode", !c.pc_mode.is_empty()),
            ("collect.pc_cost_budget_pct", c.pc_cost_budget_pct != 0.0),
        ];
        if !c.pc_sampling
            && let Some((field, _)) = pc_options.iter().find(|(_, set)| *set)
        {
            return Err(ApiError::invalid(field, "is a PC sampling option: set collect.pc_sampling too"));
        }
        let flush = c.pc_flush_interval_ms;
        if flush != 0 && !(100..=60_000).contains(&flush) {
            return Err(ApiError::invalid(
                "collect.pc_flush_interval_ms",
                format!("{flush} ms is outside 100..60000 (0: 1000)"),
            ));
        }
        if c.pc_hw_buffer_mib > MAX_PC_HW_BUFFER_MIB {
            return Err(ApiError::invalid(
                "collect.pc_hw_buffer_mib",
                format!(
                    "{} MiB is above the maximum of {MAX_PC_HW_BUFFER_MIB} (0: CUPTI's default, 512)",
                    c.pc_hw_buffer_mib
                ),
            ));
        }
        if c.pc_scratch_buffer_mib > MAX_PC_SCRATCH_MIB {
            return Err(ApiError::invalid(
                "collect.pc_scratch_buffer_mib",
                format!("{} MiB is above the maximum of {MAX_PC_SCRATCH_MIB} (0: 4)", c.pc_scratch_buffer_mib),
            ));
        }
        if c.pm_sampling_rate_hz > MAX_PM_RATE_HZ {
            return Err(ApiError::invalid(
                "collect.pm_sampling_rate_hz",
                format!("{} Hz is above the maximum of {MAX_PM_RATE_HZ} Hz (100 us)", c.pm_sampling_rate_hz),
            ));
        }
        let pc_mode = c.pc_mode.trim().to_ascii_lowercase();
        if !matches!(pc_mode.as_str(), "" | "windows" | "continuous") {
            return Err(ApiError::invalid(
                "collect.pc_mode",
                format!("{:?} is not a PC sampling mode: use \"windows\" or \"continuous\"", c.pc_mode),
            ));
        }
        let budget = c.pc_cost_budget_pct;
        if !budget.is_finite() || !(0.0..=MAX_PC_COST_BUDGET_PCT).contains(&budget) {
            return Err(ApiError::invalid(
                "collect.pc_cost_budget_pct",
                format!("{budget} is outside 0..{MAX_PC_COST_BUDGET_PCT} % (0: gpuprofd's [pc] cost_budget_pct)"),
            ));
        }
        if budget != 0.0 && pc_mode == "continuous" {
            return Err(ApiError::invalid(
                "collect.pc_cost_budget_pct",
                "applies to the windows mode only: continuous sampling is not spaced to a budget",
            ));
        }
        let pc_stall_reasons = stall_reasons(&c.pc_stall_reasons)?;
        Ok(Collect {
            pc_mode,
            pc_cost_budget_ppm: (budget * 10_000.0).round() as u32,
            preset,
            pc_sampling: c.pc_sampling,
            pc_sampling_period_log2: if p == 0 && c.pc_sampling { DEFAULT_PC_PERIOD_LOG2 } else { p },
            pm_metrics: c.pm_metrics,
            pc_stall_reasons,
            pc_flush_interval_ms: if flush == 0 && c.pc_sampling { 1000 } else { flush },
            pc_hw_buffer_mib: c.pc_hw_buffer_mib,
            pc_scratch_buffer_mib: c.pc_scratch_buffer_mib,
            pm_sampling_rate_hz: c.pm_sampling_rate_hz,
        })
    }

    pub fn to_pb(&self) -> pb::CollectOptions {
        pb::CollectOptions {
            preset: self.preset.clone(),
            pc_sampling: self.pc_sampling,
            pc_sampling_period_log2: self.pc_sampling_period_log2,
            pm_metrics: self.pm_metrics.clone(),
            pc_stall_reasons: self.pc_stall_reasons.clone(),
            pc_flush_interval_ms: self.pc_flush_interval_ms,
            pc_hw_buffer_mib: self.pc_hw_buffer_mib,
            pc_scratch_buffer_mib: self.pc_scratch_buffer_mib,
            pm_sampling_rate_hz: self.pm_sampling_rate_hz,
            pc_mode: self.pc_mode.clone(),
            pc_cost_budget_pct: f64::from(self.pc_cost_budget_ppm) / 10_000.0,
        }
    }

    /// The activity kinds the injector enables for this preset.
    pub fn trace_config(&self) -> wire::TraceConfig {
        if self.preset == "pc" {
            return wire::TraceConfig { activity_off: true, ..Default::default() };
        }
        let full = self.preset == "full";
        let default = full || self.preset == "default";
        wire::TraceConfig {
            kernels: true,
            memcpy: default,
            memset: default,
            runtime_api: default,
            driver_api: full,
            // SYNCHRONIZATION and EXTERNAL_CORRELATION make CUPTI intercept every sync and
            // every framework op (measured on the H100: +0.35x and +0.12x on a PyTorch loop of
            // small kernels); the sync API calls themselves are still recorded by default.
            sync: full,
            overhead: full,
            nvtx: default,
            external_correlation: full,
            graphs: default,
            flush_interval_ms: 0,
            activity_off: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_validate() {
        use pb::target::Target as T;
        let t = |x| pb::Target { target: Some(x) };
        assert!(TargetSpec::from_pb(&t(T::Pid(0))).is_err());
        assert!(TargetSpec::from_pb(&t(T::ExeName("/usr/bin/python3".into()))).is_err());
        assert!(TargetSpec::from_pb(&t(T::ExePattern("[abc".into()))).is_err());
        assert!(TargetSpec::from_pb(&t(T::All(false))).is_err());
        assert!(TargetSpec::from_pb(&pb::Target { target: None }).is_err());
        assert_eq!(TargetSpec::from_pb(&t(T::All(true))).unwrap(), TargetSpec::All);
        let json = serde_json::to_string(&vec![TargetSpec::Pid(3), TargetSpec::All]).unwrap();
        assert_eq!(json, r#"[{"pid":3},"all"]"#);
    }

    #[test]
    fn a_pid_target_covers_the_process_and_its_descendants() {
        let mut rank = agent(4300, 1000, "/usr/bin/python3", &[], "");
        rank.ancestors = vec![4200, 4100];
        assert!(TargetSpec::Pid(4300).matches(&rank));
        assert!(TargetSpec::Pid(4200).matches(&rank), "its launcher");
        assert!(TargetSpec::Pid(4100).matches(&rank), "the launcher's shell");
        assert!(!TargetSpec::Pid(4301).matches(&rank));
    }

    fn agent(pid: u32, uid: u32, exe: &str, cmdline: &[&str], cgroup: &str) -> Agent {
        Agent {
            pid,
            uid,
            gid: uid,
            exe: exe.into(),
            cmdline: cmdline.iter().map(|s| s.to_string()).collect(),
            cgroup: cgroup.into(),
            placement: crate::cgroup::parse_path(cgroup).into(),
            ..Agent::for_test(1, tokio::sync::mpsc::channel(1).0)
        }
    }

    #[test]
    fn targets_match() {
        let a = agent(
            42,
            1000,
            "/opt/conda/bin/python3.11",
            &["python", "train_gpt.py", "--lr=1"],
            "/kubepods/burstable/pod9f3a/c0ffee",
        );
        assert!(TargetSpec::Pid(42).matches(&a));
        assert!(!TargetSpec::Pid(43).matches(&a));
        assert!(TargetSpec::ExeName("python3.11".into()).matches(&a));
        assert!(TargetSpec::ExeName("python".into()).matches(&a), "argv[0] counts too");
        assert!(!TargetSpec::ExeName("python3".into()).matches(&a));
        assert!(TargetSpec::ExePattern("*train*.py".into()).matches(&a));
        assert!(TargetSpec::ExePattern("/opt/conda/*".into()).matches(&a));
        assert!(!TargetSpec::ExePattern("*eval*".into()).matches(&a));
        assert!(TargetSpec::Cgroup("pod9f3a".into()).matches(&a));
        assert!(!TargetSpec::Cgroup("pod0000".into()).matches(&a));
        assert!(TargetSpec::All.matches(&a));
    }

    #[test]
    fn pod_and_container_targets() {
        use pb::target::Target as T;
        let uid = "1f0a9d3c-5a4e-4f6b-9f2a-0c7d1e2b3a4c";
        let cid = "7e2b6c0a4f1d3e5b9a8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a";
        let t = |x| TargetSpec::from_pb(&pb::Target { target: Some(x) });
        // As users write them: the systemd driver's underscores, upper case, kubectl's scheme.
        let pod = t(T::PodUid(uid.replace('-', "_").to_uppercase())).unwrap();
        assert_eq!(pod, TargetSpec::PodUid(uid.into()));
        let ctr = t(T::ContainerId(format!("containerd://{}", &cid[..12]))).unwrap();
        assert_eq!(ctr, TargetSpec::ContainerId(cid[..12].into()));
        for bad in [T::PodUid("trainer-0".into()), T::ContainerId("abc".into()), T::ContainerId(String::new())] {
            let e = t(bad).unwrap_err().to_string();
            assert!(e.contains("targets.pod_uid") || e.contains("targets.container_id"), "{e}");
        }
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope",
            uid.replace('-', "_")
        );
        let inside = agent(7, 0, "/usr/bin/python3", &[], &systemd);
        let outside = agent(8, 0, "/usr/bin/python3", &[], "/user.slice/session-1.scope");
        assert!(pod.matches(&inside) && ctr.matches(&inside));
        assert!(!pod.matches(&outside) && !ctr.matches(&outside));
        assert!(!TargetSpec::ContainerId(cid[1..13].into()).matches(&inside), "a prefix, not a substring");
        assert_eq!(serde_json::to_string(&pod).unwrap(), format!(r#"{{"pod_uid":"{uid}"}}"#));
        assert_eq!(TargetSpec::from_pb(&pod.to_pb()).unwrap(), pod);
    }

    #[test]
    fn job_targets() {
        use pb::target::Target as T;
        let t = |id: &str, ranks: &[u32]| {
            TargetSpec::from_pb(&pb::Target {
                target: Some(T::Job(pb::JobTarget { job_id: id.into(), ranks: ranks.to_vec() })),
            })
        };
        let j = t("run-42", &[3, 1, 3]).unwrap();
        assert_eq!(j, TargetSpec::Job { id: "run-42".into(), ranks: vec![1, 3] });
        assert_eq!(serde_json::to_string(&j).unwrap(), r#"{"job":{"id":"run-42","ranks":[1,3]}}"#);
        assert_eq!(TargetSpec::from_pb(&j.to_pb()).unwrap(), j);
        for (id, ranks, want) in
            [("", &[][..], "job id is empty"), ("a\nb", &[], "control"), ("x", &[0; 4097], "at most")]
        {
            let e = t(id, ranks).unwrap_err().to_string();
            assert!(e.contains("targets.job") && e.contains(want), "{e}");
        }
        let mut rank = agent(10, 0, "/usr/bin/python3", &[], "");
        rank.job = wire::JobIdentity { job_id: "run-42".into(), rank: Some(3), ..Default::default() };
        let mut launcher = agent(9, 0, "/usr/bin/python3", &[], "");
        launcher.job.job_id = "run-42".into();
        assert!(j.matches(&rank) && !t("run-42", &[1]).unwrap().matches(&rank));
        assert!(t("run-42", &[]).unwrap().matches(&launcher), "the whole job: rank or not");
        assert!(!j.matches(&launcher), "a rank list: only processes with one of those ranks");
        assert!(!t("run-4", &[]).unwrap().matches(&rank), "the id exactly, not a prefix");
    }

    #[test]
    fn pc_sampling_options() {
        let o = |f: &dyn Fn(&mut pb::CollectOptions)| {
            let mut c = pb::CollectOptions { pc_sampling: true, ..Default::default() };
            f(&mut c);
            Collect::from_pb(Some(&c)).map_err(|e| e.to_string())
        };
        let c = o(&|c| {
            c.pc_stall_reasons = vec![
                "smsp__pcsamp_warps_issue_stalled_long_scoreboard".into(),
                "Stalled_Barrier ".into(),
                "stalled_long_scoreboard".into(),
            ];
            c.pc_sampling_period_log2 = 5;
            c.pc_flush_interval_ms = 100;
            c.pc_mode = " Windows".into();
            c.pc_cost_budget_pct = 1.5;
        })
        .unwrap();
        assert_eq!((c.pc_mode.as_str(), c.pc_cost_budget_ppm), ("windows", 15_000));
        assert_eq!(c.pc_stall_reasons, ["stalled_long_scoreboard", "stalled_barrier"]);
        assert_eq!(Collect::from_pb(Some(&c.to_pb())).unwrap(), c, "stored options read back the same");
        for (bad, field) in [
            (
                &(|c: &mut pb::CollectOptions| c.pc_sampling_period_log2 = 4) as &dyn Fn(&mut pb::CollectOptions),
                "period_log2",
            ),
            (&|c| c.pc_sampling_period_log2 = 32, "period_log2"),
            (&|c| c.pc_flush_interval_ms = 99, "pc_flush_interval_ms"),
            (&|c| c.pc_flush_interval_ms = 60_001, "pc_flush_interval_ms"),
            (&|c| c.pc_hw_buffer_mib = 4097, "pc_hw_buffer_mib"),
            (&|c| c.pc_scratch_buffer_mib = 1025, "pc_scratch_buffer_mib"),
            (&|c| c.pc_mode = "always".into(), "use \"windows\" or \"continuous\""),
            (&|c| c.pc_cost_budget_pct = 11.0, "pc_cost_budget_pct"),
            (&|c| c.pc_cost_budget_pct = f64::NAN, "pc_cost_budget_pct"),
            (
                &|c| {
                    c.pc_mode = "continuous".into();
                    c.pc_cost_budget_pct = 1.0;
                },
                "applies to the windows mode only",
            ),
            (&|c| c.pc_stall_reasons = vec!["long scoreboard".into()], "pc_stall_reasons"),
            (&|c| c.pc_stall_reasons = vec![String::new()], "pc_stall_reasons"),
            (
                &|c| {
                    c.pc_sampling = false;
                    c.pc_flush_interval_ms = 500;
                },
                "set collect.pc_sampling too",
            ),
        ] {
            let e = o(bad).unwrap_err();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn presets() {
        assert!(Collect::from_pb(Some(&pb::CollectOptions { preset: "bogus".into(), ..Default::default() })).is_err());
        let pc_only = |pc_sampling| pb::CollectOptions { preset: "pc".into(), pc_sampling, ..Default::default() };
        let e = Collect::from_pb(Some(&pc_only(false))).unwrap_err();
        assert!(format!("{e:?}").contains("--pc-sampling"), "{e:?}");
        let t = Collect::from_pb(Some(&pc_only(true))).unwrap().trace_config();
        assert!(t.activity_off && !t.kernels && !t.runtime_api && !t.memcpy, "{t:?}");
        let pc = Collect::from_pb(Some(&pb::CollectOptions { pc_sampling: true, ..Default::default() })).unwrap();
        assert_eq!((pc.pc_sampling_period_log2, pc.pc_flush_interval_ms), (15, 1000));
        let pm = pb::CollectOptions { pm_metrics: vec!["sm__cycles_active.avg".into()], ..Default::default() };
        assert!(Collect::from_pb(Some(&pm)).is_err());
        let c = Collect::from_pb(None).unwrap();
        assert_eq!(c.preset, "default");
        let k = Collect { preset: "kernels".into(), ..Default::default() }.trace_config();
        assert!(k.kernels && !k.memcpy && !k.runtime_api);
        let f = Collect { preset: "full".into(), ..Default::default() }.trace_config();
        assert!(f.driver_api && f.overhead && f.nvtx && f.sync && f.external_correlation);
        let d = Collect::from_pb(None).unwrap().trace_config();
        assert!(d.memcpy && d.runtime_api && d.nvtx && !d.sync && !d.external_correlation && !d.driver_api);
    }

    #[test]
    fn pm_sampling_rate_is_bounded() {
        let c = |hz| Collect::from_pb(Some(&pb::CollectOptions { pm_sampling_rate_hz: hz, ..Default::default() }));
        assert_eq!(c(10_000).unwrap().pm_sampling_rate_hz, 10_000);
        assert_eq!(c(0).unwrap().to_pb().pm_sampling_rate_hz, 0);
        let e = c(10_001).unwrap_err().to_string();
        assert!(e.contains("collect.pm_sampling_rate_hz") && e.contains("10000"), "{e}");
    }
}
