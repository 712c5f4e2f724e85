//! systemd `Type=notify` integration. Without NOTIFY_SOCKET these are no-ops.

/// READY=1: migrations are applied and both sockets are listening.
pub fn ready() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::debug!(error = %e, "sd_notify READY failed");
    }
}

/// STOPPING=1: shutdown has begun.
pub fn stopping() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]) {
        tracing::debug!(error = %e, "sd_notify STOPPING failed");
    }
}

/// RELOADING=1: a SIGHUP reload is under way (READY=1 follows).
pub fn reloading() {
    if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Reloading]) {
        tracing::debug!(error = %e, "sd_notify RELOADING failed");
    }
}
