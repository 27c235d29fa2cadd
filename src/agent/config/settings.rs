//! The validated configuration, as the agent's tasks use it.

use std::path::PathBuf;
use std::time::Duration;

use crate::supervisor::account::Account;

/// The settings of the runner child; a change to any of them restarts it on reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunnerSettings {
    /// `None`: run the runner as the agent's own (non-root) account.
    pub(crate) user: Option<Account>,
    pub(crate) stop_grace: Duration,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_log_bytes: u64,
    /// Job engine limits passed to the runner; `None` keeps the runner's defaults.
    pub(crate) max_jobs: Option<usize>,
    pub(crate) max_jobs_per_owner: Option<usize>,
    pub(crate) max_queued: Option<usize>,
    pub(crate) max_output_bytes: Option<u64>,
    /// Give the runner a cgroup of its own, delegated to its account, so that jobs get the
    /// cgroup tier (Linux). `true`: the agent runs in a cgroup delegated to it (a systemd
    /// unit with `Delegate=yes`). Unset: only where a root agent runs in the root cgroup
    /// (no service manager), in a subtree it makes. `false`: never.
    pub(crate) delegate_cgroup: Option<bool>,
    /// PATH of every job (a job's own `PATH` still wins); `None` keeps the baseline.
    pub(crate) job_path: Option<String>,
    /// Bytes finished jobs keep on disk (spools and workspaces); `None`: the runner's
    /// default.
    pub(crate) max_kept_bytes: Option<u64>,
    /// Every job's sandbox (`runner.sandbox*`, passed to the runner).
    pub(crate) sandbox: SandboxSettings,
}

/// `runner.sandbox`: `auto`, `required` or `off`; the directories shared by every job;
/// the size of each job's /tmp; the system calls taken off the seccomp deny list; and
/// `runner.network`, which the sandbox keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SandboxSettings {
    pub(crate) mode: Option<String>,
    pub(crate) shared: Vec<PathBuf>,
    pub(crate) tmp_size: Option<u64>,
    pub(crate) allow_syscalls: Vec<String>,
    pub(crate) network: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubSettings {
    /// `https://host[:port]`, without a trailing slash: one, or the replicas of one hub
    /// (same token, same CA), tried in this order and in turn on failure.
    pub(crate) urls: Vec<String>,
    /// This agent's name at the hub (the `{id}` of its reconcile URL).
    pub(crate) agent_id: String,
    /// The agent's own token; with `enrol_token_file`, where the token it is given goes.
    pub(crate) token_file: PathBuf,
    /// An enrolment token, traded for the agent's own token while `token_file` does not
    /// exist.
    pub(crate) enrol_token_file: Option<PathBuf>,
    pub(crate) ca_file: Option<PathBuf>,
}

/// How the agent upgrades itself (docs/design.md, invariant 13).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpgradeSettings {
    /// minisign public key lines; a release must be signed by one of them. Empty: every
    /// upgrade from the hub is refused.
    pub(crate) trusted_keys: Vec<String>,
    /// How long the new agent's runner must stay healthy before the upgrade commits.
    pub(crate) settle: Duration,
    /// How long after the switch the upgrade may take to commit before the watcher rolls
    /// it back.
    pub(crate) deadline: Duration,
    /// How much longer than `deadline` a new agent that is healthy on its host may wait
    /// for a hub it cannot reach, before the watcher rolls it back, blaming nothing.
    pub(crate) hub_wait: Duration,
    /// How long the runner drains before the switch (its jobs finish; what still runs
    /// then is cancelled with the reason `upgrade`); zero switches at once.
    pub(crate) drain_deadline: Duration,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentConfig {
    /// The file that was read, if any.
    pub(crate) config_path: Option<PathBuf>,
    pub(crate) state_dir: PathBuf,
    pub(crate) log_dir: PathBuf,
    pub(crate) runner: RunnerSettings,
    pub(crate) hub: Option<HubSettings>,
    /// The labels the host declares (`agent.labels`), without the automatic ones.
    pub(crate) labels: crate::proto::labels::Labels,
    pub(crate) log_max_files: usize,
    pub(crate) upgrade: UpgradeSettings,
    /// Where `/metrics` is served (`None`: nowhere, the default).
    pub(crate) metrics: Option<MetricsSettings>,
}

/// The agent's metrics endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetricsSettings {
    pub(crate) listen: std::net::SocketAddr,
    /// Whether an address other than loopback was allowed.
    pub(crate) allow_remote: bool,
}

impl AgentConfig {
    /// The runner's own state directory, `<state>/runner`.
    pub(crate) fn runner_dir(&self) -> PathBuf {
        self.state_dir.join("runner")
    }
}
