//! The libc calls of gpuprof's own machinery, behind safe functions: the eventfd that wakes the
//! background thread's poll when a buffer is queued or the process is exiting (one `write`,
//! safe from any thread), the poll itself, the idle scheduling class of gpuprof's threads that do
//! seconds of work the application must not wait for, and the process's exit and fork handlers.
// Safety: each call's preconditions are stated where it is made.
#![allow(unsafe_code)]

use std::os::fd::RawFd;

pub struct Wake {
    fd: RawFd,
}

impl Wake {
    pub fn new() -> std::io::Result<Wake> {
        // Safety: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Wake { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    pub fn wake(&self) {
        let one: u64 = 1;
        // Safety: writes 8 bytes from a local to our eventfd; failure (counter full) is harmless.
        let _ = unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter after poll reported the fd readable.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // Safety: reads 8 bytes into a local from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
    }
}

impl Drop for Wake {
    fn drop(&mut self) {
        // Safety: we own the descriptor.
        unsafe { libc::close(self.fd) };
    }
}

/// Waits for readability on `fds` for at most `timeout_ms` (-1 = forever). Returns the
/// readable flags in the same order.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // Safety: `p` is a valid array of pollfd of the given length.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|x| x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0).collect()
}

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

/// The process's user id.
pub fn getuid() -> u32 {
    // Safety: getuid has no preconditions.
    unsafe { libc::getuid() }
}

/// Closes `fd` (the child's copy of a descriptor after fork; errors ignored).
pub fn close_fd(fd: RawFd) {
    // Safety: the caller owns `fd` and uses it no more.
    unsafe { libc::close(fd) };
}

/// Registers `at_exit` to run at process exit and `in_child` in the child right after a fork.
pub fn on_exit_and_fork(at_exit: extern "C" fn(), in_child: extern "C" fn()) {
    // Safety: registering plain `extern "C"` functions of this library, which stays loaded.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(in_child));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakes_poll() {
        let w = Wake::new().unwrap();
        assert_eq!(poll_readable(&[w.fd()], 0), vec![false]);
        w.wake();
        assert_eq!(poll_readable(&[w.fd()], 1000), vec![true]);
        w.drain();
        assert_eq!(poll_readable(&[w.fd()], 0), vec![false]);
    }

    #[test]
    fn only_the_calling_thread_goes_idle() {
        let idle = std::thread::spawn(|| super::idle_priority().map(|()| super::is_idle())).join().unwrap();
        assert!(idle.unwrap(), "the thread that asked is SCHED_IDLE");
        assert!(!super::is_idle(), "the others keep their class");
    }
}
