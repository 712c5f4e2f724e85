//! Test kit for gpuprof: fake agents that speak the real agent protocol to a real
//! `gpuprofd`, and helpers that run the daemon and the CLI as processes.

// A test kit fails by panicking: an unwrap here is a failed test with its cause printed.
#![allow(clippy::unwrap_used)]

pub mod daemon;
pub mod fake_agent;
pub mod kinds;
pub mod layout;
pub mod pc_agent;
pub mod python;
pub mod rank_agent;
pub mod records;
pub mod tls_node;
pub mod traced_agent;

pub use daemon::{TestDaemon, bin_path};
pub use fake_agent::{FakeAgent, Sent};
pub use records::{Mix, RecordGen};

/// Reads a server stream until it ends, fails, or stays silent for `idle`: the messages read,
/// and the error it ended with (a dropped slow subscriber's RESOURCE_EXHAUSTED).
pub async fn read_to_end<T>(s: &mut tonic::Streaming<T>, idle: std::time::Duration) -> (u64, Option<tonic::Status>) {
    let mut got = 0;
    loop {
        match tokio::time::timeout(idle, s.message()).await {
            Ok(Ok(Some(_))) => got += 1,
            Ok(Ok(None)) | Err(_) => return (got, None),
            Ok(Err(e)) => return (got, Some(e)),
        }
    }
}
