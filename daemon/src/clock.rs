//! The daemon's clock: nanoseconds since the Unix epoch, the timebase of every stored record.
//! A leaf: it uses no other daemon module.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in nanoseconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}
