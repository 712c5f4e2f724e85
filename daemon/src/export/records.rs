//! The session's records for the Chrome and Perfetto traces: each event table scanned (see
//! [`super::scan`]) on one of a few threads, each thread's records put in (process, start)
//! order (see [`super::sort`]), and the threads' streams merged into one.

use std::path::Path;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

use gpuprof_proto::api as pb;

use super::flows::{FlowKeys, Flows};
use super::out::Stop;
use super::scan::{Dims, scan};
use super::sort::Sorter;

pub use super::rec::EVENT_TABLES;
pub(super) use super::rec::Rec;

/// Records (and their durations) per batch handed from a reading thread to the merging one.
const BATCH: usize = 2048;

type Batch = Vec<(Rec, i64)>;

/// What a reader sends: first what it saw of its rows while reading them, then its sorted
/// records in batches.
enum Part {
    Seen(FlowKeys, i64),
    Batch(Batch),
}

/// What the whole session's rows give before the first record is written: their flows and
/// their earliest start (ns since the epoch), `i64::MAX` when there is none.
pub(super) struct Prelude {
    pub(super) flows: Flows,
    pub(super) first: i64,
}

/// The tables each reading thread reads (indexes into [`EVENT_TABLES`]): kernels and API
/// calls, the bulk of any CUDA trace, get a thread each; the other kinds share one.
pub(super) const READERS: &[&[usize]] = &[&[0], &[4], &[1, 2, 3, 5, 6, 7, 8]];

/// Which of two records comes first: (process, start), ties in table order.
fn sort_key(r: &Rec) -> (i64, i64, usize) {
    (r.proc, r.start, r.table)
}

/// The index of the smallest head by [`sort_key`], if any.
fn first_of<'a>(heads: impl Iterator<Item = Option<&'a Rec>>) -> Option<usize> {
    let mut best: Option<(usize, (i64, i64, usize))> = None;
    for (i, h) in heads.enumerate() {
        if let Some(r) = h
            && best.is_none_or(|(_, b)| sort_key(r) < b)
        {
            best = Some((i, sort_key(r)));
        }
    }
    best.map(|(i, _)| i)
}

/// Calls `write` with each of the session's records (and its duration) in (process, start)
/// order, on the writer `start` makes from the [`Prelude`], and returns that writer. The
/// tables are read and sorted on a few threads (see [`READERS`]), each with a read connection
/// of its own, noting the flows' keys and the first start as they read; this thread builds the
/// prelude from what they noted, then merges the sorted records they send and `write` formats.
/// At most two batches per reader wait, so memory stays bounded. A reading error ends the
/// export with that error; an error of `start` or `write` (the client gone) ends the readers.
/// Which rows are read does not depend on the connection: every scan is bounded by the
/// rollup's rowid range.
pub(super) fn each_record<W>(
    db: &Path,
    session: u64,
    f: &pb::RecordFilter,
    start: impl FnOnce(Prelude) -> Result<W, Stop>,
    mut write: impl FnMut(&mut W, &Rec, i64) -> Result<(), Stop>,
) -> Result<W, Stop> {
    std::thread::scope(|s| {
        let mut readers = Vec::with_capacity(READERS.len());
        for tables in READERS {
            let (tx, batches) = sync_channel::<Result<Part, Stop>>(2);
            s.spawn(move || {
                if let Err(e) = read_tables(db, tables, session, f, &tx) {
                    let _ = tx.send(Err(e));
                }
            });
            readers.push(Source { batches, batch: Vec::new().into_iter(), head: None });
        }
        // Returning drops the receivers, which ends each reader at its next send.
        let mut keys = Vec::with_capacity(readers.len());
        let mut first = i64::MAX;
        for r in &readers {
            match r.batches.recv() {
                Ok(Ok(Part::Seen(k, f))) => {
                    keys.push(k);
                    first = first.min(f);
                }
                Ok(Err(e)) => return Err(e),
                Ok(Ok(Part::Batch(_))) | Err(_) => {
                    return Err(Stop::Failed(crate::error::ApiError::Internal(
                        "export: a reading thread ended before reading its rows".into(),
                    )));
                }
            }
        }
        let mut w = start(Prelude { flows: Flows::from_keys(keys), first })?;
        for r in &mut readers {
            r.advance()?;
        }
        while let Some(i) = first_of(readers.iter().map(|r| r.head.as_ref().map(|(rec, _)| rec))) {
            let r = &mut readers[i];
            if let Some((rec, dur)) = r.head.take() {
                write(&mut w, &rec, dur)?;
            }
            r.advance()?;
        }
        Ok(w)
    })
}

/// One reader: its tables' rows read, their flow keys and first start sent, then the rows
/// sorted together (see [`super::sort`]) and sent in batches; returns once every row is sent
/// or the receiver is gone.
fn read_tables(
    db: &Path,
    tables: &[usize],
    session: u64,
    f: &pb::RecordFilter,
    tx: &SyncSender<Result<Part, Stop>>,
) -> Result<(), Stop> {
    let c = crate::store::open_reader(db)?;
    let d = Dims::read(&c, session)?;
    let mut sorter = Sorter::new(db.parent().unwrap_or(Path::new(".")));
    let mut keys = FlowKeys::default();
    let mut first = i64::MAX;
    for &t in tables {
        let mut note = keys.for_table(t);
        scan(&c, &d, t, session, f, |rec, dur| {
            note(&rec);
            first = first.min(rec.start);
            sorter.push((rec, dur.max(0))).map_err(spill_failed)
        })?;
    }
    if tx.send(Ok(Part::Seen(keys, first))).is_err() {
        return Ok(());
    }
    let mut sorted = sorter.finish().map_err(spill_failed)?;
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(r) = sorted.next().map_err(spill_failed)? {
        batch.push(r);
        if batch.len() == BATCH
            && tx.send(Ok(Part::Batch(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))))).is_err()
        {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(Ok(Part::Batch(batch)));
    }
    Ok(())
}

/// A failure of the sorter's temporary file, as the export's error: a full disk is
/// RESOURCE_EXHAUSTED.
fn spill_failed(e: std::io::Error) -> Stop {
    use crate::error::ApiError;
    let msg = format!("export: sorting the records in a temporary file in the state directory: {e}");
    Stop::Failed(if e.kind() == std::io::ErrorKind::StorageFull {
        ApiError::ResourceExhausted(msg)
    } else {
        ApiError::Internal(msg)
    })
}

/// One reader's records as the merge sees them: the batches still to come, the rest of the
/// current one, and the next record (None once the reader is done).
struct Source {
    batches: Receiver<Result<Part, Stop>>,
    batch: std::vec::IntoIter<(Rec, i64)>,
    head: Option<(Rec, i64)>,
}

impl Source {
    /// The next record into `head`, receiving the next batch when the current one is used up.
    fn advance(&mut self) -> Result<(), Stop> {
        self.head = self.batch.next();
        if self.head.is_none()
            && let Ok(part) = self.batches.recv()
            && let Part::Batch(b) = part?
        {
            self.batch = b.into_iter();
            self.head = self.batch.next();
        }
        Ok(())
    }
}
