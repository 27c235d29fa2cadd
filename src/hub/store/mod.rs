//! What the hub keeps: enrolled agents (their token's SHA-256, never the token), the
//! desired settings of the fleet and of each agent, the generation counter, and each
//! agent's latest report.
//!
//! [`Store`] is the narrow seam between the hub's logic and its database. The hub keeps
//! its working set in memory ([`super::fleet`]) and comes here to load it at start, to
//! make a change durable before it is acted on, and to write reports in batches. The SQL
//! is kept portable (no SQLite-only functions or upserts beyond `ON CONFLICT … DO UPDATE`),
//! so that a PostgreSQL store is the same statements on another driver.

pub(crate) mod sqlite;

use std::future::Future;

use thiserror::Error;

use crate::proto::hub::DesiredSettings;

#[derive(Debug, Error)]
pub(crate) enum StoreError {
    #[error("the hub database {path}")]
    Sqlite {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the hub database {path} has schema version {found}, newer than this hub knows ({known}): run the newer hub, or restore a backup")]
    NewerSchema {
        path: String,
        found: i64,
        known: usize,
    },
    #[error("the hub database {path} holds a record that does not parse ({what})")]
    Corrupt {
        path: String,
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("the hub database's worker thread failed")]
    Worker(#[source] tokio::task::JoinError),
}

/// One enrolled agent, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentRow {
    pub(crate) id: String,
    /// Lowercase hex SHA-256 of its token.
    pub(crate) token_sha256: String,
    pub(crate) enrolled_at: u64,
    pub(crate) revoked_at: Option<u64>,
    pub(crate) last_seen: Option<u64>,
    pub(crate) observed_generation: u64,
    /// The latest report, as the agent sent it (JSON).
    pub(crate) report: Option<String>,
}

/// The desired settings of one scope: `""` is the fleet, otherwise an agent's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScopeRow {
    pub(crate) scope: String,
    pub(crate) generation: u64,
    pub(crate) settings: DesiredSettings,
}

/// Everything the hub loads at start.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub(crate) agents: Vec<AgentRow>,
    pub(crate) scopes: Vec<ScopeRow>,
    /// The last generation handed out.
    pub(crate) generation: u64,
}

/// A report to write: the latest of one agent since the last batch.
#[derive(Debug, Clone)]
pub(crate) struct ReportRow {
    pub(crate) id: String,
    pub(crate) seen_at: u64,
    pub(crate) observed_generation: u64,
    pub(crate) report: String,
}

/// The hub's database. Every method is one transaction; a method that returns has made
/// its change durable.
pub(crate) trait Store: Send + Sync + 'static {
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;

    /// Enrols `id`, or re-enrols a revoked one with a new token; the agent's own scope
    /// gets a fresh generation so that its first reconcile is answered at once. Returns
    /// that generation, or `None` (nothing changed) when `id` is enrolled and not revoked.
    fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Returns false when `id` is not enrolled.
    fn revoke(&self, id: &str, now: u64) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Replaces the settings of `scope` and gives it the next generation, which is
    /// returned. `past` forces that generation above a number an agent reported (a hub
    /// restored from an older backup must still move its agents forward).
    fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        past: u64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Writes a batch of reports (last seen, observed generation, the report).
    fn record_reports(
        &self,
        batch: Vec<ReportRow>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
