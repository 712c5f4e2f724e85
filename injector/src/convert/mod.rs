//! Decoded records → `gpuprof.agent.v1` messages, on the injector's background thread:
//! string interning per connection, NVTX start/end pairing, batching, per-kind counters.
//!
//! Layout: `converter` holds [`Converter`] (batches, NVTX pairing, topology cache, counters);
//! `interner` the per-connection string table; `kinds` the record kind of a record or of a raw
//! CUPTI activity kind.

mod converter;
mod interner;
mod kinds;
#[cfg(test)]
mod tests;

pub use converter::{BATCH_RECORDS, Converter, MAX_OPEN_MARKERS, StrReader};
pub use interner::{Interner, MAX_STRINGS};
pub use kinds::{kind_of, kind_of_activity};
