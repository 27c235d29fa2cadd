//! Who may do what at the hub (docs/hub.md, "Access"): scoped admin tokens, enrolment
//! tokens that hosts trade for their own agent token, and the audit log.

use serde::{Deserialize, Serialize};

/// What an admin token may do. The root token (`admin.token`) may do everything.
pub const SCOPES: &[&str] = &[
    AGENTS_READ,
    AGENTS_WRITE,
    JOBS_READ,
    JOBS_SUBMIT,
    JOBS_CANCEL,
    JOBS_NETWORK,
    RELEASES_WRITE,
    ROLLOUTS_WRITE,
    TOKENS_WRITE,
    AUDIT_READ,
    SECRETS_WRITE,
];
pub const AGENTS_READ: &str = "agents:read";
pub const AGENTS_WRITE: &str = "agents:write";
pub const JOBS_READ: &str = "jobs:read";
pub const JOBS_SUBMIT: &str = "jobs:submit";
pub const JOBS_CANCEL: &str = "jobs:cancel";
/// A job submitted with it may be given a network wider than its runner's policy
/// (`widen_network`; docs/security.md, "Egress").
pub const JOBS_NETWORK: &str = "jobs:network";
pub const RELEASES_WRITE: &str = "releases:write";
pub const ROLLOUTS_WRITE: &str = "rollouts:write";
pub const TOKENS_WRITE: &str = "tokens:write";
pub const AUDIT_READ: &str = "audit:read";
/// Set, list and remove secrets, and rotate their key (docs/security.md, "Secrets"); a
/// token bound to a selection, only secrets scoped inside it.
pub const SECRETS_WRITE: &str = "secrets:write";
/// What only the root token may do (rotate itself).
pub const ROOT: &str = "root";

/// The name the root token goes by in the audit log.
pub const ROOT_NAME: &str = "root";

/// `POST /v1/admin/tokens`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRequest {
    pub name: String,
    pub scopes: Vec<String>,
    /// The job scopes reach only agents whose hub labels match.
    pub selector: Option<String>,
    pub ttl_secs: Option<u64>,
}

/// An admin token as listed (never its secret).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenView {
    pub name: String,
    pub scopes: Vec<String>,
    pub selector: Option<String>,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

/// A token made now: its secret, this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMade<V> {
    pub token: String,
    #[serde(flatten)]
    pub view: V,
}

/// `POST /v1/admin/enrol-tokens`.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolTokenRequest {
    /// How many hosts it enrols (unbounded when absent).
    pub uses: Option<u64>,
    pub ttl_secs: Option<u64>,
    /// Hub labels every host it enrols gets.
    #[serde(default)]
    pub labels: crate::labels::Labels,
}

/// An enrolment token as listed (never its secret).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolTokenView {
    /// `et1`, `et2` …
    pub id: String,
    pub max_uses: Option<u64>,
    pub uses: u64,
    #[serde(default)]
    pub labels: crate::labels::Labels,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

/// `POST /v1/enrol` (the enrolment token as the bearer): a host asking for its own token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelfEnrol {
    pub id: String,
    /// The host's name, for the operator (a second host with the same id is named).
    #[serde(default)]
    pub hostname: String,
}

/// One line of the audit log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    pub seq: u64,
    pub at_ms: u64,
    /// The admin token's name (`root`), an enrolment token's id, or `-` when the request
    /// carried no token the hub knows.
    pub token: String,
    pub peer: String,
    /// `METHOD /route` (the route's pattern, never a secret).
    pub action: String,
    /// What it was about: the path's own values (an agent, a job, a version).
    pub target: String,
    /// The HTTP status and, for a refusal, why.
    pub outcome: String,
    /// How many requests alike it stands for: refusals are kept as one line per source,
    /// token, route, target and outcome a minute.
    #[serde(default = "one")]
    pub count: u64,
}

fn one() -> u64 {
    1
}
