//! What the agent and the runner it starts agree on beyond the runner's socket API: the
//! defaults the agent resolves runner settings against (so that a limit the hub stops
//! setting is the value the running runner already has, not a reason to restart it), the
//! cgroup leaf the agent starts the runner in, and what `runner reap` prints for the
//! agent. Both sides read them here; neither reaches into the other.

use serde::{Deserialize, Serialize};

/// Jobs run at once unless configured: one per CPU.
pub fn default_max_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Jobs that may wait for a slot unless configured.
pub const DEFAULT_MAX_QUEUED: usize = 1000;
/// What finished jobs may keep on disk by default, spools and workspaces together.
pub const DEFAULT_MAX_KEPT_BYTES: u64 = 4 * 1024 * 1024 * 1024;
/// A job's `/tmp` and `/var/tmp`, each, unless configured.
pub const DEFAULT_TMP_BYTES: u64 = 1 << 30;

/// Name of the leaf the runner lives in, so the delegated cgroup has no processes of its
/// own and may enable controllers for its children (v2 keeps processes in leaves). The
/// agent starts the runner there when it delegates the cgroup itself.
pub const RUNNER_LEAF: &str = "runner";

/// How one leftover ended, for logs, the agent's status and `runner reap`'s report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Ended {
    pub id: String,
    /// The job's process, as recorded.
    pub pid: Option<i32>,
    /// Whether something of the job still lived and was stopped.
    pub killed: bool,
    pub reason: String,
}

/// What `runner reap` did, printed as JSON on its stdout for the agent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ReapReport {
    /// A runner holds the lock (this pid; 0 when it wrote none): its jobs are its own,
    /// nothing was touched.
    pub held_by: Option<i32>,
    pub ended: Vec<Ended>,
    /// `lost` records the database could not take in time (a full disk); the next
    /// runner reconciles those jobs again.
    #[serde(default)]
    pub uncommitted: Vec<String>,
}
