//! systemd's readiness protocol (`sd_notify(3)`): under a `Type=notify` unit, systemd starts
//! dependent units (and `systemctl start` returns) only once the service sends `READY=1` to
//! the datagram socket named in `$NOTIFY_SOCKET`; `STOPPING=1` says a stop has begun.
//!
//! ttlwheel is ready when its state is recovered from the data directory (until then the key
//! routes answer 503 `recovering`): [`notify_when_ready`] waits for that. The protocol is one
//! datagram on a Unix socket, so it is sent with the standard library (no `libsystemd`, no
//! `unsafe`): a path, or an abstract socket when the name starts with `@`.
//!
//! Deliberately absent: the watchdog (`WATCHDOG=1`): `/healthz` already reports a stalled or
//! lagging ticker, and the unit restarts a process that exits.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The environment variable systemd names its socket in.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// How often readiness is looked at while recovery runs: a start is recovery's length (up to
/// seconds for millions of keys) plus at most this.
const READY_POLL: Duration = Duration::from_millis(20);

/// Sends `state` (newline-separated `NAME=value` lines) to `$NOTIFY_SOCKET`; `Ok(false)` when
/// the variable is unset (not started by systemd, or by a unit of another type).
pub fn notify(state: &str) -> std::io::Result<bool> {
    match std::env::var_os(NOTIFY_SOCKET) {
        Some(socket) => notify_to(&socket, state).map(|()| true),
        None => Ok(false),
    }
}

/// Sends `state` to the socket `socket` names: a filesystem path, or `@name` for an abstract
/// socket.
pub fn notify_to(socket: &OsStr, state: &str) -> std::io::Result<()> {
    let datagram = UnixDatagram::unbound()?;
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => send_abstract(&datagram, name, state),
        None => datagram
            .send_to(state.as_bytes(), Path::new(socket))
            .map(drop),
    }
}

#[cfg(target_os = "linux")]
fn send_abstract(datagram: &UnixDatagram, name: &[u8], state: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    datagram.send_to_addr(state.as_bytes(), &address).map(drop)
}

#[cfg(not(target_os = "linux"))]
fn send_abstract(_: &UnixDatagram, _: &[u8], _: &str) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "abstract Unix sockets exist on Linux only",
    ))
}

/// Waits until `ready` is set (the state is recovered), then tells systemd `READY=1`. Does
/// nothing outside systemd; a failure to send is logged (systemd then times the start out).
pub async fn notify_when_ready(ready: Arc<AtomicBool>) {
    if std::env::var_os(NOTIFY_SOCKET).is_none() {
        return;
    }
    while !ready.load(Ordering::Acquire) {
        tokio::time::sleep(READY_POLL).await;
    }
    match notify("READY=1\nSTATUS=serving") {
        Ok(_) => tracing::info!("told systemd: ready"),
        Err(error) => tracing::error!(%error, "cannot tell systemd we are ready ($NOTIFY_SOCKET)"),
    }
}
