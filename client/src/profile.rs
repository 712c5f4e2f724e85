//! `gpuprofctl profile --pause|--resume|--status` (the GPUs' performance-monitor
//! reservations, like `dcgmi profile --pause`) and `gpuprofctl pm watch` (live PM samples).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use clap::{ArgGroup, Args, Subcommand};

use crate::pb;

/// `gpuprofctl profile`: pause, resume or show the GPUs' performance-monitor reservations.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("action").required(true).args(["pause", "resume", "status"])))]
pub struct ProfileArgs {
    /// Release the performance monitor of GPUs for outside tools (Nsight Compute, DCGM):
    /// gpuprof stops PM and PC sampling on them until --resume or the pause expires.
    #[arg(long)]
    pub pause: bool,
    /// End pauses; sampling comes back.
    #[arg(long)]
    pub resume: bool,
    /// Who holds each GPU's performance monitor, and who waits.
    #[arg(long)]
    pub status: bool,
    /// GPU index (repeat or comma separate); default: all GPUs.
    #[arg(long = "gpu", value_name = "N", value_delimiter = ',', conflicts_with = "all")]
    pub gpus: Vec<u32>,
    /// All GPUs (the default when no --gpu is given).
    #[arg(long)]
    pub all: bool,
    /// Pause length, e.g. "90s", "10m" (default: the daemon's, 300 s).
    #[arg(long = "for", value_name = "DURATION", value_parser = humantime::parse_duration, requires = "pause")]
    pub duration: Option<Duration>,
    /// Why, for the audit log and other operators.
    #[arg(long, value_name = "TEXT", requires = "pause")]
    pub reason: Option<String>,
}

/// `gpuprofctl pm ...`
#[derive(Debug, Subcommand)]
pub enum PmCmd {
    /// Show PM samples live (Ctrl-C to stop).
    #[command(after_help = "--json: JSON Lines, one object per sample (and per pause marker) as they arrive.")]
    Watch(WatchArgs),
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// GPU index (repeat or comma separate); default: all GPUs.
    #[arg(long = "gpu", value_name = "N", value_delimiter = ',')]
    pub gpus: Vec<u32>,
    /// Only these metrics (repeat or comma separate); default: all sampled.
    #[arg(long = "metric", value_name = "NAME", value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Average samples over this window before showing them ("0" shows every sample).
    #[arg(long, value_name = "DURATION", default_value = "100ms", value_parser = parse_duration_or_zero)]
    pub downsample: Duration,
    /// Stop after this many samples (0: run until interrupted).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Sources (repeat or comma separate): nvml, gpm (always on; they never take the
    /// performance monitor), cupti (CUPTI PM sampling, started for as long as this runs);
    /// default: what is running.
    #[arg(long = "source", value_name = "SOURCE", value_delimiter = ',', value_parser = ["nvml", "gpm", "cupti", "cupti_pm"])]
    pub sources: Vec<String>,
    /// CUPTI PM sampling rate while this runs, e.g. "1khz", "100hz", "10khz" (at most 10 kHz;
    /// default with --source cupti: 1khz). Needs operator rights: it takes the performance monitor.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate: Option<u32>,
}

/// "1khz", "1k", "500hz", "500" → Hz.
pub fn parse_rate(s: &str) -> Result<u32, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix("hz").unwrap_or(&t);
    let (num, mult) = match t.strip_suffix('k') {
        Some(n) => (n, 1000.0),
        None => (t, 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a rate like \"1khz\" or \"200hz\""))?;
    let hz = v * mult;
    if !(1.0..=10_000.0).contains(&hz) {
        return Err(format!("{s:?}: the rate must be between 1 Hz and 10 kHz"));
    }
    Ok(hz.round() as u32)
}

fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    if s.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

fn time_of(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_nanos(ns)).to_string()
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn reservation_json(r: &pb::Reservation) -> serde_json::Value {
    serde_json::json!({
        "device": r.device,
        "lease_id": r.lease_id,
        "holder_kind": r.holder_kind,
        "holder": r.holder,
        "priority": r.priority,
        "reason": r.reason,
        "granted_at_ns": r.granted_at_ns,
        "expires_at_ns": r.expires_at_ns,
    })
}

fn describe(r: &pb::Reservation) -> String {
    let mut s = format!("{} ({}, priority {})", r.holder, r.holder_kind, r.priority);
    if r.expires_at_ns > 0 {
        let left = r.expires_at_ns.saturating_sub(now_ns()) / 1_000_000_000;
        s.push_str(&format!(", until {} ({left} s left)", time_of(r.expires_at_ns)));
    }
    if !r.reason.is_empty() {
        s.push_str(&format!(": {}", r.reason));
    }
    s
}

/// Runs `gpuprofctl profile ...`.
pub async fn profile(client: &mut gpuprofctl::Client, a: ProfileArgs, json: bool) -> Result<()> {
    let all = a.all || a.gpus.is_empty();
    if a.pause {
        let r = client
            .pause(pb::PauseRequest {
                devices: a.gpus.clone(),
                all,
                duration_seconds: a.duration.map(|d| d.as_secs().max(1)).unwrap_or(0),
                reason: a.reason.clone().unwrap_or_default(),
            })
            .await?
            .into_inner();
        if json {
            let v: Vec<_> = r.reservations.iter().map(reservation_json).collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            for res in &r.reservations {
                println!("GPU {} paused: {}", res.device, describe(res));
            }
        }
    } else if a.resume {
        let r = client.resume(pb::ResumeRequest { devices: a.gpus.clone(), all }).await?.into_inner();
        if json {
            println!("{}", serde_json::json!({ "resumed": r.devices }));
        } else if r.devices.is_empty() {
            println!("no GPU was paused");
        } else {
            let list: Vec<String> = r.devices.iter().map(|d| d.to_string()).collect();
            println!("resumed GPU {}", list.join(", "));
        }
    } else {
        let r = client.list_reservations(pb::ListReservationsRequest {}).await?.into_inner();
        let devices: Vec<_> =
            r.devices.into_iter().filter(|d| a.gpus.is_empty() || a.gpus.contains(&d.device)).collect();
        if json {
            let v: Vec<_> = devices
                .iter()
                .map(|d| {
                    serde_json::json!({
                        "device": d.device,
                        "holder": d.holder.as_ref().map(reservation_json),
                        "waiting": d.waiting.iter().map(reservation_json).collect::<Vec<_>>(),
                        "held_externally": d.held_externally,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else if devices.is_empty() {
            println!("no GPU is managed by this gpuprofd (see `gpuprofctl status`)");
        } else {
            for d in &devices {
                let state = match &d.holder {
                    _ if d.held_externally => "held by an outside tool".to_string(),
                    Some(h) if h.holder_kind == "pause" => "paused".to_string(),
                    Some(h) if h.holder_kind == "sampler" => "held by the PM sampler".to_string(),
                    Some(h) => h.holder_kind.clone(),
                    None => "free".to_string(),
                };
                println!("GPU {}: {state}", d.device);
                if let Some(h) = &d.holder {
                    println!("  holder   lease {}: {}", h.lease_id, describe(h));
                }
                for w in &d.waiting {
                    println!("  waiting  lease {}: {}", w.lease_id, describe(w));
                }
            }
        }
    }
    Ok(())
}

/// Runs `gpuprofctl pm ...`.
pub async fn pm(client: &mut gpuprofctl::Client, cmd: PmCmd, json: bool) -> Result<()> {
    let PmCmd::Watch(a) = cmd;
    let ms = a.downsample.as_millis();
    if ms > u128::from(u32::MAX) {
        bail!("--downsample is too long");
    }
    let cupti = a.sources.iter().any(|s| s.starts_with("cupti"));
    if a.rate.is_some() && !cupti && !a.sources.is_empty() {
        bail!("--rate sets the CUPTI PM sampling rate: add --source cupti");
    }
    let rate = if cupti || a.rate.is_some() { a.rate.unwrap_or(1000) } else { 0 };
    let mut stream = client
        .stream_pm_samples(pb::StreamPmSamplesRequest {
            devices: a.gpus.clone(),
            metrics: a.metrics.clone(),
            downsample_ms: ms as u32,
            sources: a.sources.iter().map(|s| if s == "cupti" { "cupti_pm".to_string() } else { s.clone() }).collect(),
            cupti_rate_hz: rate,
        })
        .await?
        .into_inner();
    let mut seen = 0u64;
    // A header for each source and metric list, printed when it first appears (sources interleave).
    let mut headers: std::collections::HashSet<(String, Vec<String>)> = std::collections::HashSet::new();
    while let Some(m) = stream.message().await? {
        match m.event {
            Some(pb::stream_pm_samples_response::Event::Sample(s)) => {
                seen += 1;
                if json {
                    let values: serde_json::Map<String, serde_json::Value> =
                        s.values.iter().map(|v| (v.metric.clone(), serde_json::json!(v.value))).collect();
                    println!(
                        "{}",
                        serde_json::json!({"device": s.device, "source": s.source, "start_ns": s.start_ns, "end_ns": s.end_ns, "values": values})
                    );
                } else {
                    let names: Vec<String> = s.values.iter().map(|v| v.metric.clone()).collect();
                    let head = (s.source.clone(), names);
                    if !headers.contains(&head) {
                        println!("{:<24} {:>3} {:<8}  {}", "TIME", "GPU", "SOURCE", head.1.join("  "));
                        headers.insert(head);
                    }
                    let vals: Vec<String> =
                        s.values.iter().map(|v| format!("{:>w$.2}", v.value, w = v.metric.len())).collect();
                    println!("{:<24} {:>3} {:<8}  {}", time_of(s.end_ns), s.device, s.source, vals.join("  "));
                }
                if a.count > 0 && seen >= a.count {
                    break;
                }
            }
            Some(pb::stream_pm_samples_response::Event::Paused(p)) => {
                if json {
                    println!(
                        "{}",
                        serde_json::json!({"device": p.device, "paused": !p.resumed, "holder": p.holder, "reason": p.reason})
                    );
                } else if p.resumed {
                    println!("GPU {}: sampling resumed", p.device);
                } else {
                    println!("GPU {}: sampling paused: held by {} ({})", p.device, p.holder, p.reason);
                }
            }
            None => {}
        }
    }
    Ok(())
}
