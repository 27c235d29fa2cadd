//! The command line: clap definitions of every subcommand, nothing else.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::proto::selector::Selector;
use crate::supervisor;

#[derive(Debug, Parser)]
#[command(name = "railgrid", version = crate::build_info::VERSION, about = "Fleet agent, job runner and process supervisor", propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version, commit and target of this binary.
    Version {
        /// Print JSON: {"version", "commit", "target"}.
        #[arg(long)]
        json: bool,
    },
    /// Print a completion script for SHELL (bash, zsh, fish, elvish, powershell): for
    /// example `railgrid completions bash > /etc/bash_completion.d/railgrid`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run PROGRAM under the supervisor until SIGTERM or SIGINT, then stop its whole
    /// process group and exit 0.
    Supervise(Box<SuperviseArgs>),
    /// The host daemon: keeps one runner alive, reconciled by a hub or standalone.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Submit and inspect jobs on this host's runner.
    Job {
        #[command(flatten)]
        target: JobTarget,
        #[command(subcommand)]
        command: JobCommand,
    },
    /// The job runner (started by the agent; usable by hand for debugging).
    Runner {
        #[command(subcommand)]
        command: RunnerCommand,
    },
    /// The reference hub: `hub serve`, and the admin commands that enrol agents and set
    /// their desired state.
    Hub(Box<HubArgs>),
    /// Release signing: keys and signatures in minisign's formats (the `minisign` tool
    /// reads and writes the same).
    Release {
        #[command(subcommand)]
        command: ReleaseCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Make a key pair: the secret key (0600; unencrypted unless --password-file) and the
    /// public key. Never prompts, never overwrites.
    Keygen {
        #[arg(long, value_name = "FILE")]
        secret_key: PathBuf,
        #[arg(long, value_name = "FILE")]
        public_key: PathBuf,
        /// Encrypt the secret key with the password in FILE (its first line).
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
    },
    /// Sign FILE: writes FILE.minisig, whose trusted comment names the version, the file
    /// name and its SHA-256.
    // `--version` is the version signed here, not railgrid's own.
    #[command(disable_version_flag = true)]
    Sign {
        #[arg(long, value_name = "FILE")]
        secret_key: PathBuf,
        /// The password of an encrypted secret key, in FILE.
        #[arg(long, value_name = "FILE")]
        password_file: Option<PathBuf>,
        /// The version signed (default: what `FILE version --json` says).
        #[arg(long, value_name = "V")]
        version: Option<String>,
        file: PathBuf,
    },
    /// Check FILE's signature (FILE.minisig unless --signature) with a public key.
    Verify {
        /// A minisign public key file, or a file holding its key line (`RW…`).
        #[arg(long, value_name = "FILE")]
        public_key: PathBuf,
        #[arg(long, value_name = "FILE")]
        signature: Option<PathBuf>,
        file: PathBuf,
        /// Print JSON: the file, the key id and the trusted comment.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct HubArgs {
    /// The hub's data dir: `serve` keeps its database, tokens and CA there; the admin
    /// commands on the hub's host read the URL, admin token and CA from it. Default:
    /// /var/lib/railgrid-hub as root, $XDG_STATE_HOME/railgrid-hub otherwise.
    #[arg(long, value_name = "DIR", global = true, env = crate::env_vars::HUB_DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// The hub's URL, for admin commands from another host (with --token-file).
    #[arg(long = "hub", value_name = "URL", global = true, env = crate::env_vars::HUB_ADMIN_URL)]
    pub url: Option<String>,
    /// File holding the admin token (mode 0600; default <data-dir>/admin.token).
    #[arg(long, value_name = "FILE", global = true, env = crate::env_vars::HUB_ADMIN_TOKEN_FILE)]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that signed the hub's certificate (default with --data-dir:
    /// <data-dir>/ca.pem when the hub made its own).
    #[arg(long, value_name = "PEM", global = true, env = crate::env_vars::HUB_ADMIN_CA_FILE)]
    pub ca_file: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: HubCommand,
}

#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Serve the hub over HTTPS until SIGTERM or SIGINT (needs --data-dir).
    Serve(Box<HubServeArgs>),
    /// Enrol, list, show and revoke agents.
    Agent {
        #[command(subcommand)]
        command: HubAgentCommand,
    },
    /// Set and show desired state, for the fleet or one agent.
    Desired {
        #[command(subcommand)]
        command: HubDesiredCommand,
    },
    /// Run jobs on agents through the hub, and follow them.
    Job {
        #[command(subcommand)]
        command: HubJobCommand,
    },
    /// Publish, list and resume agent releases.
    Release {
        #[command(subcommand)]
        command: HubReleaseCommand,
    },
    /// Upgrade agents to a version wave by wave: canaries first, each wave once the last
    /// one committed, halted at the first rollback.
    Rollout {
        #[command(subcommand)]
        command: HubRolloutCommand,
    },
    /// Admin tokens limited to scopes (and to agents by their hub labels), and the root
    /// token's rotation.
    Token {
        #[command(subcommand)]
        command: HubTokenCommand,
    },
    /// Tokens hosts trade for their own agent token (`agent run --enrol-token FILE`).
    #[command(name = "enrol-token")]
    EnrolToken {
        #[command(subcommand)]
        command: HubEnrolTokenCommand,
    },
    /// What admins did: every change, refusal, enrolment and rotation.
    Audit {
        #[command(subcommand)]
        command: HubAuditCommand,
    },
    /// Work on the hub's store directly, with every hub on it stopped.
    Store {
        #[command(subcommand)]
        command: HubStoreCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum HubTokenCommand {
    /// Make an admin token limited to scopes; printed once (the hub keeps its hash).
    Create(HubTokenCreateArgs),
    /// Every admin token made (never its secret): scopes, selector, expiry, revoked.
    List,
    /// Refuse an admin token from now on.
    Revoke { name: String },
    /// A new root token (admin.token): the old one is refused from now on. With
    /// --data-dir the new one is written to <data-dir>/admin.token; otherwise printed.
    #[command(name = "rotate-root")]
    RotateRoot,
}

#[derive(Debug, Args)]
pub struct HubTokenCreateArgs {
    /// Its name in listings and in the audit log (never used twice).
    #[arg(long, value_name = "NAME")]
    pub name: String,
    /// What it may do, comma-separated: agents:read, agents:write, jobs:read,
    /// jobs:submit, jobs:cancel, releases:write, rollouts:write, tokens:write, audit:read.
    #[arg(
        long = "scope",
        value_name = "S[,S…]",
        value_delimiter = ',',
        required = true
    )]
    pub scopes: Vec<String>,
    /// Its job scopes reach only agents whose hub labels match SEL.
    #[arg(long, value_name = "SEL", value_parser = parse_selector)]
    pub select: Option<Selector>,
    /// It stops working this long from now.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// Write the token to FILE (created 0600) instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub token_out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HubEnrolTokenCommand {
    /// Make an enrolment token; printed once (the hub keeps its hash).
    Create(HubEnrolTokenCreateArgs),
    /// Every enrolment token (never its secret): uses, labels, expiry, revoked.
    List,
    /// Refuse an enrolment token from now on (hosts it enrolled keep their own token).
    Revoke { id: String },
}

#[derive(Debug, Args)]
pub struct HubEnrolTokenCreateArgs {
    /// How many hosts it enrols (default: any number).
    #[arg(long, value_name = "N")]
    pub uses: Option<u64>,
    /// It stops enrolling this long from now.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub ttl: Option<Duration>,
    /// A hub label every host it enrols gets (repeatable).
    #[arg(long = "label", value_name = "K=V", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Write the token to FILE (created 0600) instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub token_out: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HubAuditCommand {
    /// The audit log, oldest first.
    List {
        /// Only what happened within DUR.
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        since: Option<Duration>,
        /// Only what token NAME did (an admin token's name, `root`, or an enrolment
        /// token's id).
        #[arg(long, value_name = "NAME")]
        token: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum HubRolloutCommand {
    /// Start a rollout of a published version over the agents that match (all of them
    /// without --select); prints its id.
    #[command(disable_version_flag = true)]
    Start(HubRolloutStartArgs),
    /// A rollout wave by wave, member by member, and what it waits for (without ID:
    /// the latest rollouts).
    Status { id: Option<String> },
    /// Give the version to no further member (those under way finish).
    Pause { id: String },
    /// Go on with a paused, halted or stopped rollout.
    Resume { id: String },
    /// End a rollout where it is; with --rollback, first take the members that committed
    /// back to the version each ran before, wave by wave.
    Abort {
        id: String,
        #[arg(long)]
        rollback: bool,
    },
}

#[derive(Debug, Args)]
pub struct HubRolloutStartArgs {
    /// The version (published with `hub release publish`, not halted).
    #[arg(long, value_name = "V")]
    pub version: String,
    /// Only the agents (not revoked) whose labels match SEL now.
    #[arg(long, value_name = "SEL", value_parser = parse_selector)]
    pub select: Option<Selector>,
    /// The waves, cumulative: counts or percentages of the agents selected. Agents
    /// labelled rollout=canary come first.
    #[arg(long, value_name = "LIST", default_value = crate::proto::rollout::DEFAULT_WAVES)]
    pub waves: String,
    /// How long after a wave's last commit the next one starts.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "0s")]
    pub soak: std::time::Duration,
    /// The most agents draining or switching at once.
    #[arg(long, value_name = "N", default_value_t = crate::proto::rollout::DEFAULT_MAX_PARALLEL)]
    pub max_parallel: usize,
    /// Members that may fail to download or verify the version before the rollout stops.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub max_failures: usize,
    /// Stop where it is if it has not finished this long after its start.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub deadline: Option<std::time::Duration>,
}

#[derive(Debug, Subcommand)]
pub enum HubStoreCommand {
    /// Start the generation counter over at 1 (docs/hub.md, "Generations"): every agent
    /// then takes the hub's desired state at its next reconcile. SQLite with --data-dir,
    /// PostgreSQL with --store or --config.
    Renumber(HubStoreArgs),
    /// Copy a stopped SQLite hub (its data dir) into an empty PostgreSQL database, in one
    /// transaction checked table by table, so that replicas serve its agents with the
    /// tokens they have (docs/hub.md, "From one SQLite hub to replicas").
    Copy(HubStoreCopyArgs),
}

#[derive(Debug, Args)]
pub struct HubStoreCopyArgs {
    /// The data dir of the SQLite hub (stopped) to copy.
    #[arg(long, value_name = "DATA_DIR")]
    pub from: PathBuf,
    /// The empty PostgreSQL database to copy into, as `hub serve --store` takes it.
    #[arg(
        long,
        value_name = "URL",
        required_unless_present = "config",
        conflicts_with = "config"
    )]
    pub to: Option<String>,
    /// A hub config file naming the database, as `hub serve --config` takes it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct HubStoreArgs {
    /// The PostgreSQL store, as `hub serve --store` takes it.
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    pub store: Option<String>,
    /// A hub config file naming the store, as `hub serve --config` takes it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HubReleaseCommand {
    /// Upload a signed binary; the hub checks the signature against its --release-key
    /// keys before it takes it.
    #[command(disable_version_flag = true)]
    Publish(HubReleasePublishArgs),
    /// Every version: size, SHA-256, agents running it, and whether it is halted.
    List,
    /// Offer a halted version to agents again.
    #[command(disable_version_flag = true)]
    Resume { version: String },
}

#[derive(Debug, Args)]
pub struct HubReleasePublishArgs {
    /// The version the binary reports (`railgrid version`).
    #[arg(long, value_name = "V")]
    pub version: String,
    /// The binary.
    #[arg(long, value_name = "FILE")]
    pub binary: PathBuf,
    /// Its minisign signature (`railgrid release sign` writes FILE.minisig).
    #[arg(long, value_name = "FILE.minisig")]
    pub signature: PathBuf,
    /// The platform it is for (default: this host's, as `std::env::consts::OS` names it).
    #[arg(long, value_name = "OS", default_value = std::env::consts::OS)]
    pub os: String,
    /// The architecture (default: this host's, e.g. x86_64, aarch64).
    #[arg(long, value_name = "ARCH", default_value = std::env::consts::ARCH)]
    pub arch: String,
}

#[derive(Debug, Subcommand)]
pub enum HubJobCommand {
    /// Submit a job for an agent (--agent), or for any agent whose labels match
    /// (--select): argv after `--`, never a shell string. It waits at the hub while its
    /// agent is away, or in the fleet's queue until a matching agent has room.
    Submit(Box<HubJobSubmitArgs>),
    /// List jobs, newest first.
    List {
        /// Only this agent's jobs.
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// Only jobs submitted with this selector (in any spelling of it).
        #[arg(long, value_name = "SEL", value_parser = parse_selector)]
        select: Option<Selector>,
        /// Only the members of this fan-out (`submit --each`).
        #[arg(long, value_name = "GROUP")]
        group: Option<String>,
        /// At most this many (1–1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
        limit: u64,
    },
    /// Show one job.
    Status { id: String },
    /// Print a job's output as the hub holds it (stdout unless --stderr).
    /// A job's output as the hub holds it: stdout to stdout and stderr to stderr; one
    /// stream picked goes to stdout.
    Logs {
        id: String,
        /// Only the job's stdout.
        #[arg(long, conflicts_with = "stderr")]
        stdout: bool,
        /// Only the job's stderr.
        #[arg(long)]
        stderr: bool,
        /// Keep printing as the output arrives, until the job is done.
        #[arg(long)]
        follow: bool,
    },
    /// Wait until a job is done (ended, all its output at the hub); the exit code is the
    /// job's. With --group: every member's output, each line prefixed by its agent, a
    /// table at the end, and exit 0 only if every member succeeded (else the first
    /// failing member's code).
    Wait {
        #[arg(required_unless_present = "group")]
        id: Option<String>,
        /// Every member of this fan-out.
        #[arg(long, value_name = "GROUP", conflicts_with = "id")]
        group: Option<String>,
    },
    /// Cancel a job: at once if its agent never got it, else through the agent (SIGTERM
    /// to its process group, grace, SIGKILL).
    Cancel {
        #[arg(required_unless_present = "group")]
        id: Option<String>,
        /// Every member of this fan-out not done yet.
        #[arg(long, value_name = "GROUP", conflicts_with = "id")]
        group: Option<String>,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("route").required(true).args(["agent", "select"])))]
pub struct HubJobSubmitArgs {
    /// The agent that runs it.
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// Any agent whose labels match runs it: `queue=build,os=linux,gpu,tier!=prod,zone
    /// in (a,b)` (docs/hub.md, "Routing jobs"). The least loaded one with room gets it.
    #[arg(long, value_name = "SEL", value_parser = parse_selector)]
    pub select: Option<Selector>,
    /// 0–100, higher first (default 50); then submission order.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=100))]
    pub priority: Option<u8>,
    /// End the job as `expired` if no agent took it within DUR (with --select).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, conflicts_with = "agent")]
    pub queue_timeout: Option<Duration>,
    /// Run the job again (as ID.2, ID.3 …, on another matching agent when there is one)
    /// if it ends `lost`, up to N times (0–10, with --select). A job that may have run to
    /// an end of its own is never retried.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(0..=10), conflicts_with = "agent")]
    pub retry: Option<u8>,
    /// Fan-out: one job per agent matching --select, as one group (--id names the
    /// group; members are GROUP.AGENT). Agents away get theirs when they return.
    #[arg(long, conflicts_with_all = ["agent", "queue_timeout", "retry"])]
    pub each: bool,
    /// With --each: only the agents connected now.
    #[arg(long)]
    pub connected_only: bool,
    #[command(flatten)]
    pub job: JobSpecArgs,
    /// Stream the job's output as it reaches the hub and exit with the job's exit code
    /// (128 + signal, 124 on timeout). Ctrl-C cancels the job; a second one detaches.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct HubServeArgs {
    /// Address to listen on (port 0: any free port; hub.json says which).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7443")]
    pub listen: std::net::SocketAddr,
    /// PEM certificate chain of the hub (with --tls-key).
    #[arg(
        long,
        value_name = "PEM",
        requires = "tls_key",
        conflicts_with = "tls_self_signed"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the hub (with --tls-cert).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Make a CA of the hub's own at first start (<data-dir>/ca.pem, for agents to pin)
    /// and a certificate from it for localhost, 127.0.0.1, ::1 and each --tls-name.
    #[arg(long, required_unless_present = "tls_cert")]
    pub tls_self_signed: bool,
    /// Another name (DNS or IP) for the self-signed certificate (repeatable).
    #[arg(long, value_name = "NAME", requires = "tls_self_signed")]
    pub tls_name: Vec<String>,
    /// The URL agents use, written to hub.json (default: https://<listen address>).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// Connections served at once; past it, 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 20_000)]
    pub max_connections: usize,
    /// The longest a reconcile is held open, whatever the agent asks.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30s")]
    pub max_wait: Duration,
    /// Jobs not done yet per agent (waiting, running, or uploading their output), at most
    /// 1000 (so that an agent's desired state and report stay under 1 MiB); past it, `hub
    /// job submit` is refused.
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub max_open_jobs: u64,
    /// Bytes of each job stream the hub keeps (more is counted, and said to be cut).
    #[arg(long, value_name = "BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_job_output: u64,
    /// Done jobs kept, with their output; older ones are deleted.
    #[arg(long, value_name = "N", default_value_t = 10_000)]
    pub keep_done_jobs: usize,
    /// How long an agent may go unseen before the jobs it was sent end `lost` (and
    /// `--retry` runs them elsewhere); `0`: wait for it for ever.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10m")]
    pub agent_patience: Duration,
    /// A publisher's minisign public key file (repeatable): `hub release publish` takes
    /// only binaries signed by one of them. Without one, releases are refused.
    #[arg(long, value_name = "PUBFILE")]
    pub release_key: Vec<PathBuf>,
    /// Keep the hub's state in PostgreSQL, shared with other hub replicas, instead of
    /// SQLite in the data dir: postgres://USER@HOST/DB?sslmode=require[&sslrootcert=PEM].
    /// A URL with a password belongs in --config, not on a command line.
    #[arg(long, value_name = "URL", conflicts_with = "config")]
    pub store: Option<String>,
    /// A hub config file (TOML): `[store] url = "postgres://…"`. 0600 when the URL
    /// holds a password.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// How log lines are written.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        env = "RAILGRID_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: crate::logging::LogFormat,
    /// Also serve /metrics in plain HTTP, without a token, on ADDR (a private network's
    /// scraper; https://HUB/metrics takes a token with agents:read).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// How long audit lines are kept (`hub audit list`).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "90days")]
    pub keep_audit: Duration,
    /// Send each agent whose token is older than DUR a new one at its next reconcile
    /// (default: only when asked, `hub agent rotate`).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub agent_token_max_age: Option<Duration>,
}

#[derive(Debug, Subcommand)]
pub enum HubAgentCommand {
    /// Enrol an agent and print its token, once (the hub keeps only its hash).
    Add {
        id: String,
        /// Write the token to FILE (created 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
    },
    /// Every agent: last seen, version, platform, runner, generations, connected.
    List,
    /// One agent, with its latest report.
    Show { id: String },
    /// Refuse the agent's token from now on (its held poll is answered 401 at once).
    Revoke { id: String },
    /// Set labels on an agent (K=V…) or remove them (--remove K); the hub's labels win
    /// over the ones its host declares, and route jobs (`hub job submit --select`).
    Label {
        id: String,
        /// Labels to set.
        #[arg(value_name = "K=V", value_parser = parse_label)]
        set: Vec<(String, String)>,
        /// A label to remove (repeatable).
        #[arg(long, value_name = "K")]
        remove: Vec<String>,
    },
    /// Send an agent no new job while its running jobs finish (pinned jobs wait at the
    /// hub, selected ones go to other agents). With --wait: exit 0 once every agent
    /// drained is idle, 1 when the deadline cancelled jobs (they are listed).
    Drain(HubDrainArgs),
    /// End the hub's drain of an agent (a drain its host keeps stays: `agent resume`
    /// there).
    Resume(HubAgentsArgs),
    /// Send an agent a new token at its next reconcile: it stores it, then uses it, and
    /// the old one is refused from then on.
    Rotate {
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// Every enrolled agent.
        #[arg(long)]
        all: bool,
    },
}

/// One agent, or every agent whose labels match.
#[derive(Debug, Args)]
#[group(id = "agents", required = true, multiple = false)]
pub struct HubAgentsArgs {
    pub id: Option<String>,
    /// Every agent (not revoked) whose labels match SEL now.
    #[arg(long, value_name = "SEL", value_parser = parse_selector)]
    pub select: Option<Selector>,
}

#[derive(Debug, Args)]
pub struct HubDrainArgs {
    #[command(flatten)]
    pub agents: HubAgentsArgs,
    /// Cancel what still runs this long after now (reason `drain deadline`); default:
    /// wait for every job, however long (a drain in force keeps its deadline).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub deadline: Option<std::time::Duration>,
    /// Return once every agent drained is idle (exit 0), or after the deadline with what
    /// it cancelled (exit 1).
    #[arg(long)]
    pub wait: bool,
}

fn parse_selector(s: &str) -> Result<Selector, String> {
    Selector::parse(s).map_err(|e| e.to_string())
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    crate::proto::labels::parse_pair(s).map_err(|e| e.to_string())
}

/// The fleet, or one agent.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct DesiredScope {
    /// The fleet's defaults.
    #[arg(long)]
    pub fleet: bool,
    /// One agent's own settings (they win over the fleet's, field by field).
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum HubDesiredCommand {
    /// Change settings (each change bumps the generation agents converge to).
    #[command(disable_version_flag = true)]
    Set(HubDesiredSetArgs),
    /// Show a scope's own settings (and, for an agent, what it is sent).
    Show(DesiredScope),
}

#[derive(Debug, Args)]
pub struct HubDesiredSetArgs {
    #[command(flatten)]
    pub scope: DesiredScope,
    /// Whether the host runs a runner. `false` drains it first: its jobs finish (none is
    /// taken meanwhile), then it stops.
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub runner_enabled: Option<bool>,
    /// With --runner-enabled false: stop the runner at once, its jobs getting the stop
    /// budget, instead of draining it first.
    #[arg(long, requires = "runner_enabled")]
    pub force: bool,
    /// Jobs running at once.
    #[arg(long, value_name = "N")]
    pub max_jobs: Option<usize>,
    /// Jobs of one owner running at once.
    #[arg(long, value_name = "N")]
    pub max_jobs_per_owner: Option<usize>,
    /// The agent version wanted (published with `hub release publish`).
    #[arg(long, value_name = "V")]
    pub version: Option<String>,
    /// Let --version be older than what agents run (an explicit rollback; agents refuse
    /// a downgrade otherwise).
    #[arg(long, value_name = "BOOL", action = clap::ArgAction::Set)]
    pub rollback: Option<bool>,
    /// Unset a setting here (repeatable): runner_enabled, max_jobs, max_jobs_per_owner,
    /// version, rollback.
    #[arg(long, value_name = "FIELD")]
    pub clear: Vec<String>,
}

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
    /// How log lines are written (stderr and the agent's log; the runner's too).
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        env = "RAILGRID_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: crate::logging::LogFormat,
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

#[derive(Debug, Subcommand)]
pub enum RunnerCommand {
    /// Serve the runner API on <state>/runner/runner.sock until SIGTERM or SIGINT.
    Run(RunnerArgs),
    /// End the jobs a runner that is gone left running, mark them lost, print what was
    /// done as JSON and exit (the agent runs it after every runner stop). Takes the runner
    /// lock first: while a runner holds it, touches nothing and says so. Run it as the
    /// runner's account.
    Reap(ReapArgs),
}

#[derive(Debug, Args)]
pub struct ReapArgs {
    /// The agent's state directory; the runner's is <DIR>/runner.
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Longest time between SIGTERM and SIGKILL for each job (its own kill grace when
    /// that is shorter).
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub grace: Duration,
}

#[derive(Debug, Args)]
pub struct RunnerArgs {
    /// The agent's state directory; the runner uses <DIR>/runner.
    #[arg(long, value_name = "DIR")]
    pub state_dir: PathBuf,
    /// How log lines are written.
    #[arg(
        long,
        value_enum,
        value_name = "FORMAT",
        env = "RAILGRID_LOG_FORMAT",
        default_value = "text"
    )]
    pub log_format: crate::logging::LogFormat,
    /// Jobs running at once (default: the number of CPUs).
    #[arg(long, value_name = "N")]
    pub max_jobs: Option<usize>,
    /// Jobs of one owner running at once (default: --max-jobs).
    #[arg(long, value_name = "N")]
    pub max_jobs_per_owner: Option<usize>,
    /// Jobs waiting; beyond it submissions get 429.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_queued: usize,
    /// Spool cap per stream and job; beyond it output is counted and dropped.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_output_bytes: u64,
    /// Finished jobs kept (records and files).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_finished_jobs: usize,
    /// Total spool bytes of finished jobs kept.
    #[arg(long, value_name = "BYTES", default_value_t = 1024 * 1024 * 1024)]
    pub max_spool_bytes: u64,
    /// Bytes finished jobs keep on disk, spools and workspaces together: beyond it the
    /// oldest finished jobs go, never a running one's.
    #[arg(long, value_name = "BYTES", default_value_t = crate::runner::engine::DEFAULT_MAX_KEPT_BYTES)]
    pub max_kept_bytes: u64,
    /// API connections served at once from accounts other than root; one more is answered
    /// 503 and closed.
    #[arg(long, value_name = "N", default_value_t = crate::runner::serve::MAX_CONNECTIONS)]
    pub max_api_connections: usize,
    /// How long a stop (SIGTERM) may take in all: job kill graces are cut to fit and the
    /// rest is SIGKILLed in time (the agent passes its runner.stop_grace). Without it,
    /// each job gets its whole kill grace.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub stop_budget: Option<Duration>,
    /// Every job's PATH unless its spec sets one: absolute directories, ':'-separated
    /// (the agent passes runner.job_path).
    #[arg(long, value_name = "PATH")]
    pub job_path: Option<String>,
    /// How jobs are started: `auto` (clone with a pidfd where the kernel allows it, else
    /// fork) or `fork` (always fork and exec).
    #[arg(long, value_enum, default_value_t = JobLaunch::Auto)]
    pub job_launch: JobLaunch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum JobLaunch {
    Auto,
    Fork,
}

#[derive(Debug, Args)]
#[command(
    after_help = "As root, the child needs an account: --user NAME (for example --user nobody), or --uid N --gid N.\nDurations take humantime forms: 250ms, 2s, 1m."
)]
pub struct SuperviseArgs {
    /// Log file for the child's stdout and stderr (created 0600, rotated to FILE.1).
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
    /// Rotate the log when it would exceed this many bytes.
    #[arg(long, value_name = "N", default_value_t = supervisor::DEFAULT_MAX_LOG_BYTES)]
    pub max_log_bytes: u64,
    /// Time between SIGTERM and SIGKILL when stopping the child's process group.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "10s")]
    pub stop_grace: Duration,
    /// First restart pause; it doubles on each consecutive unexpected exit, up to 60s.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1s")]
    pub initial_backoff: Duration,
    /// Run the child as this user (with its groups, HOME, USER and LOGNAME).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["uid", "gid"])]
    pub user: Option<String>,
    /// Run the child as this uid (needs --gid).
    #[arg(long, value_name = "N", requires = "gid")]
    pub uid: Option<u32>,
    /// Run the child with this gid (needs --uid).
    #[arg(long, value_name = "N", requires = "uid")]
    pub gid: Option<u32>,
    /// HOME for the child (default: the account's home directory).
    #[arg(long, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// PATH for the child, also used to find PROGRAM.
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
    /// Working directory of the child.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub dir: PathBuf,
    /// Add K=V to the child's environment (repeatable). Loader variables are refused.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Lock file of a runner: terminate a stale holder before the first start.
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<OsString>,
}

/// Parses humantime durations ("250ms", "2s", "1m").
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use forms like 250ms, 2s, 1m)"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    crate::env_policy::parse_assignment(s).map_err(|e| e.to_string())
}

/// Where the runner's socket is.
#[derive(Debug, Clone, Args)]
pub struct JobTarget {
    /// The agent's state directory (default as for the agent); the socket is
    /// <DIR>/runner/runner.sock.
    #[arg(long, value_name = "DIR", global = true, conflicts_with = "socket")]
    pub state_dir: Option<PathBuf>,
    /// The runner's socket.
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job: argv after `--`, never a shell string.
    Submit(JobSubmitArgs),
    /// Delete finished jobs, oldest first: their records, output and workspaces. Running
    /// and queued jobs are never touched.
    Prune {
        /// Finished jobs to keep, the newest (default: none).
        #[arg(long, value_name = "N", default_value_t = 0)]
        keep: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List jobs, newest first.
    List {
        /// Only jobs in this state.
        #[arg(long)]
        state: Option<String>,
        /// Only jobs of this owner.
        #[arg(long)]
        owner: Option<String>,
        /// At most this many (1–1000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one job.
    Status {
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a job's output (stdout unless --stderr).
    Logs {
        id: String,
        #[arg(long)]
        stderr: bool,
        /// Keep printing until the job ends.
        #[arg(long)]
        follow: bool,
    },
    /// Wait for a job to end; the exit code is the job's.
    Wait { id: String },
    /// Cancel a job (SIGTERM to its process group, grace, SIGKILL).
    Cancel { id: String },
}

#[derive(Debug, Args)]
pub struct JobSubmitArgs {
    #[command(flatten)]
    pub job: JobSpecArgs,
    /// Stream the job's output and exit with its exit code (the default). The first Ctrl-C
    /// (or SIGTERM) cancels the job and waits for its end; a second one detaches.
    #[arg(long, conflicts_with = "detach")]
    pub wait: bool,
    /// Print the job's id and return at once; the job runs on.
    #[arg(long)]
    pub detach: bool,
}

/// A job as `job submit` and `hub job submit` alike describe it.
#[derive(Debug, Args)]
pub struct JobSpecArgs {
    /// The job's id (default: a random one). The runner takes the same id and spec again
    /// as the one job (a retried submission); the hub refuses an id it has.
    #[arg(long)]
    pub id: Option<String>,
    /// Working directory, inside the runner's workspace root.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Add K=V to the job's environment (repeatable). Loader variables are refused by
    /// the runner.
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Wall-clock limit, then SIGTERM, grace, SIGKILL to the group.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Owner, for the runner's per-owner admission limits.
    #[arg(long)]
    pub owner: Option<String>,
    #[command(flatten)]
    pub limits: JobLimitArgs,
    /// The program and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    pub command: Vec<String>,
}

/// A job's resource limits, for `job submit` and `hub job submit` alike.
#[derive(Debug, Args)]
pub struct JobLimitArgs {
    /// Memory limit in bytes (at least 8 MiB): memory.max in the cgroup tier, else RLIMIT_AS.
    #[arg(long, value_name = "BYTES")]
    pub memory_bytes: Option<u64>,
    /// Process limit: pids.max of the job's tree in the cgroup tier; else RLIMIT_NPROC,
    /// which counts every process and thread of the runner's account, the runner's own too.
    #[arg(long, value_name = "N")]
    pub processes: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (at least 10): cpu.max, cgroup tier only.
    #[arg(long, value_name = "N")]
    pub cpu_millis: Option<u64>,
    /// CPU time limit in seconds (RLIMIT_CPU).
    #[arg(long, value_name = "SECS")]
    pub cpu_secs: Option<u64>,
    /// Open-file limit (RLIMIT_NOFILE, at least 16).
    #[arg(long, value_name = "N")]
    pub open_files: Option<u64>,
}

#[cfg(test)]
mod tests {
    /// clap checks a command's definition only when that command is parsed: check them
    /// all here (duplicate names, a `--version` that clashes with clap's own flag).
    #[test]
    fn every_command_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
