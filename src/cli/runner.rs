//! `railgrid runner …` and `railgrid supervise`: the runner and the supervisor.

use super::*;

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
    #[command(flatten)]
    pub log: LogFlags,
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
    /// A sandbox for every job (namespaces, private /tmp, the host read-only, seccomp):
    /// `auto` where the kernel allows it, `required` (jobs are refused where it does
    /// not), or `off` (the agent passes runner.sandbox).
    #[arg(long, value_enum, default_value_t = SandboxFlag::Auto)]
    pub sandbox: SandboxFlag,
    /// A directory every sandboxed job may write, shared between jobs (a compiler
    /// cache, say); repeatable (runner.sandbox_shared).
    #[arg(long, value_name = "DIR")]
    pub sandbox_shared: Vec<PathBuf>,
    /// The size of each sandboxed job's private /tmp and /var/tmp.
    #[arg(long, value_name = "BYTES", default_value_t = crate::runner::sandbox::DEFAULT_TMP_BYTES)]
    pub sandbox_tmp_size: u64,
    /// The size of each sandboxed job's /dev/shm.
    #[arg(long, value_name = "BYTES", default_value_t = crate::runner::sandbox::DEFAULT_SHM_BYTES)]
    pub sandbox_shm_size: u64,
    /// A system call to take off the sandbox's seccomp deny list (repeatable;
    /// docs/security.md lists them).
    #[arg(long, value_name = "NAME")]
    pub sandbox_allow_syscall: Vec<String>,
    /// The network jobs reach unless they ask for less: `open` (the host's) or `none` (a
    /// network namespace of their own, loopback only; needs the sandbox) (the agent
    /// passes runner.network).
    #[arg(long, value_name = "POLICY", default_value = "open")]
    pub network: crate::proto::job::Network,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SandboxFlag {
    Auto,
    Required,
    Off,
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
