//! The distributed job a process belongs to, from the variables its launcher set: torchrun
//! (torchelastic), SLURM or MPI. Read once at start; values that do not parse are left out.

use gpuprof_proto::agent as pb;

/// Longest job id sent (the daemon refuses longer ones).
const MAX_JOB_ID: usize = 128;

/// Every variable [`job_identity`] reads.
pub const VARS: &[&str] = &[
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "RANK",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "WORLD_SIZE",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
    "GROUP_RANK",
    "SLURM_NODEID",
];

/// This process's job identity: the variables of [`VARS`] read from its environment, and its
/// parent pid. Called on the application's thread at initialisation (with the other variables
/// the injector reads), not later from the background thread, where reading the environment
/// could race with the application changing it.
pub fn of_this_process() -> pb::JobIdentity {
    let vars: Vec<(&str, String)> =
        VARS.iter().filter_map(|k| std::env::var_os(k).and_then(|v| v.into_string().ok()).map(|v| (*k, v))).collect();
    // getppid(2), which cannot fail.
    job_identity(&vars, std::os::unix::process::parent_id())
}

/// The job identity given by `vars` (name, value): for each field the first variable that is
/// set and parses, in the order torchelastic, SLURM, MPI.
pub fn job_identity(vars: &[(&str, String)], parent_pid: u32) -> pb::JobIdentity {
    let get = |k: &str| vars.iter().rev().find(|(n, _)| *n == k).map(|(_, v)| v.trim());
    let number = |keys: &[&str]| keys.iter().find_map(|k| get(k).and_then(|v| v.parse::<u32>().ok()));
    let id = |k: &str| get(k).filter(|v| !v.is_empty() && v.len() <= MAX_JOB_ID && !v.chars().any(char::is_control));
    let (launcher, job_id) = if let Some(v) = id("TORCHELASTIC_RUN_ID") {
        ("torchelastic", v)
    } else if let Some(v) = id("SLURM_JOB_ID") {
        ("slurm", v)
    } else if get("OMPI_COMM_WORLD_RANK").is_some() || get("PMI_RANK").is_some() {
        ("mpi", "")
    } else {
        ("", "")
    };
    pb::JobIdentity {
        launcher: launcher.into(),
        job_id: job_id.into(),
        rank: number(&["RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"]),
        local_rank: number(&["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"]),
        world_size: number(&["WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"]),
        group_rank: number(&["GROUP_RANK", "SLURM_NODEID"]),
        parent_pid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(vars: &[(&str, &str)]) -> pb::JobIdentity {
        let vars: Vec<(&str, String)> = vars.iter().map(|(k, v)| (*k, v.to_string())).collect();
        job_identity(&vars, 4100)
    }

    #[test]
    fn torchrun_rank() {
        let j = job(&[
            ("TORCHELASTIC_RUN_ID", "run-42"),
            ("RANK", "3"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "8"),
            ("GROUP_RANK", "1"),
            ("PATH", "/usr/bin"),
        ]);
        assert_eq!((j.launcher.as_str(), j.job_id.as_str()), ("torchelastic", "run-42"));
        assert_eq!((j.rank, j.local_rank, j.world_size, j.group_rank), (Some(3), Some(1), Some(8), Some(1)));
        assert_eq!(j.parent_pid, 4100);
    }

    #[test]
    fn torchrun_inside_slurm_is_the_torchrun_job() {
        let j = job(&[
            ("SLURM_JOB_ID", "777"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("TORCHELASTIC_RUN_ID", "run-1"),
            ("RANK", "5"),
        ]);
        assert_eq!((j.launcher.as_str(), j.job_id.as_str(), j.rank), ("torchelastic", "run-1", Some(5)));
        assert_eq!(j.world_size, Some(2), "WORLD_SIZE unset: SLURM_NTASKS is next");
    }

    #[test]
    fn slurm_and_mpi() {
        let s =
            job(&[("SLURM_JOB_ID", "123456"), ("SLURM_PROCID", "7"), ("SLURM_LOCALID", "3"), ("SLURM_NODEID", "1")]);
        assert_eq!((s.launcher.as_str(), s.job_id.as_str()), ("slurm", "123456"));
        assert_eq!((s.rank, s.local_rank, s.group_rank, s.world_size), (Some(7), Some(3), Some(1), None));
        let m =
            job(&[("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_LOCAL_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "4")]);
        assert_eq!((m.launcher.as_str(), m.job_id.as_str()), ("mpi", ""));
        assert_eq!((m.rank, m.local_rank, m.world_size), (Some(2), Some(0), Some(4)));
        let p = job(&[("PMI_RANK", "9")]);
        assert_eq!((p.launcher.as_str(), p.rank), ("mpi", Some(9)));
    }

    #[test]
    fn nothing_set() {
        let j = job(&[("HOME", "/root")]);
        assert_eq!(j, pb::JobIdentity { parent_pid: 4100, ..Default::default() });
    }

    #[test]
    fn values_that_do_not_parse_are_left_out() {
        let long = "x".repeat(MAX_JOB_ID + 1);
        let j = job(&[
            ("TORCHELASTIC_RUN_ID", &long),
            ("SLURM_JOB_ID", "55"),
            ("RANK", "-1"),
            ("SLURM_PROCID", "two"),
            ("OMPI_COMM_WORLD_RANK", " 4 "),
            ("LOCAL_RANK", "99999999999"),
            ("WORLD_SIZE", ""),
            ("GROUP_RANK", "1.5"),
        ]);
        assert_eq!((j.launcher.as_str(), j.job_id.as_str()), ("slurm", "55"), "a too long run id is skipped");
        assert_eq!(j.rank, Some(4), "the first rank variable that parses");
        assert_eq!((j.local_rank, j.world_size, j.group_rank), (None, None, None));
        let bad = job(&[("TORCHELASTIC_RUN_ID", "a\nb"), ("RANK", "0")]);
        assert_eq!((bad.launcher.as_str(), bad.job_id.as_str(), bad.rank), ("", "", Some(0)));
    }
}
