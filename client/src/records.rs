//! `gpuprofctl top` and `query`, and the record filter they share with `export`.

use std::io::Write;

use anyhow::Result;
use clap::Args;
use gpuprofctl::{Client, pb};

use crate::output::{Usage, human_ns, print_summary, shorten, summary_json, wall_us};

/// Which records of a session.
#[derive(Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only this process (daemon process id from `session show`; repeatable).
    #[arg(long = "process", value_name = "ID")]
    pub processes: Vec<u64>,
    /// Only this device (repeatable).
    #[arg(long = "device", value_name = "N")]
    pub devices: Vec<u32>,
    /// Only this stream (repeatable).
    #[arg(long = "stream", value_name = "N")]
    pub streams: Vec<u32>,
    /// Kernel names matching this glob, e.g. '*gemm*' (demangled or mangled: either matches).
    #[arg(long = "name", value_name = "GLOB")]
    pub name: Option<String>,
    /// From this time: ns since the Unix epoch or RFC 3339 UTC.
    #[arg(long, value_name = "TIME")]
    pub from: Option<String>,
    /// Until this time (exclusive): ns since the Unix epoch or RFC 3339 UTC.
    #[arg(long, value_name = "TIME")]
    pub to: Option<String>,
}

fn parse_time(flag: &str, s: &str) -> Result<u64> {
    if let Ok(ns) = s.parse::<u64>() {
        return Ok(ns);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| Usage(format!("{flag} {s}: {e} (use ns since the epoch or RFC 3339 UTC)")))?;
    Ok(t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0))
}

impl FilterArgs {
    pub fn to_pb(&self) -> Result<pb::RecordFilter> {
        let from = self.from.as_deref().map(|s| parse_time("--from", s)).transpose()?.unwrap_or(0);
        let to = self.to.as_deref().map(|s| parse_time("--to", s)).transpose()?.unwrap_or(0);
        Ok(pb::RecordFilter {
            process_ids: self.processes.clone(),
            device_ids: self.devices.clone(),
            stream_ids: self.streams.clone(),
            name_pattern: self.name.clone().unwrap_or_default(),
            time_range: (from > 0 || to > 0).then_some(pb::TimeRange { start_ns: from, end_ns: to }),
        })
    }
}

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Session id.
    pub session: u64,
    /// Rows of the kernel and API tables.
    #[arg(long, default_value_t = 20)]
    pub top: u32,
    /// Show kernel names in full.
    #[arg(long)]
    pub wide: bool,
    /// Kernel names as the driver reported them (mangled) instead of demangled.
    #[arg(long)]
    pub mangled: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

pub async fn top(c: &mut Client, a: TopArgs, json: bool) -> Result<()> {
    let s = c
        .get_summary(pb::GetSummaryRequest { session_id: a.session, filter: Some(a.filter.to_pb()?), top: a.top })
        .await?
        .into_inner();
    if json {
        println!("{}", serde_json::to_string_pretty(&summary_json(&s))?);
    } else {
        print_summary(&s, if a.wide { usize::MAX } else { 80 }, a.mangled);
    }
    Ok(())
}

#[derive(Args, Debug)]
pub struct QueryArgs {
    /// Session id.
    pub session: u64,
    /// Record kinds, comma-separated: kernel, memcpy, memset, api, sync, marker, collective (NCCL
    /// collectives, where NCCL loaded the injector as its profiler plugin).
    #[arg(long, value_delimiter = ',', default_value = "kernel")]
    pub kind: Vec<String>,
    /// At most this many records (0: all).
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Kernel names as the driver reported them (mangled) instead of demangled.
    #[arg(long)]
    pub mangled: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
}

/// Prints records as they stream: a table per message, or one JSON object per line.
pub async fn query(c: &mut Client, a: QueryArgs, json: bool) -> Result<()> {
    let mut stream = c
        .query_records(pb::QueryRecordsRequest {
            session_id: a.session,
            kinds: a.kind.clone(),
            filter: Some(a.filter.to_pb()?),
            limit: a.limit,
        })
        .await?
        .into_inner();
    let mut out = std::io::stdout().lock();
    let mut header_done = false;
    while let Some(m) = stream.message().await? {
        if json {
            for k in &m.kernels {
                let v = serde_json::json!({"kind": "kernel", "process_id": k.process_id, "start_ns": k.start_ns,
                    "end_ns": k.end_ns, "device_id": k.device_id, "stream_id": k.stream_id,
                    "correlation_id": k.correlation_id, "name": k.name, "mangled_name": k.mangled_name,
                    "grid": [k.grid_x, k.grid_y, k.grid_z], "block": [k.block_x, k.block_y, k.block_z],
                    "registers_per_thread": k.registers_per_thread, "static_shared_bytes": k.static_shared_bytes,
                    "dynamic_shared_bytes": k.dynamic_shared_bytes});
                writeln!(out, "{v}")?;
            }
            for r in &m.memcpys {
                let v = serde_json::json!({"kind": "memcpy", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "device_id": r.device_id, "stream_id": r.stream_id,
                    "correlation_id": r.correlation_id, "bytes": r.bytes, "direction": r.direction});
                writeln!(out, "{v}")?;
            }
            for r in &m.memsets {
                let v = serde_json::json!({"kind": "memset", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "device_id": r.device_id, "stream_id": r.stream_id,
                    "correlation_id": r.correlation_id, "bytes": r.bytes});
                writeln!(out, "{v}")?;
            }
            for r in &m.api_calls {
                let v = serde_json::json!({"kind": "api", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "thread_id": r.thread_id, "correlation_id": r.correlation_id,
                    "domain": r.domain, "name": r.name, "cbid": r.cbid});
                writeln!(out, "{v}")?;
            }
            for r in &m.syncs {
                let v = serde_json::json!({"kind": "sync", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "stream_id": r.stream_id, "correlation_id": r.correlation_id,
                    "sync_type": r.sync_type});
                writeln!(out, "{v}")?;
            }
            for r in &m.markers {
                let v = serde_json::json!({"kind": "marker", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "thread_id": r.thread_id, "name": r.name, "domain": r.domain,
                    "is_mark": r.is_mark});
                writeln!(out, "{v}")?;
            }
            for r in &m.collectives {
                let gpu =
                    (r.gpu_end_ns > 0).then(|| serde_json::json!({"start_ns": r.gpu_start_ns, "end_ns": r.gpu_end_ns}));
                let v = serde_json::json!({"kind": "collective", "process_id": r.process_id, "start_ns": r.start_ns,
                    "end_ns": r.end_ns, "thread_id": r.thread_id, "name": r.name, "seq": r.seq,
                    "communicator": r.communicator, "rank": r.rank, "nranks": r.nranks, "count": r.count,
                    "bytes": r.bytes, "datatype": r.datatype, "root": r.root, "algorithm": r.algorithm,
                    "protocol": r.protocol, "channels": r.channels, "gpu": gpu,
                    "kernel_correlation_id": r.kernel_correlation_id, "device_id": r.device_id});
                writeln!(out, "{v}")?;
            }
            continue;
        }
        // Table: one line per record, one layout for all kinds.
        if !header_done {
            writeln!(
                out,
                "{:<7} {:>6} {:<26} {:>12} {:>4} {:>6} {:>8}  WHAT",
                "KIND", "PROC", "START (UTC)", "DURATION", "DEV", "STREAM", "CORR"
            )?;
            header_done = true;
        }
        let line = |out: &mut std::io::StdoutLock<'_>,
                    kind: &str,
                    proc: u64,
                    s: u64,
                    e: u64,
                    dev: String,
                    stream: String,
                    corr: u32,
                    what: String| {
            writeln!(
                out,
                "{kind:<7} {proc:>6} {:<26} {:>12} {dev:>4} {stream:>6} {corr:>8}  {what}",
                wall_us(s),
                human_ns(e.saturating_sub(s))
            )
        };
        for k in &m.kernels {
            line(
                &mut out,
                "kernel",
                k.process_id,
                k.start_ns,
                k.end_ns,
                k.device_id.to_string(),
                k.stream_id.to_string(),
                k.correlation_id,
                shorten(crate::output::kernel_name(&k.name, &k.mangled_name, a.mangled), 90),
            )?;
        }
        for r in &m.memcpys {
            line(
                &mut out,
                "memcpy",
                r.process_id,
                r.start_ns,
                r.end_ns,
                r.device_id.to_string(),
                r.stream_id.to_string(),
                r.correlation_id,
                format!("{} {}", r.direction, crate::output::human_bytes(r.bytes)),
            )?;
        }
        for r in &m.memsets {
            line(
                &mut out,
                "memset",
                r.process_id,
                r.start_ns,
                r.end_ns,
                r.device_id.to_string(),
                r.stream_id.to_string(),
                r.correlation_id,
                crate::output::human_bytes(r.bytes),
            )?;
        }
        for r in &m.api_calls {
            line(
                &mut out,
                "api",
                r.process_id,
                r.start_ns,
                r.end_ns,
                "-".into(),
                "-".into(),
                r.correlation_id,
                format!("{} (tid {})", r.name, r.thread_id),
            )?;
        }
        for r in &m.syncs {
            line(
                &mut out,
                "sync",
                r.process_id,
                r.start_ns,
                r.end_ns,
                "-".into(),
                r.stream_id.to_string(),
                r.correlation_id,
                r.sync_type.clone(),
            )?;
        }
        for r in &m.markers {
            let what = if r.domain.is_empty() { r.name.clone() } else { format!("{}: {}", r.domain, r.name) };
            line(&mut out, "marker", r.process_id, r.start_ns, r.end_ns, "-".into(), "-".into(), 0, what)?;
        }
        for r in &m.collectives {
            // The run in the kernel where NCCL timed it, else the enqueue.
            let (s, e) = if r.gpu_end_ns > 0 { (r.gpu_start_ns, r.gpu_end_ns) } else { (r.start_ns, r.end_ns) };
            let dev = if r.kernel_correlation_id > 0 { r.device_id.to_string() } else { "-".into() };
            let what = format!(
                "{} #{} {} {} rank {}/{} comm {}",
                r.name,
                r.seq,
                crate::output::human_bytes(r.bytes),
                r.datatype,
                r.rank,
                r.nranks,
                r.communicator
            );
            line(&mut out, "coll", r.process_id, s, e, dev, "-".into(), r.kernel_correlation_id, what)?;
        }
    }
    out.flush()?;
    Ok(())
}
/// A whole export of a session in memory (for merging several hosts' traces).
pub async fn export_bytes(c: &mut Client, session: u64, format: pb::ExportFormat) -> Result<Vec<u8>> {
    let mut stream = c
        .export_trace(pb::ExportTraceRequest { session_id: session, format: format as i32, ..Default::default() })
        .await?
        .into_inner();
    let mut data = Vec::new();
    while let Some(m) = stream.message().await? {
        data.extend_from_slice(&m.data);
    }
    Ok(data)
}
