//! The single SQLite writer.
//!
//! Agent connections hand decoded messages to one dedicated thread through a bounded
//! channel; the thread drains whatever is queued into one transaction and commits, so
//! under load each commit covers many batches and when idle each batch is committed at
//! once. Rows are inserted with multi-row prepared statements. When the channel is full,
//! connections stop reading their sockets and the backpressure reaches the agents, whose
//! own bounded queues drop and count.
//!
//! Where things are: `msg` holds what connections send to the writer, `writer` the thread
//! itself (transactions, commits, string interning, process registration), `rows` the
//! tables and their INSERTs, `fill` how each kind of a batch becomes rows.

mod fill;
mod ids;
mod msg;
mod rows;
mod writer;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use anyhow::Result;
use rusqlite::Connection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::config::IngestConfig;
use crate::error::WriterGone;
use crate::stats::Stats;
use writer::Writer;

pub use msg::{ProcessInfo, WriterCall, WriterMsg};
pub use rows::{UNKNOWN, batch_totals};

/// Sending side of the writer channel.
#[derive(Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<WriterMsg>,
    /// Records that may be queued, as permits held by the queued batches.
    records: Arc<Semaphore>,
    records_max: u32,
}

impl WriterHandle {
    /// Waits until `count` more records may be queued (at most the whole budget for one batch);
    /// the permit goes with the batch ([`WriterMsg::Records`]) and is returned when the writer
    /// has taken it.
    pub async fn reserve_records(&self, count: u64) -> Result<OwnedSemaphorePermit, WriterGone> {
        let n = count.clamp(1, u64::from(self.records_max)) as u32;
        self.records.clone().acquire_many_owned(n).await.map_err(|_| WriterGone)
    }

    /// Queues a message, waiting while the queue is full (backpressure).
    pub async fn send(&self, msg: WriterMsg) -> Result<(), WriterGone> {
        self.tx.send(msg).await.map_err(|_| WriterGone)
    }

    /// Runs `f` on the writer connection and returns its result.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> T + Send + 'static,
    ) -> Result<T, WriterGone> {
        let (tx, rx) = oneshot::channel();
        self.send(WriterMsg::Call(Box::new(move |c| {
            let _ = tx.send(f(c));
        })))
        .await?;
        rx.await.map_err(|_| WriterGone)
    }

    /// Waits until everything queued so far is committed.
    pub async fn flush(&self) -> Result<(), WriterGone> {
        let (tx, rx) = oneshot::channel();
        self.send(WriterMsg::Flush(tx)).await?;
        rx.await.map_err(|_| WriterGone)
    }

    /// Asks the writer to commit everything queued so far and stop.
    pub async fn stop(&self) -> Result<(), WriterGone> {
        self.send(WriterMsg::Stop).await
    }

    /// Messages waiting in the queue.
    pub fn queued_messages(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// The writer on an open connection: its handle, and its loop for the thread that runs it
/// (started by `runtime.rs`; it ends once every handle is gone or after `Stop`).
pub fn writer(
    conn: Connection,
    cfg: &IngestConfig,
    stats: Arc<Stats>,
) -> Result<(WriterHandle, impl FnOnce() + Send + use<>)> {
    let (tx, rx) = mpsc::channel(cfg.queue_messages);
    let mut w = Writer::new(conn, stats, cfg.commit_max_records)?;
    let records_max = u32::try_from(cfg.queue_records).unwrap_or(u32::MAX).min(Semaphore::MAX_PERMITS as u32);
    Ok((WriterHandle { tx, records: Arc::new(Semaphore::new(records_max as usize)), records_max }, move || w.run(rx)))
}

/// A writer on its own thread for unit tests of the components that write through it.
#[cfg(test)]
pub(crate) struct TestWriter {
    pub handle: WriterHandle,
    thread: std::thread::JoinHandle<()>,
}

#[cfg(test)]
impl TestWriter {
    /// The writer on `conn` (from `store::open_writer`), its thread started.
    pub(crate) fn start(conn: Connection, cfg: &IngestConfig) -> TestWriter {
        let (handle, write) = writer(conn, cfg, Arc::new(Stats::default())).unwrap();
        TestWriter { handle, thread: std::thread::spawn(write) }
    }

    /// Commits what was queued and joins the thread (clones of the handle may remain).
    pub(crate) async fn stop(self) {
        self.handle.stop().await.unwrap();
        drop(self.handle);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join().unwrap()).await.unwrap();
    }
}
