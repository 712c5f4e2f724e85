//! The one clock of gpuprof's agents: nanoseconds since the Unix epoch (CLOCK_REALTIME), the
//! clock CUPTI's own timestamps (activity records, PM samples) use on Linux. Agents stamp
//! anything of their own with it, so records from the injector and samples from the sampler
//! line up without conversion.

use std::time::{SystemTime, UNIX_EPOCH};

/// CLOCK_REALTIME in ns (0 if the system clock is before 1970).
pub fn realtime_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// CLOCK_MONOTONIC in ns, for the (realtime, monotonic) pair an agent's hello carries.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // Safety: `ts` is a valid out pointer; clock_gettime only writes it.
    #[allow(unsafe_code)]
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if r != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn realtime_is_after_2024_and_monotonic_advances() {
        assert!(realtime_ns() > 1_704_067_200_000_000_000);
        let a = monotonic_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(monotonic_ns() >= a + 1_000_000);
    }
}
