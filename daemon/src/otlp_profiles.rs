//! PC samples as OTLP profiles (`[otlp] profiles = true`): the samples that reach the daemon
//! are summed per (process, GPU, function, source line, PC, stall reason) and sent with each
//! OTLP export as one `ExportProfilesServiceRequest` (the profiles signal, `v1development`):
//! one resource per process (`host.name`, `process.pid`, `process.executable.name`, the pod
//! and container when known), one profile per GPU it used (`gpu.index`; sample type
//! `pc_samples`/`count`), each sample a one-frame stack (the kernel at its PC, with file and
//! line when the cubin had line information) with the stall reason as an attribute
//! (`gpu.pc.stall_reason`, without CUPTI's `smsp__pcsamp_warps_issue_` prefix).
//!
//! What waits for the next export is bounded ([`MAX_ENTRIES`] distinct rows); beyond it, and
//! when an export fails, samples are counted as dropped (`gpuprof_otlp_pc_samples_dropped_total`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use gpuprof_proto::api as pb;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development::{
    Function, KeyValueAndUnit, Line, Location, Profile, ProfilesDictionary, ResourceProfiles, Sample, ScopeProfiles,
    Stack, ValueType,
};
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::registry::Placement;

/// Distinct rows kept between two exports at most.
pub const MAX_ENTRIES: usize = 200_000;

/// (function, mangled name, file, line, PC offset, stall reason).
type Row = (String, String, String, u32, u64, String);

/// The samples waiting for the next export.
#[derive(Default)]
pub struct PcProfiles {
    inner: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    /// (process id, GPU) → row → samples.
    by: BTreeMap<(u64, u32), HashMap<Row, u64>>,
    entries: usize,
    dropped: u64,
    /// Start of the period the pending samples cover (ns since the epoch; 0: none yet).
    since_ns: u64,
}

/// What one export takes.
#[derive(Default)]
pub struct Taken {
    pub by: BTreeMap<(u64, u32), HashMap<Row, u64>>,
    /// Samples dropped since the last take (over [`MAX_ENTRIES`]).
    pub dropped: u64,
    pub since_ns: u64,
}

impl Taken {
    pub fn samples(&self) -> u64 {
        self.by.values().flat_map(|m| m.values()).sum()
    }
}

impl PcProfiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the rows of one batch of process `proc` (rows as `StreamPcSamples` shows them).
    pub fn add(&self, proc: u64, start_ns: u64, rows: &[pb::PcSampleRow]) {
        let mut g = self.lock();
        if g.since_ns == 0 || (start_ns > 0 && start_ns < g.since_ns) {
            g.since_ns = start_ns;
        }
        for r in rows {
            let key = (
                r.function_name.clone(),
                r.mangled_name.clone(),
                r.file.clone(),
                r.line,
                r.pc_offset,
                crate::pcsamp::short_stall(&r.stall_reason).to_string(),
            );
            let full = g.entries >= MAX_ENTRIES;
            let m = g.by.entry((proc, r.device)).or_default();
            if let Some(n) = m.get_mut(&key) {
                *n += r.count;
            } else if full {
                g.dropped += r.count;
            } else {
                m.insert(key, r.count);
                g.entries += 1;
            }
        }
    }

    /// Takes what is pending.
    pub fn take(&self) -> Taken {
        let mut g = self.lock();
        let p = std::mem::take(&mut *g);
        Taken { by: p.by, dropped: p.dropped, since_ns: p.since_ns }
    }
}

/// A process as the profiles' resource names it.
#[derive(Debug, Clone, Default)]
pub struct ProcInfo {
    pub pid: u32,
    pub exe: String,
    pub placement: Placement,
    /// The distributed job it reported (empty id and no rank when none).
    pub job_id: String,
    pub rank: Option<u32>,
}

/// A process's distributed job as attributes: `gpuprof.job.id` and `gpuprof.job.rank`, each
/// when known (for profiles' resources here, and metrics' process points in `otlp`).
pub fn job_attributes(job_id: &str, rank: Option<u32>) -> Vec<KeyValue> {
    let mut out = Vec::new();
    if !job_id.is_empty() {
        out.push(s("gpuprof.job.id", job_id));
    }
    if let Some(r) = rank {
        out.push(kv("gpuprof.job.rank", any_value::Value::IntValue(i64::from(r))));
    }
    out
}

fn kv(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue { key: key.into(), value: Some(AnyValue { value: Some(v) }), ..Default::default() }
}

fn s(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.into()))
}

/// The string table, with "" at index 0 as OTLP requires.
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i32>,
}

impl Strings {
    fn new() -> Strings {
        Strings { table: vec![String::new()], index: HashMap::from([(String::new(), 0)]) }
    }

    fn id(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i32;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The request for what was taken; `procs` names the processes (an unknown one gets its id).
pub fn request(host: &str, taken: &Taken, procs: &HashMap<u64, ProcInfo>, now_ns: u64) -> ExportProfilesServiceRequest {
    let mut strings = Strings::new();
    // Index 0 of every table is the empty entry OTLP reserves.
    let mut dict = ProfilesDictionary {
        mapping_table: vec![Default::default()],
        location_table: vec![Default::default()],
        function_table: vec![Default::default()],
        link_table: vec![Default::default()],
        attribute_table: vec![Default::default()],
        stack_table: vec![Default::default()],
        ..Default::default()
    };
    let mut functions: HashMap<(String, String, String), i32> = HashMap::new();
    let mut locations: HashMap<(i32, u64, u32), i32> = HashMap::new();
    let mut stalls: HashMap<String, i32> = HashMap::new();
    let sample_type = ValueType { type_strindex: strings.id("pc_samples"), unit_strindex: strings.id("count") };
    let stall_key = strings.id("gpu.pc.stall_reason");
    let start = if taken.since_ns > 0 { taken.since_ns } else { now_ns };
    let mut resources: BTreeMap<u64, ResourceProfiles> = BTreeMap::new();
    for (&(proc, gpu), rows) in &taken.by {
        let mut profile = Profile {
            sample_type: Some(sample_type),
            time_unix_nano: start,
            duration_nano: now_ns.saturating_sub(start),
            period_type: Some(ValueType { type_strindex: strings.id("cycles"), unit_strindex: strings.id("count") }),
            ..Default::default()
        };
        let gpu_attr = dict.attribute_table.len() as i32;
        dict.attribute_table.push(KeyValueAndUnit {
            key_strindex: strings.id("gpu.index"),
            value: Some(AnyValue { value: Some(any_value::Value::IntValue(i64::from(gpu))) }),
            unit_strindex: 0,
        });
        profile.attribute_indices.push(gpu_attr);
        let mut rows: Vec<(&Row, &u64)> = rows.iter().collect();
        rows.sort();
        for ((function, mangled, file, line, pc, stall), count) in rows {
            let f = *functions.entry((function.clone(), mangled.clone(), file.clone())).or_insert_with(|| {
                dict.function_table.push(Function {
                    name_strindex: strings.id(function),
                    system_name_strindex: strings.id(mangled),
                    filename_strindex: strings.id(file),
                    start_line: 0,
                });
                dict.function_table.len() as i32 - 1
            });
            let loc = *locations.entry((f, *pc, *line)).or_insert_with(|| {
                dict.location_table.push(Location {
                    mapping_index: 0,
                    address: *pc,
                    lines: vec![Line { function_index: f, line: i64::from(*line), column: 0 }],
                    attribute_indices: Vec::new(),
                });
                dict.stack_table.push(Stack { location_indices: vec![dict.location_table.len() as i32 - 1] });
                dict.stack_table.len() as i32 - 1
            });
            let st = *stalls.entry(stall.clone()).or_insert_with(|| {
                dict.attribute_table.push(KeyValueAndUnit {
                    key_strindex: stall_key,
                    value: Some(AnyValue { value: Some(any_value::Value::StringValue(stall.clone())) }),
                    unit_strindex: 0,
                });
                dict.attribute_table.len() as i32 - 1
            });
            profile.samples.push(Sample {
                stack_index: loc,
                attribute_indices: vec![st],
                values: vec![*count as i64],
                ..Default::default()
            });
        }
        let rp = resources.entry(proc).or_insert_with(|| {
            let p = procs.get(&proc).cloned().unwrap_or_default();
            let mut attributes = vec![
                s("service.name", "gpuprofd"),
                s("host.name", host),
                kv("process.pid", any_value::Value::IntValue(i64::from(p.pid))),
                s("process.executable.name", p.exe.rsplit('/').next().unwrap_or_default()),
                kv("gpuprof.process.id", any_value::Value::IntValue(proc as i64)),
            ];
            attributes.extend(job_attributes(&p.job_id, p.rank));
            let pl = &p.placement;
            for (k, v) in [
                ("container.id", &pl.container_id),
                ("k8s.pod.uid", &pl.pod_uid),
                ("k8s.pod.name", &pl.pod_name),
                ("k8s.namespace.name", &pl.pod_namespace),
                ("k8s.container.name", &pl.container_name),
            ] {
                if !v.is_empty() {
                    attributes.push(s(k, v));
                }
            }
            ResourceProfiles {
                resource: Some(Resource { attributes, ..Default::default() }),
                scope_profiles: vec![ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "gpuprofd".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }
        });
        rp.scope_profiles[0].profiles.push(profile);
    }
    dict.string_table = strings.table;
    ExportProfilesServiceRequest { resource_profiles: resources.into_values().collect(), dictionary: Some(dict) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(function: &str, line: u32, pc: u64, stall: &str, count: u64, device: u32) -> pb::PcSampleRow {
        pb::PcSampleRow {
            function_name: function.into(),
            mangled_name: format!("_Z{function}"),
            file: "k.cu".into(),
            line,
            pc_offset: pc,
            stall_reason: stall.into(),
            count,
            device,
            ..Default::default()
        }
    }

    #[test]
    fn samples_become_one_frame_stacks_with_their_stall_reason() {
        let p = PcProfiles::default();
        p.add(
            7,
            1_000,
            &[row("gather", 15, 0x40, "long_scoreboard", 30, 0), row("gather", 15, 0x40, "selected", 5, 0)],
        );
        p.add(7, 2_000, &[row("gather", 15, 0x40, "long_scoreboard", 10, 0), row("fma", 24, 0x80, "wait", 2, 1)]);
        let t = p.take();
        assert_eq!((t.samples(), t.dropped, t.since_ns), (47, 0, 1_000));
        assert_eq!(p.take().samples(), 0, "taken once");
        let procs = HashMap::from([(
            7,
            ProcInfo {
                pid: 42,
                exe: "/usr/bin/python3".into(),
                job_id: "run-7".into(),
                rank: Some(3),
                ..Default::default()
            },
        )]);
        let req = request("node-1", &t, &procs, 5_000);
        let d = req.dictionary.as_ref().unwrap();
        let st = |i: i32| d.string_table[i as usize].as_str();
        assert_eq!(d.string_table[0], "");
        assert_eq!(req.resource_profiles.len(), 1);
        let profiles = &req.resource_profiles[0].scope_profiles[0].profiles;
        assert_eq!(profiles.len(), 2, "one profile per GPU");
        let total: i64 = profiles.iter().flat_map(|p| &p.samples).map(|s| s.values[0]).sum();
        assert_eq!(total, 47);
        let p0 = &profiles[0];
        assert_eq!((p0.time_unix_nano, p0.duration_nano), (1_000, 4_000));
        let hot = p0.samples.iter().max_by_key(|s| s.values[0]).unwrap();
        assert_eq!(hot.values[0], 40, "the same row from two batches is summed");
        let loc = &d.location_table[d.stack_table[hot.stack_index as usize].location_indices[0] as usize];
        assert_eq!(loc.address, 0x40);
        let f = &d.function_table[loc.lines[0].function_index as usize];
        assert_eq!(
            (st(f.name_strindex), st(f.system_name_strindex), st(f.filename_strindex)),
            ("gather", "_Zgather", "k.cu")
        );
        assert_eq!(loc.lines[0].line, 15);
        let a = &d.attribute_table[hot.attribute_indices[0] as usize];
        assert_eq!(st(a.key_strindex), "gpu.pc.stall_reason");
        assert_eq!(a.value.as_ref().unwrap().value, Some(any_value::Value::StringValue("long_scoreboard".into())));
        let attrs = &req.resource_profiles[0].resource.as_ref().unwrap().attributes;
        assert!(
            attrs.iter().any(|kv| kv.key == "process.pid"
                && kv.value.as_ref().unwrap().value == Some(any_value::Value::IntValue(42)))
        );
        assert!(
            attrs.iter().any(|kv| kv.key == "gpuprof.job.rank"
                && kv.value.as_ref().unwrap().value == Some(any_value::Value::IntValue(3))),
            "the rank: {attrs:?}"
        );
    }

    #[test]
    fn pending_rows_are_bounded_and_the_rest_counted() {
        let p = PcProfiles::default();
        let rows: Vec<_> = (0..MAX_ENTRIES as u64 + 10).map(|i| row("k", 1, i, "wait", 2, 0)).collect();
        p.add(1, 1, &rows);
        p.add(1, 1, &[row("k", 1, 0, "wait", 3, 0)]);
        let t = p.take();
        assert_eq!(t.dropped, 20, "10 new rows over the bound, 2 samples each");
        assert_eq!(t.samples(), MAX_ENTRIES as u64 * 2 + 3, "known rows still count");
    }
}
