//! The validated configuration, as the agent's tasks use it.

use std::path::PathBuf;
use std::time::Duration;

use crate::supervisor::account::Account;

/// The settings of the runner child; a change to any of them restarts it on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerSettings {
    /// `None`: run the runner as the agent's own (non-root) account.
    pub user: Option<Account>,
    pub stop_grace: Duration,
    pub initial_backoff: Duration,
    pub max_log_bytes: u64,
    /// Job engine limits passed to the runner; `None` keeps the runner's defaults.
    pub max_jobs: Option<usize>,
    pub max_jobs_per_owner: Option<usize>,
    pub max_queued: Option<usize>,
    pub max_output_bytes: Option<u64>,
    /// Give the runner a cgroup of its own, delegated to its account, so that jobs get the
    /// cgroup tier (Linux). `true`: the agent runs in a cgroup delegated to it (a systemd
    /// unit with `Delegate=yes`). Unset: only where a root agent runs in the root cgroup
    /// (no service manager), in a subtree it makes. `false`: never.
    pub delegate_cgroup: Option<bool>,
    /// PATH of every job (a job's own `PATH` still wins); `None` keeps the baseline.
    pub job_path: Option<String>,
    /// Bytes finished jobs keep on disk (spools and workspaces); `None`: the runner's
    /// default.
    pub max_kept_bytes: Option<u64>,
    /// Every job's sandbox (`runner.sandbox*`, passed to the runner).
    pub sandbox: SandboxSettings,
}

/// `runner.sandbox`: `auto`, `required` or `off`; the directories shared by every job;
/// the size of each job's /tmp; the system calls taken off the seccomp deny list; and
/// `runner.network`, which the sandbox keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSettings {
    pub mode: Option<String>,
    pub shared: Vec<PathBuf>,
    pub tmp_size: Option<u64>,
    pub allow_syscalls: Vec<String>,
    pub network: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSettings {
    /// `https://host[:port]`, without a trailing slash: one, or the replicas of one hub
    /// (same token, same CA), tried in this order and in turn on failure.
    pub urls: Vec<String>,
    /// This agent's name at the hub (the `{id}` of its reconcile URL).
    pub agent_id: String,
    /// The agent's own token; with `enrol_token_file`, where the token it is given goes.
    pub token_file: PathBuf,
    /// An enrolment token, traded for the agent's own token while `token_file` does not
    /// exist.
    pub enrol_token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// How the agent upgrades itself (docs/design.md, invariant 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpgradeSettings {
    /// minisign public key lines; a release must be signed by one of them. Empty: every
    /// upgrade from the hub is refused.
    pub trusted_keys: Vec<String>,
    /// How long the new agent's runner must stay healthy before the upgrade commits.
    pub settle: Duration,
    /// How long after the switch the upgrade may take to commit before the watcher rolls
    /// it back.
    pub deadline: Duration,
    /// How much longer than `deadline` a new agent that is healthy on its host may wait
    /// for a hub it cannot reach, before the watcher rolls it back, blaming nothing.
    pub hub_wait: Duration,
    /// How long the runner drains before the switch (its jobs finish; what still runs
    /// then is cancelled with the reason `upgrade`); zero switches at once.
    pub drain_deadline: Duration,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The file that was read, if any.
    pub config_path: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub log_dir: PathBuf,
    pub runner: RunnerSettings,
    pub hub: Option<HubSettings>,
    /// The labels the host declares (`agent.labels`), without the automatic ones.
    pub labels: crate::proto::labels::Labels,
    pub log_max_files: usize,
    pub upgrade: UpgradeSettings,
    /// Where `/metrics` is served (`None`: nowhere, the default).
    pub metrics: Option<MetricsSettings>,
}

/// The agent's metrics endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsSettings {
    pub listen: std::net::SocketAddr,
    /// Whether an address other than loopback was allowed.
    pub allow_remote: bool,
}

impl AgentConfig {
    /// The runner's own state directory, `<state>/runner`.
    pub fn runner_dir(&self) -> PathBuf {
        self.state_dir.join("runner")
    }
}
