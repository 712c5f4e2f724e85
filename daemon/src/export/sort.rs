//! A reader's records in (process, start, table) order in bounded memory: runs of [`RUN`]
//! records sorted in memory, written to an unnamed temporary file next to the database once
//! there is more than one, and merged as they are read back. The sort is stable and the merge
//! prefers the earlier run, so records with equal keys keep the order they were read in.
//!
//! SQLite's sorter (`ORDER BY`) did this before at several times the cost: it builds a record
//! of every row and compares them column by column; here a record is 12 integers and the key
//! three of them.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::rec::Rec;

/// Records sorted in memory at a time (3 MiB of them).
pub(super) const RUN: usize = 32 * 1024;

/// A record and its duration as the sorter holds them.
pub(super) type Item = (Rec, i64);

/// Bytes of one record in the temporary file: proc, start, table, the 8 values, duration.
const REC_BYTES: usize = 12 * 8;

/// Bytes of all the runs' read buffers together while merging, within [MIN_BUF, MAX_BUF] each.
const MERGE_BUFFERS: usize = 4 << 20;
const MIN_BUF: usize = 4 << 10;
const MAX_BUF: usize = 64 << 10;

/// The order: process, start, table.
type Key = (i64, i64, usize);

fn key(r: &Item) -> Key {
    (r.0.proc, r.0.start, r.0.table)
}

/// Collects records, then hands them back sorted (see the module's documentation).
pub(super) struct Sorter<'a> {
    dir: &'a Path,
    run: Vec<Item>,
    file: Option<BufWriter<File>>,
    /// The runs written so far: offset in the file and record count.
    runs: Vec<(u64, u64)>,
    written: u64,
}

impl<'a> Sorter<'a> {
    /// A sorter whose temporary file, if it needs one, is created in `dir`.
    pub(super) fn new(dir: &'a Path) -> Sorter<'a> {
        Sorter { dir, run: Vec::with_capacity(RUN), file: None, runs: Vec::new(), written: 0 }
    }

    pub(super) fn push(&mut self, r: Item) -> std::io::Result<()> {
        self.run.push(r);
        if self.run.len() == RUN { self.spill() } else { Ok(()) }
    }

    /// Sorts the current run and appends it to the temporary file.
    fn spill(&mut self) -> std::io::Result<()> {
        self.run.sort_by_key(key);
        let f = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(BufWriter::with_capacity(MAX_BUF, tempfile::tempfile_in(self.dir)?)),
        };
        let n = self.run.len() as u64;
        for (r, dur) in self.run.drain(..) {
            let words = [r.proc, r.start, r.table as i64];
            for w in words.iter().chain(&r.v).chain([&dur]) {
                f.write_all(&w.to_le_bytes())?;
            }
        }
        self.runs.push((self.written, n));
        self.written += n * REC_BYTES as u64;
        Ok(())
    }

    /// Every record pushed, in order.
    pub(super) fn finish(mut self) -> std::io::Result<Sorted> {
        if self.runs.is_empty() {
            self.run.sort_by_key(key);
            return Ok(Sorted(Inner::Memory(self.run.into_iter())));
        }
        if !self.run.is_empty() {
            self.spill()?;
        }
        let Some(f) = self.file.take() else { return Ok(Sorted(Inner::Memory(Vec::new().into_iter()))) };
        let file = f.into_inner().map_err(|e| e.into_error())?;
        let buf = (MERGE_BUFFERS / self.runs.len()).clamp(MIN_BUF, MAX_BUF) / REC_BYTES * REC_BYTES;
        let mut runs: Vec<RunReader> = self
            .runs
            .iter()
            .map(|&(off, left)| RunReader { off, left, buf: vec![0; buf], pos: buf, end: buf })
            .collect();
        let mut heap = BinaryHeap::with_capacity(runs.len());
        let mut heads = Vec::with_capacity(runs.len());
        for (i, r) in runs.iter_mut().enumerate() {
            let h = r.next(&file)?;
            if let Some(h) = &h {
                heap.push(Reverse((key(h), i)));
            }
            heads.push(h);
        }
        Ok(Sorted(Inner::Merged { file, runs, heads, heap }))
    }
}

/// One run in the temporary file, read in buffered chunks.
struct RunReader {
    off: u64,
    left: u64,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
}

impl RunReader {
    fn next(&mut self, f: &File) -> std::io::Result<Option<Item>> {
        if self.pos == self.end {
            if self.left == 0 {
                return Ok(None);
            }
            let n = (self.buf.len() / REC_BYTES).min(self.left as usize);
            self.end = n * REC_BYTES;
            f.read_exact_at(&mut self.buf[..self.end], self.off)?;
            self.off += self.end as u64;
            self.left -= n as u64;
            self.pos = 0;
        }
        let mut w = [0i64; 12];
        for (i, x) in w.iter_mut().enumerate() {
            let at = self.pos + i * 8;
            *x = i64::from_le_bytes(self.buf[at..at + 8].try_into().unwrap_or_default());
        }
        self.pos += REC_BYTES;
        let mut v = [0i64; 8];
        v.copy_from_slice(&w[3..11]);
        Ok(Some((Rec { proc: w[0], start: w[1], table: w[2] as usize, v }, w[11])))
    }
}

/// The sorted records.
pub(super) struct Sorted(Inner);

/// All in memory, or runs merged from the temporary file (each run's next record in `heads`,
/// the runs by that record's key and their index in `heap`).
enum Inner {
    Memory(std::vec::IntoIter<Item>),
    Merged { file: File, runs: Vec<RunReader>, heads: Vec<Option<Item>>, heap: BinaryHeap<Reverse<(Key, usize)>> },
}

impl Sorted {
    pub(super) fn next(&mut self) -> std::io::Result<Option<Item>> {
        match &mut self.0 {
            Inner::Memory(it) => Ok(it.next()),
            Inner::Merged { file, runs, heads, heap } => {
                let Some(Reverse((_, i))) = heap.pop() else { return Ok(None) };
                let next = runs[i].next(file)?;
                if let Some(h) = &next {
                    heap.push(Reverse((key(h), i)));
                }
                Ok(std::mem::replace(&mut heads[i], next))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(proc: i64, start: i64, table: usize, seq: i64) -> Item {
        (Rec { proc, start, table, v: [seq, -seq, 0, 0, 0, 0, 0, i64::MIN] }, seq * 3)
    }

    fn sorted(items: &[Item]) -> Vec<Item> {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Sorter::new(dir.path());
        for r in items {
            s.push(r.clone()).unwrap();
        }
        let mut out = s.finish().unwrap();
        let mut v = Vec::new();
        while let Some(r) = out.next().unwrap() {
            v.push(r);
        }
        v
    }

    /// Records spread over many runs come back in key order, equal keys in the order they
    /// were pushed, every value as it was, none lost: what a stable sort of them gives.
    #[test]
    fn runs_merge_into_a_stable_order() {
        let mut items = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for seq in 0..(RUN as i64 * 5 + 123) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Few distinct keys, so that many are equal across runs.
            items.push(rec((x % 3) as i64, ((x >> 8) % 500) as i64 - 250, ((x >> 20) % 2) as usize, seq));
        }
        let got = sorted(&items);
        let mut want = items.clone();
        want.sort_by_key(key);
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((key(g), g.0.v, g.1), (key(w), w.0.v, w.1));
        }
    }

    #[test]
    fn one_run_stays_in_memory() {
        let items: Vec<Item> = (0..10).map(|i| rec(1, 10 - i, 0, i)).collect();
        let got = sorted(&items);
        assert_eq!(got.iter().map(|r| r.0.start).collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>());
    }
}
