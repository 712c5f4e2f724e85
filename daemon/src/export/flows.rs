//! Flow arrows from each launch/copy API call to the device activities with the same
//! correlation id.

use super::rec::{EVENT_TABLES, Rec};

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

/// Which side of a flow a record of each of [`EVENT_TABLES`] is on, and where its correlation
/// id is in `Rec::v`: API calls start flows; kernels, copies and sets end them.
fn side(table: usize) -> Option<(bool, usize)> {
    match EVENT_TABLES[table] {
        "api" => Some((true, 1)),
        "kernel" | "memcpy" | "memset" => Some((false, 2)),
        _ => None,
    }
}

/// The flow keys of the records one reader read: gathered as it reads them, so that the
/// flows need no pass of their own over the tables.
#[derive(Default)]
pub(super) struct FlowKeys {
    api: Vec<u64>,
    dev: Vec<u64>,
}

impl FlowKeys {
    /// What notes each record of `EVENT_TABLES[table]` (those without a correlation id start or
    /// end no flow): the table's side is looked up once, not per record.
    pub(super) fn for_table(&mut self, table: usize) -> impl FnMut(&Rec) + '_ {
        let side = side(table);
        move |rec| {
            if let Some((api, at)) = side
                && rec.v[at] != 0
            {
                let k = key(rec.proc, rec.v[at]);
                if api { self.api.push(k) } else { self.dev.push(k) }
            }
        }
    }
}

impl Flows {
    /// The flows of the records the readers noted.
    pub(super) fn from_keys(parts: Vec<FlowKeys>) -> Flows {
        let mut api = Vec::new();
        let mut dev = Vec::new();
        for p in parts {
            api.extend(p.api);
            dev.extend(p.dev);
        }
        api.sort_unstable();
        api.dedup();
        dev.retain(|k| api.binary_search(k).is_ok());
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
        Flows { keys, counts, first_id, next }
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
