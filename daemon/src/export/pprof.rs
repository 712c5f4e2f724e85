//! The pprof writer (`--format pprof`): a session's PC samples as a gzipped pprof `Profile`
//! (`go tool pprof`, Pyroscope, Speedscope).
//!
//! Layout: sample types "samples" (all stall reasons together) then one per stall reason
//! present, hottest first (names without CUPTI's prefix), all in unit "count"; one location
//! per (function, PC offset) with its source line, one sample per location holding its
//! counts; functions with the demangled name, the name as CUPTI reported it and the source
//! file; the period is the session's sampling period in SM cycles. A session's PC rows are
//! aggregated (thousands), so the profile is built in memory.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use gpuprof_proto::api as pb;
use gpuprof_proto::pprof::{Function, Line, Location, Profile, Sample, ValueType};
use prost::Message;
use rusqlite::OptionalExtension;

use super::out::{CHUNK, Out, Stop, Tx};
use crate::error::ApiError;
use crate::pcsamp::short_stall;
use crate::query::pc::{PcRow, pc_rows};

/// The string table under construction ("" at index 0).
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn id(&mut self, s: &str) -> i64 {
        if self.table.is_empty() {
            self.table.push(String::new());
            self.index.insert(String::new(), 0);
        }
        if let Some(i) = self.index.get(s) {
            return *i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The profile of `rows` (a session's PC rows) sampled every 2^`period_log2` cycles.
pub fn profile(rows: &[PcRow], period_log2: u32, start_ns: u64, dur_ns: u64, filter: &str) -> Profile {
    let mut s = Strings::default();
    s.id("");
    // Stall reasons, hottest first.
    let mut stall_totals: HashMap<&str, u64> = HashMap::new();
    for r in rows {
        *stall_totals.entry(r.stall.as_str()).or_default() += r.count;
    }
    let mut stalls: Vec<(&str, u64)> = stall_totals.into_iter().collect();
    stalls.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let count = s.id("count");
    let mut sample_type = vec![ValueType { r#type: s.id("samples"), unit: count }];
    let mut column: HashMap<&str, usize> = HashMap::new();
    for (i, (reason, _)) in stalls.iter().enumerate() {
        let name = if reason.is_empty() { "unknown_stall" } else { short_stall(reason) };
        sample_type.push(ValueType { r#type: s.id(name), unit: count });
        column.insert(reason, i + 1);
    }
    let width = sample_type.len();
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<i64, u64> = HashMap::new();
    let mut locations: Vec<Location> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut location_ids: HashMap<(i64, u64), usize> = HashMap::new();
    for r in rows {
        let fid = *function_ids.entry(r.function).or_insert_with(|| {
            let id = functions.len() as u64 + 1;
            functions.push(Function {
                id,
                name: s.id(&r.name),
                system_name: s.id(&r.mangled),
                filename: s.id(&r.file),
                start_line: 0,
            });
            id
        });
        if functions[fid as usize - 1].filename == 0 && !r.file.is_empty() {
            functions[fid as usize - 1].filename = s.id(&r.file);
        }
        let li = *location_ids.entry((r.function, r.pc)).or_insert_with(|| {
            let id = locations.len() as u64 + 1;
            locations.push(Location {
                id,
                mapping_id: 0,
                address: r.pc,
                line: vec![Line { function_id: fid, line: i64::from(r.line) }],
                is_folded: false,
            });
            samples.push(Sample { location_id: vec![id], value: vec![0; width], label: Vec::new() });
            samples.len() - 1
        });
        let v = &mut samples[li].value;
        v[0] += r.count as i64;
        if let Some(c) = column.get(r.stall.as_str()) {
            v[*c] += r.count as i64;
        }
    }
    let cycles = s.id("cycles");
    let comment = if filter.is_empty() { Vec::new() } else { vec![s.id(&format!("kernel filter: {filter}"))] };
    let default_sample_type = s.id("samples");
    Profile {
        sample_type,
        sample: samples,
        mapping: Vec::new(),
        location: locations,
        function: functions,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: start_ns as i64,
        duration_nanos: dur_ns as i64,
        period_type: Some(ValueType { r#type: cycles, unit: count }),
        period: 1i64 << period_log2.min(62),
        comment,
        default_sample_type,
        string_table: s.table,
    }
}

/// A session's PC samples as a gzipped pprof profile.
pub(super) fn pprof(db: &Path, session: u64, f: &pb::RecordFilter, tx: &Tx) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let row: Option<(String, i64, i64)> = c
        .query_row(
            "SELECT collect, coalesce(started_ns, 0), coalesce(stopped_ns, 0) FROM sessions WHERE id = ?1",
            [session as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let (collect, started, stopped) = row.unwrap_or_default();
    let period_log2 = serde_json::from_str::<serde_json::Value>(&collect)
        .ok()
        .and_then(|v| v.get("pc_sampling_period_log2").and_then(|p| p.as_u64()))
        .filter(|p| *p > 0)
        .unwrap_or(10) as u32;
    let rows = pc_rows(&c, session, &f.name_pattern)?;
    if rows.is_empty() {
        return Err(Stop::Failed(ApiError::FailedPrecondition(format!(
            "session {session} has no PC samples{}; start sessions with PC sampling \
             (gpuprofctl session start --pc-sampling, gpuprofctl trace --pc-sampling)",
            if f.name_pattern.is_empty() {
                String::new()
            } else {
                format!(" of kernels matching {:?}", f.name_pattern)
            }
        ))));
    }
    let dur = if stopped > started { (stopped - started) as u64 } else { 0 };
    let p = profile(&rows, period_log2, started.max(0) as u64, dur, &f.name_pattern);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec()).map_err(|e| ApiError::Internal(format!("compressing the profile: {e}")))?;
    let data = gz.finish().map_err(|e| ApiError::Internal(format!("compressing the profile: {e}")))?;
    let total = p.sample.len() as u64;
    let mut out = Out::new(tx, total);
    for (i, chunk) in data.chunks(CHUNK).enumerate() {
        out.buf = chunk.to_vec();
        out.written = if (i + 1) * CHUNK >= data.len() { total } else { 0 };
        out.send()?;
    }
    Ok(())
}
