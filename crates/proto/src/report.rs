//! The agent's report: the body of `POST /v1/agents/{id}/reconcile` (hub protocol v1,
//! docs/hub.md). What the agent observes on its host, sent with every reconcile; the hub
//! keeps the latest one per agent and shows it in `hub agent list|show`.

use serde::{Deserialize, Serialize};

pub use super::fleet_job::JobReport;

/// The request body of a reconcile.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The agent's own version (`railgrid version`).
    pub version: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub arch: String,
    #[serde(default)]
    pub hostname: String,
    /// The host's labels with the ones the agent sets itself (`os`, `arch`, `hostname`);
    /// the hub's own labels go over them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: super::labels::Labels,
    /// The generation of the desired state this agent applied last (0: none yet).
    pub observed_generation: u64,
    #[serde(default)]
    pub runner: RunnerReport,
    /// The self-upgrade's progress, once there is one.
    pub upgrade: Option<UpgradeReport>,
    /// How many jobs the runner holds, when the agent could ask it.
    pub jobs_summary: Option<JobsSummary>,
    /// The drain in force on the host (the hub's, the host's own, an upgrade's), while
    /// there is one: the hub routes no job to it meanwhile.
    pub drain: Option<super::drain::DrainReport>,
    /// The hub's jobs on this host, each as the agent sees it now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobReport>,
    /// The `jobs_version` of the last answer whose jobs this agent took: a hub holding
    /// the poll answers at once while its own is newer (a job given or cancelled since,
    /// or an answer lost on its way). `None` from an agent older than the field.
    pub jobs_version: Option<u64>,
    /// The generation of the desired state this agent could not apply (its runner
    /// settings), while that is the newest it was given: a hub holding the poll does so
    /// until a newer one (or a job) comes, rather than answering the same state again at
    /// once. `None` when it applied the newest, and from an agent older than the field.
    pub refused_generation: Option<u64>,
}

/// The runner as the agent's supervisor sees it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerReport {
    /// `running`, `starting`, `backoff`, `stopped`, `disabled`, … (the supervisor's states;
    /// a hub shows a state it does not know as it is).
    #[serde(default)]
    pub state: String,
    pub pid: Option<u32>,
    /// Launches over the agent's life.
    #[serde(default)]
    pub starts: u64,
    pub last_error: Option<String>,
}

/// Where a self-upgrade stands.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeReport {
    /// `idle`, `downloading`, `verifying`, `switching`, `committed`, `rolled_back`,
    /// `refused`, ….
    #[serde(default)]
    pub state: String,
    pub target: Option<String>,
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_versions: Vec<String>,
    /// What the upgrade waits for (`draining`: `waiting for 2 job(s) (deadline …)`).
    pub waiting: Option<String>,
}

impl UpgradeReport {
    /// An upgrade toward `target` in `state`, with the error that ended it if any.
    pub fn toward(state: &str, target: &str, error: Option<&str>) -> Self {
        Self {
            state: state.into(),
            target: Some(target.into()),
            error: error.map(Into::into),
            ..Self::default()
        }
    }
}

/// The runner's jobs, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobsSummary {
    #[serde(default)]
    pub running: u64,
    #[serde(default)]
    pub queued: u64,
    /// The runner's admission limit (0: not known): the most of the fleet's queue the hub
    /// gives this agent at once.
    #[serde(default)]
    pub max_jobs: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_report_names_its_version_and_generation() {
        let r: AgentReport =
            serde_json::from_str(r#"{"version": "0.1.0", "observed_generation": 3, "new": 1}"#)
                .expect("parse");
        assert_eq!(r.observed_generation, 3);
        assert_eq!(r.runner, RunnerReport::default());
        let e = serde_json::from_str::<AgentReport>(r#"{"observed_generation": 3}"#)
            .expect_err("no version");
        assert!(e.to_string().contains("`version`"), "{e}");
    }
}
