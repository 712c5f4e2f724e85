//! What the process tells the daemon about itself: identity, cgroup, clocks.

use gpuprof_proto::agent as pb;

/// What the process tells the daemon about itself.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub pid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
    pub devices: Vec<pb::Device>,
    /// The distributed job, read at initialisation ([`super::job::of_this_process`]).
    pub job: Option<pb::JobIdentity>,
}

impl Identity {
    pub fn of_this_process(devices: Vec<pb::Device>) -> Identity {
        let exe = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or_default();
        let cmdline = std::fs::read("/proc/self/cmdline")
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let cgroup = parse_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default());
        Identity { pid: std::process::id(), exe, cmdline, cgroup, devices, job: None }
    }
}

/// The unified (v2) cgroup path, else the first hierarchy's.
pub fn parse_cgroup(s: &str) -> String {
    let mut first = None;
    for line in s.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if id == "0" {
            return path.to_string();
        }
        first.get_or_insert_with(|| path.to_string());
    }
    first.unwrap_or_default()
}

pub fn clock_pair() -> pb::ClockPair {
    use gpuprof_cupti::clock;
    pb::ClockPair { realtime_ns: clock::realtime_ns(), monotonic_ns: clock::monotonic_ns() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_paths() {
        assert_eq!(parse_cgroup("0::/kubepods/pod1/abc\n"), "/kubepods/pod1/abc");
        assert_eq!(parse_cgroup("12:cpu,cpuacct:/docker/x\n11:memory:/docker/x\n"), "/docker/x");
        assert_eq!(parse_cgroup(""), "");
    }
}
