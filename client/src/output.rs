//! Output helpers shared by the session, query and export commands: tables, units,
//! times, JSON forms of API messages, and exit codes.

use std::time::{SystemTime, UNIX_EPOCH};

use gpuprofctl::pb;
use serde_json::{Value, json};

/// Exit codes (also in `gpuprofctl --help`): 0 ok, 1 the request failed, 2 bad usage or
/// arguments, 3 daemon unreachable or shutting down, 4 not found, 5 permission denied,
/// 6 not possible in the current state (e.g. stopping a finished session).
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_UNREACHABLE: u8 = 3;
pub const EXIT_NOT_FOUND: u8 = 4;
pub const EXIT_DENIED: u8 = 5;
pub const EXIT_STATE: u8 = 6;

/// The exit code for an error, from the gRPC status it carries (if any).
pub fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return match s.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => EXIT_USAGE,
            tonic::Code::Unavailable => EXIT_UNREACHABLE,
            tonic::Code::NotFound => EXIT_NOT_FOUND,
            tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => EXIT_DENIED,
            tonic::Code::FailedPrecondition => EXIT_STATE,
            _ => EXIT_FAILED,
        };
    }
    if io_error_kind(e) == Some(std::io::ErrorKind::PermissionDenied) {
        return EXIT_DENIED;
    }
    if e.downcast_ref::<tonic::transport::Error>().is_some() || format!("{e}").starts_with("cannot connect") {
        return EXIT_UNREACHABLE;
    }
    if e.downcast_ref::<Usage>().is_some() {
        return EXIT_USAGE;
    }
    if e.downcast_ref::<WrongState>().is_some() {
        return EXIT_STATE;
    }
    EXIT_FAILED
}

/// The kind of the first I/O error among an error's causes.
/// Whether `e` is a write to a closed stdout (`gpuprofctl query 7 | head`): a broken pipe that
/// did not come through gRPC (a connection the server closed, e.g. on refusing a client
/// certificate, is a broken pipe too, and an error).
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    let through_grpc = e.chain().any(|c| c.is::<tonic::Status>() || c.is::<tonic::transport::Error>());
    !through_grpc && io_error_kind(e) == Some(std::io::ErrorKind::BrokenPipe)
}

pub fn io_error_kind(e: &anyhow::Error) -> Option<std::io::ErrorKind> {
    e.chain().find_map(|c| c.downcast_ref::<std::io::Error>()).map(std::io::Error::kind)
}

/// An error as gpuprofctl tells it: its context, then what gpuprofd answered in its own words
/// (never tonic's "status: Unavailable, message: ..." form).
pub fn describe(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = match cause.downcast_ref::<tonic::Status>() {
            Some(s) => status_text(s),
            None => cause.to_string(),
        };
        // A Status's sources (transport detail) repeat what its message says.
        let last = cause.downcast_ref::<tonic::Status>().is_some();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        if last {
            break;
        }
    }
    parts.join(": ")
}

/// What a gRPC status means, in gpuprof's words, with gpuprofd's message.
pub fn status_text(s: &tonic::Status) -> String {
    use tonic::Code as C;
    let msg = s.message().trim();
    let lead = match s.code() {
        C::Unavailable => "gpuprofd is unavailable (not running, shutting down or unreachable)",
        C::DeadlineExceeded => "gpuprofd did not answer in time",
        C::Cancelled => "the call was cut off before gpuprofd answered",
        C::Unimplemented => "this gpuprofd does not know this call (is it older than gpuprofctl?)",
        C::Internal | C::Unknown | C::DataLoss => "gpuprofd failed",
        C::ResourceExhausted => "gpuprofd is out of room for this",
        // The daemon's own messages say what was wrong and what to do.
        _ if !msg.is_empty() => return msg.to_string(),
        C::NotFound => "not found",
        C::PermissionDenied | C::Unauthenticated => "permission denied",
        C::InvalidArgument | C::OutOfRange => "invalid request",
        C::FailedPrecondition | C::Aborted | C::AlreadyExists => "not possible now",
        C::Ok => "ok",
    };
    if msg.is_empty() { lead.to_string() } else { format!("{lead}: {msg}") }
}

/// A usage error found after parsing (exit code 2).
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Not possible in the current state, found by gpuprofctl itself (exit code 6, as for
/// gpuprofd's FAILED_PRECONDITION): e.g. a flame graph of a session without PC samples, which
/// the pprof export refuses the same way.
#[derive(Debug)]
pub struct WrongState(pub String);

impl std::fmt::Display for WrongState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WrongState {}

/// Nanoseconds as a short human duration ("812 ns", "3.25 ms", "1.50 s").
pub fn human_ns(ns: u64) -> String {
    let v = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.2} us", v / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else {
        format!("{:.2} s", v / 1e9)
    }
}

/// Bytes with a binary unit ("812 B", "1.5 KiB", "20.0 GiB").
pub fn human_bytes(b: u64) -> String {
    bytesize::ByteSize(b).display().iec().to_string()
}

/// ns since the Unix epoch as UTC "YYYY-MM-DD HH:MM:SS.uuuuuu" ("-" for 0).
pub fn wall_us(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    format!("{}{:03}", wall(ns), (ns / 1000) % 1000)
}

/// ns since the Unix epoch as UTC "YYYY-MM-DD HH:MM:SS.mmm" ("-" for 0).
pub fn wall(ns: u64) -> String {
    if ns == 0 {
        return "-".into();
    }
    let secs = (ns / 1_000_000_000) as i64;
    let ms = (ns / 1_000_000) % 1000;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{ms:03}", rem / 3600, rem % 3600 / 60, rem % 60)
}

pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Prints rows under a header, each column as wide as its widest cell, two spaces apart;
/// columns whose header starts with '>' are right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    println!("{}", table_text(header, rows));
}

/// The text [`table`] prints, without a final newline.
pub fn table_text(header: &[&str], rows: &[Vec<String>]) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table, TableComponent, presets};
    let mut t = Table::new();
    t.load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.iter().map(|h| h.trim_start_matches('>')));
    for c in [TableComponent::LeftBorder, TableComponent::RightBorder, TableComponent::HeaderLines] {
        t.remove_style(c);
    }
    for r in rows {
        t.add_row(r.iter().take(header.len()));
    }
    let last = header.len().saturating_sub(1);
    for (i, col) in t.column_iter_mut().enumerate() {
        col.set_padding((0, if i == last { 0 } else { 2 }));
        if header[i].starts_with('>') {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.lines().map(|l| l.trim_end().to_string()).collect::<Vec<_>>().join("\n")
}

/// CUPTI's prefix on every stall reason, left out when showing them.
const STALL_PREFIX: &str = "smsp__pcsamp_warps_issue_";

/// A stall reason as people read it ("stalled_long_scoreboard").
pub fn short_stall(s: &str) -> &str {
    let s = s.strip_prefix(STALL_PREFIX).unwrap_or(s);
    if s.is_empty() { "unknown" } else { s }
}

/// A host's clock against the caller's as shown: `+4.000 ms ± 1.5 µs`.
pub fn clock_text(offset_ns: i64, error_ns: u64) -> String {
    format!("{:+.3} ms ± {:.1} µs", offset_ns as f64 / 1e6, error_ns as f64 / 1e3)
}

/// Shortens a long (mangled) name to `max` characters, keeping its start and end.
pub fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max || max < 5 {
        return s.to_string();
    }
    let head = (max - 1) * 2 / 3;
    let tail = max - 1 - head;
    let start: String = s.chars().take(head).collect();
    let end: String = s.chars().skip(n - tail).collect();
    format!("{start}…{end}")
}

/// "session 3: completed (duration), 1200 records from 2 processes": how a trace ended.
pub fn session_line(s: &pb::Session) -> String {
    let n = s.processes.len();
    format!(
        "session {}: {} ({}), {} records from {n} process{}",
        s.id,
        state_name(s.state),
        s.stop_reason,
        s.records,
        if n == 1 { "" } else { "es" }
    )
}

pub fn state_name(s: i32) -> String {
    pb::SessionState::try_from(s)
        .map(|s| s.as_str_name().trim_start_matches("SESSION_STATE_").to_lowercase())
        .unwrap_or_else(|_| format!("state{s}"))
}

pub fn target_text(t: &pb::Target) -> String {
    use pb::target::Target as T;
    match &t.target {
        Some(T::Pid(p)) => format!("pid={p}"),
        Some(T::ExeName(n)) => format!("exe={n}"),
        Some(T::ExePattern(p)) => format!("pattern={p}"),
        Some(T::Cgroup(c)) => format!("cgroup={c}"),
        Some(T::All(_)) => "all".into(),
        Some(T::PodUid(u)) => format!("pod={u}"),
        Some(T::ContainerId(c)) => format!("container={c}"),
        Some(T::Job(j)) if j.ranks.is_empty() => format!("job={}", j.job_id),
        Some(T::Job(j)) => {
            let ranks: Vec<String> = j.ranks.iter().map(u32::to_string).collect();
            format!("job={} rank={}", j.job_id, ranks.join(","))
        }
        None => "?".into(),
    }
}

/// A process's place in its job for tables: "3/8" (rank of world size), "3", "launcher" or "-".
pub fn rank_text(role: &str, rank: Option<u32>, world_size: Option<u32>) -> String {
    match (rank, world_size) {
        (Some(r), Some(w)) => format!("{r}/{w}"),
        (Some(r), None) => r.to_string(),
        (None, _) if !role.is_empty() => role.to_string(),
        (None, _) => "-".into(),
    }
}

pub fn session_json(s: &pb::Session) -> Value {
    let c = s.collect.clone().unwrap_or_default();
    json!({
        "id": s.id,
        "name": s.name,
        "state": state_name(s.state),
        "targets": s.targets.iter().map(target_text).collect::<Vec<_>>(),
        "collect": {
            "preset": c.preset,
            "pc_sampling": c.pc_sampling,
            "pm_sampling_rate_hz": c.pm_sampling_rate_hz,
            "pc_sampling_period_log2": c.pc_sampling_period_log2,
            "pc_stall_reasons": c.pc_stall_reasons,
            "pc_flush_interval_ms": c.pc_flush_interval_ms,
            "pm_metrics": c.pm_metrics,
        },
        "owner_uid": s.owner_uid,
        "created_at_ns": s.created_at_ns,
        "start_at_ns": s.start_at_ns,
        "started_at_ns": s.started_at_ns,
        "stopped_at_ns": s.stopped_at_ns,
        "duration_ms": s.duration_ms,
        "max_records": s.max_records,
        "stop_reason": s.stop_reason,
        "records": s.records,
        "processes": s.processes.iter().map(|p| json!({
            "process_id": p.process_id,
            "pid": p.pid,
            "exe": p.exe,
            "records": p.records,
            "dropped": p.dropped,
            "displaced": p.displaced,
            "state": p.state,
            "joined_at_ns": p.joined_at_ns,
            "detail": p.detail,
            "container_id": p.container_id,
            "pod_uid": p.pod_uid,
            "pod_name": p.pod_name,
            "pod_namespace": p.pod_namespace,
            "job_id": p.job_id,
            "rank": p.rank,
            "role": p.role,
            "pc_sampling": p.pc_sampling.iter().map(|d| json!({
                "device": d.device, "state": d.state, "samples": d.samples, "dropped": d.dropped, "heals": d.heals,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

pub fn summary_json(s: &pb::GetSummaryResponse) -> Value {
    json!({
        "kernel_count": s.kernel_count,
        "kernel_total_ns": s.kernel_total_ns,
        "top_kernels": s.top_kernels.iter().map(|k| json!({
            "name": k.name, "mangled_name": k.mangled_name, "count": k.count, "total_ns": k.total_ns, "mean_ns": k.mean_ns,
            "p50_ns": k.p50_ns, "p95_ns": k.p95_ns, "min_ns": k.min_ns, "max_ns": k.max_ns,
        })).collect::<Vec<_>>(),
        "device_busy": s.device_busy.iter().map(|d| json!({
            "device_id": d.device_id, "busy_ns": d.busy_ns, "span_ns": d.span_ns,
        })).collect::<Vec<_>>(),
        "copies": s.copies.iter().map(|c| json!({
            "direction": c.direction, "count": c.count, "bytes": c.bytes, "total_ns": c.total_ns,
            "bandwidth_gbps": c.bandwidth_gbps,
        })).collect::<Vec<_>>(),
        "api_calls": s.api_calls.iter().map(|a| json!({
            "name": a.name, "domain": a.domain, "count": a.count, "total_ns": a.total_ns, "max_ns": a.max_ns,
        })).collect::<Vec<_>>(),
    })
}

/// A kernel's name as shown: demangled, or as the driver reported it with `mangled`.
pub fn kernel_name<'a>(name: &'a str, mangled_name: &'a str, mangled: bool) -> &'a str {
    if mangled && !mangled_name.is_empty() { mangled_name } else { name }
}

/// Prints a summary as tables (kernel names demangled, or as reported with `mangled`).
pub fn print_summary(s: &pb::GetSummaryResponse, name_width: usize, mangled: bool) {
    let total = s.kernel_total_ns;
    println!("kernels: {}, {} of GPU time", s.kernel_count, human_ns(total));
    if !s.top_kernels.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .top_kernels
            .iter()
            .map(|k| {
                vec![
                    human_ns(k.total_ns),
                    format!("{:.1}%", if total > 0 { k.total_ns as f64 * 100.0 / total as f64 } else { 0.0 }),
                    k.count.to_string(),
                    human_ns(k.mean_ns),
                    human_ns(k.p50_ns),
                    human_ns(k.p95_ns),
                    human_ns(k.max_ns),
                    shorten(kernel_name(&k.name, &k.mangled_name, mangled), name_width),
                ]
            })
            .collect();
        table(&[">TOTAL", ">SHARE", ">COUNT", ">MEAN", ">P50", ">P95", ">MAX", "KERNEL"], &rows);
    }
    if !s.device_busy.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .device_busy
            .iter()
            .map(|d| {
                let pct = if d.span_ns > 0 { d.busy_ns as f64 * 100.0 / d.span_ns as f64 } else { 0.0 };
                vec![d.device_id.to_string(), human_ns(d.busy_ns), human_ns(d.span_ns), format!("{pct:.1}%")]
            })
            .collect();
        table(&[">DEVICE", ">BUSY", ">SPAN", ">UTIL"], &rows);
    }
    if !s.copies.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .copies
            .iter()
            .map(|c| {
                vec![
                    c.direction.clone(),
                    c.count.to_string(),
                    human_bytes(c.bytes),
                    human_ns(c.total_ns),
                    format!("{:.2} GB/s", c.bandwidth_gbps),
                ]
            })
            .collect();
        table(&["COPY", ">COUNT", ">BYTES", ">TIME", ">BANDWIDTH"], &rows);
    }
    if !s.api_calls.is_empty() {
        println!();
        let rows: Vec<Vec<String>> = s
            .api_calls
            .iter()
            .map(|a| {
                vec![human_ns(a.total_ns), a.count.to_string(), human_ns(a.max_ns), a.domain.clone(), a.name.clone()]
            })
            .collect();
        table(&[">TOTAL", ">COUNT", ">MAX", "DOMAIN", "API CALL"], &rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_pipe_is_a_closed_stdout_only_outside_grpc() {
        let pipe = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        assert!(is_closed_stdout(&anyhow::Error::from(pipe()).context("writing rows")));
        // The server closed the connection (a refused client certificate): an error.
        let status = tonic::Status::from_error(Box::new(pipe()));
        assert!(!is_closed_stdout(&anyhow::Error::from(status).context("status")));
        assert!(!is_closed_stdout(&anyhow::anyhow!("no io error")));
    }

    #[test]
    fn formats() {
        assert_eq!(wall(0), "-");
        assert_eq!(wall(1_700_000_000_123_000_000), "2023-11-14 22:13:20.123");
        assert_eq!(wall_us(1_700_000_000_123_456_789), "2023-11-14 22:13:20.123456");
        assert_eq!(human_ns(999), "999 ns");
        assert_eq!(human_ns(1_500_000), "1.50 ms");
        assert_eq!(shorten("abcdefghijklmnopqrstuvwxyz", 10), "abcdef…xyz");
        assert_eq!(state_name(pb::SessionState::Interrupted as i32), "interrupted");
        assert_eq!(human_bytes(812), "812 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }

    #[test]
    fn errors_are_told_in_gpuprofs_words() {
        let e = anyhow::Error::new(tonic::Status::not_found("session 7 does not exist")).context("session show 7");
        assert_eq!(describe(&e), "session show 7: session 7 does not exist");
        assert_eq!(exit_code(&e), EXIT_NOT_FOUND);
        let e = anyhow::Error::new(tonic::Status::unavailable("shutting down"));
        let text = describe(&e);
        assert_eq!(text, "gpuprofd is unavailable (not running, shutting down or unreachable): shutting down");
        assert!(!text.contains("status:") && !text.contains("message:"), "{text}");
        assert_eq!(exit_code(&e), EXIT_UNREACHABLE);
        let e = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied)).context("connecting");
        assert_eq!(exit_code(&e), EXIT_DENIED);
        // The same failure exits the same whether gpuprofd or gpuprofctl found it.
        let by_daemon = anyhow::Error::new(tonic::Status::failed_precondition("session 7 has no PC samples"));
        let by_client = anyhow::Error::new(WrongState("session 7 has no PC samples".into())).context("export 7");
        assert_eq!(exit_code(&by_daemon), EXIT_STATE);
        assert_eq!(exit_code(&by_client), EXIT_STATE);
    }

    #[test]
    fn tables_align_columns() {
        let rows = vec![vec!["1".to_string(), "kernel_a".to_string()], vec!["1234".to_string(), "b".to_string()]];
        assert_eq!(table_text(&[">COUNT", "NAME"], &rows), "COUNT  NAME\n    1  kernel_a\n 1234  b");
    }
}

/// What PC-sample rows are grouped by (`pc top --by`, `pc diff --by`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    Function,
    Line,
    Stall,
    Pc,
}
