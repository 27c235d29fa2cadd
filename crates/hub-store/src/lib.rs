//! What the hub keeps: enrolled agents (their token's SHA-256, never the token), the
//! desired settings of the fleet and of each agent, the generation counter, and each
//! agent's latest report.
//!
//! [`Store`] is the narrow seam between the hub's logic and its database. The hub keeps
//! its working set in memory (`hub::fleet`) and comes here to load it at start, to
//! make a change durable before it is acted on, and to write reports in batches. The SQL
//! is kept portable (no SQLite-only functions or upserts beyond `ON CONFLICT … DO UPDATE`),
//! so that a PostgreSQL store is the same statements on another driver.

pub mod access;
pub mod copy;
mod exec;
mod fleet;
pub mod jobs;
mod migrations;
pub mod postgres;
pub mod rollouts;
pub mod secrets;
mod sql;
pub mod sqlite;

use std::collections::HashMap;
use std::future::Future;

use railgrid_proto as proto;
use railgrid_util as util;
use railgrid_util::small_file;
use thiserror::Error;

use crate::proto::desired::MAX_GENERATION;
use crate::proto::hub::DesiredSettings;
pub use crate::proto::labels::Labels;
pub use access::AccessStore;
pub use jobs::{
    plan_append, AppendPlan, Appended, Assigned, Assignment, JobFilter, JobProgress, JobRow,
    JobStore,
};
pub use rollouts::RolloutStore;

#[derive(Debug, Error)]
pub enum StoreError {
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
    #[error("the hub database {store}: column {index} of a row read holds {found}, where {want} belongs")]
    Column {
        store: String,
        index: usize,
        want: &'static str,
        found: &'static str,
    },
    #[error("the hub database {store} lacks {what}: was it made by a hub (or restored whole)?")]
    Missing { store: String, what: String },
    #[error("the hub database's worker thread failed")]
    Worker(#[source] tokio::task::JoinError),
    #[error("the hub database {url}")]
    Postgres {
        url: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("the hub database {url}: no connection")]
    Pool {
        url: String,
        #[source]
        source: deadpool_postgres::PoolError,
    },
    #[error("the hub database {0} has handed out every generation a hub may (up to {max}): no change can be made until the counter is renumbered; stop every hub on it and run `railgrid hub store renumber` (docs/hub.md, \"Generations\")", max = MAX_GENERATION)]
    GenerationsExhausted(String),
    #[error("a hub is running on the database {0}: stop every hub on it first")]
    HubsRunning(String),
    #[error("the hub database {store}: {at} holds {why}, which a copy cannot carry as it is")]
    Uncopyable {
        store: String,
        at: String,
        why: String,
    },
    #[error("the database {url} is not empty (it holds {what}): `hub store copy` fills an empty database only; create one (`createdb`) and give its URL")]
    NotEmpty { url: String, what: String },
    #[error("invalid --store {url}: {why}")]
    BadUrl { url: String, why: String },
    #[error("could not read {path}, the CA of the hub database {url}")]
    DatabaseCa {
        url: String,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    /// The database could not write for want of space: the hub says so (507), rather
    /// than that it could not reach its database.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DiskFull)
            ),
            StoreError::Postgres { source, .. } => {
                source.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL)
            }
            _ => false,
        }
    }
}

/// `v` as the JSON text a column keeps; `place` (a path, a URL) and `what` name it in
/// the error.
pub(crate) fn encode(
    place: &str,
    what: &str,
    v: &impl serde::Serialize,
) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|source| StoreError::Corrupt {
        path: place.to_owned(),
        what: what.to_owned(),
        source,
    })
}

/// A number the store keeps in a signed 64-bit column, as the unsigned one it stands
/// for (a negative one, which no hub writes, reads as 0).
pub(crate) fn u64_of(n: i64) -> u64 {
    n.max(0) as u64
}

/// An agent's stored `observed_generation` after a renumbering: whatever generation it
/// reports (other than 0), it is told to take the hub's own desired state, since the
/// numbers it holds may now name other states.
pub const MUST_RESET: u64 = i64::MAX as u64;

/// What another replica changed, as its notification says (replicated stores only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An agent: its enrolment, its settings or its jobs.
    Agent(String),
    /// The fleet's settings, releases or halts.
    Fleet,
    /// Output of a job was taken.
    Output(String),
    /// A queued job: submitted, or ended while queued.
    Queued(String),
    /// The admin or enrolment tokens.
    Tokens,
    /// Notifications may have been missed (the listening connection was lost): load
    /// everything again.
    Resync,
}

/// One agent as stored, with its own settings and its open jobs: what a replica loads
/// when another one changed it.
#[derive(Debug, Clone)]
pub struct AgentSnapshot {
    pub agent: AgentRow,
    pub scope: Option<ScopeRow>,
    pub open_jobs: Vec<JobRow>,
}

/// The fleet's own settings, releases and halts, and the newest generation.
#[derive(Debug, Clone, Default)]
pub struct FleetSnapshot {
    pub scope: Option<ScopeRow>,
    pub generation: u64,
    pub releases: Vec<ReleaseRow>,
    pub halts: Vec<HaltRow>,
}

/// One enrolled agent, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentRow {
    pub id: String,
    /// Lowercase hex SHA-256 of its token.
    pub token_sha256: String,
    pub enrolled_at: u64,
    pub revoked_at: Option<u64>,
    pub last_seen: Option<u64>,
    pub observed_generation: u64,
    /// The latest report, as the agent sent it (JSON).
    pub report: Option<String>,
    /// The labels the hub set on it (a JSON object), over the ones its host reports.
    pub labels: String,
    /// The token it is being sent (rotation), which works beside its own until used.
    pub next_token_sha256: Option<String>,
    /// A new token is to be sent at its next reconcile.
    pub rotate_asked: bool,
    /// When its token was made (Unix ms; `None`: at its enrolment).
    pub token_issued_ms: Option<u64>,
    /// The number of the fleet's counter the latest change to what it is sent of its
    /// jobs took (0: none yet); every hub answers it with this version.
    pub jobs_version: u64,
}

/// The desired settings of one scope: `""` is the fleet, otherwise an agent's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeRow {
    pub scope: String,
    pub generation: u64,
    pub settings: DesiredSettings,
}

pub use crate::proto::job::Stream;

/// What an enrolment by an admin did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enrol {
    /// Enrolled; its scope took this generation.
    Done(u64),
    /// Enrolled already, and not revoked: nothing changed.
    Exists,
    /// Revoked, and not asked to reuse its id: nothing changed.
    Revoked,
}

/// The hub's labels of agent `id`, from their stored JSON.
pub fn parse_labels(place: &str, id: &str, stored: &str) -> Result<Labels, StoreError> {
    serde_json::from_str(stored).map_err(|source| StoreError::Corrupt {
        path: place.to_owned(),
        what: format!("the labels of agent {id:?}"),
        source,
    })
}

/// Everything the hub loads at start.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub agents: Vec<AgentRow>,
    pub scopes: Vec<ScopeRow>,
    /// Jobs not yet done.
    pub open_jobs: Vec<JobRow>,
    /// The last generation handed out.
    pub generation: u64,
    pub releases: Vec<ReleaseRow>,
    pub halts: Vec<HaltRow>,
}

impl Snapshot {
    /// Its scopes apart: the fleet's (once it has been set) and each agent's own, by id.
    pub fn take_scopes(&mut self) -> (Option<ScopeRow>, HashMap<String, ScopeRow>) {
        let mut fleet = None;
        let mut own = HashMap::new();
        for s in std::mem::take(&mut self.scopes) {
            if s.scope.is_empty() {
                fleet = Some(s);
            } else {
                own.insert(s.scope.clone(), s);
            }
        }
        (fleet, own)
    }
}

/// One published release artifact: a version for one platform. Its bytes are a file in
/// the hub's data dir named by their SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRow {
    pub version: String,
    pub os: String,
    pub arch: String,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
    /// The `.minisig` file, as published.
    pub signature: String,
    /// The publisher key that verified it (minisign key id, hex).
    pub key_id: String,
    pub published_at: u64,
}

/// A version halted fleet-wide because an agent rolled it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HaltRow {
    pub version: String,
    pub agent: String,
    pub reason: String,
    pub halted_at: u64,
}

/// A report to write: the latest of one agent since the last batch.
#[derive(Debug, Clone)]
pub struct ReportRow {
    pub id: String,
    pub seen_at: u64,
    pub observed_generation: u64,
    pub report: String,
}

/// The hub's database. Every method is one transaction; a method that returns has made
/// its change durable. The jobs' part of it is [`JobStore`], the rollouts' [`RolloutStore`].
pub trait Store:
    JobStore + RolloutStore + AccessStore + secrets::SecretStore + Send + Sync + 'static
{
    fn load(&self) -> impl Future<Output = Result<Snapshot, StoreError>> + Send;

    /// Enrols `id` (a revoked one only with `reuse_revoked`, as a new agent: its labels
    /// and own settings cleared); the agent's own scope gets a fresh generation so that
    /// its first reconcile is answered at once.
    fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
        reuse_revoked: bool,
    ) -> impl Future<Output = Result<Enrol, StoreError>> + Send;

    /// Revokes `id` and gives its scope the next generation, which is returned (so that
    /// replicas see the change); `None` when `id` is not enrolled.
    fn revoke(
        &self,
        id: &str,
        now: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Replaces the settings of `scope` and gives it the next generation, which is
    /// returned. With `base`,
    /// only if the stored settings are `base` (a scope never set counts as the default):
    /// otherwise nothing changes and the stored settings are returned, so that a change
    /// computed from a stale copy (another replica's change not seen yet) is computed
    /// again instead of undoing that change.
    fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        base: Option<&DesiredSettings>,
    ) -> impl Future<Output = Result<Result<u64, DesiredSettings>, StoreError>> + Send;

    /// Writes a batch of reports (last seen, observed generation, the report).
    fn record_reports(
        &self,
        batch: Vec<ReportRow>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Adds a release artifact, or replaces one with the same version and platform (a
    /// re-publish with a new signature, say), and gives the fleet's scope the next
    /// generation, which is returned: agents waiting for it are sent its artifact.
    fn put_release(&self, row: &ReleaseRow)
        -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Sets the hub's labels `set` on `id` and removes `remove`, in one transaction (a
    /// change another replica made meanwhile is kept), and gives the agent's scope the
    /// next generation, so that the other replicas load it. Returns that generation and
    /// the hub's labels now; `None` for an agent that is not enrolled, or revoked.
    fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
    ) -> impl Future<Output = Result<Option<(u64, Labels)>, StoreError>> + Send;

    /// Halts a version (`Some`) or lifts its halt (`None`), and gives the fleet's scope
    /// the next generation, which is returned: every agent's desired state may change.
    fn set_halt(
        &self,
        version: &str,
        halt: Option<&HaltRow>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    // Replicas. A store that several hubs share says so, tells each what the others
    // changed, and holds what they must agree on. The embedded store has one hub: it
    // has no events and keeps release bytes and secrets in the data dir.

    /// Whether other hubs may change this store.
    fn replicated(&self) -> bool {
        false
    }

    /// The changes other hubs make, once: the receiver is taken by the first caller.
    fn events(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<Event>> {
        None
    }

    /// False when a change another hub made may not have reached this one (its
    /// notification lost): the caller loads everything again.
    fn in_sync(&self) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async { Ok(true) }
    }

    /// One agent as stored now.
    fn load_agent(
        &self,
        _id: &str,
    ) -> impl Future<Output = Result<Option<AgentSnapshot>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// The fleet's scope, releases and halts as stored now.
    fn load_fleet(&self) -> impl Future<Output = Result<FleetSnapshot, StoreError>> + Send {
        async { Ok(FleetSnapshot::default()) }
    }

    /// Starts the generations over (docs/hub.md, "Generations"), with every hub on this
    /// store stopped: the counter and every scope go to 1, and every agent is marked
    /// [`MUST_RESET`] so that it takes the hub's state whatever number it reports.
    /// Returns the counter as it was. One transaction.
    fn renumber(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The newest generation handed out, by any hub.
    fn generation(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async { Ok(0) }
    }

    /// Every agent as stored (the reports other hubs wrote).
    fn load_agents(&self) -> impl Future<Output = Result<Vec<AgentRow>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// A value all hubs share (the admin token's hash, the CA): the stored one, or
    /// `value` when none was, stored now. Two hubs racing agree on one.
    fn shared_secret(
        &self,
        _name: &str,
        value: String,
    ) -> impl Future<Output = Result<String, StoreError>> + Send {
        async { Ok(value) }
    }

    /// The value of a shared secret, if any hub stored one.
    fn get_secret(
        &self,
        _name: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send {
        async { Ok(None) }
    }

    /// Keeps a release's bytes where every hub can fetch them.
    fn put_blob(
        &self,
        _sha256: &str,
        _data: Vec<u8>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// A release's bytes, by SHA-256, if stored.
    fn get_blob(
        &self,
        _sha256: &str,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// Stored settings (`None`: a scope never set, the default).
pub(crate) fn parse_settings(
    path: &str,
    scope: &str,
    json: Option<&str>,
) -> Result<DesiredSettings, StoreError> {
    json.map_or(Ok(DesiredSettings::default()), |j| {
        serde_json::from_str(j).map_err(|source| StoreError::Corrupt {
            path: path.to_owned(),
            what: format!("desired settings of scope {scope:?}"),
            source,
        })
    })
}
