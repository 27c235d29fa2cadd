//! `<state>/agent-status.json`: what the agent is doing, for `railgrid agent status`,
//! monitoring, and people. Written atomically, so a reader never sees half a file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::supervisor::Status;
use crate::sys::{self, ProcessId};
use crate::util;

pub const FILE_NAME: &str = "agent-status.json";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AgentStatus {
    pub version: String,
    pub pid: u32,
    /// The agent's process start time (clock ticks since boot, Linux): tells a live agent
    /// from a process that reuses its pid.
    pub pid_start_time: Option<u64>,
    #[serde(with = "util::unix_secs")]
    pub started_at: SystemTime,
    #[serde(with = "util::unix_secs")]
    pub updated_at: SystemTime,
    /// False once the agent has shut down cleanly.
    pub running: bool,
    /// True from SIGTERM/SIGINT until the agent has stopped: its runner's stop (the jobs'
    /// grace, the reap) may take the whole stop budget, and a reader should know why.
    #[serde(default)]
    pub stopping: bool,
    pub config_path: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    pub runner: Status,
    /// Orphan runners terminated at start.
    pub reclaimed_pids: Vec<i32>,
    /// What the last runner stop left and the agent ended (`runner reap`, `cgroup.kill`),
    /// one line each.
    #[serde(default)]
    pub reaped: Vec<String>,
    /// The executable the agent started from and launches its runners from (pinned at
    /// start); absent in files written before it was recorded.
    #[serde(default)]
    pub exe: Option<ExeStatus>,
    /// False while the desired state disables the runner (a stopped runner is then no
    /// failure); true in files written before it was recorded.
    #[serde(default = "enabled")]
    pub runner_enabled: bool,
    /// The hub this agent is reconciled by; `None` standalone (and in older files).
    #[serde(default)]
    pub hub: Option<HubStatus>,
    /// The self-upgrade's state (what the hub is told too).
    #[serde(default)]
    pub upgrade: Option<crate::proto::report::UpgradeReport>,
    /// The SIGHUPs handled so far; `None` in files of agents that did not count them
    /// (`agent reload` then cannot wait for the reload's end).
    #[serde(default)]
    pub reloads: Option<Reloads>,
    /// The drain in force on the host (`None`: it takes jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<crate::proto::drain::DrainReport>,
}

/// The reloads (SIGHUP) an agent has handled: `agent reload` signals, then waits for
/// `count` to pass the value it read, and tells the operator how the last one ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Reloads {
    pub count: u64,
    /// Unix seconds of the end of the last reload.
    #[serde(default)]
    pub last_at: Option<u64>,
    /// Why the last reload was refused (the new configuration, as the agent read it); the
    /// running one stays in force. `None`: applied.
    #[serde(default)]
    pub last_error: Option<String>,
}

fn enabled() -> bool {
    true
}

/// The agent's link to its hub, as `agent status` shows it. Never holds the token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HubStatus {
    pub url: String,
    pub agent_id: String,
    /// True when the last reconcile got a desired state from the hub.
    #[serde(default)]
    pub connected: bool,
    /// Unix seconds of the last answer with a desired state; `None` before the first.
    #[serde(default)]
    pub last_contact: Option<u64>,
    /// What is failing now: reaching the hub, or applying its desired state; `None`
    /// once a desired state from the hub is in force.
    #[serde(default)]
    pub last_error: Option<String>,
    /// The generation of the desired state applied (0: none from the hub yet).
    #[serde(default)]
    pub generation: u64,
    /// The agent version the hub asks for; only reported until self-upgrade acts on it.
    #[serde(default)]
    pub desired_version: Option<String>,
}

/// The pinned executable, as `agent status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExeStatus {
    pub path: PathBuf,
    /// Lowercase hex, as `sha256sum` prints it.
    pub sha256: String,
    pub size: u64,
    pub device: u64,
    pub inode: u64,
}

impl From<&sys::exe::ExeIdentity> for ExeStatus {
    fn from(id: &sys::exe::ExeIdentity) -> Self {
        Self {
            path: id.path.clone(),
            sha256: id.sha256.clone(),
            size: id.size,
            device: id.device,
            inode: id.inode,
        }
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// Writes `status` to `<state>/agent-status.json` (mode 0644: it holds no secret and lets
/// unprivileged operators run `railgrid agent status`).
pub fn write(state_dir: &Path, status: &AgentStatus) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    util::write_atomic(&path(state_dir), &bytes, 0o644)
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("no agent status at {path}: the agent has not run with this state directory")]
    Missing { path: PathBuf },
    #[error("could not read agent status {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agent status {path} is malformed")]
    Malformed {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

pub fn read(state_dir: &Path) -> Result<AgentStatus, ReadError> {
    let path = path(state_dir);
    let bytes = match crate::small_file::read(&path, crate::small_file::CONFIG_MAX) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ReadError::Missing { path })
        }
        Err(source) => return Err(ReadError::Io { path, source }),
    };
    serde_json::from_slice(&bytes).map_err(|source| ReadError::Malformed { path, source })
}

/// True when the process recorded in `status` is still the agent of `state_dir`: where
/// the kernel says who holds the state directory's agent lock (Linux), that it is this
/// pid; elsewhere that the pid lives, with the same start time where the OS tells it, and
/// runs `agent run`.
pub fn agent_alive(state_dir: &Path, status: &AgentStatus) -> bool {
    if !status.running {
        return false;
    }
    let Some(pid) = ProcessId::from_u32(status.pid) else {
        return false;
    };
    if let Some(holders) = super::instance::holders(state_dir) {
        let same_process = match (status.pid_start_time, sys::process_start_time(pid)) {
            (Some(want), Some(got)) => want == got,
            _ => true,
        };
        return holders.contains(&pid.get()) && same_process;
    }
    if !sys::group::process_alive(pid) {
        return false;
    }
    if let (Some(want), Some(got)) = (status.pid_start_time, sys::process_start_time(pid)) {
        if want != got {
            return false;
        }
    }
    match sys::process_cmdline(pid) {
        Some(args) => args.windows(2).any(|w| w[0] == "agent" && w[1] == "run"),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_file_of_an_older_agent_still_parses() {
        let old = r#"{"version": "0.1.0", "pid": 7, "pid_start_time": null,
            "started_at": 1, "updated_at": 2, "running": true, "config_path": null,
            "state_dir": "/s", "log_dir": "/l",
            "runner": {"state": "running", "pid": 8, "starts": 1, "last_error": null, "since": 1},
            "reclaimed_pids": []}"#;
        let st: AgentStatus = serde_json::from_str(old).expect("parse");
        assert!(st.runner_enabled, "a runner was wanted then");
        assert_eq!(st.hub, None);
        let back: serde_json::Value = serde_json::to_value(&st).expect("json");
        assert!(back["hub"].is_null() && back.is_object());
    }
}
