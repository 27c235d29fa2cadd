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
use crate::proto::job::{JobSpec, Truncation};
pub use crate::proto::labels::Labels;
pub use access::AccessStore;
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

pub(crate) fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(u64_of)
}

/// An agent's stored `observed_generation` after a renumbering: whatever generation it
/// reports (other than 0), it is told to take the hub's own desired state, since the
/// numbers it holds may now name other states.
pub const MUST_RESET: u64 = i64::MAX as u64;

/// What [`Store::renumber`] runs, on either database.
pub(crate) const RENUMBER: [&str; 4] = [
    "UPDATE meta SET value = 1 WHERE key = 'generation'",
    "UPDATE desired SET generation = 1",
    "UPDATE agents SET observed_generation = 9223372036854775807",
    // Numbers of the same counter: kept, they would stay ahead of every later change,
    // which could then never move them. An agent's echo of an old one is ahead of the
    // hub's 0, and is answered at once.
    "UPDATE agent_jobs SET version = 0",
];

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

/// What changes about a hub job as its agent reports it (or as it is cancelled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobProgress {
    /// `pending`, or the runner's state.
    pub state: String,
    pub cancel_requested: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub finished_ms: Option<u64>,
    /// When the hub first heard the job had reached its agent's runner (hub clock).
    pub started_ms: Option<u64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub runner_truncated: Option<Truncation>,
    /// What the job's egress proxy refused, as its agent last reported it.
    pub egress_denied: Vec<crate::proto::egress::Denial>,
    /// Ended, and all of its output the hub will hold is there.
    pub done: bool,
}

/// One hub job, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    pub id: String,
    /// Submission order, over the whole hub.
    pub seq: u64,
    /// Empty while a selected job waits in the fleet's queue.
    pub agent: String,
    pub spec: JobSpec,
    pub created_ms: u64,
    pub progress: JobProgress,
    /// The selector it was routed by (canonical text), for a selected job.
    pub selector: Option<String>,
    pub priority: u8,
    /// When a queued job nobody took ends `expired` (Unix ms).
    pub queue_deadline_ms: Option<u64>,
    /// The fan-out it is a member of.
    pub group: Option<String>,
    /// 1 for a job as submitted; `n` for `ID.n`, its retry after attempt `n - 1` was lost.
    pub attempt: u32,
    /// Retries left, should this attempt end `lost`.
    pub retries: u8,
    /// The agent the previous attempt was lost on: another one is preferred.
    pub avoid: Option<String>,
    /// The selector of the scoped token that submitted it: only agents whose hub labels
    /// match may take it.
    pub scope: Option<String>,
    /// How much of each stream the hub has acknowledged, and how much of it it keeps
    /// (less, past its cap).
    pub stdout_length: u64,
    pub stderr_length: u64,
    pub stdout_stored: u64,
    pub stderr_stored: u64,
}

impl JobRow {
    /// A queued job running `true`, every other field at its default: where a test
    /// builds the row it needs, field by field.
    pub fn queued(id: &str) -> Self {
        Self {
            id: id.into(),
            seq: 0,
            agent: String::new(),
            spec: JobSpec::from_argv(["true"]),
            created_ms: 0,
            progress: JobProgress {
                state: crate::proto::fleet_job::QUEUED.into(),
                ..JobProgress::default()
            },
            selector: None,
            priority: crate::proto::fleet_job::DEFAULT_PRIORITY,
            queue_deadline_ms: None,
            group: None,
            attempt: 1,
            retries: 0,
            avoid: None,
            scope: None,
            stdout_length: 0,
            stderr_length: 0,
            stdout_stored: 0,
            stderr_stored: 0,
        }
    }
}

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

/// The outcome of an output upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The stream's acknowledged length now.
    Length(u64),
    /// The upload starts past the acknowledged length, which it names: nothing taken.
    Gap(u64),
    NoJob,
}

/// What an upload does to a stream, by the one rule every store follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendPlan {
    /// Nothing to write: the answer.
    Answer(Appended),
    /// Write `data[skip..skip + keep]` at the stored end; the stream is `length` long then.
    Take {
        skip: usize,
        keep: usize,
        length: u64,
    },
}

/// An upload of `len` bytes at `offset` to a stream the hub acknowledged `length` bytes
/// of and keeps `stored` of (at most `cap`). What the hub has already is the same bytes
/// (a spool is append-only): only what lies past `length` is new, and a job `done` takes
/// nothing more.
pub fn plan_append(
    length: u64,
    stored: u64,
    done: bool,
    offset: u64,
    len: usize,
    cap: u64,
) -> AppendPlan {
    if done {
        return AppendPlan::Answer(Appended::Length(length));
    }
    if offset > length {
        return AppendPlan::Answer(Appended::Gap(length));
    }
    let skip = length - offset;
    if skip >= len as u64 {
        return AppendPlan::Answer(Appended::Length(length));
    }
    let new = len - skip as usize;
    AppendPlan::Take {
        skip: skip as usize,
        keep: (new as u64).min(cap.saturating_sub(stored)) as usize,
        length: length + new as u64,
    }
}

/// The hub's labels of agent `id` as stored (`stored`, JSON) with `set` merged in and
/// `remove` taken out: the labels and their JSON. One rule for every store.
pub(crate) fn merge_labels(
    place: &str,
    id: &str,
    stored: &str,
    set: &Labels,
    remove: &[String],
) -> Result<(Labels, String), StoreError> {
    let mut labels = parse_labels(place, id, stored)?;
    for k in remove {
        labels.remove(k);
    }
    labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
    let json = serde_json::to_string(&labels).map_err(|source| StoreError::Corrupt {
        path: place.to_owned(),
        what: format!("the labels of agent {id:?}"),
        source,
    })?;
    Ok((labels, json))
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

/// What [`JobStore::assign_job`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assigned {
    /// The job is the agent's now; the change took this number of the fleet's counter,
    /// the agent's jobs' version now (its scope keeps its generation: jobs are not
    /// settings).
    To(u64),
    /// The job is no longer queued (another hub assigned it, or it ended): nothing changed.
    Gone,
    /// The agent has as many open jobs as it may: nothing changed.
    Full,
}

/// One assignment of a dispatch round: queued job `job` to `agent`, if the agent has
/// fewer than `max_open` jobs not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub job: String,
    pub agent: String,
    pub max_open: usize,
}

/// Which jobs a listing shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobFilter<'a> {
    pub agent: Option<&'a str>,
    /// Jobs routed by this selector (canonical text).
    pub selector: Option<&'a str>,
    /// The members of one fan-out.
    pub group: Option<&'a str>,
}

/// The jobs through the hub and their output, as the hub's database keeps them; the same
/// rules as [`Store`].
pub trait JobStore: Send + Sync + 'static {
    /// Adds a job (its `seq` is assigned here). A job for an agent takes the next number
    /// of the fleet's counter, which becomes the agent's `jobs_version` (so that every
    /// hub answers the agent alike, and the other hubs' check for a missed change covers
    /// it), but moves no scope's generation (jobs are not settings); a queued one (no
    /// agent yet) takes none. Either tells the other hubs. Returns (seq, the number
    /// taken), or `None` when the id is taken.
    fn insert_job(
        &self,
        job: &JobRow,
    ) -> impl Future<Output = Result<Option<(u64, Option<u64>)>, StoreError>> + Send;

    /// Gives each queued job of `batch` to its agent if the job is still queued and the
    /// agent has fewer than its `max_open` jobs not done (counting the batch's own), in
    /// one transaction: the store decides, so that two hubs never hand one job out twice,
    /// nor one agent more than it may take. Each agent given a job takes the next
    /// number of the fleet's counter, as [`Self::insert_job`] does. One outcome per
    /// assignment, in order.
    fn assign_jobs(
        &self,
        batch: &[Assignment],
    ) -> impl Future<Output = Result<Vec<Assigned>, StoreError>> + Send;

    /// Ends the queued job `id` as `progress` says (cancelled, expired), if it is still
    /// queued; false when it is not (assigned meanwhile, or ended).
    fn end_queued(
        &self,
        id: &str,
        progress: &JobProgress,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records what changed about some of `agent`'s jobs, in one transaction; with `bump`
    /// (what the agent is sent changed) the change takes the next number of the fleet's
    /// counter, as [`Self::insert_job`] does, which is returned.
    fn update_jobs(
        &self,
        agent: &str,
        jobs: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Appends to a stream what of `data` (uploaded at `offset`) lies past the length
    /// acknowledged, keeping at most `cap` bytes of the stream.
    fn append_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: bytes::Bytes,
        cap: u64,
    ) -> impl Future<Output = Result<Appended, StoreError>> + Send;

    /// Up to `limit` bytes of what the hub keeps of a stream, from `offset`.
    fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<u8>, StoreError>> + Send;

    fn get_job(&self, id: &str) -> impl Future<Output = Result<Option<JobRow>, StoreError>> + Send;

    /// The agent of a job, without the rest of it.
    fn job_agent(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Jobs newest first, as `filter` picks them, below `before` (a seq), at most `limit`.
    fn list_jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<JobRow>, StoreError>> + Send;

    /// Deletes the oldest done jobs and their output beyond the newest `keep`; returns
    /// how many went.
    fn retain_jobs(&self, keep: usize) -> impl Future<Output = Result<usize, StoreError>> + Send;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_takes_only_what_lies_past_the_acknowledged_length() {
        use AppendPlan::{Answer, Take};
        // (length, stored, done, offset, len, cap) → plan
        let cases = [
            (
                (0, 0, false, 0, 3, 8),
                Take {
                    skip: 0,
                    keep: 3,
                    length: 3,
                },
            ),
            ((3, 3, false, 0, 3, 8), Answer(Appended::Length(3))),
            (
                (3, 3, false, 2, 4, 8),
                Take {
                    skip: 1,
                    keep: 3,
                    length: 6,
                },
            ),
            ((6, 6, false, 9, 1, 8), Answer(Appended::Gap(6))),
            (
                (6, 6, false, 6, 5, 8),
                Take {
                    skip: 0,
                    keep: 2,
                    length: 11,
                },
            ),
            (
                (11, 8, false, 11, 4, 8),
                Take {
                    skip: 0,
                    keep: 0,
                    length: 15,
                },
            ),
            ((5, 5, true, 5, 4, 8), Answer(Appended::Length(5))),
            ((5, 5, true, 9, 4, 8), Answer(Appended::Length(5))),
        ];
        for ((length, stored, done, offset, len, cap), want) in cases {
            assert_eq!(
                plan_append(length, stored, done, offset, len, cap),
                want,
                "{length} {stored} {done} {offset} {len} {cap}"
            );
        }
    }
}
