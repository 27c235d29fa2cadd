//! The sources as they come, before any check: the file as written and the flags as
//! given.

use std::path::PathBuf;

use serde::Deserialize;

/// The file as written. Unknown keys are errors: a typo must not silently mean "default".
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub state_dir: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    #[serde(default)]
    pub runner: RawRunner,
    #[serde(default)]
    pub hub: RawHub,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub upgrade: RawUpgrade,
    #[serde(default)]
    pub agent: RawAgent,
    #[serde(default)]
    pub metrics: RawMetrics,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    /// `127.0.0.1:9469`: where the agent serves `/metrics` in plain HTTP.
    pub listen: Option<String>,
    /// A listen address other than loopback is refused without it.
    pub allow_remote: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    /// `{queue = "build"}`: the labels that route jobs to this host.
    pub labels: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpgrade {
    /// minisign public key lines (`RW…`).
    pub trusted_keys: Option<Vec<String>>,
    pub settle: Option<String>,
    pub deadline: Option<String>,
    pub hub_wait: Option<String>,
    pub drain_deadline: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRunner {
    pub user: Option<String>,
    pub stop_grace: Option<String>,
    pub initial_backoff: Option<String>,
    pub max_log_bytes: Option<u64>,
    pub max_jobs: Option<usize>,
    pub max_jobs_per_owner: Option<usize>,
    pub max_queued: Option<usize>,
    pub max_output_bytes: Option<u64>,
    pub delegate_cgroup: Option<bool>,
    pub job_path: Option<String>,
    pub max_kept_bytes: Option<u64>,
    pub sandbox: Option<String>,
    pub sandbox_shared: Option<Vec<String>>,
    pub sandbox_tmp_size: Option<u64>,
    pub sandbox_allow_syscalls: Option<Vec<String>>,
    pub network: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHub {
    /// One URL, or several: replicas of one hub, tried in turn.
    pub url: Option<HubUrls>,
    pub agent_id: Option<String>,
    pub token_file: Option<PathBuf>,
    /// An enrolment token (`rge_`), traded at first contact for the agent's own token,
    /// which is then kept in `token_file` (default `<state_dir>/hub.token`).
    pub enrol_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    pub max_files: Option<usize>,
}

/// `hub.url`: a string, or a list of replicas' URLs.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum HubUrls {
    One(String),
    Many(Vec<String>),
}

/// Values given on the command line.
#[derive(Debug, Default, Clone)]
pub struct Flags {
    pub config: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
    pub log_dir: Option<PathBuf>,
    pub runner_user: Option<String>,
    /// `--hub`, repeated; `None` when not given.
    pub hub: Option<Vec<String>>,
    pub agent_id: Option<String>,
    pub token_file: Option<PathBuf>,
    pub enrol_token: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    /// `--trusted-key`, repeated; `None` when not given.
    pub trusted_keys: Option<Vec<String>>,
    /// `--label K=V`, repeated; `None` when not given.
    pub labels: Option<Vec<String>>,
}
