//! Jobs on the wire: what a client submits (`JobSpec`), what the runner reports
//! (`JobRecord`, `JobState`, `Truncation`), and the answer to a submission (`Submitted`).
//! The runner's API serves these, `railgrid job` reads them, and (next) the hub carries
//! the same specs to agents.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Resource limits applied to the job's processes before exec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Address space (RLIMIT_AS), bytes.
    pub memory_bytes: Option<u64>,
    /// CPU time (RLIMIT_CPU), seconds.
    pub cpu_secs: Option<u64>,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: Option<u64>,
    /// Processes: the job's own tree (`pids.max`) in the cgroup tier; otherwise every
    /// process of the runner's account (RLIMIT_NPROC).
    pub processes: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (1500 = one and a half CPUs), as `cpu.max`.
    /// Only the cgroup tier can enforce it; the job's `confinement` says when it did not.
    /// Left out when unset, so specs stored before it existed keep their canonical form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
}

/// `POST /v1/jobs` body. Unknown fields are ignored (forward compatibility with newer
/// clients); missing or invalid required fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: Option<String>,
    #[serde(default)]
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    pub kill_grace_secs: Option<u64>,
    pub owner: Option<String>,
    pub stdin: Option<String>,
    pub limits: Option<Limits>,
    /// The network the job may reach: narrower than the runner's policy, never wider
    /// (docs/security.md, "Egress"). `None`: the runner's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// The submitter may give the job a network wider than the runner's policy: set by
    /// the hub for a token with the `jobs:network` scope, or by the runner's own token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub widen_network: bool,
    /// Secrets the job gets as environment variables of these names (docs/security.md,
    /// "Secrets"): names only; their values travel beside the spec, never in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Secrets the job gets as files of these names, 0400 in a directory of its private
    /// tmpfs (`$RAILGRID_SECRETS_DIR`, `/tmp/secrets`), never in its workspace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_files: Vec<String>,
}

pub use super::egress::Network;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    Lost,
    Rejected,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::TimedOut => "timed_out",
            JobState::Lost => "lost",
            JobState::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "starting" => JobState::Starting,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            "timed_out" => JobState::TimedOut,
            "lost" => JobState::Lost,
            "rejected" => JobState::Rejected,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Queued | JobState::Starting | JobState::Running
        )
    }
}

/// Why a job's spooled output is shorter than what it printed, per stream: the cap was
/// reached, or the spool file could not be written (a full disk).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    pub stdout: Option<String>,
    pub stderr: Option<String>,
}

impl Truncation {
    /// `None` when neither stream was cut.
    pub fn of(stdout: Option<String>, stderr: Option<String>) -> Option<Self> {
        (stdout.is_some() || stderr.is_some()).then_some(Self { stdout, stderr })
    }
}

/// One job as the API reports it (the store builds it from its row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub seq: i64,
    pub id: String,
    pub owner: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub pid: Option<i32>,
    /// Process start time (clock ticks since boot, Linux): with `pid`, the job's identity.
    pub start_time: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    /// Which confinement applied: "rlimits", "none".
    pub confinement: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Why output was cut short, per stream; `None` when it was not.
    #[serde(default)]
    pub output_truncated: Option<Truncation>,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    /// What the job's egress proxy refused (network `allow`), by destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<crate::egress::Denial>,
    /// The state shown is held in memory: the database could not take it yet (a full
    /// disk), and the runner writes it as soon as it can. Lost if the runner dies first.
    #[serde(default)]
    pub commit_pending: bool,
}

/// `{id, state}` of a submission.
#[derive(Debug, Serialize, Deserialize)]
pub struct Submitted {
    pub id: String,
    pub state: JobState,
    /// Limits this host will not enforce as asked, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The answer to `POST /v1/prune`: what went, and what finished jobs still keep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Pruned {
    pub deleted: usize,
    pub freed_bytes: u64,
    pub finished_jobs: usize,
    pub kept_bytes: u64,
}

/// A job's output stream, as the runner spools it, the hub keeps it and URLs name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}
