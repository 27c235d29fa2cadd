//! Jobs through the hub (hub protocol v1, docs/hub.md): what the desired state carries to
//! an agent ([`DesiredJob`]), what the agent reports of each ([`JobReport`]), the answer
//! to an output upload ([`OutputAck`]), and the admin side ([`HubJobSubmit`],
//! [`HubJobView`]).
//!
//! A hub job keeps the id it has at the hub on the runner too, so that the runner's
//! idempotent submission (same id and spec: 200, nothing started) is what makes a
//! delivery safe to repeat.

use serde::{Deserialize, Serialize};

use super::job::{JobSpec, JobState, Truncation};
use super::secret::Values;

/// A job the hub wants followed on this host, in the desired state's `jobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredJob {
    pub id: String,
    /// The job to start, until the hub has seen the agent report it. An agent submits
    /// only a job that comes with its spec: once its runner has had the job, nothing
    /// submits it again, also when the runner no longer remembers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<JobSpec>,
    /// The values of the secrets `spec` names, sent with it and never stored by the
    /// agent: it hands them to its runner with the job (docs/security.md, "Secrets").
    #[serde(default, skip_serializing_if = "Values::is_empty")]
    pub secret_values: Values,
}

/// One hub job as its agent sees it, in the report's `jobs`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobReport {
    pub id: String,
    pub state: JobState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    /// What the job printed, past the runner's cap too.
    #[serde(default)]
    pub stdout_bytes: u64,
    #[serde(default)]
    pub stderr_bytes: u64,
    /// Why the runner kept less than the job printed.
    pub output_truncated: Option<Truncation>,
    /// The job has ended and the hub has acknowledged every byte the runner kept of it.
    #[serde(default)]
    pub output_done: bool,
    /// What the job's egress proxy refused, by destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<crate::egress::Denial>,
}

/// The answer to `PUT /v1/jobs/{job}/output/{stream}?offset=N`, and to an upload the hub
/// refuses for a gap (409): how much of the stream the hub holds, from which an agent
/// resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputAck {
    pub length: u64,
}

/// `POST /v1/admin/jobs` body: the job for one agent (`agent`), or for any agent whose
/// labels match `selector` (then it waits in the fleet's queue until one has room).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HubJobSubmit {
    pub agent: Option<String>,
    /// A label selector (`queue=build,os=linux`, docs/hub.md, "Routing jobs").
    pub selector: Option<String>,
    /// 0–100, default [`DEFAULT_PRIORITY`]: higher first, then submission order.
    pub priority: Option<u8>,
    /// A selected job no agent took within this ends `expired`.
    pub queue_timeout_secs: Option<u64>,
    /// A selected job that ends `lost` is queued again as `ID.2`, `ID.3` … up to this
    /// many times (at most [`MAX_RETRIES`]).
    pub retries: Option<u8>,
    pub spec: JobSpec,
}

/// `POST /v1/admin/groups` body: a fan-out, one job per agent matching `selector` now
/// (each pinned to its agent, as if submitted with `agent`), as one group. Agents that
/// are not connected get their member when they return, unless `connected_only`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HubGroupSubmit {
    pub selector: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(default)]
    pub connected_only: bool,
    /// `spec.id`, when given, is the group's id; each member is `GROUP.AGENT`.
    pub spec: JobSpec,
}

/// A fan-out's members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubGroupView {
    pub group: String,
    pub jobs: Vec<HubJobView>,
}

/// The state of a job at the hub: `queued` while a selected job waits for an agent,
/// `pending` once it has one (or named one) until the agent reports it, then the
/// runner's state; `expired` for a selected job no agent took in time.
pub const PENDING: &str = "pending";
/// A selected job in the fleet's queue (its `agent` is empty). The runner's own
/// `queued` (admitted, waiting for a slot on its host) always has an agent.
pub const QUEUED: &str = "queued";
/// A selected job no agent took within its queue timeout: final.
pub const EXPIRED: &str = "expired";
pub const DEFAULT_PRIORITY: u8 = 50;
pub const MAX_RETRIES: u8 = 10;
pub const MAX_PRIORITY: u8 = 100;

/// One job as the hub shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubJobView {
    pub id: String,
    /// The agent that has it; empty while a selected job is queued.
    pub agent: String,
    /// The selector it was submitted with, for a job routed by labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The selector of the scoped token that submitted it: only agents whose hub labels
    /// match take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// While it is queued: its priority with what its wait added (`hub serve
    /// --priority-aging`), at most 100, which the queue orders by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_priority: Option<u8>,
    /// Which run of the job this is (1: the first; `n` for `ID.n`, the retry of a lost
    /// attempt).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
    /// Retries left, should this attempt end `lost`.
    #[serde(default)]
    pub retries: u8,
    /// The fan-out it is a member of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Unix milliseconds after which a queued job ends `expired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_deadline_ms: Option<u64>,
    pub spec: JobSpec,
    /// `pending`, or one of the runner's states.
    pub state: String,
    /// A cancel was asked for and has not yet ended the job.
    #[serde(default)]
    pub cancel_requested: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// When the hub first heard the job had reached its agent's runner (the hub's clock).
    #[serde(default)]
    pub started_ms: Option<u64>,
    #[serde(default)]
    pub finished_ms: Option<u64>,
    /// What the job printed (the runner's count, past its cap too).
    #[serde(default)]
    pub stdout_bytes: u64,
    #[serde(default)]
    pub stderr_bytes: u64,
    /// What the hub holds of each stream.
    #[serde(default)]
    pub stdout_stored: u64,
    #[serde(default)]
    pub stderr_stored: u64,
    /// Why what the hub holds is shorter than what the job printed (the runner's cap, a
    /// full disk on the host, the hub's cap), per stream.
    #[serde(default)]
    pub output_truncated: Option<Truncation>,
    /// The job has ended and all of its output the hub will ever hold is there.
    #[serde(default)]
    pub done: bool,
    /// What a queued or pending job waits for, as the hub sees it (no agent matching its
    /// selector, all of them full, its agent away, its runner not running, the agent not
    /// yet having taken it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// What the job's egress proxy refused (network `allow`), by destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_denied: Vec<crate::egress::Denial>,
}

fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

fn first_attempt() -> u32 {
    1
}

impl HubJobView {
    /// The runner's state, once the agent has reported one.
    pub fn job_state(&self) -> Option<JobState> {
        JobState::parse(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivered_job_travels_without_its_spec() {
        let mut j = DesiredJob {
            id: "a".into(),
            spec: None,
            secret_values: Default::default(),
        };
        assert_eq!(serde_json::to_string(&j).expect("json"), r#"{"id":"a"}"#);
        // A value travels, but no log line that shows the job shows it.
        j.secret_values
            .0
            .insert("TOKEN".into(), "s3cr3t-value".into());
        assert!(serde_json::to_string(&j)
            .expect("json")
            .contains("s3cr3t-value"));
        assert!(!format!("{j:?}").contains("s3cr3t-value"));
        let r: JobReport =
            serde_json::from_str(r#"{"id": "a", "state": "running", "new": 1}"#).expect("parse");
        assert_eq!(r.state, JobState::Running);
        assert!(!r.output_done);
    }
}
