//! [`Control`]: how the `atexit` handler asks the background thread to flush, say goodbye and
//! finish, and waits for it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::sys::Wake;

/// Exit handshake between the `atexit` handler and the background thread.
#[derive(Default)]
pub struct Control {
    exit: AtomicBool,
    done: Mutex<bool>,
    cv: Condvar,
    /// True while a daemon connection is up (an exit with none needs no wait).
    pub connected: AtomicBool,
}

impl Control {
    /// Asks the background thread to flush and say goodbye; waits at most `timeout`.
    pub fn request_exit(&self, wake: &Wake, timeout: Duration) -> bool {
        self.exit.store(true, Ordering::SeqCst);
        wake.wake();
        if !self.connected.load(Ordering::SeqCst) {
            return true;
        }
        let Ok(g) = self.done.lock() else { return false };
        match self.cv.wait_timeout_while(g, timeout, |done| !*done) {
            Ok((g, _)) => *g,
            Err(_) => false,
        }
    }

    pub(super) fn exiting(&self) -> bool {
        self.exit.load(Ordering::SeqCst)
    }

    pub(super) fn finish(&self) {
        if let Ok(mut g) = self.done.lock() {
            *g = true;
        }
        self.cv.notify_all();
    }
}
