//! The systemd notification protocol (`sd_notify`), spoken directly: one datagram per
//! message to `$NOTIFY_SOCKET`. launchd has no equivalent; there the variables are unset
//! and every call is a no-op.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

/// A connection to the service manager, if it asked for notifications.
pub struct Notifier {
    sock: UnixDatagram,
    addr: Addr,
}

enum Addr {
    Path(PathBuf),
    #[cfg(target_os = "linux")]
    Abstract(Vec<u8>),
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`; `None` when unset or unusable (logged).
    pub fn from_env() -> Option<Self> {
        let raw = std::env::var_os(crate::env_vars::NOTIFY_SOCKET)?;
        let bytes = raw.as_encoded_bytes();
        let addr = match bytes.first() {
            #[cfg(target_os = "linux")]
            Some(b'@') => Addr::Abstract(bytes[1..].to_vec()),
            Some(b'/') => Addr::Path(PathBuf::from(&raw)),
            _ => {
                tracing::warn!(socket = ?raw, "NOTIFY_SOCKET is neither a path nor an abstract socket; not notifying");
                return None;
            }
        };
        match UnixDatagram::unbound() {
            Ok(sock) => Some(Self { sock, addr }),
            Err(e) => {
                tracing::warn!(error = %e, "could not create a socket for service manager notifications");
                None
            }
        }
    }

    /// Sends one notification such as `READY=1` or `STATUS=...`. Failures are logged, never
    /// fatal: the service manager's view is advisory.
    pub fn send(&self, msg: &str) {
        let res = match &self.addr {
            Addr::Path(p) => self.sock.send_to(msg.as_bytes(), p),
            #[cfg(target_os = "linux")]
            Addr::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt;
                std::os::unix::net::SocketAddr::from_abstract_name(name)
                    .and_then(|a| self.sock.send_to_addr(msg.as_bytes(), &a))
            }
        };
        if let Err(e) = res {
            tracing::debug!(error = %e, msg, "service manager notification failed");
        }
    }
}

/// Half the watchdog timeout systemd asked for (`$WATCHDOG_USEC`), when it is meant for
/// this process (`$WATCHDOG_PID` unset or ours).
pub fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var(crate::env_vars::WATCHDOG_PID) {
        if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    let usec: u64 = std::env::var(crate::env_vars::WATCHDOG_USEC)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
