//! The commands of README.md and the guides in docs/ work as written.
//!
//! Every ```` ```sh ```` block is one of two kinds:
//! - untagged: run by bash, block after block, as a reader would type them, against a daemon
//!   with fake CUDA processes (README.md: the daemon its own command starts in a fresh
//!   directory; a guide: a daemon whose session 7 has records of two ranks of a job and PC
//!   samples, after six empty sessions). `cargo` is a shell function that runs the debug
//!   binaries of this build for the `cargo run` lines and checks the rest: the packages and
//!   programs a `cargo build` names exist, and `cargo test --workspace` is what `.ci/run` runs.
//!   Streaming commands (`pm watch`, `pc watch`) are cut after 3 s. Every command must succeed.
//! - tagged with where it runs (```` ```sh gpu ````, `root`, `remote`, `cluster`, `bench`,
//!   `pip`, `grpcurl`, `always-on`: a daemon with `[pc] always_on`): each `gpuprofctl` command is parsed by gpuprofctl itself against a
//!   socket that is not there (it must fail to connect, not on its arguments), each `gpuprofd`
//!   command's arguments likewise (`--help` added), each script or program path must exist,
//!   each `cargo` command must name packages and programs that exist, and any other program
//!   must be one the tag allows.
//!
//! Every ```` ```toml ```` block is a configuration `gpuprofd check-config` accepts, and every
//! relative link points at a file and heading that exist.

// Helpers outside #[test] functions fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpuprof_testkit::layout::repo_root;
use gpuprof_testkit::pc_agent::{FakePc, PcAgent, PcCommand, ctl_ok, start_daemon_config};
use gpuprof_testkit::traced_agent::{Event, TracedAgent, TracedConfig};
use gpuprof_testkit::{TestDaemon, bin_path};

/// One ```sh block: where it is, its tag (the word after `sh`), its text.
struct Block {
    at: String,
    tag: Option<String>,
    text: String,
}

const TAGS: &[&str] = &["gpu", "root", "remote", "cluster", "bench", "pip", "grpcurl", "always-on"];

fn blocks(path: &Path) -> Vec<Block> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut open: Option<(usize, Option<String>, String, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split_whitespace();
                if words.next() == Some("sh") {
                    open = Some((i + 1, words.next().map(str::to_string), String::new(), indent));
                } else {
                    open = Some((i + 1, Some(format!("not sh: {info}")), String::new(), indent));
                }
            }
            (Some(_), Some("")) => {
                let (at, tag, text, _) = open.take().unwrap();
                if tag.as_deref().is_none_or(|t| !t.starts_with("not sh")) {
                    out.push(Block { at: format!("{}:{at}", path.display()), tag, text });
                }
            }
            (Some((_, _, text, indent)), _) => {
                text.push_str(line.get(*indent..).unwrap_or(line.trim_start()));
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{}: a code block is not closed", path.display());
    out
}

/// The commands of a block: continuation lines joined, comments and blank lines dropped, split
/// at `;`, `&&` and `|` (outside quotes), leading `VAR=value` words and `sudo` left out.
fn commands(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let (mut cur, mut quote, mut prev_space) = (String::new(), None::<char>, true);
        let mut parts = Vec::new();
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match (quote, c) {
                (None, '#') if prev_space => break,
                (None, '\'' | '"') => quote = Some(c),
                (Some(q), c) if c == q => quote = None,
                (None, ';' | '|' | '&') => {
                    if c == '&' && chars.peek() != Some(&'&') {
                        // `cmd &`: in the background, still one command.
                    } else {
                        chars.next_if_eq(&c);
                    }
                    parts.push(std::mem::take(&mut cur));
                    prev_space = true;
                    continue;
                }
                _ => {}
            }
            prev_space = c.is_whitespace();
            cur.push(c);
        }
        parts.push(cur);
        for p in parts {
            let words: Vec<&str> = p
                .split_whitespace()
                .skip_while(|w| *w == "sudo" || (w.contains('=') && !w.starts_with('-') && !w.starts_with('"')))
                .collect();
            if !words.is_empty() {
                out.push(words.join(" "));
            }
        }
    }
    out
}

/// Package names of the workspace, and the programs (`[[bin]]` names) each builds.
fn workspace() -> (Vec<String>, Vec<String>) {
    let root = repo_root();
    let (mut packages, mut bins) = (Vec::new(), Vec::new());
    for dir in ["proto", "cupti", "daemon", "client", "injector", "sampler", "tests"] {
        let toml: toml::Table =
            toml::from_str(&std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap()).unwrap();
        let name = toml["package"]["name"].as_str().unwrap().to_string();
        for b in toml.get("bin").and_then(|b| b.as_array()).into_iter().flatten() {
            bins.push(b["name"].as_str().unwrap().to_string());
        }
        if dir == "daemon" || dir == "sampler" {
            bins.push(name.clone());
        }
        packages.push(name);
    }
    (packages, bins)
}

/// The bash that runs untagged blocks: `cargo` as described above, streaming commands cut.
fn prelude(bin: &Path, repo: &Path) -> String {
    let (packages, bins) = workspace();
    format!(
        r#"set -eE -o pipefail
trap 'echo "docs command failed (exit $?): $BASH_COMMAND" >&2' ERR
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
BIN='{bin}'; REPO='{repo}'
PACKAGES=' {packages} '; PROGRAMS=' {bins} '
export PATH="$BIN:$PATH"
started_daemon() {{
  for _ in $(seq 300); do grep -q ' ready: ' "$1" && return 0; sleep 0.1; done
  cat "$1" >&2; return 1
}}
check_build() {{
  while [ $# -gt 0 ]; do
    case "$1" in
      -p) case "$PACKAGES" in *" $2 "*) ;; *) echo "no package $2" >&2; return 1;; esac; shift;;
      --bin) case "$PROGRAMS" in *" $2 "*) ;; *) echo "no program $2" >&2; return 1;; esac; shift;;
    esac
    shift
  done
}}
cargo() {{
  case "$*" in
    "test --workspace") grep -qxF 'cargo test --workspace --locked' "$REPO/.ci/run";;
    "build "*) check_build "$@";;
    "run --release -p gpuprofd -- "*)
      shift 5; gpuprofd "$@" >gpuprofd.log 2>&1 & started_daemon gpuprofd.log;;
    *) echo "the docs test does not know: cargo $*" >&2; return 1;;
  esac
}}
gpuprofctl() {{
  case "$1 $2" in
    "pm watch"|"pc watch") local rc=0; timeout 3 "$BIN/gpuprofctl" "$@" || rc=$?; [ "$rc" = 124 ] || return "$rc";;
    *) "$BIN/gpuprofctl" "$@";;
  esac
}}
"#,
        bin = bin.display(),
        repo = repo.display(),
        packages = packages.join(" "),
        bins = bins.join(" "),
    )
}

/// Runs the untagged blocks of `doc` as one bash script in `work`, with `env`.
fn run_blocks(doc: &Path, work: &Path, env: &[(&str, String)]) {
    let bin = bin_path("gpuprofctl").parent().unwrap().to_path_buf();
    let mut script = prelude(&bin, &repo_root());
    let mut n = 0;
    for b in blocks(doc).iter().filter(|b| b.tag.is_none()) {
        script.push_str(&format!("# {}\n{}", b.at, b.text));
        n += 1;
    }
    assert!(n > 0, "{}: no block to run", doc.display());
    let home = work.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let o = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(work)
        .env("HOME", &home)
        .env_remove("GPUPROF_ADDR")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}: a command failed:\n{}\n--- stdout:\n{}\n--- script:\n{script}",
        doc.display(),
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout),
    );
}

/// Programs each tag allows besides gpuprofctl, gpuprofd, cargo and paths in the repository.
fn allowed(tag: &str) -> &'static [&'static str] {
    match tag {
        "gpu" => &["export", "python3", "torchrun"],
        "root" => &["apt-get", "dpkg", "systemctl", "install", "buildah"],
        "cluster" => &["kubectl"],
        "pip" => &["python3", "venv/bin/pip"],
        "grpcurl" => &["grpcurl"],
        _ => &[],
    }
}

/// Checks the commands of a tagged block without what the tag says they need.
fn check_tagged(b: &Block, bin: &Path) -> Vec<String> {
    let tag = b.tag.as_deref().unwrap();
    let mut bad = Vec::new();
    if !TAGS.contains(&tag) {
        return vec![format!("{}: unknown tag {tag:?} (one of {TAGS:?})", b.at)];
    }
    let (packages, bins) = workspace();
    for c in commands(&b.text) {
        let words: Vec<&str> = c.split_whitespace().collect();
        let what = format!("{}: {c}", b.at);
        match words[0] {
            "gpuprofctl" | "gpuprofd" => {
                let mut line = format!("{}/{c}", bin.display());
                if words[0] == "gpuprofd" {
                    line.push_str(" --help");
                }
                // $(kubectl ...) and $uid stand for a pod's UID.
                let o = Command::new("bash")
                    .arg("-c")
                    .arg(format!("kubectl() {{ echo 0b5e7f2c-1d3a-4e1f-9a6b-7c8d9e0f1a2b; }}; uid=x; {line}"))
                    .env("GPUPROF_API_SOCKET", "/nonexistent/gpuprof/api.sock")
                    .env_remove("GPUPROF_ADDR")
                    .output()
                    .unwrap();
                let code = o.status.code();
                let ok = if words[0] == "gpuprofd" { code == Some(0) } else { code != Some(2) && code != Some(101) };
                if !ok {
                    bad.push(format!("{what}: exit {code:?}: {}", String::from_utf8_lossy(&o.stderr)));
                }
            }
            "cargo" => {
                let mut w = words.iter().skip(1);
                while let Some(x) = w.next() {
                    let (list, kind) = match *x {
                        "-p" => (&packages, "package"),
                        "--bin" => (&bins, "program"),
                        _ => continue,
                    };
                    let name = w.next().unwrap_or(&"");
                    if !list.iter().any(|n| n == name) {
                        bad.push(format!("{what}: no {kind} {name}"));
                    }
                }
                if tag == "bench"
                    && let Some(i) = words.iter().position(|w| *w == "--bin")
                {
                    let prog = bin.join(words[i + 1]);
                    let ok = Command::new(&prog).arg("--help").output().is_ok_and(|o| o.status.success());
                    if !ok {
                        bad.push(format!("{what}: {} --help failed", prog.display()));
                    }
                }
            }
            p if allowed(tag).contains(&p) => {}
            p if p.contains('/') => {
                let path = repo_root().join(p.trim_start_matches("./"));
                if !path.exists() && !Path::new(p).is_absolute() {
                    bad.push(format!("{what}: {p} is not in the repository"));
                }
            }
            p if !allowed(tag).contains(&p) => bad.push(format!("{what}: {p} is not a program `sh {tag}` allows")),
            _ => {}
        }
    }
    bad
}

fn docs() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    files
}

#[test]
fn tagged_commands_parse_and_name_what_exists() {
    let bin = bin_path("gpuprofctl").parent().unwrap().to_path_buf();
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in docs() {
        for b in blocks(&doc).iter().filter(|b| b.tag.is_some()) {
            bad.extend(check_tagged(b, &bin));
            checked += commands(&b.text).len();
        }
    }
    assert!(checked > 20, "{checked} commands checked");
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn commands_split_as_bash_would() {
    let text = "gpuprofctl session list; gpuprofctl session show 7   # two\nFOO=1 sudo dpkg -i x.deb\n\
                gpuprofctl export 7 -o - | head -c 100\nagent --seconds 5 &\ngpuprofctl query 7 --name '*a;b*'\n";
    assert_eq!(
        commands(text),
        [
            "gpuprofctl session list",
            "gpuprofctl session show 7",
            "dpkg -i x.deb",
            "gpuprofctl export 7 -o -",
            "head -c 100",
            "agent --seconds 5",
            "gpuprofctl query 7 --name '*a;b*'",
        ]
    );
}

#[test]
fn the_readme_runs_as_written_in_a_fresh_directory() {
    let dir = tempfile::tempdir().unwrap();
    let readme = repo_root().join("README.md");
    assert!(std::fs::read_to_string(&readme).unwrap().lines().count() < 200, "README.md stays under 200 lines");
    run_blocks(&readme, dir.path(), &[]);
    // The daemon it started kept its database where the README says.
    assert!(dir.path().join("state/gpuprof.db").exists());
    assert!(dir.path().join("first.pftrace").metadata().unwrap().len() > 1000);
    assert!(dir.path().join("home/.local/share/man/man1/gpuprofctl.1").exists());
}

/// A daemon for the guides: GPU 0 from a scripted NVML, six empty sessions, then session 7
/// with the records of two ranks of job `docs-job` and PC samples of a third process.
struct Prepared {
    d: TestDaemon,
    _agents: Vec<TracedAgent>,
    _pc: PcAgent,
}

fn prepared(dir: &Path) -> Prepared {
    let nvml = dir.join("nvml.json");
    std::fs::write(
        &nvml,
        r#"{"driver_version": "580.159.04", "cuda_version": "13.0", "devices": [
  {"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": "NVIDIA H100 80GB HBM3",
   "pci_bus_id": "00000000:1B:00.0", "memory_total_bytes": 85520809984, "mig_mode": "disabled",
   "power_limit_watts": 700, "compute_major": 9, "compute_minor": 0, "gpm_supported": true,
   "nvml": [{"gpu_utilization_percent": 100, "power_usage_watts": 650}],
   "gpm": [{"sm_active_percent": 40}, {"sm_active_percent": 60}]}]}"#,
    )
    .unwrap();
    let extra = format!("[metrics]\nfake_nvml = \"{}\"\ninterval = \"100ms\"\n", nvml.display());
    let d = start_daemon_config(dir, "0", &extra).unwrap();
    for i in 1..=6u64 {
        let v: serde_json::Value =
            serde_json::from_str(&ctl_ok(&d, &["--json", "session", "start", "--exe", "never-started"])).unwrap();
        assert_eq!(v["id"], i);
        ctl_ok(&d, &["session", "stop", &i.to_string()]);
    }
    let agents: Vec<TracedAgent> = (0..2)
        .map(|rank| {
            let cfg = TracedConfig {
                exe: "/usr/bin/python3".into(),
                cmdline: vec!["python3".into(), "train.py".into()],
                per_session: 3_000,
                rate: 100_000.0,
                batch: 500,
                seed: rank as u64 + 1,
                job: Some(gpuprof_proto::agent::JobIdentity {
                    launcher: "torchelastic".into(),
                    job_id: "docs-job".into(),
                    rank: Some(rank),
                    local_rank: Some(rank),
                    world_size: Some(2),
                    group_rank: None,
                    parent_pid: 1,
                }),
                ..Default::default()
            };
            TracedAgent::start(&d.agent_socket, cfg).unwrap()
        })
        .collect();
    let mut pc = PcAgent::connect(&d.agent_socket, "/usr/bin/python3", 1).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ctl_ok(&d, &["--json", "session", "start", "--exe", "python3", "--pc-sampling"]))
            .unwrap();
    assert_eq!(v["id"], 7);
    for a in &agents {
        assert_eq!(a.wait_event(Duration::from_secs(10)).unwrap(), Event::Started(7));
    }
    assert!(matches!(pc.command(Duration::from_secs(10)).unwrap(), PcCommand::Start(_)));
    let gemm = "_Z9gemm_tileILi128EEvPfS0_S0_";
    pc.batch(
        7,
        0,
        &[
            FakePc::new(gemm, 0x100, "smsp__pcsamp_warps_issue_stalled_long_scoreboard", 900, "/src/gemm.cu", 42),
            FakePc::new(gemm, 0x180, "smsp__pcsamp_warps_issue_stalled_barrier", 300, "/src/gemm.cu", 57),
        ],
        0,
    )
    .unwrap();
    let t = Instant::now();
    while agents.iter().any(|a| a.sent_for(7) < 3_000) || !ctl_ok(&d, &["pc", "top", "7"]).contains("1200 PC samples") {
        assert!(t.elapsed() < Duration::from_secs(30), "session 7's records and samples are stored");
        std::thread::sleep(Duration::from_millis(50));
    }
    ctl_ok(&d, &["session", "stop", "7"]);
    Prepared { d, _agents: agents, _pc: pc }
}

fn run_guide(name: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = prepared(dir.path());
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let env = [
        ("GPUPROF_API_SOCKET", p.d.api_socket.display().to_string()),
        ("GPUPROF_AGENT_SOCKET", p.d.agent_socket.display().to_string()),
        ("TORCHELASTIC_RUN_ID", "docs-job".to_string()),
    ];
    run_blocks(&repo_root().join("docs").join(name), &work, &env);
}

#[test]
fn the_users_guide_runs_as_written() {
    run_guide("user-guide.md");
}

#[test]
fn the_pc_sampling_guide_runs_as_written() {
    run_guide("pc-sampling.md");
}

#[test]
fn the_jobs_guide_runs_as_written() {
    run_guide("jobs.md");
}

#[test]
fn the_operators_guide_runs_as_written() {
    run_guide("operating.md");
}

#[test]
fn the_development_guide_runs_as_written() {
    run_guide("development.md");
}

#[test]
fn every_guide_is_run() {
    let run = ["user-guide.md", "pc-sampling.md", "jobs.md", "operating.md", "development.md"];
    for doc in docs().iter().skip(1) {
        let name = doc.file_name().unwrap().to_str().unwrap();
        let untagged = blocks(doc).iter().any(|b| b.tag.is_none());
        assert!(!untagged || run.contains(&name), "{name} has commands to run: add a test that runs it");
    }
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[test]
fn links_between_the_docs_point_at_files_and_headings() {
    let mut bad = Vec::new();
    let mut links = 0;
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            rest = &rest[end..];
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            links += 1;
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() { doc.clone() } else { doc.parent().unwrap().join(file) };
            let Ok(linked) = std::fs::read_to_string(&path) else {
                if !path.is_dir() {
                    bad.push(format!("{}: {target}: no such file", doc.display()));
                }
                continue;
            };
            let headings: Vec<String> =
                linked.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#'))).collect();
            if !frag.is_empty() && !headings.iter().any(|h| h == frag) {
                bad.push(format!("{}: {target}: no such heading (has {headings:?})", doc.display()));
            }
        }
    }
    assert!(links > 15, "{links} links");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Every ```toml block of the docs is a valid gpuprofd configuration (`gpuprofd check-config`,
/// which names a bad key), with the files it names under /etc/gpuprof made for it: a server
/// certificate and key, a token.
#[test]
fn toml_blocks_are_configurations_gpuprofd_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(&etc).unwrap();
    let server = rcgen::generate_simple_self_signed(vec!["gpu-node-17".to_string()]).unwrap();
    std::fs::write(etc.join("server.pem"), server.cert.pem()).unwrap();
    std::fs::write(etc.join("server.key"), server.signing_key.serialize_pem()).unwrap();
    std::fs::write(etc.join("collector-ca.pem"), server.cert.pem()).unwrap();
    std::fs::write(etc.join("token"), "0f3c9a7e51d24b6c8e2a9d4f7b1c6e3a0f3c9a7e51d24b6c8e2a9d4f7b1c6e3a\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        for f in ["server.key", "token"] {
            std::fs::set_permissions(etc.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
    let mut checked = 0;
    let mut bad = Vec::new();
    for doc in docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for (i, block) in text.split("```toml\n").skip(1).enumerate() {
            let toml = block.split("```").next().unwrap().replace("/etc/gpuprof/", &format!("{}/", etc.display()));
            let file = dir.path().join(format!("block-{checked}.toml"));
            std::fs::write(&file, &toml).unwrap();
            let o = Command::new(bin_path("gpuprofd")).arg("check-config").arg(&file).output().unwrap();
            if !o.status.success() {
                bad.push(format!("{} block {}: {}\n{toml}", doc.display(), i + 1, String::from_utf8_lossy(&o.stderr)));
            }
            checked += 1;
        }
    }
    assert!(checked >= 6, "{checked} blocks");
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}
