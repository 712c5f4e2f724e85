//! The new-process hint file next to the agent socket: which processes the active sessions
//! will trace from their start (see [`gpuprof_proto::hint`]).

use std::path::Path;

use super::spec::TargetSpec;
use super::state::{Inner, State};
use crate::config::AgentConfig;

/// The new-process hint lines: the runtime hook asked for; the targets of the active sessions
/// that record runtime API calls; and, as PC lines, the targets of the active sessions that
/// PC-sample, but for the node's always-on profile (session `node`): its `all` would have every
/// CUDA process keep its cubins from `cuInit` on (see [`gpuprof_proto::hint`]).
fn hint_lines(agent: &AgentConfig, node: u64, g: &Inner) -> String {
    let mut out = String::new();
    if agent.late_attach_hook {
        out.push_str(gpuprof_proto::hint::HOOK_LINE);
        out.push('\n');
    } else {
        // Checked when the configuration was read.
        for (kind, value) in agent.hook_targets().unwrap_or_default() {
            if let Some(l) = gpuprof_proto::hint::hook_line(kind, value) {
                out.push_str(&l);
                out.push('\n');
            }
        }
    }
    let active = || g.open.values().filter(|l| l.state == State::Active);
    if agent.api_from_start {
        for l in active().filter(|l| l.collect.trace_config().runtime_api) {
            push_targets(&mut out, l.own_only.then_some(l.owner_uid), &l.targets, gpuprof_proto::hint::line);
        }
    }
    for l in active().filter(|l| l.collect.pc_sampling && l.id != node) {
        push_targets(&mut out, l.own_only.then_some(l.owner_uid), &l.targets, gpuprof_proto::hint::pc_line);
    }
    out
}

/// Appends the lines (made by `line`: target or PC lines) that cover what `targets` match.
fn push_targets(
    out: &mut String,
    uid: Option<u32>,
    targets: &[TargetSpec],
    line: fn(Option<u32>, &str, &str) -> Option<String>,
) {
    for t in targets {
        let lines = match t {
            TargetSpec::All => vec![line(uid, "all", "")],
            TargetSpec::Pid(p) => vec![line(uid, "pid", &p.to_string())],
            TargetSpec::ExeName(n) => vec![line(uid, "exe_name", n)],
            TargetSpec::Cgroup(c) => vec![line(uid, "cgroup", c)],
            TargetSpec::ExePattern(p) => vec![line(uid, "exe_pattern", p)],
            // A process matches these on its own /proc/self/cgroup, where the pod UID is
            // written with dashes (cgroupfs driver) or underscores (systemd driver). Inside
            // its own cgroup namespace it sees neither and records API calls the other way.
            TargetSpec::PodUid(u) => vec![line(uid, "cgroup", u), line(uid, "cgroup", &u.replace('-', "_"))],
            TargetSpec::ContainerId(c) => vec![line(uid, "cgroup", c)],
            // The hint format has no job form: a rank that starts later joins when it
            // connects, its runtime API calls recorded (and its cubins kept) from then on.
            TargetSpec::Job { .. } => Vec::new(),
        };
        for l in lines.into_iter().flatten() {
            out.push_str(&l);
            out.push('\n');
        }
    }
}

/// Rewrites the new-process hint file next to `agent_socket` when its lines changed (removes
/// it when it has none). A failure only costs new processes the cheaper way of recording API
/// calls, and the source lines of modules they load before a PC-sampling lease, so it is
/// logged, not returned.
pub(super) fn publish_hint(agent: &AgentConfig, agent_socket: &Path, node: u64, g: &mut Inner) {
    let text = hint_lines(agent, node, g);
    if text == g.hint {
        return;
    }
    let path = gpuprof_proto::hint::hint_path(agent_socket);
    let r = if text.is_empty() {
        std::fs::remove_file(&path).or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
    } else {
        let tmp = path.with_extension("new-processes.tmp");
        std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &path))
    };
    match r {
        Ok(()) => g.hint = text,
        Err(e) => tracing::warn!(path = %path.display(), error = %e, "could not update the new-process hint"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hint file from the agent settings and the sessions' state alone: the hook line
    /// while a hook is asked for, removed once nothing is left to say.
    #[test]
    fn the_hint_file_follows_the_settings_without_a_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let path = gpuprof_proto::hint::hint_path(&socket);
        let mut agent = crate::config::Config::from_toml("").unwrap().agent;
        let mut g = Inner::default();
        agent.late_attach_hook = true;
        publish_hint(&agent, &socket, 0, &mut g);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", gpuprof_proto::hint::HOOK_LINE));
        assert_eq!(g.hint, text);
        agent.late_attach_hook = false;
        publish_hint(&agent, &socket, 0, &mut g);
        assert!(!path.exists(), "no session and no hook: no hint file");
        assert_eq!(g.hint, "");
    }
}
