//! `GET|PUT /v1/admission` of the runner: the job engine's admission limits, changed on a
//! running runner (by the agent, when the desired state changes them) without a restart,
//! so that no running job is disturbed by a new limit.

use serde::{Deserialize, Serialize};

/// The limits in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub max_jobs: usize,
    pub max_jobs_per_owner: usize,
    pub max_queued: usize,
}

/// `PUT /v1/admission` body: the limits to change; a field left out keeps its value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs_per_owner: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queued: Option<usize>,
}
