//! Flow arrows from each launch/copy API call to the device activities with the same
//! correlation id.

use gpuprof_proto::api as pb;
use rusqlite::Connection;

use super::out::Stop;
use super::scan::{Dims, corrs};

/// Flow key: process and correlation id.
pub(super) fn key(proc: i64, corr: i64) -> u64 {
    ((proc as u64) << 32) | (corr as u64 & 0xffff_ffff)
}

/// Correlation ids present on both sides (API call and device activity), with how many
/// device activities each has, sorted; flow ids are offsets into it.
pub(super) struct Flows {
    keys: Vec<u64>,
    counts: Vec<u32>,
    first_id: Vec<u64>,
    next: Vec<u32>,
}

/// The tables [`Flows::build`] reads.
pub(super) const FLOW_TABLES: &[&str] = &["api", "kernel", "memcpy", "memset"];

impl Flows {
    /// The flows of the session's rows that pass `f`, and the earliest start (ns since the
    /// epoch) of those rows of [`FLOW_TABLES`], `i64::MAX` when there is none: one pass over
    /// each table gives both.
    pub(super) fn build(c: &Connection, d: &Dims, session: u64, f: &pb::RecordFilter) -> Result<(Flows, i64), Stop> {
        let mut first = i64::MAX;
        let mut keys_of = |table: &'static str, each: &mut dyn FnMut(u64)| {
            corrs(c, d, table, session, f, |proc, start, corr| {
                first = first.min(start);
                if corr != 0 {
                    each(key(proc, corr));
                }
            })
        };
        let mut api = Vec::new();
        keys_of("api", &mut |k| api.push(k))?;
        api.sort_unstable();
        api.dedup();
        let mut dev = Vec::new();
        for t in ["kernel", "memcpy", "memset"] {
            keys_of(t, &mut |k| {
                if api.binary_search(&k).is_ok() {
                    dev.push(k);
                }
            })?;
        }
        drop(api);
        dev.sort_unstable();
        let mut keys = Vec::new();
        let mut counts: Vec<u32> = Vec::new();
        for k in dev {
            if keys.last() == Some(&k) {
                if let Some(c) = counts.last_mut() {
                    *c += 1;
                }
            } else {
                keys.push(k);
                counts.push(1);
            }
        }
        let mut first_id = Vec::with_capacity(keys.len());
        let mut id = 1u64;
        for c in &counts {
            first_id.push(id);
            id += u64::from(*c);
        }
        let next = vec![0; keys.len()];
        Ok((Flows { keys, counts, first_id, next }, first))
    }

    /// Flow ids starting at an API call.
    pub(super) fn starts(&self, k: u64) -> Option<(u64, u32)> {
        self.keys.binary_search(&k).ok().map(|i| (self.first_id[i], self.counts[i]))
    }

    /// The next flow id ending at a device activity.
    pub(super) fn end(&mut self, k: u64) -> Option<u64> {
        let i = self.keys.binary_search(&k).ok()?;
        if self.next[i] >= self.counts[i] {
            return None;
        }
        self.next[i] += 1;
        Some(self.first_id[i] + u64::from(self.next[i]) - 1)
    }
}
