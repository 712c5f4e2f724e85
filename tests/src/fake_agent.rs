//! A fake injector that speaks the real agent protocol over the real Unix socket.

use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpuprof_proto::agent::{
    self as wire, AgentKind, AgentMessage, ClockPair, DaemonMessage, Hello, InternedString, PROTOCOL_VERSION,
    RecordBatch, StringTable, agent_message::Msg, daemon_message,
};
use gpuprof_proto::frame::{encode_frame, read_message};

use crate::records::{KERNEL_NAMES, MARKER_NAMES, Mix, RecordGen};

/// Records sent, per table name ("kernel", "api", ...).
pub type Sent = BTreeMap<&'static str, u64>;

/// Adds a batch's record counts to `sent`.
pub fn count(sent: &mut Sent, b: &RecordBatch) {
    for (k, n) in gpuprof_proto::kinds::batch_counts(b) {
        // Device rows belong to no session: not records of a table.
        if n > 0 && k != wire::RecordKind::Device {
            *sent.entry(gpuprof_proto::kinds::name(k)).or_default() += n as u64;
        }
    }
}

/// One fake process connected to gpuprofd.
pub struct FakeAgent {
    out: BufWriter<UnixStream>,
    input: UnixStream,
    /// The daemon's id of this connection (processes.id).
    pub process_id: u64,
    next_string: u32,
    pub generator: RecordGen,
    buf: Vec<u8>,
}

/// The Hello a fake injector sends.
pub fn hello(exe: &str) -> Hello {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    Hello {
        protocol_version: PROTOCOL_VERSION,
        kind: AgentKind::Injector as i32,
        pid: std::process::id(),
        exe: exe.to_string(),
        cmdline: vec![exe.to_string(), "train.py".into()],
        cgroup: "/kubepods/pod-1234/abcdef".into(),
        cupti_version: 130000,
        devices: (0..2)
            .map(|i| wire::Device {
                id: i,
                uuid: format!("GPU-fake0000-0000-0000-0000-00000000000{i}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                compute_major: 9,
                compute_minor: 0,
                sm_count: 132,
                global_memory_bytes: 80 << 30,
                pci_bus_id: format!("0000:{:02x}:00.0", 0x1b + i),
            })
            .collect(),
        clock: Some(ClockPair { realtime_ns: now, monotonic_ns: 0 }),
        agent_version: "fake".into(),
        sampler_device: 0,
        job: None,
    }
}

/// The job identity of a torchrun rank (`rank` of `world_size` in run `job_id`; no rank: a
/// process that carries the run id only), its parent the current process's parent.
pub fn torchrun_job(job_id: &str, rank: Option<u32>, world_size: u32) -> wire::JobIdentity {
    wire::JobIdentity {
        launcher: "torchelastic".into(),
        job_id: job_id.into(),
        rank,
        local_rank: rank,
        world_size: Some(world_size),
        group_rank: Some(0),
        parent_pid: std::os::unix::process::parent_id(),
    }
}

impl FakeAgent {
    /// Connects, says hello, waits for Welcome and defines the kernel and marker names.
    pub fn connect(socket: &Path, seed: u64, mix: Mix) -> Result<FakeAgent> {
        let s = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut input = s.try_clone()?;
        let mut out = BufWriter::with_capacity(1 << 20, s);
        write(&mut out, Msg::Hello(hello("/usr/bin/python3")))?;
        out.flush()?;
        let welcome: DaemonMessage = read_message(&mut input, 16 << 20)?;
        let Some(daemon_message::Msg::Welcome(w)) = welcome.msg else {
            bail!("expected Welcome, got {welcome:?}");
        };
        let mut a = FakeAgent {
            out,
            input,
            process_id: w.process_id,
            next_string: 1,
            generator: RecordGen::new(seed, mix),
            buf: Vec::new(),
        };
        a.generator.kernel_name_ids = a.define_strings(KERNEL_NAMES)?;
        a.generator.marker_name_ids = a.define_strings(MARKER_NAMES)?;
        Ok(a)
    }

    /// Defines strings, returning their ids.
    pub fn define_strings(&mut self, values: &[&str]) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut t = StringTable::default();
        for v in values {
            ids.push(self.next_string);
            t.strings.push(InternedString { id: self.next_string, value: v.to_string() });
            self.next_string += 1;
        }
        write(&mut self.out, Msg::Strings(t))?;
        Ok(ids)
    }

    /// Sends one message.
    pub fn send(&mut self, m: Msg) -> Result<()> {
        write(&mut self.out, m)
    }

    /// Sends `total` generated records in batches of `batch`, at most `rate` records/s
    /// (0 = as fast as the daemon takes them). Returns what was sent, per kind.
    pub fn send_records(&mut self, total: u64, batch: usize, rate: f64, session_id: u64) -> Result<Sent> {
        let mut sent = Sent::new();
        let start = Instant::now();
        let mut done = 0u64;
        let mut b = RecordBatch::default();
        while done < total {
            let n = batch.min((total - done) as usize);
            b.clear_all();
            b.session_id = session_id;
            self.generator.fill(&mut b, n);
            count(&mut sent, &b);
            self.buf.clear();
            encode_frame(&AgentMessage { msg: Some(Msg::Records(std::mem::take(&mut b))) }, &mut self.buf);
            self.out.write_all(&self.buf)?;
            done += n as u64;
            if rate > 0.0 {
                let due = Duration::from_secs_f64(done as f64 / rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    self.out.flush()?;
                    std::thread::sleep(wait);
                }
            }
        }
        self.out.flush()?;
        Ok(sent)
    }

    /// Writes raw bytes (pre-encoded frames) to the socket.
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        Ok(())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }

    /// Waits for the next command from the daemon.
    pub fn recv(&mut self, timeout: Duration) -> Result<DaemonMessage> {
        self.input.set_read_timeout(Some(timeout))?;
        Ok(read_message(&mut self.input, 16 << 20)?)
    }

    /// Says goodbye and closes.
    pub fn goodbye(mut self) -> Result<()> {
        write(&mut self.out, Msg::Goodbye(wire::Goodbye { reason: "done".into() }))?;
        self.out.flush()?;
        Ok(())
    }
}

fn write(out: &mut impl Write, m: Msg) -> Result<()> {
    let mut buf = Vec::new();
    encode_frame(&AgentMessage { msg: Some(m) }, &mut buf);
    out.write_all(&buf)?;
    Ok(())
}

trait ClearAll {
    fn clear_all(&mut self);
}

impl ClearAll for RecordBatch {
    fn clear_all(&mut self) {
        *self = RecordBatch::default();
    }
}
