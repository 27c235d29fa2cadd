//! `GET /v1/health` of the runner: what it is, what it offers jobs, and whether it is
//! still ending what a previous runner left.

use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Health {
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub jobs_running: u64,
    /// Jobs admitted and waiting for room to run (counted at the same instant as
    /// `jobs_running`).
    #[serde(default)]
    pub jobs_queued: u64,
    /// How jobs are confined: `cgroup` or `process-group` (see `runner::confine`).
    #[serde(default)]
    pub confinement: String,
    /// What keeps jobs away from the runner: `landlock+signals`, `landlock` or `none`.
    #[serde(default)]
    pub isolation: String,
    /// What keeps jobs away from each other and the host: `namespaces+seccomp` (a sandbox
    /// for every job), or `none: why` (`runner.sandbox`, docs/security.md).
    #[serde(default)]
    pub sandbox: String,
    /// The network jobs reach unless they ask for less: `open` or `none` (the hub's
    /// `network`, else `runner.network`; docs/security.md, "Egress").
    #[serde(default)]
    pub network: String,
    /// Job state changes held in memory because the job database could not take them (a
    /// full disk); written as soon as it can.
    #[serde(default)]
    pub commits_pending: u64,
    /// True while jobs a previous runner left running are being ended (in the
    /// background: the API serves meanwhile, and those jobs show `running` until they are
    /// marked `lost`).
    #[serde(default)]
    pub reconciling: bool,
    /// How many such jobs (and job cgroups) are left to end.
    #[serde(default)]
    pub leftovers: u64,
    /// How jobs are started: `clone-vfork` (Linux 5.2+) or `fork`.
    #[serde(default)]
    pub launch: String,
    /// Finished jobs kept (records, spools, workspaces) and the bytes they hold on disk.
    #[serde(default)]
    pub finished_jobs: u64,
    #[serde(default)]
    pub kept_bytes: u64,
    /// The bound on `kept_bytes` (`--max-kept-bytes`).
    #[serde(default)]
    pub max_kept_bytes: u64,
    /// Jobs it runs at once, at most (its admission limit now); 0 from an older runner.
    #[serde(default)]
    pub max_jobs: u64,
}
