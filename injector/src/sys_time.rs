//! CLOCK_MONOTONIC in nanoseconds (std's Instant is opaque), for the hello's clock pair.
// Safety: clock_gettime into a local timespec.
#![allow(unsafe_code)]

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: `ts` is a valid out pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
