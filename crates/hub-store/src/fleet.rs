//! The fleet as the hub's database keeps it: enrolled agents, the desired settings of
//! each scope, releases and halts, and the generation counter that numbers every change
//! to them. The bodies both backends run (crate::exec); each backend's [`crate::Store`]
//! only opens the transaction and runs one.
//!
//! Lock order where other hubs write too: a change that decides on what it reads (settings
//! compared with a base) takes the generation counter's row first, so that what it read
//! holds until it commits; a change to one agent's row takes that row, then the counter's.
//! No change takes two agents' rows, and jobs' rows are another table: two hubs' changes
//! take turns rather than deadlock.

use std::sync::LazyLock;

use crate::exec::{args, bump_scope, filled, next_generation, Decided, Lock, Param, Row, Tx};
use crate::jobs;
use crate::proto::hub::DesiredSettings;
use crate::{
    parse_labels, parse_settings, sql, AgentRow, AgentSnapshot, Enrol, FleetSnapshot, HaltRow,
    Labels, ReleaseRow, ReportRow, ScopeRow, Snapshot, StoreError,
};

/// What [`crate::Store::renumber`] runs.
const RENUMBER: [&str; 4] = [
    "UPDATE meta SET value = 1 WHERE key = 'generation'",
    "UPDATE desired SET generation = 1",
    "UPDATE agents SET observed_generation = 9223372036854775807",
    // Numbers of the same counter: kept, they would stay ahead of every later change,
    // which could then never move them. An agent's echo of an old one is ahead of the
    // hub's 0, and is answered at once.
    "UPDATE agent_jobs SET version = 0",
];

fn agent_row(mut r: Row) -> Result<AgentRow, StoreError> {
    Ok(AgentRow {
        id: r.text(0)?,
        token_sha256: r.text(1)?,
        enrolled_at: r.u64(2)?,
        revoked_at: r.opt_u64(3)?,
        last_seen: r.opt_u64(4)?,
        observed_generation: r.u64(5)?,
        report: r.opt_text(6)?,
        labels: r.text(7)?,
        next_token_sha256: r.opt_text(8)?,
        rotate_asked: r.int(9)? != 0,
        token_issued_ms: r.opt_u64(10)?,
        jobs_version: r.u64(11)?,
    })
}

fn scope_row(mut r: Row) -> Result<ScopeRow, StoreError> {
    let scope = r.text(0)?;
    let settings = r.text(2)?;
    let settings = parse_settings(&r.store, &scope, Some(&settings))?;
    Ok(ScopeRow {
        generation: r.u64(1)?,
        scope,
        settings,
    })
}

fn release_row(mut r: Row) -> Result<ReleaseRow, StoreError> {
    Ok(ReleaseRow {
        version: r.text(0)?,
        os: r.text(1)?,
        arch: r.text(2)?,
        size: r.u64(3)?,
        sha256: r.text(4)?,
        signature: r.text(5)?,
        key_id: r.text(6)?,
        published_at: r.u64(7)?,
    })
}

fn halt_row(mut r: Row) -> Result<HaltRow, StoreError> {
    Ok(HaltRow {
        version: r.text(0)?,
        agent: r.text(1)?,
        reason: r.text(2)?,
        halted_at: r.u64(3)?,
    })
}

async fn rows<T>(
    tx: &mut impl Tx,
    statement: &str,
    args: &[Param<'_>],
    decode: impl Fn(Row) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    tx.query(statement, args)
        .await?
        .into_iter()
        .map(decode)
        .collect()
}

/// The last generation handed out.
pub(crate) async fn generation(tx: &mut impl Tx) -> Result<u64, StoreError> {
    match tx.query_opt(sql::GENERATION, &[]).await? {
        Some(mut row) => row.u64(0),
        None => Err(StoreError::Missing {
            store: tx.name().to_owned(),
            what: "the generation counter".into(),
        }),
    }
}

pub(crate) async fn agents(tx: &mut impl Tx) -> Result<Vec<AgentRow>, StoreError> {
    rows(tx, sql::AGENTS_ALL, &[], agent_row).await
}

async fn scope(tx: &mut impl Tx, scope: &str) -> Result<Option<ScopeRow>, StoreError> {
    let row = tx.query_opt(sql::DESIRED_OF_SCOPE, &args![scope]).await?;
    row.map(scope_row).transpose()
}

pub(crate) async fn fleet(tx: &mut impl Tx) -> Result<FleetSnapshot, StoreError> {
    Ok(FleetSnapshot {
        generation: generation(tx).await?,
        scope: scope(tx, "").await?,
        releases: rows(tx, sql::RELEASES_ALL, &[], release_row).await?,
        halts: rows(tx, sql::HALTS_ALL, &[], halt_row).await?,
    })
}

/// Everything the hub loads at start; the caller gives it one snapshot to read.
pub(crate) async fn load(tx: &mut impl Tx) -> Result<Snapshot, StoreError> {
    let fleet = fleet(tx).await?;
    Ok(Snapshot {
        agents: agents(tx).await?,
        scopes: rows(tx, sql::DESIRED_ALL, &[], scope_row).await?,
        open_jobs: jobs::select(tx, sql::OPEN_JOBS, &[]).await?,
        generation: fleet.generation,
        releases: fleet.releases,
        halts: fleet.halts,
    })
}

/// One agent with its own settings and open jobs; the caller gives it one snapshot.
pub(crate) async fn agent(tx: &mut impl Tx, id: &str) -> Result<Option<AgentSnapshot>, StoreError> {
    let Some(agent) = tx.query_opt(sql::AGENT_BY_ID, &args![id]).await? else {
        return Ok(None);
    };
    Ok(Some(AgentSnapshot {
        agent: agent_row(agent)?,
        scope: scope(tx, id).await?,
        open_jobs: jobs::select(tx, sql::AGENT_OPEN_JOB_ROWS, &args![id]).await?,
    }))
}

/// A change to `scope` that moves it: its generation is bumped, the other hubs told.
async fn moved(tx: &mut impl Tx, scope: &str) -> Result<u64, StoreError> {
    let generation = bump_scope(tx, scope).await?;
    let kind = if scope.is_empty() { 'f' } else { 'a' };
    tx.tell(kind, Some(generation), scope);
    Ok(generation)
}

pub(crate) async fn enrol(
    tx: &mut impl Tx,
    id: &str,
    token_sha256: &str,
    now: u64,
    reuse_revoked: bool,
) -> Result<Decided<Enrol>, StoreError> {
    let read = tx.locking(sql::AGENT_REVOKED_AT, sql::AGENT_REVOKED_AT_LOCKED);
    if let Some(mut row) = tx.query_opt(read, &args![id]).await? {
        if row.opt_u64(0)?.is_none() {
            return Ok(Decided::Rollback(Enrol::Exists));
        }
        if !reuse_revoked {
            return Ok(Decided::Rollback(Enrol::Revoked));
        }
        // A new agent under the id: none of the old one's own settings.
        tx.execute(sql::DESIRED_CLEAR, &args![id]).await?;
    }
    // Two hubs enrolling one id at once: the second waits on the first's row and finds
    // it enrolled.
    if tx
        .execute(sql::AGENT_ADD, &args![id, token_sha256, now])
        .await?
        == 0
    {
        return Ok(Decided::Rollback(Enrol::Exists));
    }
    Ok(Decided::Commit(Enrol::Done(moved(tx, id).await?)))
}

pub(crate) async fn revoke(
    tx: &mut impl Tx,
    id: &str,
    now: u64,
) -> Result<Decided<Option<u64>>, StoreError> {
    if tx.execute(sql::AGENT_REVOKE, &args![id, now]).await? == 0 {
        return Ok(Decided::Rollback(None));
    }
    Ok(Decided::Commit(Some(moved(tx, id).await?)))
}

/// Starts the generations over; only with no hub on the database. The last generation
/// handed out before.
pub(crate) async fn renumber(tx: &mut impl Tx) -> Result<Decided<u64>, StoreError> {
    if !tx.try_lock(Lock::NoHub).await? {
        return Err(StoreError::HubsRunning(tx.name().to_owned()));
    }
    let was = match tx
        .query_opt(tx.locking(sql::GENERATION, sql::GENERATION_LOCKED), &[])
        .await?
    {
        Some(mut row) => row.u64(0)?,
        None => 0,
    };
    for statement in RENUMBER {
        tx.execute(statement, &[]).await?;
    }
    Ok(Decided::Commit(was))
}

/// Stores `json` as `scope`'s settings if they are still `base` (when given); else the
/// stored ones, nothing changed.
pub(crate) async fn set_scope(
    tx: &mut impl Tx,
    scope: &str,
    json: &str,
    base: Option<&DesiredSettings>,
) -> Result<Decided<Result<u64, DesiredSettings>>, StoreError> {
    // The counter's row first: the lock order (module doc).
    let generation = next_generation(tx).await?;
    if let Some(base) = base {
        let read = tx.locking(sql::DESIRED_SETTINGS, sql::DESIRED_SETTINGS_LOCKED);
        let stored = match tx.query_opt(read, &args![scope]).await? {
            Some(mut row) => Some(row.text(0)?),
            None => None,
        };
        let stored = parse_settings(tx.name(), scope, stored.as_deref())?;
        if stored != *base {
            // Rolled back: the counter does not move.
            return Ok(Decided::Rollback(Err(stored)));
        }
    }
    tx.execute(sql::DESIRED_PUT, &args![scope, generation, json])
        .await?;
    let kind = if scope.is_empty() { 'f' } else { 'a' };
    tx.tell(kind, Some(generation), scope);
    Ok(Decided::Commit(Ok(generation)))
}

/// Reports one statement writes ([`filled`]: one prepared statement serves any batch).
const REPORTS_AT_ONCE: usize = 64;

/// Each agent's report, unless a newer one is stored (another hub wrote it): in id
/// order, as every hub locks the rows, [`REPORTS_AT_ONCE`] rows a statement.
static REPORTS_PUT: LazyLock<String> = LazyLock::new(|| {
    let rows: Vec<String> = (0..REPORTS_AT_ONCE)
        .map(|i| {
            let n = 4 * i;
            if i == 0 {
                // The first row types the columns; PostgreSQL types the rest from it.
                "(CAST($1 AS TEXT), CAST($2 AS BIGINT), CAST($3 AS BIGINT), CAST($4 AS TEXT))"
                    .to_owned()
            } else {
                format!("(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4)
            }
        })
        .collect();
    format!(
        "UPDATE agents SET last_seen = b.column2, observed_generation = b.column3,
             report = b.column4
         FROM (VALUES {}) AS b
         WHERE agents.id = b.column1
             AND (agents.last_seen IS NULL OR agents.last_seen <= b.column2)",
        rows.join(", ")
    )
});

pub(crate) async fn record_reports(
    tx: &mut impl Tx,
    mut batch: Vec<ReportRow>,
) -> Result<Decided<()>, StoreError> {
    batch.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    for chunk in batch.chunks(REPORTS_AT_ONCE) {
        let mut params = Vec::with_capacity(4 * REPORTS_AT_ONCE);
        for r in filled(chunk, REPORTS_AT_ONCE) {
            params.extend(args![&r.id, r.seen_at, r.observed_generation, &r.report]);
        }
        tx.execute(&REPORTS_PUT, &params).await?;
    }
    Ok(Decided::Commit(()))
}

pub(crate) async fn put_release(
    tx: &mut impl Tx,
    r: &ReleaseRow,
) -> Result<Decided<u64>, StoreError> {
    let generation = moved(tx, "").await?;
    tx.execute(
        sql::RELEASE_PUT,
        &args![
            &r.version,
            &r.os,
            &r.arch,
            r.size,
            &r.sha256,
            &r.signature,
            &r.key_id,
            r.published_at,
        ],
    )
    .await?;
    Ok(Decided::Commit(generation))
}

pub(crate) async fn change_labels(
    tx: &mut impl Tx,
    id: &str,
    set: &Labels,
    remove: &[String],
) -> Result<Decided<Option<(u64, Labels)>>, StoreError> {
    // The row locked where other hubs write: another's change to these labels waits,
    // then merges into this one's result.
    let read = tx.locking(sql::AGENT_LABELS, sql::AGENT_LABELS_LOCKED);
    let Some(mut row) = tx.query_opt(read, &args![id]).await? else {
        return Ok(Decided::Rollback(None));
    };
    let mut labels = parse_labels(tx.name(), id, &row.text(0)?)?;
    for k in remove {
        labels.remove(k);
    }
    labels.extend(set.iter().map(|(k, v)| (k.clone(), v.clone())));
    let json = crate::encode(tx.name(), &format!("the labels of agent {id:?}"), &labels)?;
    tx.execute(sql::AGENT_SET_LABELS, &args![id, json.as_str()])
        .await?;
    let generation = moved(tx, id).await?;
    Ok(Decided::Commit(Some((generation, labels))))
}

pub(crate) async fn set_halt(
    tx: &mut impl Tx,
    version: &str,
    halt: Option<&HaltRow>,
) -> Result<Decided<u64>, StoreError> {
    let generation = moved(tx, "").await?;
    match halt {
        Some(h) => {
            let put = args![version, &h.agent, &h.reason, h.halted_at];
            tx.execute(sql::HALT_PUT, &put).await?
        }
        None => tx.execute(sql::HALT_DELETE, &args![version]).await?,
    };
    Ok(Decided::Commit(generation))
}
