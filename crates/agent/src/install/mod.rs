//! `railgrid agent install | uninstall`: the host's agent service in one command, safe to
//! run again.
//!
//! Both commands first look at the host without touching it and make a [`Plan`]: every
//! directory, file, account and service-manager command, each marked create, update, keep
//! or remove, with the reason. `--dry-run` prints the plan (and the files it would write);
//! otherwise it is applied step by step, each printed as it is done, so a failure shows
//! exactly what was and was not done. Running install again plans only the differences:
//! an installed host plans nothing but `keep`.

mod account;
mod command;
mod config_file;
mod converge;
mod manager;
mod manifest;
mod plan;
mod remove;
mod root;
pub mod templates;

use std::path::PathBuf;

use thiserror::Error;

pub use self::converge::plan_install;
pub use self::plan::Plan;
pub use self::remove::plan_uninstall;
use self::root::Root;
use crate::file_error::FileError;
use crate::sys::exe::ExeError;

/// The directory of the config, token and CA.
const CONFIG_DIR: &str = "/etc/railgrid";
/// Where install keeps the hub token and the hub's CA.
pub const TOKEN_FILE: &str = "/etc/railgrid/token";
pub const CA_FILE: &str = "/etc/railgrid/hub-ca.pem";
/// An enrolment token the agent trades at its first contact (its own token then lives
/// in its state dir).
pub const ENROL_TOKEN_FILE: &str = "/etc/railgrid/enrol.token";
/// Largest token or CA file accepted.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The runner's account when none is named: macOS names system accounts with `_`.
pub fn default_runner_user() -> &'static str {
    if cfg!(target_os = "macos") {
        "_railgrid"
    } else {
        "railgrid"
    }
}

#[derive(Debug, Error)]
pub enum InstallError {
    #[error("railgrid agent {command} must run as root (it writes {CONFIG_DIR} and the service's file): run it with sudo, or give --root DIR to write an image")]
    NotRoot { command: &'static str },
    #[error("{manager} is not running on this host ({why}): give --root / to write the files without starting anything, or run `railgrid agent run` under your own supervisor")]
    NoServiceManager { manager: &'static str, why: String },
    #[error("{path} is not a railgrid agent config this version can read ({message}): fix it (railgrid agent check-config --config {path} says more) or move it away; nothing was changed")]
    ForeignConfig { path: PathBuf, message: String },
    #[error("the runner's account {name:?} is root (uid 0): the runner never runs as root; give --runner-user with another account")]
    RootRunner { name: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{path} is not an install manifest of railgrid ({message}): move it away to uninstall by the defaults")]
    BadManifest { path: PathBuf, message: String },
    #[error("an agent (pid {pid}) still holds {dir}: stop it first (systemctl stop railgrid-agent), then purge")]
    AgentRunning { pid: i32, dir: PathBuf },
    #[error("{path} may be read by root only: run this with sudo")]
    NoAccess { path: PathBuf },
    #[error(transparent)]
    File(#[from] FileError),
    #[error("could not run {command}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Exe(#[from] ExeError),
}

/// `agent install`'s flags.
#[derive(Debug, Clone, Default)]
pub struct InstallOptions {
    /// `--hub`, repeated (replicas of one hub); `None` when not given.
    pub hub: Option<Vec<String>>,
    pub agent_id: Option<String>,
    pub token_file: Option<PathBuf>,
    pub enrol_token: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub trusted_keys: Vec<String>,
    /// `--label K=V`, repeated: replaces `agent.labels` when given.
    pub labels: Vec<String>,
    pub runner_user: Option<String>,
    pub prefix: PathBuf,
    pub root: Option<PathBuf>,
    pub dry_run: bool,
    pub no_start: bool,
}

/// `agent uninstall`'s flags (the confirmation of `--purge` is the command line's).
#[derive(Debug, Clone, Default)]
pub struct UninstallOptions {
    pub purge: bool,
    pub root: Option<PathBuf>,
    pub dry_run: bool,
}

/// The state and log directories a root agent with this config uses (`config::load`'s
/// rule: the log directory is the state directory when only that is set).
fn agent_dirs(raw: &crate::config::RawConfig) -> (PathBuf, PathBuf) {
    use crate::config::{ROOT_LOG_DIR, ROOT_STATE_DIR};
    let state = raw
        .state_dir
        .clone()
        .unwrap_or_else(|| ROOT_STATE_DIR.into());
    let log = raw
        .log_dir
        .clone()
        .or(raw.state_dir.clone())
        .unwrap_or_else(|| ROOT_LOG_DIR.into());
    (state, log)
}

/// Checks who runs the command, before anything is looked at.
fn check_privileges(command: &'static str, root: &Root, dry_run: bool) -> Result<(), InstallError> {
    if root.on_host() && !dry_run && !crate::sys::is_root() {
        return Err(InstallError::NotRoot { command });
    }
    Ok(())
}
