//! systemd notifications (a no-op when not started by systemd).

/// READY=1 with a status line.
pub fn ready(status: &str) {
    let _ = sd_notify::notify(
        false,
        &[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(status),
        ],
    );
}

/// STATUS= line.
pub fn status(status: &str) {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Status(status)]);
}

/// STOPPING=1.
pub fn stopping() {
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
}
