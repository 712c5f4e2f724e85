//! Test kit for gpuprof: fake agents that speak the real agent protocol to a real
//! `gpuprofd`, and helpers that run the daemon and the CLI as processes.

// A test kit fails by panicking: an unwrap here is a failed test with its cause printed.
#![allow(clippy::unwrap_used)]

pub mod daemon;
pub mod fake_agent;
pub mod layout;
pub mod pc_agent;
pub mod records;
pub mod traced_agent;

pub use daemon::{TestDaemon, bin_path};
pub use fake_agent::{FakeAgent, Sent};
pub use records::{Mix, RecordGen};
