//! Configuration: embedded defaults, an optional TOML file, then environment and flags.
//!
//! Unknown keys are errors (a typo must not silently fall back to a default), and every
//! validation error names the key it is about.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

mod log_filter;
mod pc;

pub use pc::PcConfig;

/// The built-in defaults, also the reference for every key.
pub const DEFAULT_TOML: &str = include_str!("default.toml");

/// The whole daemon configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory of the database (`gpuprof.db`).
    pub state_dir: PathBuf,
    /// Agent socket path.
    pub agent_socket: PathBuf,
    /// API socket path.
    pub api_socket: PathBuf,
    /// Log filter.
    pub log_level: String,
    pub agent: AgentConfig,
    pub ingest: IngestConfig,
    pub storage: StorageConfig,
    pub api: ApiConfig,
    pub sampler: SamplerConfig,
    pub metrics: MetricsConfig,
    pub arbiter: ArbiterConfig,
    pub pc: PcConfig,
    pub retention: RetentionConfig,
    pub prometheus: PrometheusConfig,
    pub kubernetes: KubernetesConfig,
    pub otlp: OtlpConfig,
}

/// A duration written like "1ms", "300s", "5m", "24h" (humantime syntax).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub std::time::Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(s.trim())
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration like \"1ms\" or \"300s\": {e}")))
    }
}

/// The per-GPU PM samplers (`gpuprofd sampler --device N`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerConfig {
    pub enabled: bool,
    pub spawn: bool,
    /// Sample all the time (the monitor held whenever nothing outranks the sampler) instead of
    /// only while a lease asks for it (`pm watch --source cupti`).
    pub always_on: bool,
    /// An on-demand lease ends this long after its last renewal.
    pub lease_ttl: Dur,
    pub devices: Vec<u32>,
    pub metrics: Vec<String>,
    pub interval: Dur,
    pub program: String,
    pub cupti_library: String,
    pub hardware_buffer_mib: u32,
    pub restart_backoff_max: Dur,
    pub stream_queue: usize,
    /// PC sampling stopped by HARDWARE_BUSY (a profiler outside gpuprof took the monitor) asks
    /// for its lease again this long after.
    pub pc_busy_retry: Dur,
}

/// Always-on device metrics from NVML and GPM (`[metrics]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub enabled: bool,
    /// How often each GPU is read (100ms to 1h).
    pub interval: Dur,
    /// Samples are averaged over this window before they are stored (at least `interval`).
    pub store_interval: Dur,
    /// Read GPM metrics where the GPU supports them.
    pub gpm: bool,
    /// libnvidia-ml to load; empty: libnvidia-ml.so.1 from the loader's search path.
    pub nvml_library: String,
    /// A JSON script of devices and values played instead of NVML (tests).
    pub fake_nvml: String,
}

/// The performance-monitor arbiter.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArbiterConfig {
    pub default_pause: Dur,
    pub max_pause: Dur,
    pub external_retry_initial: Dur,
    pub external_retry_max: Dur,
}

/// A size written like "20GiB", "512MiB" or "0" (binary units B, KiB, MiB, GiB, TiB; decimal
/// kB, MB, GB, TB also accepted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl Size {
    pub fn parse(s: &str) -> std::result::Result<Size, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = (&t[..split], t[split..].trim());
        let mult: u64 = match unit {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            "kB" | "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            _ => return Err(format!("{s:?}: unknown unit {unit:?} (use B, KiB, MiB, GiB or TiB)")),
        };
        let v: f64 = num.parse().map_err(|_| format!("{s:?} is not a size like \"20GiB\" or \"512MiB\""))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("{s:?} is too large"));
        }
        Ok(Size(bytes as u64))
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(0) => Ok(Size(0)),
            Raw::Int(n) => {
                Err(serde::de::Error::custom(format!("{n} has no unit; write a string like \"{n}MiB\" or \"{n}GiB\"")))
            }
            Raw::Text(s) => Size::parse(&s).map_err(serde::de::Error::custom),
        }
    }
}

/// How long samples, sessions and records are kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    pub pm_full_rate: Dur,
    pub pm_rollup_width: Dur,
    pub pm_rollup_keep: Dur,
    pub interval: Dur,
    /// Finished sessions and records outside sessions older than this are deleted (0: kept).
    pub sessions_max_age: Dur,
    /// Past this size the oldest finished sessions are deleted (0: no limit).
    pub database_max_size: Size,
}

impl RetentionConfig {
    /// The size retention keeps the database under (0: none): `database_max_size`, and at
    /// most 90% of `storage.max_database_mib` when that hard cap is set (past it writes fail).
    pub fn max_bytes(&self, storage: &StorageConfig) -> u64 {
        let cap = storage.max_database_mib.saturating_mul(1 << 20) / 10 * 9;
        match (self.database_max_size.0, cap) {
            (0, cap) => cap,
            (size, 0) => size,
            (size, cap) => size.min(cap),
        }
    }
}

/// The Prometheus text endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    pub listen: String,
}

/// OTLP metrics export to an OpenTelemetry collector.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    pub endpoint: String,
    /// PC samples as OTLP profiles (see `otlp_profiles`).
    pub profiles: bool,
    pub interval: Dur,
    pub timeout: Dur,
    pub ca_file: String,
    pub client_cert_file: String,
    pub client_key_file: String,
}

/// Pod names and namespaces from the kubelet's pod list (pod UIDs come from cgroups without it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    pub kubelet_url: String,
    pub token_file: String,
    pub ca_file: String,
    pub insecure_skip_tls_verify: bool,
    pub timeout: Dur,
    pub refresh_min: Dur,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    pub max_frame_bytes: u32,
    pub heartbeat_interval_ms: u32,
    pub liveness_timeout_ms: u64,
    /// Publish the targets of the sessions that record API calls in the new-process hint (see
    /// `sessions::hints::publish_hint`; PC-sampling sessions' PC lines are published either way).
    pub api_from_start: bool,
    /// Ask every injected process to hook the runtime's API callbacks inside cuInit
    /// (`gpuprof_proto::hint::HOOK_LINE`), so that late traces record API calls by id (off by
    /// default: costs untraced processes 1–4 %).
    pub late_attach_hook: bool,
    /// Ask only the processes matching one of these (`"exe_name:python3"`, `"exe_pattern:*train*"`,
    /// `"cgroup:kubepods"`) to hook the runtime; see [`AgentConfig::hook_targets`].
    pub late_attach_hook_for: Vec<String>,
}

impl AgentConfig {
    /// `late_attach_hook_for` as (kind, value) pairs, each checked as a session target of that
    /// kind would be; the error names the entry and what is wrong with it.
    pub fn hook_targets(&self) -> Result<Vec<(&str, &str)>> {
        let mut out = Vec::new();
        for (i, t) in self.late_attach_hook_for.iter().enumerate() {
            let what = || format!("agent.late_attach_hook_for[{i}] {t:?}");
            let Some((kind, value)) = t.split_once(':') else {
                bail!(
                    "{}: write KIND:VALUE, KIND one of exe_name, exe_pattern, cgroup (e.g. \"exe_name:python3\")",
                    what()
                );
            };
            match kind {
                "exe_name" if value.is_empty() || value.contains('/') => {
                    bail!(
                        "{}: {value:?} is not an executable base name (e.g. \"python3\"); use exe_pattern for paths",
                        what()
                    )
                }
                "exe_pattern" => {
                    if let Err(e) = gpuprof_proto::glob::check(value) {
                        bail!("{}: {e}", what());
                    }
                }
                "exe_name" | "cgroup" => {}
                _ => bail!("{}: {kind:?} is not one of exe_name, exe_pattern, cgroup", what()),
            }
            if gpuprof_proto::hint::hook_line(kind, value).is_none() || value.is_empty() {
                bail!("{}: the value must be one line, not empty, without leading or trailing spaces", what());
            }
            out.push((kind, value));
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestConfig {
    pub queue_messages: usize,
    /// Records queued for the writer at most (bounds the queue's memory).
    pub queue_records: usize,
    pub commit_max_records: usize,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    pub cache_mib: u32,
    pub wal_autocheckpoint_pages: u32,
    /// Hard cap on the database size in MiB (0: none); beyond it writes fail like a full disk.
    pub max_database_mib: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    pub tcp_listen: String,
    pub admin_group: String,
    pub socket_mode: u32,
    /// Server certificate chain (PEM) for the API on TCP; empty: none.
    pub tls_cert_file: PathBuf,
    /// Private key (PEM) of `tls_cert_file`.
    pub tls_key_file: PathBuf,
    /// CA (PEM) that TCP clients' certificates must chain to (mTLS); empty: no client certificates.
    pub client_ca_file: PathBuf,
    /// File holding the bearer token TCP clients must present; empty: no token.
    pub token_file: PathBuf,
}

impl ApiConfig {
    /// With `tcp_listen` set: TLS (certificate and key) and at least one way for callers to
    /// authenticate (client certificates or a token) are required, and every file must be
    /// readable. The contents are checked when the API starts (`TcpSecurity::load` in the `api` module).
    fn validate_tcp(&self) -> Result<()> {
        if self.tcp_listen.is_empty() {
            return Ok(());
        }
        let set = |p: &Path| !p.as_os_str().is_empty();
        if !set(&self.tls_cert_file) || !set(&self.tls_key_file) {
            bail!(
                "api.tcp_listen is set, so api.tls_cert_file and api.tls_key_file (PEM) are required: \
                 the API is served on TCP with TLS only"
            );
        }
        if !set(&self.client_ca_file) && !set(&self.token_file) {
            bail!(
                "api.tcp_listen is set, so api.token_file or api.client_ca_file (or both) is required: \
                 TCP callers must present a bearer token or a client certificate"
            );
        }
        for (key, p) in [
            ("api.tls_cert_file", &self.tls_cert_file),
            ("api.tls_key_file", &self.tls_key_file),
            ("api.client_ca_file", &self.client_ca_file),
            ("api.token_file", &self.token_file),
        ] {
            if set(p)
                && let Err(e) = std::fs::read(p)
            {
                bail!("{key}: cannot read {}: {e}", p.display());
            }
        }
        Ok(())
    }
}

/// Values from flags and environment that override the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// Put the database and both sockets in this directory.
    pub state_dir: Option<PathBuf>,
    pub log_level: Option<String>,
    pub agent_socket: Option<PathBuf>,
    pub api_socket: Option<PathBuf>,
}

impl Config {
    /// Parses a TOML document layered over the defaults: keys missing from `text` keep
    /// their default value.
    pub fn from_toml(text: &str) -> Result<Config> {
        // The embedded defaults are parsed once (10 KB of TOML; a reload or `check-config` need
        // not parse them again).
        static DEFAULTS: std::sync::LazyLock<toml::Table> =
            std::sync::LazyLock::new(|| DEFAULT_TOML.parse().expect("embedded defaults are valid TOML"));
        let mut base = DEFAULTS.clone();
        let overlay: toml::Table = text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("{e}"))?;
        merge(&mut base, overlay);
        let cfg: Config = serde_path_to_error::deserialize(toml::Value::Table(base)).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if path == "." {
                anyhow::anyhow!("{}", inner.message())
            } else {
                anyhow::anyhow!("{path}: {}", inner.message())
            }
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Loads the file (if any) and applies overrides.
    pub fn load(file: Option<&Path>, ov: &Overrides) -> Result<Config> {
        let mut cfg = match file {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).with_context(|| format!("reading config file {}", p.display()))?;
                Config::from_toml(&text).with_context(|| format!("invalid config file {}", p.display()))?
            }
            None => Config::from_toml("")?,
        };
        if let Some(dir) = &ov.state_dir {
            cfg.state_dir = dir.clone();
            cfg.agent_socket = dir.join("agent.sock");
            cfg.api_socket = dir.join("api.sock");
        }
        if let Some(p) = &ov.agent_socket {
            cfg.agent_socket = p.clone();
        }
        if let Some(p) = &ov.api_socket {
            cfg.api_socket = p.clone();
        }
        if let Some(l) = &ov.log_level {
            cfg.log_level = l.clone();
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Path of the SQLite database.
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("gpuprof.db")
    }

    fn validate(&self) -> Result<()> {
        self.pc.validate()?;
        if self.agent.max_frame_bytes < 1024 || self.agent.max_frame_bytes > 256 << 20 {
            bail!("agent.max_frame_bytes must be between 1024 and 268435456, got {}", self.agent.max_frame_bytes);
        }
        self.agent.hook_targets()?;
        if self.agent.heartbeat_interval_ms == 0 {
            bail!("agent.heartbeat_interval_ms must be greater than 0");
        }
        if self.agent.liveness_timeout_ms < 2 * u64::from(self.agent.heartbeat_interval_ms) {
            bail!(
                "agent.liveness_timeout_ms ({}) must be at least twice agent.heartbeat_interval_ms ({})",
                self.agent.liveness_timeout_ms,
                self.agent.heartbeat_interval_ms
            );
        }
        if self.ingest.queue_messages == 0 {
            bail!("ingest.queue_messages must be greater than 0");
        }
        if self.ingest.queue_records < 8192 || self.ingest.queue_records > 1 << 30 {
            bail!(
                "ingest.queue_records must be between 8192 (one full agent batch) and 1073741824, not {}",
                self.ingest.queue_records
            );
        }
        if self.ingest.commit_max_records == 0 {
            bail!("ingest.commit_max_records must be greater than 0");
        }
        if self.storage.cache_mib == 0 {
            bail!("storage.cache_mib must be greater than 0");
        }
        if self.api.socket_mode > 0o777 {
            bail!("api.socket_mode must be a file mode like 0o660, got {:#o}", self.api.socket_mode);
        }
        if !self.api.tcp_listen.is_empty() && self.api.tcp_listen.parse::<std::net::SocketAddr>().is_err() {
            bail!("api.tcp_listen must be an address like \"0.0.0.0:7461\", got {:?}", self.api.tcp_listen);
        }
        self.api.validate_tcp()?;
        self.validate_pm()?;
        let k = &self.kubernetes;
        let url = &k.kubelet_url;
        if !(url.is_empty() || url.starts_with("https://") || url.starts_with("http://")) {
            bail!(
                "kubernetes.kubelet_url must be an http:// or https:// URL like \"https://127.0.0.1:10250/pods\", got {:?}",
                k.kubelet_url
            );
        }
        if k.timeout.0.is_zero() {
            bail!("kubernetes.timeout must be greater than 0");
        }
        let o = &self.otlp;
        if !(o.endpoint.is_empty() || o.endpoint.starts_with("http://") || o.endpoint.starts_with("https://")) {
            bail!(
                "otlp.endpoint must be like \"http://127.0.0.1:4317\" or \"https://collector:4317\", got {:?}",
                o.endpoint
            );
        }
        if o.interval.0 < std::time::Duration::from_secs(1) {
            bail!("otlp.interval must be at least 1s, got {:?}", o.interval.0);
        }
        if o.timeout.0.is_zero() {
            bail!("otlp.timeout must be greater than 0");
        }
        if o.client_cert_file.is_empty() != o.client_key_file.is_empty() {
            bail!("otlp.client_cert_file and otlp.client_key_file go together: set both or neither");
        }
        if let Err(e) = log_filter::check_field_values(&self.log_level) {
            bail!("log_level {:?}: {e}", self.log_level);
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            bail!("log_level {:?} is not a valid filter: {e}", self.log_level);
        }
        Ok(())
    }
}

impl Config {
    /// Checks of the sampler, arbiter, retention and prometheus sections.
    fn validate_pm(&self) -> Result<()> {
        use std::time::Duration;
        let s = &self.sampler;
        let iv = s.interval.0;
        if iv < Duration::from_micros(100) || iv > Duration::from_secs(1) {
            bail!("sampler.interval must be between 100us and 1s, got {iv:?}");
        }
        if s.enabled && s.metrics.is_empty() {
            bail!("sampler.metrics must name at least one metric");
        }
        for (i, m) in s.metrics.iter().enumerate() {
            if m.is_empty() || !m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
                bail!("sampler.metrics[{i}]: {m:?} is not a metric name like \"sm__cycles_active.avg\"");
            }
            if s.metrics[..i].contains(m) {
                bail!("sampler.metrics[{i}]: {m:?} is listed twice");
            }
        }
        if s.hardware_buffer_mib == 0 || s.hardware_buffer_mib > 4096 {
            bail!("sampler.hardware_buffer_mib must be between 1 and 4096, got {}", s.hardware_buffer_mib);
        }
        if s.stream_queue < 16 {
            bail!("sampler.stream_queue must be at least 16, got {}", s.stream_queue);
        }
        if s.restart_backoff_max.0 < Duration::from_secs(1) {
            bail!("sampler.restart_backoff_max must be at least 1s");
        }
        if s.lease_ttl.0 < Duration::from_secs(1) {
            bail!("sampler.lease_ttl must be at least 1s, got {:?}", s.lease_ttl.0);
        }
        let m = &self.metrics;
        if m.interval.0 < Duration::from_millis(100) || m.interval.0 > Duration::from_secs(3600) {
            bail!(
                "metrics.interval must be between 100ms and 1h (GPM reads less than 100ms apart are not reliable), got {:?}",
                m.interval.0
            );
        }
        if m.store_interval.0 < m.interval.0 {
            bail!(
                "metrics.store_interval ({:?}) must be at least metrics.interval ({:?})",
                m.store_interval.0,
                m.interval.0
            );
        }
        let a = &self.arbiter;
        if a.default_pause.0.is_zero() || a.default_pause.0 > a.max_pause.0 {
            bail!("arbiter.default_pause must be greater than 0 and at most arbiter.max_pause");
        }
        if a.external_retry_initial.0 < Duration::from_millis(10) || a.external_retry_initial.0 > a.external_retry_max.0
        {
            bail!("arbiter.external_retry_initial must be at least 10ms and at most arbiter.external_retry_max");
        }
        let r = &self.retention;
        if r.pm_rollup_width.0 < Duration::from_millis(1) {
            bail!("retention.pm_rollup_width must be at least 1ms");
        }
        if r.pm_full_rate.0 < r.pm_rollup_width.0 {
            bail!("retention.pm_full_rate must be at least retention.pm_rollup_width");
        }
        if r.pm_rollup_keep.0 < r.pm_full_rate.0 {
            bail!("retention.pm_rollup_keep must be at least retention.pm_full_rate");
        }
        if r.interval.0 < Duration::from_millis(100) {
            bail!("retention.interval must be at least 100ms");
        }
        if !r.sessions_max_age.0.is_zero() && r.sessions_max_age.0 < Duration::from_secs(1) {
            bail!("retention.sessions_max_age must be 0 (keep forever) or at least 1s");
        }
        let size = r.database_max_size.0;
        if size != 0 && size < 1 << 20 {
            bail!("retention.database_max_size must be 0 (no limit) or at least 1MiB, got {size} bytes");
        }
        if !self.prometheus.listen.is_empty() && self.prometheus.listen.parse::<std::net::SocketAddr>().is_err() {
            bail!("prometheus.listen must be an address like \"127.0.0.1:9464\", got {:?}", self.prometheus.listen);
        }
        Ok(())
    }
}

fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (k, v) in overlay {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests;
