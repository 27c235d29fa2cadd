//! The service manager the agent runs under, as far as an upgrade needs it: where the
//! watcher must run so that the manager's restart of the agent does not kill it, how an
//! agent is brought back after a rollback, and how to tell that the agent died again.
//!
//! - systemd: the watcher is a transient unit of its own (`systemd-run`); the agent is
//!   brought back with `systemctl restart`; its deaths show as a new `MainPID`.
//! - launchd: the watcher is a job of its own (`launchctl submit`); the agent is
//!   brought back with `launchctl kickstart -k`; its pid is read from `launchctl print`.
//! - standalone: the watcher is a daemon of its own (own session, reparented to init);
//!   the agent is started again with the arguments it was started with, the same way.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the agent runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Service {
    Systemd { unit: String },
    Launchd { label: String },
    Standalone,
}

impl Service {
    /// The service manager of this process, from what it leaves in the environment and
    /// (systemd) the cgroup it put the process in.
    pub fn detect() -> Self {
        if let Some(unit) = systemd_unit() {
            return Service::Systemd { unit };
        }
        if cfg!(target_os = "macos") {
            if let Ok(label) = std::env::var("XPC_SERVICE_NAME") {
                if !label.is_empty() && label != "0" && label.starts_with("com.") {
                    return Service::Launchd { label };
                }
            }
        }
        Service::Standalone
    }

    /// `systemd:UNIT`, `launchd:LABEL` or `standalone`: how the watcher is told.
    pub fn to_arg(&self) -> String {
        match self {
            Service::Systemd { unit } => format!("systemd:{unit}"),
            Service::Launchd { label } => format!("launchd:{label}"),
            Service::Standalone => "standalone".into(),
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.split_once(':') {
            Some(("systemd", unit)) if !unit.is_empty() => Some(Service::Systemd {
                unit: unit.to_owned(),
            }),
            Some(("launchd", label)) if !label.is_empty() => Some(Service::Launchd {
                label: label.to_owned(),
            }),
            None if s == "standalone" => Some(Service::Standalone),
            _ => None,
        }
    }

    /// Starts `program args…` outside the agent's process tree and service: the
    /// watcher. `log` takes its output (standalone). Returns its pid where known.
    pub fn start_watcher(
        &self,
        program: &Path,
        args: &[OsString],
        log: &Path,
        tag: &str,
    ) -> std::io::Result<Option<u32>> {
        match self {
            Service::Systemd { .. } => {
                let unit = format!("railgrid-upgrade-watch-{tag}");
                let status = Command::new("systemd-run")
                    .arg(format!("--unit={unit}"))
                    .args(["--collect", "--quiet", "--service-type=exec"])
                    .arg("--")
                    .arg(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .status()?;
                check(status, "systemd-run")?;
                Ok(None)
            }
            Service::Launchd { .. } => {
                let label = format!("com.railgrid.upgrade-watch.{tag}");
                let status = Command::new("launchctl")
                    .args(["submit", "-l", &label, "-o"])
                    .arg(log)
                    .arg("-e")
                    .arg(log)
                    .arg("--")
                    .arg(program)
                    .args(args)
                    .stdin(Stdio::null())
                    .status()?;
                check(status, "launchctl submit")?;
                Ok(None)
            }
            Service::Standalone => {
                let pid = spawn_detached(program, args, Some(log))?;
                #[cfg(target_os = "linux")]
                if let Some(pid) = pid {
                    crate::cgroup::move_out_of_own(pid);
                }
                Ok(pid)
            }
        }
    }

    /// Brings an agent back after a rollback (`agent_args`: what it was started with,
    /// standalone).
    pub fn restart_agent(
        &self,
        exe: &Path,
        agent_args: &[OsString],
    ) -> std::io::Result<Option<u32>> {
        match self {
            Service::Systemd { unit } => {
                // A unit that hit its start limit, or failed, takes a restart only after
                // this.
                let _ = Command::new("systemctl")
                    .args(["reset-failed", unit])
                    .stdin(Stdio::null())
                    .status();
                let status = Command::new("systemctl")
                    .args(["restart", unit])
                    .stdin(Stdio::null())
                    .status()?;
                check(status, "systemctl restart")?;
                Ok(None)
            }
            Service::Launchd { label } => {
                let status = Command::new("launchctl")
                    .args(["kickstart", "-k", &format!("system/{label}")])
                    .stdin(Stdio::null())
                    .status()?;
                check(status, "launchctl kickstart")?;
                Ok(None)
            }
            // Its own rolling log has everything; its stdio would grow a file nobody
            // rotates.
            Service::Standalone => spawn_detached(exe, agent_args, None),
        }
    }

    /// Removes the watcher's own launchd job once it is done (`launchctl submit` jobs
    /// are kept alive otherwise).
    pub fn finish_watcher(&self) {
        if let (Service::Launchd { .. }, Ok(label)) = (self, std::env::var("XPC_SERVICE_NAME")) {
            if label.starts_with("com.railgrid.upgrade-watch.") {
                let _ = Command::new("launchctl")
                    .args(["remove", &label])
                    .stdin(Stdio::null())
                    .status();
            }
        }
    }

    /// The agent as the service manager sees it now, and how many times the manager
    /// restarted it by itself (systemd's `NRestarts`; `None` where it keeps no count).
    pub fn agent_seen(&self) -> (Seen, Option<u64>) {
        match self {
            Service::Systemd { unit } => systemd_seen(unit),
            Service::Launchd { label } => {
                let out = Command::new("launchctl")
                    .args(["print", &format!("system/{label}")])
                    .stdin(Stdio::null())
                    .stderr(Stdio::null())
                    .output();
                let text = out
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                let seen = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("pid = "))
                    .and_then(|p| p.trim().parse().ok())
                    .filter(|p: &u32| *p > 1)
                    .map_or(Seen::Down, Seen::Running);
                (seen, None)
            }
            Service::Standalone => (Seen::Down, None),
        }
    }
}

/// What a service manager says of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Running with this main pid.
    Running(u32),
    /// Not running: crashed, restarting, or failed for good.
    Down,
    /// Stopped on purpose (`systemctl stop`) while the host keeps running: the operator's
    /// stop, not the new version's fault, and not to be undone by a restart.
    Stopped,
    /// The host is shutting down: what the unit does now says nothing of the version,
    /// and the watcher is about to be stopped too (the unit's `ExecStartPre` guard starts
    /// another at the next boot).
    ShuttingDown,
}

fn systemd_seen(unit: &str) -> (Seen, Option<u64>) {
    let Ok(out) = Command::new("systemctl")
        .args([
            "show",
            "--property=MainPID,ActiveState,SubState,NRestarts",
            unit,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return (Seen::Down, None);
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let prop = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
    };
    let restarts = prop("NRestarts").trim().parse().ok();
    if let Some(pid) = prop("MainPID")
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|p| *p > 1)
    {
        return (Seen::Running(pid), restarts);
    }
    if system_stopping() {
        return (Seen::ShuttingDown, restarts);
    }
    let seen = match (prop("ActiveState"), prop("SubState")) {
        // A unit that crashed shows `activating`/`auto-restart` until its restart, and
        // `failed` once its restarts are used up; `inactive`/`dead` is a stop that was
        // asked for.
        ("inactive", "dead") => Seen::Stopped,
        _ => Seen::Down,
    };
    (seen, restarts)
}

/// True while systemd takes the host down (or is rebooting it).
fn system_stopping() -> bool {
    Command::new("systemctl")
        .arg("is-system-running")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "stopping")
}

fn check(status: std::process::ExitStatus, what: &str) -> std::io::Result<()> {
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{what} failed ({status})")))
    }
}

/// The unit of this process when systemd started it: the last `*.service` of its
/// cgroup path (cgroup v2), only when systemd is PID 1 and `systemd-run` exists.
fn systemd_unit() -> Option<String> {
    if !Path::new("/run/systemd/system").is_dir() || std::env::var_os("INVOCATION_ID").is_none() {
        return None;
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    path.split('/')
        .rev()
        .find(|c| c.ends_with(".service"))
        .map(str::to_owned)
}

/// `program args…` in a session of its own, reparented to init, its output appended to
/// `log` (0600), its input from /dev/null. The pid of the process that execs.
fn spawn_detached(
    program: &Path,
    args: &[OsString],
    log: Option<&Path>,
) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::OpenOptionsExt;
    let (out, err) = match log {
        Some(log) => {
            let out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(log)?;
            let err = out.try_clone()?;
            (Stdio::from(out), Stdio::from(err))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    crate::sys::spawn::spawn_detached(&mut cmd).map(Some)
}

/// The watcher's log (and, standalone, the log of an agent it brings back).
pub fn log_path(log_dir: &Path) -> PathBuf {
    log_dir.join("upgrade-watch.log")
}
