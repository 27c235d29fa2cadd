//! Rollouts as the hub's database keeps them (docs/hub.md, "Rollouts"), and the lease
//! that lets one hub at a time drive them.
//!
//! Every state a rollout moves to is compared and set here: an operator's pause or
//! abort (through any replica) and the driver's own steps (halted, done …) never undo
//! each other. The driver's steps are also guarded by its lease, so a replica that lost
//! it (stalled, cut off from the database) writes nothing more.

use std::future::Future;

use super::StoreError;
pub(crate) use crate::sql::ROLLOUT_COLUMNS;

/// The migration that makes the rollout tables (portable SQL).
pub const MIGRATION: &str = "INSERT INTO meta (key, value) VALUES ('rollout_seq', 0);
    CREATE TABLE rollouts (
        id TEXT PRIMARY KEY,
        seq BIGINT NOT NULL UNIQUE,
        version TEXT NOT NULL,
        selector TEXT,
        waves TEXT NOT NULL,
        soak_ms BIGINT NOT NULL,
        max_parallel BIGINT NOT NULL,
        max_failures BIGINT NOT NULL,
        failures_accepted BIGINT NOT NULL DEFAULT 0,
        deadline_ms BIGINT,
        state TEXT NOT NULL,
        reason TEXT,
        wave BIGINT NOT NULL DEFAULT 0,
        last_commit_ms BIGINT,
        created_ms BIGINT NOT NULL,
        finished_ms BIGINT
    );
    CREATE INDEX rollouts_by_state ON rollouts (state, seq);
    CREATE TABLE rollout_members (
        rollout TEXT NOT NULL,
        agent TEXT NOT NULL,
        wave BIGINT NOT NULL,
        position BIGINT NOT NULL,
        state TEXT NOT NULL,
        from_version TEXT,
        given_ms BIGINT,
        ended_ms BIGINT,
        error TEXT,
        PRIMARY KEY (rollout, agent)
    );
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_ms BIGINT NOT NULL
    );";

/// The migration that keeps when each agent was last served each release's artifact to
/// its end: a rollout counts a member's commit only on that evidence (portable SQL).
pub const FETCH_MIGRATION: &str = "CREATE TABLE release_fetches (
        agent TEXT NOT NULL,
        version TEXT NOT NULL,
        fetched_ms BIGINT NOT NULL,
        PRIMARY KEY (agent, version)
    );";

/// Release `version`'s artifact served to `agent`, with its own token, to its last
/// byte, at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub agent: String,
    pub version: String,
    pub now_ms: u64,
}

/// The states in which a rollout holds its agents, in SQL.
pub fn active_states_sql() -> String {
    crate::proto::rollout::ACTIVE
        .iter()
        .map(|s| format!("'{s}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lease the rollout driver holds.
pub const ROLLOUT_LEASE: &str = "rollouts";

/// One rollout, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolloutRow {
    /// `r1`, `r2` …, taken at insertion.
    pub id: String,
    pub seq: u64,
    pub version: String,
    pub selector: Option<String>,
    /// `--waves` as given.
    pub waves: String,
    pub soak_ms: u64,
    pub max_parallel: usize,
    pub max_failures: usize,
    /// Failures an operator took on by resuming a rollout they stopped.
    pub failures_accepted: usize,
    pub deadline_ms: Option<u64>,
    pub state: String,
    pub reason: Option<String>,
    /// The wave under way (0-based).
    pub wave: usize,
    /// When a member last committed: the soak counts from it.
    pub last_commit_ms: Option<u64>,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
}

/// One member of a rollout, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberRow {
    pub agent: String,
    pub wave: usize,
    /// Its place in the rollout's order.
    pub position: usize,
    pub state: String,
    pub from_version: Option<String>,
    pub given_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub error: Option<String>,
}

/// A move of a rollout's state, made only from the state it was read in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateMove {
    pub to: String,
    pub reason: Option<String>,
    pub now_ms: u64,
    /// Resuming a stopped rollout takes on the failures so far.
    pub failures_accepted: Option<usize>,
}

/// What one step of the driver changed: written only if the rollout is still in
/// `state` (else an operator moved it meanwhile, and the step is taken again from what
/// is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub id: String,
    /// The state the step was computed from.
    pub state: String,
    pub wave: usize,
    pub last_commit_ms: Option<u64>,
    pub members: Vec<MemberRow>,
    pub moved: Option<StateMove>,
}

/// What became of a [`Progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    Written,
    /// The rollout is no longer in the state the step read: nothing written.
    Moved,
    /// Another hub holds the lease now: nothing written.
    LeaseLost,
}

/// The rollouts, as the hub's database keeps them; the same rules as `Store`.
pub trait RolloutStore: Send + Sync + 'static {
    /// Adds a rollout with its members, taking its id, unless a rollout that is not over
    /// holds one of its agents: then nothing changes, and each such agent is returned
    /// with that rollout's id.
    fn insert_rollout(
        &self,
        row: &RolloutRow,
        members: &[MemberRow],
    ) -> impl Future<Output = Result<Result<RolloutRow, Vec<(String, String)>>, StoreError>> + Send;

    /// The rollouts, oldest first: with `active`, only those not over.
    fn list_rollouts(
        &self,
        active: bool,
    ) -> impl Future<Output = Result<Vec<RolloutRow>, StoreError>> + Send;

    /// One rollout with its members in order.
    fn get_rollout(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError>> + Send;

    /// Moves rollout `id` from one of `from` to `m.to`; `None` when it is in none of
    /// them (or there is no such rollout). A final state ends the members still
    /// `pending` or `deferred` as `skipped`; `rolling_back` starts again from wave 0.
    fn move_rollout(
        &self,
        id: &str,
        from: &[&str],
        m: &StateMove,
    ) -> impl Future<Output = Result<Option<RolloutRow>, StoreError>> + Send;

    /// Writes one step of the driver that holds the lease as `holder` (renewing it
    /// until `lease_until_ms`).
    fn record_rollout(
        &self,
        holder: &str,
        lease_until_ms: u64,
        p: &Progress,
    ) -> impl Future<Output = Result<Recorded, StoreError>> + Send;

    /// Records an agent's fetch of a release's artifact (the latest one is kept).
    fn record_fetch(&self, f: &Fetch) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// When each agent was last served release `version`'s artifact.
    fn fetches(
        &self,
        version: &str,
    ) -> impl Future<Output = Result<Vec<(String, u64)>, StoreError>> + Send;

    /// Takes lease `name` for `holder` until `until_ms` if it is free, expired (as of
    /// `now_ms`) or `holder`'s already; true when `holder` holds it now.
    fn take_lease(
        &self,
        name: &str,
        holder: &str,
        now_ms: u64,
        until_ms: u64,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

/// The members whose agent an active rollout holds, among `agents`.
pub fn overlapping(
    held: impl IntoIterator<Item = (String, String)>,
    agents: &[MemberRow],
) -> Vec<(String, String)> {
    let wanted: std::collections::HashSet<&str> = agents.iter().map(|m| m.agent.as_str()).collect();
    let mut out: Vec<(String, String)> = held
        .into_iter()
        .filter(|(agent, _)| wanted.contains(agent.as_str()))
        .collect();
    out.sort();
    out
}

/// The member states a rollout moving `to` a final state (or back) ends as `skipped`:
/// never given the version, and never to be. A rollout that is done leaves its deferred
/// members deferred: they take the version when they are back.
pub fn unstarted(to: &str) -> &'static str {
    if to == crate::proto::rollout::DONE {
        "'pending'"
    } else {
        "'pending', 'deferred'"
    }
}
