//! `GET|PUT /v1/admission` of the runner: the job engine's admission limits, changed on a
//! running runner (by the agent, when the desired state changes them) without a restart,
//! so that no running job is disturbed by a new limit.

use serde::{Deserialize, Serialize};

/// The limits in force: jobs starting or running at once, in all and per owner, and jobs
/// waiting (beyond it submissions are refused with 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub max_jobs: usize,
    pub max_jobs_per_owner: usize,
    pub max_queued: usize,
}

/// `PUT /v1/admission` body: the limits to change; a field left out (or null) keeps its
/// value. `max_jobs` and `max_jobs_per_owner` must be at least 1.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionChange {
    pub max_jobs: Option<usize>,
    pub max_jobs_per_owner: Option<usize>,
    pub max_queued: Option<usize>,
}
