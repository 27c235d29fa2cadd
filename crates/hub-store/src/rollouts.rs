//! Rollouts as the hub's database keeps them (docs/hub.md, "Rollouts"), and the lease
//! that lets one hub at a time drive them.
//!
//! Every state a rollout moves to is compared and set here: an operator's pause or
//! abort (through any replica) and the driver's own steps (halted, done …) never undo
//! each other. The driver's steps are also guarded by its lease, so a replica that lost
//! it (stalled, cut off from the database) writes nothing more.

use std::future::Future;

use super::StoreError;
use crate::exec::{args, next_seq, Decided, Row, Tx};
use crate::sql;
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

// The bodies both backends run (crate::exec): each backend's `RolloutStore` only opens
// the transaction (or the snapshot) and runs one.

fn rollout_row(mut r: Row) -> Result<RolloutRow, StoreError> {
    Ok(RolloutRow {
        id: r.text(0)?,
        seq: r.u64(1)?,
        version: r.text(2)?,
        selector: r.opt_text(3)?,
        waves: r.text(4)?,
        soak_ms: r.u64(5)?,
        max_parallel: r.u64(6)? as usize,
        max_failures: r.u64(7)? as usize,
        failures_accepted: r.u64(8)? as usize,
        deadline_ms: r.opt_u64(9)?,
        state: r.text(10)?,
        reason: r.opt_text(11)?,
        wave: r.u64(12)? as usize,
        last_commit_ms: r.opt_u64(13)?,
        created_ms: r.u64(14)?,
        finished_ms: r.opt_u64(15)?,
    })
}

fn member_row(mut r: Row) -> Result<MemberRow, StoreError> {
    Ok(MemberRow {
        agent: r.text(0)?,
        wave: r.u64(1)? as usize,
        position: r.u64(2)? as usize,
        state: r.text(3)?,
        from_version: r.opt_text(4)?,
        given_ms: r.opt_u64(5)?,
        ended_ms: r.opt_u64(6)?,
        error: r.opt_text(7)?,
    })
}

/// Rollout `id`; its row locked until the transaction ends where other hubs write too.
async fn rollout(tx: &mut impl Tx, id: &str, lock: bool) -> Result<Option<RolloutRow>, StoreError> {
    let statement = if lock {
        tx.locking(sql::ROLLOUT_BY_ID, sql::ROLLOUT_BY_ID_LOCKED)
    } else {
        sql::ROLLOUT_BY_ID
    };
    tx.query_opt(statement, &args![id])
        .await?
        .map(rollout_row)
        .transpose()
}

pub(crate) async fn insert(
    tx: &mut impl Tx,
    row: &RolloutRow,
    members: &[MemberRow],
) -> Result<Decided<Result<RolloutRow, Vec<(String, String)>>>, StoreError> {
    // First: the counter's row lock makes two starts through two replicas take turns, so
    // the second sees the first's members.
    let seq = next_seq(tx, "rollout_seq").await?;
    let statement = format!(
        "SELECT m.agent, m.rollout FROM rollout_members m JOIN rollouts r ON r.id = m.rollout
         WHERE r.state IN ({})",
        active_states_sql()
    );
    let held = tx
        .query(&statement, &[])
        .await?
        .into_iter()
        .map(|mut r| Ok((r.text(0)?, r.text(1)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    let clash = overlapping(held, members);
    if !clash.is_empty() {
        return Ok(Decided::Rollback(Err(clash)));
    }
    let stored = RolloutRow {
        id: format!("r{seq}"),
        seq: crate::u64_of(seq),
        ..row.clone()
    };
    let insert = args![
        &stored.id,
        seq,
        &stored.version,
        &stored.selector,
        &stored.waves,
        stored.soak_ms,
        stored.max_parallel,
        stored.max_failures,
        stored.deadline_ms,
        &stored.state,
        &stored.reason,
        stored.created_ms,
    ];
    tx.execute(sql::ROLLOUT_INSERT, &insert).await?;
    for m in members {
        let member = args![
            &stored.id,
            &m.agent,
            m.wave,
            m.position,
            &m.state,
            &m.from_version
        ];
        tx.execute(sql::MEMBER_INSERT, &member).await?;
    }
    Ok(Decided::Commit(Ok(stored)))
}

pub(crate) async fn list(tx: &mut impl Tx, active: bool) -> Result<Vec<RolloutRow>, StoreError> {
    let filter = if active {
        format!("WHERE state IN ({})", active_states_sql())
    } else {
        String::new()
    };
    let statement = format!("SELECT {ROLLOUT_COLUMNS} FROM rollouts {filter} ORDER BY seq");
    let rows = tx.query(&statement, &[]).await?;
    rows.into_iter().map(rollout_row).collect()
}

/// A rollout and its members; run in one snapshot, so that they agree.
pub(crate) async fn get(
    tx: &mut impl Tx,
    id: &str,
) -> Result<Option<(RolloutRow, Vec<MemberRow>)>, StoreError> {
    let Some(row) = rollout(tx, id, false).await? else {
        return Ok(None);
    };
    let members = tx.query(sql::ROLLOUT_MEMBERS, &args![id]).await?;
    let members = members
        .into_iter()
        .map(member_row)
        .collect::<Result<_, _>>()?;
    Ok(Some((row, members)))
}

pub(crate) async fn move_to(
    tx: &mut impl Tx,
    id: &str,
    from: &[&str],
    m: &StateMove,
) -> Result<Decided<Option<RolloutRow>>, StoreError> {
    let Some(row) = rollout(tx, id, true).await? else {
        return Ok(Decided::Rollback(None));
    };
    if !from.contains(&row.state.as_str()) {
        return Ok(Decided::Rollback(None));
    }
    move_on(tx, &row, m).await?;
    let moved = rollout(tx, id, true).await?;
    Ok(Decided::Commit(moved))
}

pub(crate) async fn record(
    tx: &mut impl Tx,
    holder: &str,
    lease_until_ms: u64,
    p: &Progress,
) -> Result<Decided<Recorded>, StoreError> {
    let renew = args![ROLLOUT_LEASE, holder, lease_until_ms];
    if tx.execute(sql::LEASE_RENEW, &renew).await? == 0 {
        return Ok(Decided::Rollback(Recorded::LeaseLost));
    }
    let Some(row) = rollout(tx, &p.id, true).await? else {
        return Ok(Decided::Rollback(Recorded::Moved));
    };
    if row.state != p.state {
        return Ok(Decided::Rollback(Recorded::Moved));
    }
    let wave = args![&p.id, p.wave, p.last_commit_ms];
    tx.execute(sql::ROLLOUT_SET_WAVE, &wave).await?;
    for m in &p.members {
        let member = args![&p.id, &m.agent, &m.state, m.given_ms, m.ended_ms, &m.error];
        tx.execute(sql::MEMBER_UPDATE, &member).await?;
    }
    if let Some(m) = &p.moved {
        move_on(tx, &row, m).await?;
    }
    Ok(Decided::Commit(Recorded::Written))
}

/// Moves `row` as `m` says, within the caller's transaction.
async fn move_on(tx: &mut impl Tx, row: &RolloutRow, m: &StateMove) -> Result<(), StoreError> {
    let fin = crate::proto::rollout::is_final(&m.to);
    let back = m.to == crate::proto::rollout::ROLLING_BACK;
    let update = args![
        &row.id,
        &m.to,
        &m.reason,
        fin.then_some(m.now_ms),
        back,
        m.failures_accepted,
    ];
    tx.execute(sql::ROLLOUT_UPDATE, &update).await?;
    if fin || back {
        let statement = format!(
            "UPDATE rollout_members SET state = 'skipped', ended_ms = $2
             WHERE rollout = $1 AND state IN ({})",
            unstarted(&m.to)
        );
        tx.execute(&statement, &args![&row.id, m.now_ms]).await?;
    }
    Ok(())
}

pub(crate) async fn record_fetch(tx: &mut impl Tx, f: &Fetch) -> Result<(), StoreError> {
    let fetch = args![&f.agent, &f.version, f.now_ms];
    tx.execute(sql::FETCH_PUT, &fetch).await.map(drop)
}

pub(crate) async fn fetches(
    tx: &mut impl Tx,
    version: &str,
) -> Result<Vec<(String, u64)>, StoreError> {
    let rows = tx.query(sql::VERSION_FETCHES, &args![version]).await?;
    rows.into_iter()
        .map(|mut r| Ok((r.text(0)?, r.u64(1)?)))
        .collect()
}

pub(crate) async fn take_lease(
    tx: &mut impl Tx,
    name: &str,
    holder: &str,
    now_ms: u64,
    until_ms: u64,
) -> Result<bool, StoreError> {
    let take = args![name, holder, until_ms, now_ms];
    Ok(tx.query_opt(sql::LEASE_TAKE, &take).await?.is_some())
}
