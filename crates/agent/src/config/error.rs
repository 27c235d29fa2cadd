//! What loading the configuration can run into: each names the file and key, the
//! variable or the flag that holds the bad value.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("could not read config file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("running as root needs an account for the runner: set runner.user (e.g. --runner-user nobody)")]
    NoRunnerUser,
    #[error("no default state directory: set state_dir, XDG_STATE_HOME or HOME")]
    NoHome,
    #[error(
        "the host name cannot be the hub agent id ({message}): set hub.agent_id (or --agent-id)"
    )]
    NoAgentId { message: String },
}
