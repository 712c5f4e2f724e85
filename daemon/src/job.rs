//! Distributed jobs: the job identity an injector reports in its Hello (checked here), and
//! which processes are the launchers of a job's ranks.

use gpuprof_proto::agent::JobIdentity;

/// Longest job id accepted, bytes.
pub const MAX_JOB_ID: usize = 128;

/// The launchers an agent may name.
const LAUNCHERS: &[&str] = &["", "torchelastic", "slurm", "mpi"];

/// Checks a Hello's job identity: a known launcher and a bounded printable job id.
pub fn check(j: &JobIdentity) -> Result<(), String> {
    if !LAUNCHERS.contains(&j.launcher.as_str()) {
        let shown: String = j.launcher.chars().take(32).collect();
        return Err(format!("job.launcher {shown:?} is not one of torchelastic, slurm, mpi or empty"));
    }
    check_job_id(&j.job_id).map_err(|e| format!("job.job_id: {e}"))
}

/// A job id as reported or asked for: at most [`MAX_JOB_ID`] bytes, no control characters.
pub fn check_job_id(id: &str) -> Result<(), String> {
    if id.len() > MAX_JOB_ID {
        return Err(format!("{} bytes, at most {MAX_JOB_ID}", id.len()));
    }
    if id.chars().any(char::is_control) {
        return Err("contains control characters".into());
    }
    Ok(())
}

/// One process, as the launcher relation sees it.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub pid: u32,
    /// Its parent, the parent's parent, ... (or just the parent, as far as known).
    pub ancestors: &'a [u32],
    pub job_id: &'a str,
    pub rank: Option<u32>,
}

/// What each of `procs` is in its job: `("rank", its job)` when it has a rank, `("launcher",
/// the job)` when it has none but another process of a job descends from it (and its own job
/// id, if any, is that job's), else `("", its job id)`.
pub fn roles<'a>(procs: &[Member<'a>]) -> Vec<(&'static str, &'a str)> {
    procs
        .iter()
        .map(|p| {
            if p.rank.is_some() {
                return ("rank", p.job_id);
            }
            let launched = procs.iter().find(|q| {
                q.pid != p.pid
                    && !q.job_id.is_empty()
                    && q.ancestors.contains(&p.pid)
                    && (p.job_id.is_empty() || p.job_id == q.job_id)
            });
            match launched {
                Some(q) => ("launcher", q.job_id),
                None => ("", p.job_id),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_job_checks() {
        let ok = JobIdentity { launcher: "torchelastic".into(), job_id: "run-42".into(), ..Default::default() };
        assert!(check(&ok).is_ok());
        assert!(check(&JobIdentity::default()).is_ok(), "no job at all");
        let e = check(&JobIdentity { launcher: "pbs".into(), ..Default::default() }).unwrap_err();
        assert!(e.contains("job.launcher"), "{e}");
        let e = check(&JobIdentity { job_id: "j".repeat(MAX_JOB_ID + 1), ..Default::default() }).unwrap_err();
        assert!(e.contains("129 bytes"), "{e}");
        assert!(check(&JobIdentity { job_id: "a\u{1b}[2J".into(), ..Default::default() }).is_err());
    }

    #[test]
    fn launchers_of_ranks() {
        let m = |pid, ancestors: &'static [u32], job_id: &'static str, rank| Member { pid, ancestors, job_id, rank };
        let procs = [
            m(100, &[1], "", None),               // torchrun: no job variables of its own
            m(101, &[100, 1], "run-42", Some(0)), // its ranks
            m(102, &[100, 1], "run-42", Some(1)),
            m(200, &[1], "", None),          // unrelated, no job
            m(300, &[1], "7", None),         // srun step without a rank...
            m(301, &[300, 1], "8", Some(0)), // ... of another job's rank: not its launcher
            m(400, &[], "run-42", None),     // ancestors unknown
        ];
        let r = roles(&procs);
        assert_eq!(r[0], ("launcher", "run-42"));
        assert_eq!((r[1], r[2]), (("rank", "run-42"), ("rank", "run-42")));
        assert_eq!(r[3], ("", ""));
        assert_eq!(r[4], ("", "7"));
        assert_eq!(r[5], ("rank", "8"));
        assert_eq!(r[6], ("", "run-42"));
    }
}
