//! An eventfd that wakes the background thread's poll when a buffer is queued or the process
//! is exiting (one `write`, safe from any thread).
// Safety: eventfd/read/write/close on a descriptor this struct owns.
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
}
