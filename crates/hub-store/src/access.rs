//! Access as the hub's database keeps it (docs/hub.md, "Access"): scoped admin tokens and
//! enrolment tokens (their SHA-256 only), the audit log, and agent token rotation.
//!
//! An enrolment is one transaction: the token's use is counted, the agent enrolled with
//! the token's labels, or nothing happens (a token past its uses, its expiry or revoked;
//! an id already enrolled). So no token enrols more hosts than it may, whichever replicas
//! the hosts reach.

use std::future::Future;

use super::StoreError;
use crate::proto::labels::Labels;
pub(crate) use crate::sql::{ADMIN_TOKEN_COLUMNS, ENROL_TOKEN_COLUMNS};

/// The migration that makes the access tables (portable SQL).
pub const MIGRATION: &str = "INSERT INTO meta (key, value) VALUES ('enrol_token_seq', 0);
    INSERT INTO meta (key, value) VALUES ('audit_seq', 0);
    CREATE TABLE admin_tokens (
        name TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL UNIQUE,
        scopes TEXT NOT NULL,
        selector TEXT,
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT,
        revoked_ms BIGINT
    );
    CREATE TABLE enrol_tokens (
        id TEXT PRIMARY KEY,
        sha256 TEXT NOT NULL UNIQUE,
        max_uses BIGINT,
        uses BIGINT NOT NULL DEFAULT 0,
        labels TEXT NOT NULL DEFAULT '{}',
        created_ms BIGINT NOT NULL,
        expires_ms BIGINT,
        revoked_ms BIGINT
    );
    CREATE TABLE audit (
        seq BIGINT PRIMARY KEY,
        at_ms BIGINT NOT NULL,
        token TEXT NOT NULL,
        peer TEXT NOT NULL,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        outcome TEXT NOT NULL
    );
    CREATE INDEX audit_by_time ON audit (at_ms);
    ALTER TABLE agents ADD COLUMN next_token_sha256 TEXT;
    ALTER TABLE agents ADD COLUMN rotate_asked BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE agents ADD COLUMN token_issued_ms BIGINT;
    ALTER TABLE agents ADD COLUMN enrolled_via TEXT;
    ALTER TABLE agents ADD COLUMN enrolled_peer TEXT;
    ALTER TABLE agents ADD COLUMN enrolled_host TEXT;
    ALTER TABLE jobs ADD COLUMN scope TEXT;";

/// The migration that lets one audit line stand for many refusals alike (portable SQL).
pub const AUDIT_COUNT_MIGRATION: &str =
    "ALTER TABLE audit ADD COLUMN count BIGINT NOT NULL DEFAULT 1;";

/// A scoped admin token, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminTokenRow {
    pub name: String,
    pub sha256: String,
    /// Comma-separated.
    pub scopes: String,
    pub selector: Option<String>,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

/// An enrolment token, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnrolTokenRow {
    /// `et1`, `et2` …, taken at creation.
    pub id: String,
    pub sha256: String,
    pub max_uses: Option<u64>,
    pub uses: u64,
    pub labels: Labels,
    pub created_ms: u64,
    pub expires_ms: Option<u64>,
    pub revoked_ms: Option<u64>,
}

impl EnrolTokenRow {
    /// Why it enrols no host now, if it does not: revoked or expired (checked before
    /// anything else, so that such a token learns nothing of the fleet), or, unless
    /// `again` (the host it enrolled asks once more, its answer lost: no use taken), past
    /// its uses.
    pub fn refusal(&self, now_ms: u64, again: Option<bool>) -> Option<&'static str> {
        if self.revoked_ms.is_some() {
            Some("it was revoked")
        } else if self.expires_ms.is_some_and(|e| now_ms >= e) {
            Some("it has expired")
        } else if again == Some(false) && self.max_uses.is_some_and(|m| self.uses >= m) {
            Some("it has enrolled as many hosts as it may")
        } else {
            None
        }
    }
}

/// Who enrols, for the record and for the message that refuses a second host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Enrolment {
    pub id: String,
    pub token_sha256: String,
    pub now_ms: u64,
    pub peer: String,
    pub host: String,
}

/// What became of a self-enrolment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolled {
    /// The agent is enrolled; its scope took this generation; the token's id and labels.
    Done {
        generation: u64,
        via: String,
        labels: Labels,
    },
    /// No enrolment token has this hash.
    UnknownToken,
    /// The token enrols no host now: why, and its id.
    Refused { via: String, why: &'static str },
    /// The id was revoked (at this time, ms): it is never given to a host again.
    Retired { revoked_ms: u64 },
    /// The id is enrolled (and not revoked): by whom, from where.
    Taken {
        enrolled_ms: u64,
        peer: Option<String>,
        host: Option<String>,
    },
}

/// A line to append to the audit log (its `seq` is taken there).
pub type AuditRow = crate::proto::access::AuditEntry;

/// The access part of the hub's database; the same rules as `Store`.
pub trait AccessStore: Send + Sync + 'static {
    /// Adds an admin token; false when the name is taken (names are never reused, so
    /// that the audit log reads one way).
    fn create_admin_token(
        &self,
        row: &AdminTokenRow,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Every admin token, by name.
    fn admin_tokens(&self) -> impl Future<Output = Result<Vec<AdminTokenRow>, StoreError>> + Send;

    /// Revokes an admin token; the row as it is then, `None` for an unknown name.
    fn revoke_admin_token(
        &self,
        name: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<AdminTokenRow>, StoreError>> + Send;

    /// Adds an enrolment token, taking its id.
    fn create_enrol_token(
        &self,
        row: &EnrolTokenRow,
    ) -> impl Future<Output = Result<EnrolTokenRow, StoreError>> + Send;

    /// Every enrolment token, oldest first.
    fn enrol_tokens(&self) -> impl Future<Output = Result<Vec<EnrolTokenRow>, StoreError>> + Send;

    fn revoke_enrol_token(
        &self,
        id: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<EnrolTokenRow>, StoreError>> + Send;

    /// Enrols `e.id` with the agent token `agent_sha256`, counting a use of the enrolment
    /// token `e.token_sha256` and giving the agent its labels, in one transaction.
    fn self_enrol(
        &self,
        e: &Enrolment,
        agent_sha256: &str,
    ) -> impl Future<Output = Result<Enrolled, StoreError>> + Send;

    /// Appends to the audit log; the line's `seq`.
    fn append_audit(&self, row: &AuditRow) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Adds `n` to the count of audit line `seq` (refusals alike within its minute).
    fn add_audit_count(
        &self,
        seq: u64,
        n: u64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The audit log since `since_ms`, of `token` when given, newest last, at most `limit`
    /// (the newest).
    fn audit(
        &self,
        since_ms: u64,
        token: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AuditRow>, StoreError>> + Send;

    /// Deletes the audit lines older than `before_ms`; how many went.
    fn prune_audit(&self, before_ms: u64)
        -> impl Future<Output = Result<usize, StoreError>> + Send;

    /// Asks the agents `ids` (every enrolled one when `None`) for a new token at their
    /// next reconcile, each agent's scope taking the next generation; the agents asked,
    /// with that generation.
    fn ask_rotation(
        &self,
        ids: Option<&[String]>,
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;

    /// Keeps `next_sha256` as the token `id` is being sent (the one it had still works).
    fn set_next_token(
        &self,
        id: &str,
        next_sha256: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The agent used its next token: it becomes its only one. False when it was not
    /// (another hub promoted it meanwhile, or another rotation began).
    fn promote_token(
        &self,
        id: &str,
        next_sha256: &str,
        now_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Replaces a value all hubs share (the root admin token's hash, rotated).
    fn replace_secret(
        &self,
        name: &str,
        value: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
