//! `gpuprof-sampler --device N`: the per-GPU PM sampler, a child process of `gpuprofd`.
//!
//! It connects to the daemon's agent socket as an `AGENT_KIND_SAMPLER` agent and waits for
//! commands: `StartPmSampling` takes the device's performance monitor and samples the given
//! metrics at the given interval, `StopPmSampling` stops and releases the hardware (CUPTI's
//! profiler is deinitialized too, so Nsight Compute or DCGM can take the device). Three
//! threads: the main thread reads commands, the CUPTI thread owns every CUPTI call and
//! decodes the hardware buffer periodically, and the writer thread sends frames (samples,
//! states, heartbeats) on the socket. CUPTI faults kill only this process; the daemon
//! restarts it.
//!
//! `--check` validates a metric set on the device (exit 2 names the offending metric);
//! `--print SECONDS` samples without a daemon and prints values (for diagnosing a machine).

use std::io::{BufReader, BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use gpuprof_proto::agent::{
    self as wire, AgentMessage, DaemonMessage, PROTOCOL_VERSION, PmSample, PmSampleBatch, SamplerStatus,
    agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{DEFAULT_MAX_FRAME_BYTES, read_message, write_frame};

use gpuprof_cupti::clock::{monotonic_ns, realtime_ns as now_ns};
use gpuprof_cupti::device::{DeviceFacts, Driver};
use gpuprof_cupti::pm::{DecodeStop, Host, MetricNames, PmSampling};
use gpuprof_cupti::{Cupti, CuptiError as CallError, Purpose};

/// Command-line arguments of `gpuprof-sampler`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "gpuprof-sampler", version, about = "gpuprof's per-GPU PM sampler (started by gpuprofd)")]
pub struct SamplerArgs {
    /// Device index (CUDA ordinal with CUDA_DEVICE_ORDER=PCI_BUS_ID, as nvidia-smi numbers GPUs).
    #[arg(long)]
    pub device: u32,
    /// The daemon's agent socket.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// libcupti to load (default: GPUPROF_CUPTI_LIBRARY, CUDA_HOME, the usual CUDA places).
    #[arg(long, value_name = "PATH")]
    pub cupti: Option<PathBuf>,
    /// Hardware buffer size in MiB.
    #[arg(long, default_value_t = 256)]
    pub hardware_buffer_mib: u32,
    /// Only check that --metrics can be sampled together on the device, then exit
    /// (0: ok, 2: refused, with the metric named; 3: CUPTI unusable).
    #[arg(long)]
    pub check: bool,
    /// Sample without a daemon for this many seconds and print the values.
    #[arg(long, value_name = "SECONDS")]
    pub print: Option<f64>,
    /// Metrics for --check and --print (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Interval for --print, e.g. "1ms".
    #[arg(long, default_value = "1ms")]
    pub interval: String,
}

/// Exit codes.
const EXIT_REFUSED: u8 = 2;
const EXIT_NO_CUPTI: u8 = 3;

/// Runs the sampler child.
pub(crate) fn main(args: SamplerArgs) -> ExitCode {
    if args.check {
        return check_main(&args);
    }
    if let Some(secs) = args.print {
        return print_main(&args, secs);
    }
    let Some(socket) = args.socket.clone() else {
        eprintln!("gpuprof-sampler: --socket PATH is required (or use --check / --print)");
        return ExitCode::from(EXIT_REFUSED);
    };
    match run(&args, &socket) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuprof-sampler (device {}): {e}", args.device);
            ExitCode::FAILURE
        }
    }
}

/// A metric set that cannot be sampled, with the reason naming the metric.
#[derive(Debug)]
pub enum Refusal {
    /// CUPTI or the device is unusable.
    Cupti(String),
    /// The metric set is refused.
    Metrics(String),
}

/// Checks a metric set on a device: every metric known to the chip, one pass in all.
/// Returns the chip name.
pub fn check_metrics(cupti: &Cupti, device: u32, metrics: &[String]) -> Result<String, Refusal> {
    if metrics.is_empty() {
        return Err(Refusal::Metrics("no metric given".into()));
    }
    cupti.profiler_initialize().map_err(|e| Refusal::Cupti(e.to_string()))?;
    let chip = cupti.chip_name(device).map_err(|e| Refusal::Cupti(e.to_string()))?;
    let avail = cupti.counter_availability(device).map_err(|e| Refusal::Cupti(e.to_string()))?;
    // The passes a set of metrics needs; a metric the chip lacks fails to be added.
    let passes = |set: &[String]| -> Result<usize, Refusal> {
        let h = Host::new(cupti, &chip, avail.clone()).map_err(|e| Refusal::Cupti(e.to_string()))?;
        let mut names = MetricNames::new(set).map_err(Refusal::Metrics)?;
        if let Err(e) = h.add_metrics(&mut names) {
            return Err(Refusal::Metrics(if set.len() == 1 {
                format!("metric {:?} is not available on {chip} ({})", set[0], e.name())
            } else {
                format!("{}: {e}", set.join(", "))
            }));
        }
        let mut img = h.config_image().map_err(|e| Refusal::Cupti(e.to_string()))?;
        h.num_passes(&mut img).map_err(|e| Refusal::Cupti(e.to_string()))
    };
    for m in metrics {
        let alone = passes(std::slice::from_ref(m))?;
        if alone > 1 {
            return Err(Refusal::Metrics(format!(
                "metric {m:?} needs {alone} passes on {chip}; PM sampling collects single-pass metrics only"
            )));
        }
    }
    let all = passes(metrics)?;
    if all > 1 {
        for i in 1..metrics.len() {
            let n = passes(&metrics[..=i])?;
            if n > 1 {
                return Err(Refusal::Metrics(format!(
                    "metric {:?} does not fit in one pass together with {} on {chip} ({n} passes); \
                     sample fewer metrics",
                    metrics[i],
                    metrics[..i].join(", ")
                )));
            }
        }
        return Err(Refusal::Metrics(format!("the metric set needs {all} passes on {chip}")));
    }
    Ok(chip)
}

fn check_main(args: &SamplerArgs) -> ExitCode {
    let cupti = match load(args) {
        Ok(c) => c,
        Err(e) => {
            println!("{e}");
            return ExitCode::from(EXIT_NO_CUPTI);
        }
    };
    let r = check_metrics(&cupti, args.device, &args.metrics);
    let _ = cupti.profiler_deinitialize();
    match r {
        Ok(chip) => {
            println!("GPU {} ({chip}): {} metrics, one pass: ok", args.device, args.metrics.len());
            ExitCode::SUCCESS
        }
        Err(Refusal::Metrics(m)) => {
            println!("GPU {}: {m}", args.device);
            ExitCode::from(EXIT_REFUSED)
        }
        Err(Refusal::Cupti(m)) => {
            println!("GPU {}: cannot use CUPTI: {m}", args.device);
            ExitCode::from(EXIT_NO_CUPTI)
        }
    }
}

fn load(args: &SamplerArgs) -> Result<Cupti, String> {
    // The driver must be initialized before CUPTI's profiler calls.
    let _driver = Driver::load_and_init()?;
    std::mem::forget(_driver);
    load_cupti(args.cupti.as_deref())
}

/// libcupti for PM sampling: the configured file, or the shared search (`GPUPROF_CUPTI_LIBRARY`,
/// `CUDA_HOME`, the usual CUDA places); its PM-sampling functions checked.
fn load_cupti(explicit: Option<&std::path::Path>) -> Result<Cupti, String> {
    let cupti = match explicit {
        Some(p) => Cupti::load_path(p, Purpose::PmSampling),
        None => Cupti::load(Purpose::PmSampling),
    }
    .map_err(|e| format!("cannot load libcupti (set sampler.cupti_library or GPUPROF_CUPTI_LIBRARY): {e}"))?;
    cupti.check_pm_sampling()?;
    Ok(cupti)
}

/// What the CUPTI thread is told.
enum Cmd {
    Start { metrics: Vec<String>, interval_ns: u64 },
    Stop { reason: String },
    Quit,
}

/// Where the CUPTI thread's output goes.
trait Sink {
    fn batch(&mut self, b: PmSampleBatch);
    fn state(&mut self, s: SamplerStatus, detail: String);
}

/// An active sampling session on the device.
struct Active<'a> {
    pm: PmSampling<'a>,
    host: Host<'a>,
    names: MetricNames,
    metrics: Vec<String>,
    image: Vec<u8>,
    values: Vec<f64>,
    /// Added to CUPTI timestamps when they are not on the Unix-epoch clock.
    offset: Option<i128>,
    overflows: u64,
    /// How often the hardware buffer is decoded.
    decode_period: Duration,
    /// The config image given to SetConfig: CUPTI reads it while sampling, so it is dropped
    /// after `pm` and `host` (fields drop in declaration order).
    _config: Vec<u8>,
}

struct Sampler<'a> {
    cupti: &'a Cupti,
    device: u32,
    hw_buffer: usize,
}

impl<'a> Sampler<'a> {
    fn start(&self, metrics: &[String], interval_ns: u64) -> Result<Active<'a>, (bool, String)> {
        let fail = |e: CallError| (e.is_hardware_busy(), e.to_string());
        // The metric check names the culprit; it only runs when the set does not configure
        // as one pass (the common path costs one host object).
        let explain = |fallback: String| match check_metrics(self.cupti, self.device, metrics) {
            Err(Refusal::Cupti(m)) | Err(Refusal::Metrics(m)) => (false, m),
            Ok(_) => (false, fallback),
        };
        self.cupti.profiler_initialize().map_err(fail)?;
        let chip = self.cupti.chip_name(self.device).map_err(fail)?;
        let avail = self.cupti.counter_availability(self.device).map_err(fail)?;
        let host = Host::new(self.cupti, &chip, avail).map_err(fail)?;
        let mut names = MetricNames::new(metrics).map_err(|m| (false, m))?;
        if let Err(e) = host.add_metrics(&mut names) {
            return Err(explain(e.to_string()));
        }
        let mut config = host.config_image().map_err(fail)?;
        let passes = host.num_passes(&mut config).map_err(fail)?;
        if passes != 1 {
            return Err(explain(format!("the metric set needs {passes} passes on {chip}")));
        }
        let mut pm = PmSampling::enable(self.cupti, self.device).map_err(fail)?;
        pm.set_config(&config, self.hw_buffer, interval_ns).map_err(fail)?;
        // Room for two decode periods of samples, so a late decode loses nothing.
        let decode_period = decode_period(interval_ns);
        let per_period = (decode_period.as_nanos() as u64 / interval_ns.max(1)).max(1);
        let max_samples = (per_period * 2 + 64).min(1 << 20) as u32;
        let size = pm.counter_data_size(&mut names, max_samples).map_err(fail)?;
        let mut image = vec![0u8; size];
        pm.init_image(&mut image).map_err(fail)?;
        pm.start().map_err(fail)?;
        Ok(Active {
            pm,
            host,
            names,
            metrics: metrics.to_vec(),
            image,
            values: vec![0.0; metrics.len()],
            offset: None,
            overflows: 0,
            decode_period,
            _config: config,
        })
    }

    /// Decodes everything the hardware buffer holds and hands it to the sink.
    fn drain(&self, a: &mut Active<'a>, sink: &mut dyn Sink) -> Result<(), CallError> {
        for _ in 0..16 {
            let (stop, overflow) = a.pm.decode(&mut a.image)?;
            if overflow {
                a.overflows += 1;
            }
            let n = a.pm.completed_samples(&a.image)?;
            let mut samples = Vec::with_capacity(n);
            for i in 0..n {
                let (start, end) = a.pm.sample_times(&a.image, i)?;
                a.host.evaluate(&a.image, i, &mut a.names, &mut a.values)?;
                // CUPTI's PM timestamps are GPU time in ns; if they are not Unix-epoch based
                // on this system, map them with the offset seen at the first decode.
                let off = *a.offset.get_or_insert_with(|| {
                    let wall = now_ns() as i128;
                    if (wall - end as i128).abs() > 3_600_000_000_000 { wall - end as i128 } else { 0 }
                });
                samples.push(PmSample {
                    start_ns: (start as i128 + off).max(0) as u64,
                    end_ns: (end as i128 + off).max(0) as u64,
                    values: a.values.clone(),
                });
            }
            a.pm.init_image(&mut a.image)?;
            if !samples.is_empty() {
                sink.batch(PmSampleBatch { device_id: self.device, metrics: a.metrics.clone(), samples });
            }
            if stop != DecodeStop::ImageFull {
                break;
            }
        }
        Ok(())
    }

    fn stop(&self, mut a: Active<'a>, sink: &mut dyn Sink) {
        let _ = a.pm.stop();
        let _ = self.drain(&mut a, sink);
        drop(a);
        // Release everything, so outside tools can take the monitor.
        let _ = self.cupti.profiler_deinitialize();
    }

    /// The CUPTI thread: obeys commands and decodes every `decode_period` while active.
    fn run(&self, rx: Receiver<Cmd>, sink: &mut dyn Sink) {
        let mut active: Option<Active<'a>> = None;
        loop {
            let cmd = if let Some(a) = &active {
                match rx.recv_timeout(a.decode_period) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Cmd::Quit),
                }
            } else {
                Some(rx.recv().unwrap_or(Cmd::Quit))
            };
            match cmd {
                None => {
                    if let Some(a) = active.as_mut()
                        && let Err(e) = self.drain(a, sink)
                    {
                        let busy = e.is_hardware_busy();
                        if let Some(a) = active.take() {
                            self.stop(a, sink);
                        }
                        let status = if busy { SamplerStatus::HardwareBusy } else { SamplerStatus::Failed };
                        sink.state(status, format!("sampling stopped: {e}"));
                    }
                }
                Some(Cmd::Start { metrics, interval_ns }) => {
                    if let Some(a) = active.take() {
                        self.stop(a, sink);
                    }
                    match self.start(&metrics, interval_ns) {
                        Ok(a) => {
                            sink.state(
                                SamplerStatus::Sampling,
                                format!("{} metrics every {} us", metrics.len(), interval_ns / 1000),
                            );
                            active = Some(a);
                        }
                        Err((busy, msg)) => {
                            let _ = self.cupti.profiler_deinitialize();
                            let status = if busy { SamplerStatus::HardwareBusy } else { SamplerStatus::Failed };
                            sink.state(status, msg);
                        }
                    }
                }
                Some(Cmd::Stop { reason }) => {
                    if let Some(a) = active.take() {
                        self.stop(a, sink);
                    }
                    sink.state(SamplerStatus::Stopped, reason);
                }
                Some(Cmd::Quit) => {
                    if let Some(a) = active.take() {
                        self.stop(a, sink);
                    }
                    return;
                }
            }
        }
    }
}

/// Decode period for an interval: ~50 samples per decode, between 50 ms and 1 s.
pub fn decode_period(interval_ns: u64) -> Duration {
    Duration::from_nanos(interval_ns.saturating_mul(50)).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// Sends to the writer thread; samples are dropped (and counted) if it falls behind.
struct ChannelSink {
    tx: SyncSender<AgentMessage>,
    device: u32,
    dropped: u64,
}

impl Sink for ChannelSink {
    fn batch(&mut self, b: PmSampleBatch) {
        let n = b.samples.len() as u64;
        match self.tx.try_send(AgentMessage { msg: Some(Msg::PmSamples(b)) }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped += n;
                let drops = wire::DropReport {
                    counts: vec![wire::DropCount { kind: wire::RecordKind::PmSample as i32, dropped: self.dropped }],
                    cupti_dropped: 0,
                };
                let _ = self.tx.try_send(AgentMessage { msg: Some(Msg::Drops(drops)) });
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    fn state(&mut self, s: SamplerStatus, detail: String) {
        let st = wire::SamplerState { device_id: self.device, status: s as i32, detail };
        // States must arrive: wait for room.
        let _ = self.tx.send(AgentMessage { msg: Some(Msg::SamplerState(st)) });
    }
}

fn hello(args: &SamplerArgs, cupti_version: u32, facts: Option<DeviceFacts>) -> AgentMessage {
    let devices = facts
        .map(|f| {
            vec![wire::Device {
                id: args.device,
                uuid: f.uuid,
                name: f.name,
                compute_major: f.compute_major,
                compute_minor: f.compute_minor,
                sm_count: f.sm_count,
                global_memory_bytes: f.memory_bytes,
                pci_bus_id: f.pci_bus_id,
            }]
        })
        .unwrap_or_default();
    AgentMessage {
        msg: Some(Msg::Hello(wire::Hello {
            protocol_version: PROTOCOL_VERSION,
            kind: wire::AgentKind::Sampler as i32,
            pid: std::process::id(),
            exe: std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            cmdline: std::env::args().collect(),
            cgroup: std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default().trim().to_string(),
            cupti_version,
            devices,
            clock: Some(wire::ClockPair { realtime_ns: now_ns(), monotonic_ns: monotonic_ns() }),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            sampler_device: args.device,
            job: None,
        })),
    }
}

fn run(args: &SamplerArgs, socket: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let driver = Driver::load_and_init();
    let facts = driver.as_ref().ok().and_then(|d| d.facts(args.device).ok());
    let cupti = load_cupti(args.cupti.as_deref());
    let mut stream = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    let version = cupti.as_ref().map(|c| c.version()).unwrap_or(0);
    write_frame(&mut stream, &hello(args, version, facts))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let welcome: DaemonMessage = read_message(&mut reader, DEFAULT_MAX_FRAME_BYTES).context("reading Welcome")?;
    let heartbeat = match welcome.msg {
        Some(daemon_message::Msg::Welcome(w)) => Duration::from_millis(u64::from(w.heartbeat_interval_ms.max(100))),
        _ => anyhow::bail!("the daemon did not answer Hello with Welcome"),
    };

    let (out_tx, out_rx) = mpsc::sync_channel::<AgentMessage>(256);
    let write_half = stream.try_clone()?;
    let writer = std::thread::Builder::new()
        .name("gpuprof-sampler-io".into())
        .spawn(move || write_loop(write_half, out_rx, heartbeat))?;

    let (driver, cupti) = match (driver, cupti) {
        (Ok(d), Ok(c)) => (d, c),
        (Err(e), _) | (_, Err(e)) => {
            let st =
                wire::SamplerState { device_id: args.device, status: SamplerStatus::Failed as i32, detail: e.clone() };
            let _ = out_tx.send(AgentMessage { msg: Some(Msg::SamplerState(st)) });
            let bye = wire::Goodbye { reason: format!("sampler cannot run: {e}") };
            let _ = out_tx.send(AgentMessage { msg: Some(Msg::Goodbye(bye)) });
            drop(out_tx);
            let _ = writer.join();
            anyhow::bail!("{e}");
        }
    };
    if args.device >= driver.device_count(Duration::ZERO) {
        anyhow::bail!("device {} does not exist (CUDA sees {})", args.device, driver.device_count(Duration::ZERO));
    }

    let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
    let device = args.device;
    let hw_buffer = args.hardware_buffer_mib as usize * 1024 * 1024;
    let sink_tx = out_tx.clone();
    let result = std::thread::scope(|s| -> anyhow::Result<()> {
        let cupti_ref = &cupti;
        let cupti_thread =
            std::thread::Builder::new().name("gpuprof-sampler-cupti".into()).spawn_scoped(s, move || {
                let mut sink = ChannelSink { tx: sink_tx, device, dropped: 0 };
                let sampler = Sampler { cupti: cupti_ref, device, hw_buffer };
                sampler.run(cmd_rx, &mut sink);
            })?;
        // Main thread: commands from the daemon.
        let r = loop {
            let m: DaemonMessage = match read_message(&mut reader, DEFAULT_MAX_FRAME_BYTES) {
                Ok(m) => m,
                Err(gpuprof_proto::frame::FrameError::Closed) => break Ok(()),
                Err(e) => break Err(anyhow::anyhow!("reading commands: {e}")),
            };
            let cmd = match m.msg {
                Some(daemon_message::Msg::StartPmSampling(s)) => {
                    Cmd::Start { metrics: s.metrics, interval_ns: s.interval_ns }
                }
                Some(daemon_message::Msg::StopPmSampling(s)) => Cmd::Stop { reason: s.reason },
                _ => continue,
            };
            if cmd_tx.send(cmd).is_err() {
                break Ok(());
            }
        };
        let _ = cmd_tx.send(Cmd::Quit);
        let _ = cupti_thread.join();
        r
    });
    let _ = out_tx.send(AgentMessage { msg: Some(Msg::Goodbye(wire::Goodbye { reason: "sampler exiting".into() })) });
    drop(out_tx);
    let _ = stream.shutdown(std::net::Shutdown::Read);
    let _ = writer.join();
    drop(driver);
    result
}

fn write_loop(stream: UnixStream, rx: Receiver<AgentMessage>, heartbeat: Duration) {
    let mut w = BufWriter::with_capacity(64 * 1024, stream);
    loop {
        let m = match rx.recv_timeout(heartbeat) {
            Ok(m) => m,
            Err(RecvTimeoutError::Timeout) => AgentMessage {
                msg: Some(Msg::Heartbeat(wire::Heartbeat {
                    clock: Some(wire::ClockPair { realtime_ns: now_ns(), monotonic_ns: monotonic_ns() }),
                })),
            },
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if write_frame(&mut w, &m).is_err() {
            return;
        }
        // Write whatever else is queued, then flush once.
        while let Ok(m) = rx.try_recv() {
            if write_frame(&mut w, &m).is_err() {
                return;
            }
        }
        if w.flush().is_err() {
            return;
        }
    }
    let _ = w.flush();
}

/// Prints samples for `secs` seconds without a daemon.
fn print_main(args: &SamplerArgs, secs: f64) -> ExitCode {
    struct Print(u64);
    impl Sink for Print {
        fn batch(&mut self, b: PmSampleBatch) {
            for s in &b.samples {
                self.0 += 1;
                let vals: Vec<String> = b.metrics.iter().zip(&s.values).map(|(m, v)| format!("{m}={v:.3}")).collect();
                println!("{} {} {}", s.start_ns, s.end_ns, vals.join(" "));
            }
        }
        fn state(&mut self, s: SamplerStatus, detail: String) {
            eprintln!("state: {} {detail}", s.as_str_name());
        }
    }
    let cupti = match load(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_NO_CUPTI);
        }
    };
    let interval = humantime::parse_duration(&args.interval).map(|d| d.as_nanos() as u64).unwrap_or(1_000_000);
    let sampler =
        Sampler { cupti: &cupti, device: args.device, hw_buffer: args.hardware_buffer_mib as usize * 1024 * 1024 };
    let (tx, rx) = mpsc::channel();
    let _ = tx.send(Cmd::Start { metrics: args.metrics.clone(), interval_ns: interval });
    let mut sink = Print(0);
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(secs.max(0.0)));
            let _ = tx.send(Cmd::Quit);
        });
        sampler.run(rx, &mut sink);
    });
    eprintln!("{} samples", sink.0);
    if sink.0 == 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
