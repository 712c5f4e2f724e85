//! The daemon socket's descriptor, published by the agent thread and closed by the fork
//! handler in a child, so that the daemon sees the parent's connection end when the parent does.

use std::sync::atomic::{AtomicI32, Ordering};

static SOCKET_FD: AtomicI32 = AtomicI32::new(-1);

/// The agent thread connected (`fd`) or disconnected (-1).
pub fn publish(fd: i32) {
    SOCKET_FD.store(fd, Ordering::SeqCst);
}

/// Takes the descriptor (for the fork child to close its copy); -1 when none.
pub fn take() -> i32 {
    SOCKET_FD.swap(-1, Ordering::SeqCst)
}
