//! Every environment variable railgrid reads or sets, in one place: what an operator may
//! set, what a service manager hands the agent, and the one marker the runner puts into
//! each job. Nothing else in the crate spells a variable's name.
//!
//! The child environments the supervisor and the runner build are a different matter:
//! they start from nothing (see `supervisor::env` and `env_policy`).

/// The agent's configuration file (a flag, `--config`, wins over it).
pub const CONFIG: &str = "RAILGRID_CONFIG";
/// Filter of railgrid's own log on stderr and in the agent's log file (`debug`,
/// `railgrid=trace`).
pub const LOG: &str = "RAILGRID_LOG";

/// Agent settings (`state_dir`, `log_dir`, `runner.*`, `hub.*`, `log.*`): each has one,
/// between its flag and its file key in precedence.
pub const STATE_DIR: &str = "RAILGRID_STATE_DIR";
pub const LOG_DIR: &str = "RAILGRID_LOG_DIR";
pub const RUNNER_USER: &str = "RAILGRID_RUNNER_USER";
pub const RUNNER_STOP_GRACE: &str = "RAILGRID_RUNNER_STOP_GRACE";
pub const RUNNER_INITIAL_BACKOFF: &str = "RAILGRID_RUNNER_INITIAL_BACKOFF";
pub const RUNNER_MAX_LOG_BYTES: &str = "RAILGRID_RUNNER_MAX_LOG_BYTES";
pub const RUNNER_MAX_JOBS: &str = "RAILGRID_RUNNER_MAX_JOBS";
pub const RUNNER_MAX_JOBS_PER_OWNER: &str = "RAILGRID_RUNNER_MAX_JOBS_PER_OWNER";
pub const RUNNER_MAX_QUEUED: &str = "RAILGRID_RUNNER_MAX_QUEUED";
pub const RUNNER_MAX_OUTPUT_BYTES: &str = "RAILGRID_RUNNER_MAX_OUTPUT_BYTES";
pub const RUNNER_DELEGATE_CGROUP: &str = "RAILGRID_RUNNER_DELEGATE_CGROUP";
pub const RUNNER_JOB_PATH: &str = "RAILGRID_RUNNER_JOB_PATH";
pub const RUNNER_MAX_KEPT_BYTES: &str = "RAILGRID_RUNNER_MAX_KEPT_BYTES";
pub const RUNNER_SANDBOX: &str = "RAILGRID_RUNNER_SANDBOX";
pub const RUNNER_SANDBOX_SHARED: &str = "RAILGRID_RUNNER_SANDBOX_SHARED";
pub const RUNNER_SANDBOX_TMP_SIZE: &str = "RAILGRID_RUNNER_SANDBOX_TMP_SIZE";
pub const RUNNER_SANDBOX_ALLOW_SYSCALLS: &str = "RAILGRID_RUNNER_SANDBOX_ALLOW_SYSCALLS";
pub const RUNNER_NETWORK: &str = "RAILGRID_RUNNER_NETWORK";
pub const HUB_URL: &str = "RAILGRID_HUB_URL";
/// `text` or `json`: how `agent run`, `runner run` and `hub serve` (and every other
/// command) write their log lines.
pub const LOG_FORMAT: &str = "RAILGRID_LOG_FORMAT";
pub const HUB_AGENT_ID: &str = "RAILGRID_HUB_AGENT_ID";
pub const HUB_TOKEN_FILE: &str = "RAILGRID_HUB_TOKEN_FILE";
pub const HUB_ENROL_TOKEN_FILE: &str = "RAILGRID_HUB_ENROL_TOKEN_FILE";
pub const HUB_CA_FILE: &str = "RAILGRID_HUB_CA_FILE";
pub const LOG_MAX_FILES: &str = "RAILGRID_LOG_MAX_FILES";
pub const METRICS_LISTEN: &str = "RAILGRID_METRICS_LISTEN";
pub const METRICS_ALLOW_REMOTE: &str = "RAILGRID_METRICS_ALLOW_REMOTE";
pub const UPGRADE_TRUSTED_KEYS: &str = "RAILGRID_UPGRADE_TRUSTED_KEYS";
/// `agent.labels`, as `k=v,k2=v2`.
pub const AGENT_LABELS: &str = "RAILGRID_AGENT_LABELS";
pub const UPGRADE_SETTLE: &str = "RAILGRID_UPGRADE_SETTLE";
pub const UPGRADE_DEADLINE: &str = "RAILGRID_UPGRADE_DEADLINE";
pub const UPGRADE_HUB_WAIT: &str = "RAILGRID_UPGRADE_HUB_WAIT";
pub const UPGRADE_DRAIN_DEADLINE: &str = "RAILGRID_UPGRADE_DRAIN_DEADLINE";

/// The hub's side (`railgrid hub …`): its data dir, and for admin commands from another
/// host its URL, admin token file and CA. Named apart from the agent's `RAILGRID_HUB_*`,
/// which name the agent's own hub link and token: a host that runs both must not hand the
/// agent's token to an admin command.
pub const HUB_DATA_DIR: &str = "RAILGRID_HUB_DATA_DIR";
pub const HUB_ADMIN_URL: &str = "RAILGRID_HUB_ADMIN_URL";
pub const HUB_ADMIN_TOKEN_FILE: &str = "RAILGRID_HUB_ADMIN_TOKEN_FILE";
pub const HUB_ADMIN_CA_FILE: &str = "RAILGRID_HUB_ADMIN_CA_FILE";

/// Where a non-root agent keeps its state by default (`$XDG_STATE_HOME/railgrid`, else
/// `$HOME/.local/state/railgrid`) and looks for its configuration
/// (`$XDG_CONFIG_HOME/railgrid/agent.toml`, else `$HOME/.config/…`).
pub const XDG_STATE_HOME: &str = "XDG_STATE_HOME";
pub const XDG_CONFIG_HOME: &str = "XDG_CONFIG_HOME";
pub const HOME: &str = "HOME";

/// systemd's notification socket and watchdog (`Type=notify`, `WatchdogSec=`).
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Set by the runner in every job's initial environment to the job's id, and looked for
/// in `/proc/<pid>/environ` by the next runner when a job was spawned but its pid never
/// recorded. Never read from railgrid's own environment.
pub const JOB_ID: &str = "RAILGRID_JOB_ID";
/// Set in a job given secrets as files to the directory that holds them.
pub const SECRETS_DIR: &str = "RAILGRID_SECRETS_DIR";
