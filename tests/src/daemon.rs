//! Runs the real `gpuprofd` and `gpuprofctl` binaries for tests and benchmarks.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

static BUILD: Once = Once::new();

/// Path of a workspace binary built with the same profile as the running executable;
/// builds the daemon, its sampler and the client first (a no-op when they are fresh).
pub fn bin_path(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/test-xxxx or target/<profile>/bench-binary
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let release = dir.file_name().is_some_and(|n| n == "release");
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-q", "-p", "gpuprofd", "-p", "gpuprof-sampler", "-p", "gpuprofctl"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("running cargo build");
        assert!(st.success(), "cargo build of gpuprofd/gpuprof-sampler/gpuprofctl failed");
    });
    let p = dir.join(name);
    assert!(p.exists(), "{} was not built", p.display());
    p
}

/// A `gpuprofd --state-dir DIR` child process.
pub struct TestDaemon {
    pub child: Child,
    pub state_dir: PathBuf,
    pub agent_socket: PathBuf,
    pub api_socket: PathBuf,
    pub log: PathBuf,
}

impl TestDaemon {
    /// Starts the daemon in `state_dir` and waits until its API answers.
    pub fn start(state_dir: &Path) -> Result<TestDaemon> {
        Self::start_with(state_dir, &[])
    }

    /// Like [`start`](Self::start) with extra command-line arguments.
    pub fn start_with(state_dir: &Path, args: &[&str]) -> Result<TestDaemon> {
        Self::start_opts(state_dir, args, &[])
    }

    /// Like [`start`](Self::start) with extra arguments and environment variables.
    pub fn start_opts(state_dir: &Path, args: &[&str], envs: &[(&str, &str)]) -> Result<TestDaemon> {
        Self::start_logged(state_dir, args, envs, &state_dir.join("gpuprofd.log"))
    }

    /// Like [`start_opts`](Self::start_opts) with the log at `log` (outside a state directory
    /// that a test fills up, for one).
    pub fn start_logged(state_dir: &Path, args: &[&str], envs: &[(&str, &str)], log: &Path) -> Result<TestDaemon> {
        std::fs::create_dir_all(state_dir)?;
        let log = log.to_path_buf();
        let logf = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        let child = Command::new(bin_path("gpuprofd"))
            .arg("--state-dir")
            .arg(state_dir)
            .args(args)
            .envs(envs.iter().copied())
            .env("GPUPROF_LOG", std::env::var("GPUPROF_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(logf)
            .spawn()
            .context("spawning gpuprofd")?;
        let mut d = TestDaemon {
            child,
            state_dir: state_dir.to_path_buf(),
            agent_socket: state_dir.join("agent.sock"),
            api_socket: state_dir.join("api.sock"),
            log,
        };
        d.wait_ready(Duration::from_secs(30))?;
        Ok(d)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let t = Instant::now();
        while t.elapsed() < timeout {
            if let Some(st) = self.child.try_wait()? {
                bail!("gpuprofd exited early ({st}); log:\n{}", self.log_text());
            }
            if std::os::unix::net::UnixStream::connect(&self.api_socket).is_ok()
                && std::os::unix::net::UnixStream::connect(&self.agent_socket).is_ok()
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("gpuprofd not ready after {timeout:?}; log:\n{}", self.log_text())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn db_path(&self) -> PathBuf {
        self.state_dir.join("gpuprof.db")
    }

    /// Runs `gpuprofctl --socket <api> ARGS`.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bin_path("gpuprofctl"))
            .arg("--socket")
            .arg(&self.api_socket)
            .args(args)
            .output()
            .expect("running gpuprofctl")
    }

    /// `gpuprofctl status --json`, parsed.
    pub fn status(&self) -> Result<serde_json::Value> {
        let out = self.ctl(&["status", "--json"]);
        if !out.status.success() {
            bail!("gpuprofctl status failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Polls `status` every 100 ms until `ok` holds and returns that status; panics with
    /// `what` and the last status after 60 s.
    pub fn wait_status(&self, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let t = std::time::Instant::now();
        loop {
            let st = self.status().expect("gpuprofctl status");
            if ok(&st) {
                return st;
            }
            assert!(t.elapsed() < std::time::Duration::from_secs(60), "{what}: {st}");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Sends SIGTERM and waits for exit; returns the exit code.
    pub fn terminate(mut self) -> Result<i32> {
        // Safety: plain syscall on our own child's pid.
        unsafe_kill(self.child.id(), libc::SIGTERM);
        let st = self.child.wait()?;
        Ok(st.code().unwrap_or(-1))
    }

    /// SIGHUP: the daemon reloads its configuration and goes on.
    pub fn hangup(&self) {
        unsafe_kill(self.child.id(), libc::SIGHUP);
    }

    /// SIGKILL, no cleanup.
    pub fn kill9(mut self) {
        unsafe_kill(self.child.id(), libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Peak and current resident set size in bytes (VmHWM, VmRSS).
    pub fn rss(&self) -> (u64, u64) {
        proc_rss(self.child.id())
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[allow(unsafe_code)]
fn unsafe_kill(pid: u32, sig: i32) {
    // Safety: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// (VmHWM, VmRSS) of a process in bytes.
pub fn proc_rss(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}
