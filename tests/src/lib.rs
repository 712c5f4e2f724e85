//! Test kit for gpuprof: fake agents that speak the real agent protocol to a real
//! `gpuprofd`, and helpers that run the daemon and the CLI as processes.

pub mod daemon;
pub mod fake_agent;
pub mod records;
pub mod traced_agent;

pub use daemon::{TestDaemon, bin_path};
pub use fake_agent::{FakeAgent, Sent};
pub use records::{Mix, RecordGen};
