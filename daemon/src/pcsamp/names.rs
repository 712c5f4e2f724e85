//! The strings one agent connection defined, kept so that PC sample batches can be pushed to
//! stream subscribers with names before they reach the database.

use std::collections::HashMap;

use gpuprof_proto::agent as wire;
use gpuprof_proto::api as pb;

/// A connection's strings by id (id 0: "").
#[derive(Default)]
pub struct ConnNames {
    values: Vec<String>,
    demangled: HashMap<u32, String>,
}

impl ConnNames {
    /// Adds the next defined string (ids are defined in order from 1).
    pub fn push(&mut self, v: &str) {
        if self.values.is_empty() {
            self.values.push(String::new());
        }
        self.values.push(v.to_string());
    }

    pub fn get(&self, id: u32) -> &str {
        self.values.get(id as usize).map(String::as_str).unwrap_or("")
    }

    /// The demangled form of string `id` (itself when it is not a mangled symbol).
    fn demangled(&mut self, id: u32) -> String {
        if let Some(d) = self.demangled.get(&id) {
            return d.clone();
        }
        let raw = self.get(id).to_string();
        let d = crate::demangle::demangle(&raw).unwrap_or_else(|| raw.clone());
        self.demangled.insert(id, d.clone());
        d
    }

    /// A batch as stream rows (subscribers filter them by kernel themselves).
    pub fn rows(&mut self, proc: u64, b: &wire::PcSampleBatch) -> Vec<pb::PcSampleRow> {
        b.samples
            .iter()
            .map(|s| {
                let function_name = self.demangled(s.function_name_id);
                let raw = self.get(s.function_name_id);
                pb::PcSampleRow {
                    process_id: proc,
                    mangled_name: if raw == function_name { String::new() } else { raw.to_string() },
                    function_name,
                    pc_offset: s.pc_offset,
                    stall_reason: self.get(s.stall_reason_id).to_string(),
                    count: s.count,
                    file: self.get(s.file_id).to_string(),
                    line: s.line,
                    device: b.device_id,
                }
            })
            .collect()
    }
}
