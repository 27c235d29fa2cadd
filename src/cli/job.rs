//! `railgrid job …`: jobs on this host's runner.

use super::*;

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
    Submit(Box<JobSubmitArgs>),
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
    /// Give the job the contents of FILE as the environment variable NAME (repeatable;
    /// one trailing newline dropped): never stored, never shown, masked in its output
    /// (docs/security.md, "Secrets").
    #[arg(long, value_name = "NAME=FILE")]
    pub secret_file: Vec<String>,
    /// Give the job the contents of FILE as the file NAME in $RAILGRID_SECRETS_DIR
    /// (/tmp/secrets, 0400, on its private tmpfs; needs the sandbox) (repeatable).
    #[arg(long, value_name = "NAME=FILE")]
    pub secret_mount: Vec<String>,
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
    /// The network the job may reach: `none` (loopback of its own only), `open`, or
    /// "allow RULE…"; never wider than the runner's `runner.network` (default: the
    /// runner's; docs/security.md, "Egress").
    #[arg(long, value_name = "POLICY", conflicts_with = "allow")]
    pub network: Option<crate::proto::job::Network>,
    /// Network `allow`: let the job reach HOST:PORTS through the runner's proxy
    /// (repeatable): github.com:443, '*.crates.io:443', 10.0.0.0/8:80,443, [::1]:8080.
    #[arg(long, value_name = "HOST:PORTS")]
    pub allow: Vec<crate::proto::egress::Rule>,
    /// Give the job a network wider than its runner's policy (the hub's jobs:network
    /// scope; the runner's own token locally).
    #[arg(long)]
    pub widen_network: bool,
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
