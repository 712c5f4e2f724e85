//! Settings read from the environment once, when the library initialises.

use std::path::PathBuf;
use std::time::Duration;

/// Default agent socket of the daemon.
pub const DEFAULT_SOCKET: &str = "/run/gpuprof/agent.sock";

#[derive(Debug, Clone)]
pub struct Config {
    /// `GPUPROF_AGENT_SOCKET`.
    pub socket: PathBuf,
    /// `GPUPROF_BUFFER_KB`: size of each activity buffer handed to CUPTI.
    pub buffer_bytes: usize,
    /// `GPUPROF_MAX_BUFFERS`: cap on buffers alive at once (CUPTI drops records past it).
    pub max_buffers: usize,
    /// Default flush period while tracing (`TraceConfig.flush_interval_ms` overrides).
    pub flush_interval: Duration,
    /// Longest wait at exit for the last records to reach the daemon.
    pub exit_timeout: Duration,
    /// Longest reconnect backoff.
    pub max_backoff: Duration,
    /// `GPUPROF_TRACE_SKIP`: parts of any trace configuration this process never enables
    /// (comma separated: runtime_api, driver_api, memcpy, memset, sync, overhead, nvtx,
    /// external_correlation, graphs), e.g. to keep an expensive kind off one workload.
    pub skip: Vec<String>,
    /// `GPUPROF_CUPTI_ZEROED`: activity buffers are handed to CUPTI already zeroed (zeroed on
    /// the background thread when they come back), and CUPTI is told so
    /// (`CUPTI_ACTIVITY_ATTR_ZEROED_OUT_ACTIVITY_BUFFER`) instead of zeroing each buffer on the
    /// application thread that asks for it. Default: on. (Before the stop moved onto the
    /// application's thread, pre-zeroed buffers and `cuptiFinalize` together corrupted the heap
    /// of a PyTorch process stopped while it launched kernels; since, 30 of 30 such stops were
    /// clean on the H100.)
    pub zeroed_buffers: bool,
    /// `GPUPROF_PREFILL_BUFFERS`: buffers allocated and zeroed at trace start, so the first
    /// requests do not fault in fresh pages on the application thread.
    pub prefill_buffers: usize,
    /// `GPUPROF_CUPTI_PINNED` (0/1): CUPTI's per-context profiling buffers in pinned host memory
    /// instead of device memory (`CUPTI_ACTIVITY_ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED`); unset
    /// keeps CUPTI's default.
    pub cupti_pinned: Option<bool>,
    /// `GPUPROF_CUPTI_DEVICE_BUFFER_MB`: size of each of CUPTI's per-context profiling buffers
    /// (`CUPTI_ACTIVITY_ATTR_DEVICE_BUFFER_SIZE`); unset keeps CUPTI's default (~3 MB).
    pub cupti_device_buffer: Option<usize>,
    /// `GPUPROF_API_MODE`: how API recording is switched on (see [`ApiMode`]).
    pub api_mode: ApiMode,
    /// `GPUPROF_API_AT_INIT` (0/1): switch the recorded runtime callback ids on inside `cuInit`
    /// always (1) or never (0); unset follows the daemon's hint ([`gpuprof_proto::hint`]).
    pub api_at_init: Option<bool>,
    /// `GPUPROF_API_HOOK` (0/1): when the recorded ids are not switched on inside `cuInit`,
    /// hook the runtime's API callbacks there (always/never), so that a later trace records
    /// runtime API calls by callback id ([`crate::tracer::hook_runtime`]); unset: as the
    /// daemon's hint asks ([`gpuprof_proto::hint::HOOK_LINE`]).
    pub api_hook: Option<bool>,
    /// `GPUPROF_DETACH`: how a trace leaves CUPTI when it stops (see [`DetachMode`]).
    pub detach: DetachMode,
    /// `GPUPROF_NCCL_KERNEL_TIMES` (0/1, default 1): while a trace runs, ask NCCL (through the
    /// profiler plugin) for each collective's start and end in its kernel, not only its enqueue.
    pub nccl_kernel_times: bool,
}

/// How a stopped trace leaves the process's CUPTI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DetachMode {
    /// `finalize` (default): the whole stop (kinds and callback ids off, the trace's work
    /// waited for, the last flush, `cuptiFinalize`) on the application's thread at the exit of
    /// its next CUDA synchronization, so no CUPTI hook stays in the process and nothing of
    /// CUPTI changes under the application's launches; the next trace initialises CUPTI again
    /// (see `tracer::detach`).
    #[default]
    Finalize,
    /// `off`: kinds and callback ids switched off from the library's thread only; CUPTI stays
    /// attached (a late-attached process keeps paying for CUPTI's runtime hooks, 1.2–1.4x on
    /// launch-bound loops).
    Off,
}

impl DetachMode {
    fn parse(s: &str) -> Option<DetachMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "finalize" | "callback" => Some(DetachMode::Finalize),
            "off" | "none" => Some(DetachMode::Off),
            _ => None,
        }
    }
}

/// How a trace switches on the API records it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiMode {
    /// `kind` (default): enable the whole RUNTIME/DRIVER activity kind, then switch off the
    /// callback ids gpuprof does not record.
    #[default]
    Kind,
    /// `cbid`: only switch on the recorded callback ids. Records nothing when the trace starts
    /// after the CUDA runtime initialised (a late attach, or most PyTorch processes).
    Cbid,
}

impl ApiMode {
    fn parse(s: &str) -> Option<ApiMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "kind" => Some(ApiMode::Kind),
            "cbid" => Some(ApiMode::Cbid),
            _ => None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from(DEFAULT_SOCKET),
            buffer_bytes: 4 << 20,
            max_buffers: 64,
            flush_interval: Duration::from_millis(250),
            exit_timeout: Duration::from_millis(800),
            max_backoff: Duration::from_secs(5),
            skip: Vec::new(),
            zeroed_buffers: true,
            prefill_buffers: 4,
            cupti_pinned: None,
            cupti_device_buffer: None,
            api_mode: ApiMode::Kind,
            api_at_init: None,
            api_hook: None,
            detach: DetachMode::Finalize,
            nccl_kernel_times: true,
        }
    }
}

impl Config {
    pub fn from_env() -> Config {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Config {
        let mut c = Config::default();
        if let Some(s) = get("GPUPROF_AGENT_SOCKET").filter(|s| !s.is_empty()) {
            c.socket = PathBuf::from(s);
        }
        if let Some(kb) = get("GPUPROF_BUFFER_KB").and_then(|s| s.parse::<usize>().ok()) {
            c.buffer_bytes = kb.clamp(64, 64 << 10) << 10;
        }
        if let Some(n) = get("GPUPROF_MAX_BUFFERS").and_then(|s| s.parse::<usize>().ok()) {
            c.max_buffers = n.clamp(2, 4096);
        }
        if let Some(s) = get("GPUPROF_TRACE_SKIP") {
            c.skip = s.split(',').map(|p| p.trim().to_ascii_lowercase()).filter(|p| !p.is_empty()).collect();
        }
        if let Some(m) = get("GPUPROF_DETACH").and_then(|m| DetachMode::parse(&m)) {
            c.detach = m;
        }
        let flag = |k: &str| get(k).map(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"));
        c.zeroed_buffers = flag("GPUPROF_CUPTI_ZEROED").unwrap_or(true);
        if let Some(n) = get("GPUPROF_PREFILL_BUFFERS").and_then(|s| s.parse::<usize>().ok()) {
            c.prefill_buffers = n;
        }
        c.prefill_buffers = c.prefill_buffers.min(c.max_buffers);
        c.cupti_pinned = flag("GPUPROF_CUPTI_PINNED");
        if let Some(m) = get("GPUPROF_API_MODE").and_then(|m| ApiMode::parse(&m)) {
            c.api_mode = m;
        }
        c.api_at_init = flag("GPUPROF_API_AT_INIT");
        c.api_hook = flag("GPUPROF_API_HOOK");
        c.nccl_kernel_times = flag("GPUPROF_NCCL_KERNEL_TIMES").unwrap_or(true);
        if let Some(mb) = get("GPUPROF_CUPTI_DEVICE_BUFFER_MB").and_then(|s| s.parse::<usize>().ok()) {
            c.cupti_device_buffer = Some(mb.clamp(1, 1024) << 20);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn env_overrides_and_clamps() {
        let c = Config::from_lookup(|k| match k {
            "GPUPROF_AGENT_SOCKET" => Some("/tmp/x.sock".into()),
            "GPUPROF_BUFFER_KB" => Some("1".into()),
            "GPUPROF_MAX_BUFFERS" => Some("bogus".into()),
            _ => None,
        });
        assert_eq!(c.socket, PathBuf::from("/tmp/x.sock"));
        assert_eq!(c.buffer_bytes, 64 << 10);
        assert_eq!(c.max_buffers, Config::default().max_buffers);
        assert_eq!(Config::from_lookup(|_| None).socket, PathBuf::from(DEFAULT_SOCKET));
    }

    #[test]
    fn cupti_buffer_settings() {
        let d = Config::from_lookup(|_| None);
        assert!(d.zeroed_buffers && d.cupti_pinned.is_none() && d.cupti_device_buffer.is_none());
        let zeroed = |detach: &str, z: Option<&str>| {
            Config::from_lookup(|k| match k {
                "GPUPROF_DETACH" => Some(detach.into()),
                "GPUPROF_CUPTI_ZEROED" => z.map(Into::into),
                _ => None,
            })
            .zeroed_buffers
        };
        assert!(zeroed("finalize", None) && zeroed("off", None), "pre-zeroed buffers whatever the detach");
        assert!(zeroed("finalize", Some("1")) && !zeroed("off", Some("0")), "the variable decides when set");
        assert_eq!(d.api_mode, ApiMode::Kind);
        let mode = |v: &str| Config::from_lookup(|k| (k == "GPUPROF_API_MODE").then(|| v.into())).api_mode;
        assert_eq!(mode("cbid"), ApiMode::Cbid);
        assert_eq!(mode(" CBID "), ApiMode::Cbid);
        assert_eq!(mode("bogus"), ApiMode::Kind, "an unknown mode keeps the default");
        let c = Config::from_lookup(|k| match k {
            "GPUPROF_CUPTI_ZEROED" => Some("0".into()),
            "GPUPROF_CUPTI_PINNED" => Some("1".into()),
            "GPUPROF_CUPTI_DEVICE_BUFFER_MB" => Some("32".into()),
            "GPUPROF_MAX_BUFFERS" => Some("3".into()),
            "GPUPROF_PREFILL_BUFFERS" => Some("10".into()),
            "GPUPROF_API_AT_INIT" => Some("0".into()),
            "GPUPROF_API_HOOK" => Some("1".into()),
            _ => None,
        });
        assert_eq!(c.api_at_init, Some(false));
        assert_eq!(d.api_at_init, None, "unset: the daemon's hint decides");
        assert_eq!(c.api_hook, Some(true));
        assert_eq!(d.api_hook, None, "unset: the daemon's hint decides");
        assert!(!c.zeroed_buffers);
        assert_eq!(c.cupti_pinned, Some(true));
        assert_eq!(c.cupti_device_buffer, Some(32 << 20));
        assert_eq!(c.prefill_buffers, 3, "never more than the cap");
    }

    #[test]
    fn detach_mode() {
        let mode = |v: &str| Config::from_lookup(|k| (k == "GPUPROF_DETACH").then(|| v.into())).detach;
        assert_eq!(Config::from_lookup(|_| None).detach, DetachMode::Finalize);
        assert_eq!(mode("finalize"), DetachMode::Finalize);
        assert_eq!(mode("callback"), DetachMode::Finalize);
        assert_eq!(mode(" OFF "), DetachMode::Off);
        assert_eq!(mode("none"), DetachMode::Off);
        assert_eq!(mode("bogus"), DetachMode::Finalize, "an unknown mode keeps the default");
    }
}
