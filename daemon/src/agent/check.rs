//! The agent protocol's checks that need nothing but the messages: the handshake (Hello first,
//! protocol version, agent kind) and, per connection, string ids defined in order and referred
//! to only once defined, the messages each agent kind may send, drop counters that never go
//! backwards, PM sample shapes and cubin pieces. `agent.rs` runs them before acting on a
//! message; the fuzz targets drive them directly.

use std::collections::HashMap;

use gpuprof_proto::agent::{
    AgentKind, AgentMessage, CubinChunk, DropReport, Hello, PROTOCOL_VERSION, agent_message::Msg,
};

use super::{ConnError, msg_name, proto_err};
use crate::catalog::Kind;
use crate::pcsamp::cubin::Assembler;

/// Most devices a `DeviceActivity` may list.
const MAX_ACTIVITY_DEVICES: usize = 256;
/// Cubins one `CubinQuery` or `CubinsNotFound` may list.
pub const MAX_CUBIN_HASHES: usize = 256;

/// The first message of a connection: a Hello in this daemon's protocol version from a known
/// kind of agent. Returns it with the agent's kind ("injector" or "sampler").
pub fn hello(m: AgentMessage) -> Result<(Hello, &'static str), ConnError> {
    let hello = match m.msg {
        Some(Msg::Hello(h)) => h,
        other => {
            let what = other.as_ref().map(msg_name).unwrap_or("an empty message");
            return Err(proto_err(format!("first message must be Hello, got {what}")));
        }
    };
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(proto_err(format!(
            "unsupported protocol version {} (this gpuprofd speaks {PROTOCOL_VERSION})",
            hello.protocol_version
        )));
    }
    let kind = match AgentKind::try_from(hello.kind) {
        Ok(AgentKind::Injector) => "injector",
        Ok(AgentKind::Sampler) => "sampler",
        _ => return Err(proto_err(format!("unknown agent kind {}", hello.kind))),
    };
    if let Some(j) = &hello.job {
        crate::job::check(j).map_err(proto_err)?;
    }
    Ok((hello, kind))
}

/// One connection's protocol state after its Hello.
pub struct Checker {
    /// "injector" or "sampler".
    kind: &'static str,
    /// The next string id the agent must define.
    next_string: u32,
    /// Last cumulative drop count per kind.
    drops: HashMap<Kind, u64>,
    /// Last cumulative CUPTI drop count.
    cupti_dropped: u64,
    /// Cubins half received.
    cubins: Assembler,
}

impl Checker {
    pub fn new(kind: &'static str) -> Checker {
        Checker { kind, next_string: 1, drops: HashMap::new(), cupti_dropped: 0, cubins: Assembler::default() }
    }

    /// The next string id the agent must define (ids below it are defined).
    pub fn next_string(&self) -> u32 {
        self.next_string
    }

    fn check_str(&self, id: u32, what: &str) -> Result<(), ConnError> {
        if id >= self.next_string {
            return Err(proto_err(format!("{what} refers to string id {id}, which was never defined")));
        }
        Ok(())
    }

    fn require_kind(&self, kind: &str, m: &Msg) -> Result<(), ConnError> {
        if self.kind != kind {
            return Err(proto_err(format!("{} is not allowed from a {} agent", msg_name(m), self.kind)));
        }
        Ok(())
    }

    /// Checks one message after the Hello, defining the strings of a `StringTable`. Drop
    /// reports are checked by [`Checker::drops`] and cubin pieces by [`Checker::cubin`] (after
    /// this), as they are counted and kept as they are checked.
    pub fn message(&mut self, msg: &Msg) -> Result<(), ConnError> {
        match msg {
            Msg::Hello(_) => return Err(proto_err("Hello sent twice")),
            Msg::Strings(t) => {
                for s in &t.strings {
                    if s.id != self.next_string {
                        return Err(proto_err(format!(
                            "string id {} defined out of order (expected {})",
                            s.id, self.next_string
                        )));
                    }
                    self.next_string += 1;
                }
            }
            Msg::Records(b) => {
                self.require_kind("injector", msg)?;
                for k in &b.kernels {
                    self.check_str(k.name_id, "a kernel record")?;
                }
                for m in &b.markers {
                    self.check_str(m.name_id, "a marker record")?;
                    self.check_str(m.domain_id, "a marker record")?;
                }
            }
            Msg::TraceState(s) => {
                trace_status(s.status)?;
            }
            Msg::PmSamples(b) => {
                self.require_kind("sampler", msg)?;
                if b.samples.iter().any(|s| s.values.len() != b.metrics.len()) {
                    return Err(proto_err("PM sample with a value count different from the metric count"));
                }
            }
            Msg::PcSamples(b) => {
                self.require_kind("injector", msg)?;
                for s in &b.samples {
                    self.check_str(s.function_name_id, "a PC sample")?;
                    self.check_str(s.stall_reason_id, "a PC sample")?;
                    self.check_str(s.module_id, "a PC sample")?;
                    self.check_str(s.file_id, "a PC sample")?;
                }
            }
            Msg::SamplerState(_) => self.require_kind("sampler", msg)?,
            Msg::PcSamplingState(_) | Msg::Cubin(_) => self.require_kind("injector", msg)?,
            Msg::DeviceActivity(a) => {
                self.require_kind("injector", msg)?;
                if a.devices.len() > MAX_ACTIVITY_DEVICES {
                    return Err(proto_err(format!(
                        "DeviceActivity lists {} devices (at most {MAX_ACTIVITY_DEVICES})",
                        a.devices.len()
                    )));
                }
            }
            Msg::CubinQuery(gpuprof_proto::agent::CubinQuery { hashes })
            | Msg::CubinsNotFound(gpuprof_proto::agent::CubinsNotFound { hashes }) => {
                self.require_kind("injector", msg)?;
                if hashes.len() > MAX_CUBIN_HASHES {
                    return Err(proto_err(format!(
                        "{} lists {} cubins (at most {MAX_CUBIN_HASHES})",
                        msg_name(msg),
                        hashes.len()
                    )));
                }
                if let Some(h) = hashes.iter().find(|h| !crate::pcsamp::cubin::valid_hash(h)) {
                    return Err(proto_err(format!("{} names cubin {h:?}, not 16 hex digits", msg_name(msg))));
                }
            }
            Msg::Drops(_) | Msg::Heartbeat(_) | Msg::Goodbye(_) => {}
        }
        Ok(())
    }

    /// Checks a drop report against the previous ones, calling `add` with each increase (the
    /// kind, None for CUPTI's own drops) as it is checked. Returns the cumulative counts.
    pub fn drops(
        &mut self,
        r: &DropReport,
        mut add: impl FnMut(Option<Kind>, u64),
    ) -> Result<Vec<(Option<Kind>, u64)>, ConnError> {
        let mut counts = Vec::new();
        for c in &r.counts {
            let Some(k) = Kind::from_wire(c.kind) else {
                return Err(proto_err(format!("drop report for unknown record kind {}", c.kind)));
            };
            let last = self.drops.entry(k).or_insert(0);
            if c.dropped < *last {
                return Err(proto_err(format!(
                    "drop counter for {} went backwards ({} < {})",
                    k.name(),
                    c.dropped,
                    last
                )));
            }
            add(Some(k), c.dropped - *last);
            *last = c.dropped;
            counts.push((Some(k), c.dropped));
        }
        if r.cupti_dropped < self.cupti_dropped {
            return Err(proto_err(format!(
                "CUPTI drop counter went backwards ({} < {})",
                r.cupti_dropped, self.cupti_dropped
            )));
        }
        add(None, r.cupti_dropped - self.cupti_dropped);
        self.cupti_dropped = r.cupti_dropped;
        if r.cupti_dropped > 0 {
            counts.push((None, r.cupti_dropped));
        }
        Ok(counts)
    }

    /// Takes one cubin piece (see `Assembler::chunk`): the whole cubin once complete and not
    /// `known` already.
    pub fn cubin(
        &mut self,
        c: CubinChunk,
        known: impl Fn(&str) -> bool,
    ) -> Result<Option<(String, Vec<u8>)>, ConnError> {
        self.cubins.chunk(c, known).map_err(proto_err)
    }
}

/// A trace status's name; an unknown one is a protocol error.
pub fn trace_status(status: i32) -> Result<&'static str, ConnError> {
    use gpuprof_proto::agent::TraceStatus;
    match TraceStatus::try_from(status) {
        Ok(TraceStatus::Idle) => Ok("idle"),
        Ok(TraceStatus::Tracing) => Ok("tracing"),
        Ok(TraceStatus::Displaced) => Ok("displaced"),
        Ok(TraceStatus::Failed) => Ok("failed"),
        _ => Err(proto_err(format!("unknown trace status {status}"))),
    }
}
