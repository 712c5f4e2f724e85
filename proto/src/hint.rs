//! The new-process hint: which processes an active session will trace from their start.
//!
//! CUPTI records only the API calls whose callback ids were switched on before the CUDA runtime
//! initialised; a trace that starts later has to enable the whole RUNTIME activity kind, and
//! CUPTI then intercepts every runtime call, recorded or not (on the H100 a PyTorch loop of small
//! kernels ran 1.36–1.51× untraced that way, against 1.18–1.21× with the ids on from the start).
//! Switching the ids on in every process is no option either: an untraced process would pay for
//! API records nobody collects (1.07–1.10×).
//!
//! So `gpuprofd` publishes which new processes an active session will trace, in a small file
//! next to the agent socket ([`hint_path`]), and the injector reads it once, inside `cuInit`:
//! when a line covers this process, the recorded runtime callback ids are switched on there and
//! then, and the first trace uses them. The file only decides which way API recording is
//! switched on; whether and what the process traces is still the daemon's start-trace command.
//!
//! File format, one target per line: `<uid or *> <kind> [value]`, kind one of `all`, `pid`,
//! `exe_name`, `exe_pattern`, `cgroup` (the daemon's session targets; others never match here),
//! and the same prefixed `pc:` for the targets of PC-sampling sessions ([`pc_line`]). A uid limits
//! the line to that user's processes (a session of a non-admin owner).
//!
//! Hook lines ask the processes that no target line covers to hook the runtime's API callbacks
//! inside `cuInit` instead: one runtime callback id that applications rarely call is switched
//! on, which keeps the runtime's calls reachable through CUPTI's callback ids, so a session that
//! starts later switches the recorded ids on rather than the RUNTIME kind (on the H100 the
//! PyTorch loop then ran 1.18–1.26× while traced late, against 1.36–1.41×; an untraced, hooked
//! process 0.99–1.04× its untraced twin, about 2.5 % over an injected process that is not
//! hooked). [`HOOK_LINE`] asks it of every process (`agent.late_attach_hook`); a line
//! `* hook:<kind> <value>` ([`hook_line`], `agent.late_attach_hook_for`) of the processes a
//! target line of that kind and value would cover, e.g. the training jobs an operator may want
//! to trace while they run. Older injectors ignore both.

use std::path::{Path, PathBuf};

/// The hint file of the daemon listening on `socket`.
pub fn hint_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".new-processes");
    PathBuf::from(p)
}

/// What a hint line is matched against.
#[derive(Debug, Clone, Default)]
pub struct Me {
    pub pid: u32,
    pub uid: u32,
    pub exe: String,
    pub cmdline: Vec<String>,
    pub cgroup: String,
}

fn base_name(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Whether a process is named `name`: the base name of its executable or of its argv[0]. The
/// one rule for `exe_name` targets, in the daemon's sessions and in the hint alike.
pub fn exe_name_matches(name: &str, exe: &str, cmdline: &[String]) -> bool {
    base_name(exe) == name || cmdline.first().is_some_and(|c| base_name(c) == name)
}

/// Whether a process matches the glob `pattern` ([`crate::glob`]): its executable path, its
/// command line joined with spaces, or any one argument. The one rule for `exe_pattern`
/// targets, in the daemon's sessions and in the hint alike.
pub fn exe_pattern_matches(pattern: &str, exe: &str, cmdline: &[String]) -> bool {
    crate::glob::matches(pattern, exe)
        || crate::glob::matches(pattern, &cmdline.join(" "))
        || cmdline.iter().any(|c| crate::glob::matches(pattern, c))
}

/// Whether one line of the hint file covers `me`.
fn line_covers(line: &str, me: &Me) -> bool {
    let line = line.trim();
    let mut it = line.splitn(3, ' ');
    let (Some(uid), Some(kind)) = (it.next(), it.next()) else { return false };
    let value = it.next().unwrap_or("");
    if uid != "*" && uid.parse::<u32>().ok() != Some(me.uid) {
        return false;
    }
    match kind {
        "all" => true,
        "pid" => value.parse::<u32>().ok() == Some(me.pid),
        "exe_name" => !value.is_empty() && exe_name_matches(value, &me.exe, &me.cmdline),
        "exe_pattern" => !value.is_empty() && exe_pattern_matches(value, &me.exe, &me.cmdline),
        "cgroup" => !value.is_empty() && me.cgroup.contains(value),
        _ => false,
    }
}

/// The line asking every uncovered process to hook the runtime's API callbacks (module docs).
pub const HOOK_LINE: &str = "* hook_runtime";

/// The prefix of a hook line's kind: `* hook:<kind> <value>` asks the processes that `* <kind>
/// <value>` covers to hook the runtime's API callbacks.
const HOOK_PREFIX: &str = "hook:";

/// The hook line for the processes a target line of `kind` and `value` covers (`None` where
/// [`line`] gives none).
pub fn hook_line(kind: &str, value: &str) -> Option<String> {
    line(None, &format!("{HOOK_PREFIX}{kind}"), value)
}

/// Whether `text` asks `me` to hook the runtime's API callbacks: [`HOOK_LINE`], or a hook line
/// ([`hook_line`]) whose target covers `me`.
pub fn asks_hook(text: &str, me: &Me) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        l == HOOK_LINE
            || l.strip_prefix("* ")
                .and_then(|rest| rest.strip_prefix(HOOK_PREFIX))
                .is_some_and(|target| line_covers(&format!("* {target}"), me))
    })
}

/// The prefix of a PC line's kind: `<uid or *> pc:<kind> [value]` says that the processes
/// `<uid or *> <kind> [value]` covers are targets of a PC-sampling session. The injector then
/// keeps the cubins of the modules they load from `cuInit` on, before the sampling lease
/// comes (a lease follows the process's first kernels on a device): a module JIT-compiled from
/// PTX or loaded from memory at the first launch is in no file, and without its cubin its
/// samples have no source lines. These lines cover nothing for [`covers`] and [`asks_hook`];
/// older injectors ignore them.
const PC_PREFIX: &str = "pc:";

/// The PC line for the processes a target line of `kind` and `value` (and `uid`) covers
/// (`None` where [`line`] gives none).
pub fn pc_line(uid: Option<u32>, kind: &str, value: &str) -> Option<String> {
    line(uid, &format!("{PC_PREFIX}{kind}"), value)
}

/// Whether `text` has a PC line ([`pc_line`]) whose target covers `me`.
pub fn asks_pc(text: &str, me: &Me) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        l.split_once(' ').is_some_and(|(uid, rest)| {
            rest.strip_prefix(PC_PREFIX).is_some_and(|target| line_covers(&format!("{uid} {target}"), me))
        })
    })
}

/// Whether any line of `text` covers `me`.
pub fn covers(text: &str, me: &Me) -> bool {
    text.lines().any(|l| line_covers(l, me))
}

/// One line of the hint file (`None` for a value that cannot be written on one line).
pub fn line(uid: Option<u32>, kind: &str, value: &str) -> Option<String> {
    if value.contains(['\n', '\r']) || value.trim() != value || kind.contains([' ', '\n']) {
        return None;
    }
    let uid = uid.map_or_else(|| "*".to_string(), |u| u.to_string());
    Some(if value.is_empty() { format!("{uid} {kind}") } else { format!("{uid} {kind} {value}") })
}

/// Reads the hint file of `socket`; `None` when there is none (no session awaits new
/// processes: the common, idle case costs one failed open).
pub fn read_hint(socket: &Path) -> Option<String> {
    std::fs::read_to_string(hint_path(socket)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Me {
        Me {
            pid: 42,
            uid: 1000,
            exe: "/usr/bin/python3.12".into(),
            cmdline: vec!["python3".into(), "train.py".into()],
            cgroup: "/kubepods/pod-abc/ctr".into(),
        }
    }

    #[test]
    fn lines_match_like_session_targets() {
        let m = me();
        assert!(covers("* all\n", &m));
        assert!(covers("1000 all", &m), "the owner's own processes");
        assert!(!covers("0 all", &m), "another user's session limited to its own processes");
        assert!(covers("* pid 42", &m));
        assert!(!covers("* pid 43", &m));
        assert!(covers("* exe_name python3.12", &m), "executable base name");
        assert!(covers("* exe_name python3", &m), "argv[0] base name");
        assert!(!covers("* exe_name python", &m));
        assert!(covers("* cgroup pod-abc", &m));
        assert!(!covers("* cgroup pod-xyz", &m));
        assert!(covers("* exe_pattern /usr/bin/python*", &m), "executable path");
        assert!(covers("* exe_pattern python3 *.py", &m), "command line");
        assert!(covers("* exe_pattern tr[a-z]in.py", &m), "one argument");
        assert!(!covers("* exe_pattern *eval*", &m));
        assert!(!covers("* exe_pattern [abc", &m), "a malformed pattern matches nothing");
        assert!(covers("* pid 7\n* cgroup pod-abc\n", &m), "any line");
    }

    #[test]
    fn hook_lines_cover_no_process_and_ask_the_hook() {
        let m = me();
        let text = format!("{HOOK_LINE}\n* pid 7\n");
        assert!(asks_hook(&text, &m));
        assert!(!covers(&text, &m), "the hook line is no target");
        assert!(!asks_hook("* pid 7\n* all\n", &m));
        assert!(!asks_hook("* hook_runtimes\n", &m));
        let scoped =
            format!("{}\n{}\n", hook_line("exe_name", "python3").unwrap(), hook_line("cgroup", "pod-xyz").unwrap());
        assert_eq!(scoped, "* hook:exe_name python3\n* hook:cgroup pod-xyz\n");
        assert!(asks_hook(&scoped, &m), "argv[0] is python3");
        assert!(!covers(&scoped, &m), "a hook line is no target");
        let other = Me { exe: "/usr/bin/nvidia-smi".into(), cmdline: vec!["nvidia-smi".into()], ..m.clone() };
        assert!(!asks_hook(&scoped, &other), "neither its name nor its cgroup");
        assert!(asks_hook(&hook_line("exe_pattern", "*train*").unwrap(), &m));
        assert!(asks_hook(&hook_line("cgroup", "pod-abc").unwrap(), &m));
        for bad in ["1000 hook:all", "* hook:", "* hook:exe_name", "* hook:bogus x", "* hook:hook:all"] {
            assert!(!asks_hook(bad, &m), "{bad:?}");
        }
        assert!(asks_hook("* hook:all", &m));
        assert_eq!(hook_line("cgroup", "a\nb"), None);
    }

    #[test]
    fn written_lines_read_back() {
        let m = me();
        assert_eq!(line(None, "all", "").as_deref(), Some("* all"));
        assert!(covers(
            &line(Some(1000), "cgroup", "pod-abc ctr").unwrap(),
            &Me { cgroup: "/pod-abc ctr".into(), ..m.clone() }
        ));
        assert!(covers(&line(None, "exe_name", "python3").unwrap(), &m));
        assert!(covers(&line(None, "exe_pattern", "python3 *train*").unwrap(), &m));
        assert_eq!(line(None, "cgroup", "a\nb"), None, "a value over two lines");
        assert_eq!(line(None, "exe_pattern", "*train* "), None, "reading trims the line");
    }

    #[test]
    fn malformed_lines_match_nothing() {
        let m = me();
        for bad in ["", "all", "x all", "* exe_name", "* cgroup ", "* pid x", "*\tall"] {
            assert!(!covers(bad, &m), "{bad:?}");
        }
    }

    #[test]
    fn hint_sits_next_to_the_socket() {
        assert_eq!(
            hint_path(Path::new("/run/gpuprof/agent.sock")),
            PathBuf::from("/run/gpuprof/agent.sock.new-processes")
        );
        let dir = std::env::temp_dir().join(format!("gpuprof-hint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("agent.sock");
        assert_eq!(read_hint(&sock), None);
        std::fs::write(hint_path(&sock), "* all\n").unwrap();
        assert_eq!(read_hint(&sock).as_deref(), Some("* all\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pc_lines_ask_for_cubins_and_cover_nothing_else() {
        let m = me();
        let all = pc_line(None, "all", "").unwrap();
        assert_eq!(all, "* pc:all");
        assert!(asks_pc(&all, &m));
        assert!(!covers(&all, &m), "a PC line does not switch API records on");
        assert!(!asks_hook(&all, &m), "nor asks for the runtime hook");
        assert!(asks_pc(&pc_line(Some(1000), "exe_name", "python3").unwrap(), &m), "the owner's process");
        assert!(!asks_pc(&pc_line(Some(0), "exe_name", "python3").unwrap(), &m), "another user's session");
        assert!(!asks_pc(&pc_line(None, "pid", "43").unwrap(), &m));
        assert!(asks_pc(&format!("* exe_name other\n{}\n", pc_line(None, "cgroup", "pod-abc").unwrap()), &m));
        assert!(!asks_pc("* all\n* hook_runtime\n* hook:all\n", &m), "other lines ask for no cubins");
        assert!(!asks_pc("* pc:\n* pc:unknown x\npc:all\n", &m), "malformed and unknown PC lines cover nothing");
    }
}
