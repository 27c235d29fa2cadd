//! `railgrid hub …`: the hub's server and its admin commands.

use super::*;

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
    /// Secrets for jobs, sealed at the hub: set, list (never a value), remove, and
    /// rotate the key that seals them (scope secrets:write).
    Secret {
        #[command(subcommand)]
        command: HubSecretCommand,
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
pub enum HubSecretCommand {
    /// Set a secret (a new version when it exists): 8 bytes to 64 KiB of UTF-8 text.
    Set(HubSecretSetArgs),
    /// Every secret: name, version, scope, who set it and when; never a value.
    List,
    /// Remove a secret: jobs naming it that have not left the hub fail.
    Rm { name: String },
    /// Seal every secret under a new key, which replaces the key file (back it up).
    #[command(name = "rotate-key")]
    RotateKey,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["from_file", "from_stdin"])))]
pub struct HubSecretSetArgs {
    /// Its name: letters, digits and _ (a job may be given it as that variable).
    pub name: String,
    /// The value is FILE's contents (one trailing newline dropped, unless
    /// --keep-newline).
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,
    /// The value is what standard input holds until its end (one trailing newline
    /// dropped, unless --keep-newline).
    #[arg(long)]
    pub from_stdin: bool,
    /// Keep a trailing newline (a key file that needs it).
    #[arg(long)]
    pub keep_newline: bool,
    /// Send it only to agents whose hub labels match SEL (and accept it only in jobs
    /// that reach no others).
    #[arg(long, value_name = "SEL", value_parser = parse_selector)]
    pub select: Option<Selector>,
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
    /// jobs:submit, jobs:cancel, jobs:network, releases:write, rollouts:write,
    /// tokens:write, audit:read, secrets:write.
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
    /// Give the job the hub's secret NAME as the variable NAME, or with `NAME=file` as the
    /// file NAME in $RAILGRID_SECRETS_DIR (0400 on its private tmpfs) (repeatable):
    /// never stored with the job, masked in its output.
    #[arg(long, value_name = "NAME[=file]")]
    pub secret: Vec<String>,
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
    /// Connections served at once; past it, 503 with Retry-After [default: 20000, or
    /// what the open-files limit leaves room for when that is less].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
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
    /// A queued job gains a point of priority for each DUR it waits (capped at 100), so
    /// that a stream of higher-priority jobs never starves it; `0`: strict priority.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "3s")]
    pub priority_aging: Duration,
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
    #[command(flatten)]
    pub log: LogFlags,
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
    /// The key that seals secrets at rest (0600, made at the first `hub secret set`)
    /// [default: <data-dir>/secrets.key]. Replicas share one; the database never holds it.
    #[arg(long, value_name = "FILE")]
    pub secrets_key_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HubAgentCommand {
    /// Enrol an agent and print its token, once (the hub keeps only its hash).
    Add {
        id: String,
        /// Write the token to FILE (created 0600) instead of printing it.
        #[arg(long, value_name = "FILE")]
        token_out: Option<PathBuf>,
        /// Give the id of a revoked agent to a new one, which starts with none of the old
        /// one's settings, labels or jobs (a revoked id is refused otherwise, so that a
        /// retired host's name is never taken over by mistake).
        #[arg(long)]
        reuse_revoked_id: bool,
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
    /// The network jobs reach unless they ask for less: `none` (loopback of their own)
    /// or `open` (docs/security.md, "Egress").
    #[arg(long, value_name = "POLICY")]
    pub network: Option<crate::proto::job::Network>,
    /// Unset a setting here (repeatable): runner_enabled, max_jobs, max_jobs_per_owner,
    /// version, rollback, network.
    #[arg(long, value_name = "FIELD")]
    pub clear: Vec<String>,
}
