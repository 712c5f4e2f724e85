//! How a pass reaches the database without stalling ingest: each change is one writer call,
//! queued like an ingest batch, with rollup passes held off and a pause after it; reads go
//! to a read connection on a blocking thread.

use std::time::Duration;

use rusqlite::Connection;

use super::Retention;

/// Pause after each writer call so that queued ingest goes first.
pub(super) const YIELD: Duration = Duration::from_millis(5);

/// Why a pass stopped early.
#[derive(Debug)]
pub(super) enum Halt {
    /// The daemon is shutting down (or the writer is gone).
    Stopped,
    Failed(String),
}

impl From<rusqlite::Error> for Halt {
    fn from(e: rusqlite::Error) -> Self {
        Halt::Failed(e.to_string())
    }
}

/// Runs `f` on the writer while rollup passes are held off, then yields to ingest.
pub(super) async fn step<T: Send + 'static>(
    d: &Retention,
    f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Halt> {
    if d.shutdown.is_cancelled() {
        return Err(Halt::Stopped);
    }
    let r = {
        let _no_rollup = d.rollup.exclusive().await;
        d.writer.call(f).await
    };
    tokio::time::sleep(YIELD).await;
    match r {
        Ok(r) => Ok(r?),
        Err(_) => Err(Halt::Stopped),
    }
}

/// Runs `f` on a read connection (off the writer thread).
pub(super) async fn read<T: Send + 'static>(
    d: &Retention,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> Result<T, Halt> {
    let path = d.db_path.clone();
    tokio::task::spawn_blocking(move || -> Result<T, Halt> {
        let c = crate::store::open_reader(&path).map_err(|e| Halt::Failed(format!("{e:#}")))?;
        Ok(f(&c)?)
    })
    .await
    .map_err(|e| Halt::Failed(e.to_string()))?
}
