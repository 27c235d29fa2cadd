//! The sources as they come, before any check: the file as written and the flags as
//! given.

use std::path::PathBuf;

use serde::Deserialize;

/// The file as written. Unknown keys are errors: a typo must not silently mean "default".
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) log_dir: Option<PathBuf>,
    #[serde(default)]
    pub(crate) runner: RawRunner,
    #[serde(default)]
    pub(crate) hub: RawHub,
    #[serde(default)]
    pub(crate) log: RawLog,
    #[serde(default)]
    pub(crate) upgrade: RawUpgrade,
    #[serde(default)]
    pub(crate) agent: RawAgent,
    #[serde(default)]
    pub(crate) metrics: RawMetrics,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    /// `127.0.0.1:9469`: where the agent serves `/metrics` in plain HTTP.
    pub(crate) listen: Option<String>,
    /// A listen address other than loopback is refused without it.
    pub(crate) allow_remote: Option<bool>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    /// `{queue = "build"}`: the labels that route jobs to this host.
    pub(crate) labels: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpgrade {
    /// minisign public key lines (`RW…`).
    pub(crate) trusted_keys: Option<Vec<String>>,
    pub(crate) settle: Option<String>,
    pub(crate) deadline: Option<String>,
    pub(crate) hub_wait: Option<String>,
    pub(crate) drain_deadline: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRunner {
    pub(crate) user: Option<String>,
    pub(crate) stop_grace: Option<String>,
    pub(crate) initial_backoff: Option<String>,
    pub(crate) max_log_bytes: Option<u64>,
    pub(crate) max_jobs: Option<usize>,
    pub(crate) max_jobs_per_owner: Option<usize>,
    pub(crate) max_queued: Option<usize>,
    pub(crate) max_output_bytes: Option<u64>,
    pub(crate) delegate_cgroup: Option<bool>,
    pub(crate) job_path: Option<String>,
    pub(crate) max_kept_bytes: Option<u64>,
    pub(crate) sandbox: Option<String>,
    pub(crate) sandbox_shared: Option<Vec<String>>,
    pub(crate) sandbox_tmp_size: Option<u64>,
    pub(crate) sandbox_allow_syscalls: Option<Vec<String>>,
    pub(crate) network: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHub {
    /// One URL, or several: replicas of one hub, tried in turn.
    pub(crate) url: Option<HubUrls>,
    pub(crate) agent_id: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    /// An enrolment token (`rge_`), traded at first contact for the agent's own token,
    /// which is then kept in `token_file` (default `<state_dir>/hub.token`).
    pub(crate) enrol_token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    pub(crate) max_files: Option<usize>,
}

/// `hub.url`: a string, or a list of replicas' URLs.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum HubUrls {
    One(String),
    Many(Vec<String>),
}

/// Values given on the command line.
#[derive(Debug, Default, Clone)]
pub(crate) struct Flags {
    pub(crate) config: Option<PathBuf>,
    pub(crate) state_dir: Option<PathBuf>,
    pub(crate) log_dir: Option<PathBuf>,
    pub(crate) runner_user: Option<String>,
    /// `--hub`, repeated; `None` when not given.
    pub(crate) hub: Option<Vec<String>>,
    pub(crate) agent_id: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) enrol_token: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
    /// `--trusted-key`, repeated; `None` when not given.
    pub(crate) trusted_keys: Option<Vec<String>>,
    /// `--label K=V`, repeated; `None` when not given.
    pub(crate) labels: Option<Vec<String>>,
}
