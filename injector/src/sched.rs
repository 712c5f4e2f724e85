//! The calling thread's scheduling class, for gpuprof's own threads that do seconds of work the
//! application must not wait for.

#![allow(unsafe_code)]

/// Puts the calling thread (only it) in the SCHED_IDLE class: it runs only on CPU time that
/// nothing else on the machine wants.
pub fn idle_priority() -> std::io::Result<()> {
    // Safety: a zeroed sched_param is valid (priority 0, the only one SCHED_IDLE takes); pid 0
    // is the calling thread.
    let r = unsafe {
        let p: libc::sched_param = std::mem::zeroed();
        libc::sched_setscheduler(0, libc::SCHED_IDLE, &p)
    };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Whether the calling thread is in the SCHED_IDLE class.
pub fn is_idle() -> bool {
    // Safety: no preconditions; 0 is the calling thread.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_IDLE }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_calling_thread_goes_idle() {
        let idle = std::thread::spawn(|| super::idle_priority().map(|()| super::is_idle())).join().unwrap();
        assert!(idle.unwrap(), "the thread that asked is SCHED_IDLE");
        assert!(!super::is_idle(), "the others keep their class");
    }
}
