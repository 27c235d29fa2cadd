//! `railgrid agent …`: the agent, its install and the commands that ask it.

use super::*;

/// The running agent a command is about: its state directory, or the config naming it.
#[derive(Debug, Args)]
pub struct AgentTarget {
    /// Config file naming the state directory.
    #[arg(long, value_name = "FILE", conflicts_with = "state_dir")]
    pub config: Option<PathBuf>,
    /// State directory of the agent.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct AgentReloadArgs {
    #[command(flatten)]
    pub target: AgentTarget,
    /// The agent's pid as the service manager knows it (systemd's $MAINPID): refused when
    /// the state directory names another.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// How long to wait for the reload's end (a runner restart for new settings takes its
    /// stop grace). Under systemd's default TimeoutStartSec (90s).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "85s")]
    pub timeout: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct AgentDrainArgs {
    #[command(flatten)]
    pub target: AgentTarget,
    /// Cancel what still runs this long after now (default: wait for every job, however
    /// long it takes; a drain already in force keeps its deadline).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub deadline: Option<std::time::Duration>,
    /// Return once no job is left on the host (exit 0), or once the deadline has
    /// cancelled what was left (exit 1).
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct AgentResumeArgs {
    #[command(flatten)]
    pub target: AgentTarget,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Run the agent in the foreground until SIGTERM or SIGINT (SIGHUP reloads the config).
    Run(AgentArgs),
    /// Show what the running agent reports (exit 3 when no agent is running).
    Status(AgentStatusArgs),
    /// Make the running agent read its configuration again (SIGHUP) and wait until it is
    /// applied: exit 0 applied, 1 refused (the reason printed; the running configuration
    /// stays) or no answer within --timeout, 3 no agent running. The unit's ExecReload.
    Reload(AgentReloadArgs),
    /// Take no new job on this host while its jobs finish (before a reboot or
    /// maintenance): refused local submissions, no hub job routed here. Kept across agent
    /// restarts until `agent resume`. Exit 0 once the agent holds the drain (with --wait:
    /// once no job is left), 1 when --deadline cancelled jobs or the agent did not answer,
    /// 3 when no agent runs (the drain is kept for its next start).
    Drain(AgentDrainArgs),
    /// End this host's drain (`agent drain`); a drain the hub asked for stays until
    /// `hub agent resume`.
    Resume(AgentResumeArgs),
    /// Validate the configuration and print the effective settings (secrets redacted).
    CheckConfig(CheckConfigArgs),
    /// Install this binary as the host's agent service (systemd or launchd): the binary,
    /// the runner's account, the config and token (0600), the unit or plist; then enable
    /// and start it. Safe to run again: only what differs changes, and it says what.
    Install(AgentInstallArgs),
    /// Stop and remove the agent service and its binary; --purge also removes the
    /// config, state and logs.
    Uninstall(AgentUninstallArgs),
    /// Manage this host's self-upgrade: `--clear-bad` forgets the versions remembered as
    /// bad after a rollback, so the agent tries them again when the hub asks.
    Upgrade(AgentUpgradeArgs),
    /// The guard of an upgrade in flight (started by the agent, from the previous
    /// binary): rolls back unless the new agent commits by the deadline.
    #[command(hide = true)]
    UpgradeWatch(UpgradeWatchArgs),
    /// Starts a watcher again for an upgrade in flight whose watcher is gone (a reboot):
    /// run before every service start, from the previous binary.
    #[command(hide = true)]
    UpgradeGuard {
        #[arg(long, value_name = "DIR")]
        state_dir: PathBuf,
        #[arg(long, value_name = "DIR")]
        log_dir: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct AgentInstallArgs {
    // Written to the config; the token copied to /etc/railgrid/token (0600), the CA to
    // /etc/railgrid/hub-ca.pem.
    #[command(flatten)]
    pub link: HubFlags,
    /// The runner's account, created when missing (default: the config's, else
    /// `railgrid`; `_railgrid` on macOS).
    #[arg(long, value_name = "NAME")]
    pub runner_user: Option<String>,
    /// Where the binary goes: PREFIX/bin/railgrid.
    #[arg(long, value_name = "DIR", default_value = "/usr/local")]
    pub prefix: PathBuf,
    /// Write everything under DIR (an image) and start nothing.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print every action and file, and do none of them.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print the plan as JSON (steps, notes, and the files' text, secrets
    /// left out).
    #[arg(long, requires = "dry_run")]
    pub json: bool,
    /// Enable the service for the next boot, but do not start it now.
    #[arg(long)]
    pub no_start: bool,
}

#[derive(Debug, Args)]
pub struct AgentUninstallArgs {
    /// Also remove the config and token, the state (job records, spooled output) and
    /// the logs.
    #[arg(long)]
    pub purge: bool,
    /// Do not ask before --purge.
    #[arg(long, requires = "purge")]
    pub yes: bool,
    /// Remove what an install wrote under DIR (an image); stop nothing.
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Print every action, and do none of them.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct AgentUpgradeArgs {
    /// Forget the versions remembered as bad.
    #[arg(long)]
    pub clear_bad: bool,
    #[command(flatten)]
    pub target: AgentTarget,
}

#[derive(Debug, Args)]
pub struct UpgradeWatchArgs {
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The new binary guarded.
    #[arg(long, value_name = "HEX")]
    pub to_sha256: String,
    /// standalone, systemd:UNIT or launchd:LABEL.
    #[arg(long, value_name = "HOW")]
    pub service: String,
    /// How long the agent may take to stop on SIGTERM before it is killed.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "60s")]
    pub stop_timeout: Duration,
    /// The agent's arguments (standalone: it is started again with them).
    #[arg(last = true, value_name = "ARGS")]
    pub agent_args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Print the effective configuration as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Config file (default: /etc/railgrid/agent.toml as root, else
    /// $XDG_CONFIG_HOME/railgrid/agent.toml; a missing default file means all defaults).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// State directory (default: /var/lib/railgrid as root, else $XDG_STATE_HOME/railgrid).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Log directory (default: /var/log/railgrid as root, else the state directory).
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Account the runner runs as (required as root; never root).
    #[arg(long, value_name = "NAME")]
    pub runner_user: Option<String>,
    #[command(flatten)]
    pub link: HubFlags,
    #[command(flatten)]
    pub log: LogFlags,
}

/// How an agent reaches its hub and which releases it takes: the same flags for `agent
/// run`, `check-config` and `install`.
#[derive(Debug, Clone, Args)]
pub struct HubFlags {
    /// Hub URL (https://...); repeat it for the replicas of one hub, tried in turn.
    #[arg(long, value_name = "URL")]
    pub hub: Vec<String>,
    /// This agent's id at the hub (default: the host name).
    #[arg(long, value_name = "ID")]
    pub agent_id: Option<String>,
    /// File holding the agent's hub token (mode 0600). With --enrol-token: where the
    /// agent keeps the token it is given (default <state-dir>/hub.token).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// File holding an enrolment token (`hub enrol-token create`, mode 0600): traded at
    /// first contact for the agent's own token; not needed after.
    #[arg(long, value_name = "FILE")]
    pub enrol_token: Option<PathBuf>,
    /// PEM file of the CA that signed the hub's certificate.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// A minisign public key line (RW…) whose signature a release from the hub must
    /// carry (repeatable, for rotation; replaces upgrade.trusted_keys).
    #[arg(long, value_name = "RW…")]
    pub trusted_key: Vec<String>,
    /// A label that routes jobs to this host (repeatable; replaces agent.labels). os,
    /// arch and hostname are set by the agent itself.
    #[arg(long, value_name = "K=V")]
    pub label: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AgentStatusArgs {
    #[command(flatten)]
    pub target: AgentTarget,
    /// Print the status file as JSON.
    #[arg(long)]
    pub json: bool,
}
