//! Access as the hub's database keeps it (docs/hub.md, "Access"): scoped admin tokens and
//! enrolment tokens (their SHA-256 only), the audit log, and agent token rotation.
//!
//! An enrolment is one transaction: the token's use is counted, the agent enrolled with
//! the token's labels, or nothing happens (a token past its uses, its expiry or revoked;
//! an id already enrolled). So no token enrols more hosts than it may, whichever replicas
//! the hosts reach.

use std::future::Future;

use super::StoreError;
use crate::exec::{args, bump_scope, next_seq, Decided, Row, Tx};
use crate::proto::labels::Labels;
use crate::sql;
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

// The bodies both backends run (crate::exec): each backend's `AccessStore` only opens
// the transaction and runs one. A change the other hubs must see (a new or revoked
// token) is told as the tokens' event; an enrolment and a rotation as the agent's.

pub(crate) fn admin_token_row(mut r: Row) -> Result<AdminTokenRow, StoreError> {
    Ok(AdminTokenRow {
        name: r.text(0)?,
        sha256: r.text(1)?,
        scopes: r.text(2)?,
        selector: r.opt_text(3)?,
        created_ms: r.u64(4)?,
        expires_ms: r.opt_u64(5)?,
        revoked_ms: r.opt_u64(6)?,
    })
}

pub(crate) fn enrol_row(mut r: Row) -> Result<EnrolTokenRow, StoreError> {
    let id = r.text(0)?;
    let labels = r.text(4)?;
    let labels = crate::parse_labels(&r.store, &id, &labels)?;
    Ok(EnrolTokenRow {
        sha256: r.text(1)?,
        max_uses: r.opt_u64(2)?,
        uses: r.u64(3)?,
        labels,
        created_ms: r.u64(5)?,
        expires_ms: r.opt_u64(6)?,
        revoked_ms: r.opt_u64(7)?,
        id,
    })
}

fn audit_row(mut r: Row) -> Result<AuditRow, StoreError> {
    Ok(AuditRow {
        seq: r.u64(0)?,
        at_ms: r.u64(1)?,
        token: r.text(2)?,
        peer: r.text(3)?,
        action: r.text(4)?,
        target: r.text(5)?,
        outcome: r.text(6)?,
        count: r.u64(7)?,
    })
}

pub(crate) async fn create_admin_token(
    tx: &mut impl Tx,
    row: &AdminTokenRow,
) -> Result<Decided<bool>, StoreError> {
    let insert = args![
        &row.name,
        &row.sha256,
        &row.scopes,
        &row.selector,
        row.created_ms,
        row.expires_ms
    ];
    if tx.execute(sql::ADMIN_TOKEN_INSERT, &insert).await? == 0 {
        return Ok(Decided::Rollback(false));
    }
    tx.tell('t', None, "");
    Ok(Decided::Commit(true))
}

pub(crate) async fn admin_tokens(tx: &mut impl Tx) -> Result<Vec<AdminTokenRow>, StoreError> {
    let rows = tx.query(sql::ADMIN_TOKENS_ALL, &[]).await?;
    rows.into_iter().map(admin_token_row).collect()
}

/// Revokes the row of `table` whose `key` is `value` at `now_ms` (a second revocation
/// keeps the first time): the row as it then is, with `columns`, if there is one. The
/// caller decodes it after the commit: a token is revoked even when its row no longer
/// decodes, and the error that says so comes after.
pub(crate) async fn revoke(
    tx: &mut impl Tx,
    table: &str,
    key: &str,
    columns: &str,
    value: &str,
    now_ms: u64,
) -> Result<Decided<Option<Row>>, StoreError> {
    let statement = format!(
        "UPDATE {table} SET revoked_ms = COALESCE(revoked_ms, $2) WHERE {key} = $1
         RETURNING {columns}"
    );
    let row = tx.query_opt(&statement, &args![value, now_ms]).await?;
    tx.tell('t', None, "");
    Ok(Decided::Commit(row))
}

pub(crate) async fn create_enrol_token(
    tx: &mut impl Tx,
    row: &EnrolTokenRow,
) -> Result<Decided<EnrolTokenRow>, StoreError> {
    let labels = crate::encode(tx.name(), "an enrolment token's labels", &row.labels)?;
    let seq = next_seq(tx, "enrol_token_seq").await?;
    let stored = EnrolTokenRow {
        id: format!("et{seq}"),
        ..row.clone()
    };
    let insert = args![
        &stored.id,
        &stored.sha256,
        stored.max_uses,
        &labels,
        stored.created_ms,
        stored.expires_ms
    ];
    tx.execute(sql::ENROL_TOKEN_INSERT, &insert).await?;
    tx.tell('t', None, "");
    Ok(Decided::Commit(stored))
}

pub(crate) async fn enrol_tokens(tx: &mut impl Tx) -> Result<Vec<EnrolTokenRow>, StoreError> {
    let rows = tx.query(sql::ENROL_TOKENS_ALL, &[]).await?;
    rows.into_iter().map(enrol_row).collect()
}

pub(crate) async fn self_enrol(
    tx: &mut impl Tx,
    en: &Enrolment,
    agent_sha256: &str,
) -> Result<Decided<Enrolled>, StoreError> {
    // The token's row locked where other hubs write: two hosts enrolling with its last
    // use take turns.
    let lock = if tx.shared() { " FOR UPDATE" } else { "" };
    let statement =
        format!("SELECT {ENROL_TOKEN_COLUMNS} FROM enrol_tokens WHERE sha256 = $1{lock}");
    let token = tx.query_opt(&statement, &args![&en.token_sha256]).await?;
    let Some(token) = token.map(enrol_row).transpose()? else {
        return Ok(Decided::Rollback(Enrolled::UnknownToken));
    };
    if let Some(why) = token.refusal(en.now_ms, None) {
        return Ok(Decided::Rollback(Enrolled::Refused { via: token.id, why }));
    }
    let existing = tx.locking(sql::AGENT_ENROLMENT, sql::AGENT_ENROLMENT_LOCKED);
    let mut again = false;
    if let Some(mut row) = tx.query_opt(existing, &args![&en.id]).await? {
        if let Some(revoked) = row.opt_u64(0)? {
            return Ok(Decided::Rollback(Enrolled::Retired {
                revoked_ms: revoked.saturating_mul(1000),
            }));
        }
        // The same token's enrolment of an agent never seen: its answer was lost on the
        // way, and the host asks again.
        again = row.opt_u64(4)?.is_none() && row.opt_text(5)?.as_deref() == Some(token.id.as_str());
        if !again {
            return Ok(Decided::Rollback(Enrolled::Taken {
                enrolled_ms: row.u64(1)?.saturating_mul(1000),
                peer: row.opt_text(2)?,
                host: row.opt_text(3)?,
            }));
        }
    }
    if let Some(why) = token.refusal(en.now_ms, Some(again)) {
        return Ok(Decided::Rollback(Enrolled::Refused { via: token.id, why }));
    }
    let labels = crate::encode(tx.name(), "an enrolment token's labels", &token.labels)?;
    let enrol = args![
        &en.id,
        agent_sha256,
        en.now_ms / 1000,
        &labels,
        en.now_ms,
        &token.id,
        &en.peer,
        &en.host,
        again,
    ];
    if tx.execute(sql::AGENT_ENROL, &enrol).await? == 0 {
        // Enrolled by another hub between the two statements: nothing changes.
        return Ok(Decided::Rollback(Enrolled::Taken {
            enrolled_ms: en.now_ms,
            peer: None,
            host: None,
        }));
    }
    if !again {
        tx.execute(sql::ENROL_TOKEN_USE, &args![&token.id]).await?;
    }
    let generation = bump_scope(tx, &en.id).await?;
    tx.tell('a', Some(generation), &en.id);
    Ok(Decided::Commit(Enrolled::Done {
        generation,
        via: token.id,
        labels: token.labels,
    }))
}

pub(crate) async fn append_audit(
    tx: &mut impl Tx,
    row: &AuditRow,
) -> Result<Decided<u64>, StoreError> {
    let seq = next_seq(tx, "audit_seq").await?;
    let insert = args![
        seq,
        row.at_ms,
        &row.token,
        &row.peer,
        &row.action,
        &row.target,
        &row.outcome,
        row.count.max(1)
    ];
    tx.execute(sql::AUDIT_INSERT, &insert).await?;
    Ok(Decided::Commit(crate::u64_of(seq)))
}

pub(crate) async fn add_audit_count(tx: &mut impl Tx, seq: u64, n: u64) -> Result<(), StoreError> {
    tx.execute(sql::AUDIT_ADD_COUNT, &args![seq, n])
        .await
        .map(drop)
}

/// The lines since `since_ms` (of `token` only, if given), the newest `limit`, oldest first.
pub(crate) async fn audit(
    tx: &mut impl Tx,
    since_ms: u64,
    token: Option<&str>,
    limit: usize,
) -> Result<Vec<AuditRow>, StoreError> {
    let page = [
        since_ms.into(),
        crate::exec::Param::Text(token),
        limit.into(),
    ];
    let rows = tx.query(sql::AUDIT_PAGE, &page).await?;
    let mut rows = rows
        .into_iter()
        .map(audit_row)
        .collect::<Result<Vec<_>, _>>()?;
    rows.reverse();
    Ok(rows)
}

pub(crate) async fn prune_audit(tx: &mut impl Tx, before_ms: u64) -> Result<usize, StoreError> {
    let n = tx.execute(sql::AUDIT_PRUNE, &args![before_ms]).await?;
    Ok(n as usize)
}

pub(crate) async fn ask_rotation(
    tx: &mut impl Tx,
    ids: Option<&[String]>,
) -> Result<Decided<Vec<(String, u64)>>, StoreError> {
    let all: Vec<String> = match ids {
        Some(ids) => ids.to_vec(),
        None => tx
            .query(sql::LIVE_AGENT_IDS, &[])
            .await?
            .into_iter()
            .map(|mut r| r.text(0))
            .collect::<Result<_, _>>()?,
    };
    let mut asked = Vec::new();
    for id in all {
        if tx.execute(sql::AGENT_ASK_ROTATION, &args![&id]).await? == 1 {
            let generation = bump_scope(tx, &id).await?;
            tx.tell('a', Some(generation), &id);
            asked.push((id, generation));
        }
    }
    Ok(Decided::Commit(asked))
}

pub(crate) async fn set_next_token(
    tx: &mut impl Tx,
    id: &str,
    next: &str,
) -> Result<(), StoreError> {
    tx.execute(sql::AGENT_SET_NEXT_TOKEN, &args![id, next])
        .await
        .map(drop)
}

/// The agent's next token becomes its token. Where other hubs are, the agent's scope
/// moves, so that they load it and refuse its old token too.
pub(crate) async fn promote_token(
    tx: &mut impl Tx,
    id: &str,
    next: &str,
    now_ms: u64,
) -> Result<Decided<bool>, StoreError> {
    if tx
        .execute(sql::AGENT_ROTATE, &args![id, next, now_ms])
        .await?
        == 0
    {
        return Ok(Decided::Rollback(false));
    }
    if tx.shared() {
        let generation = bump_scope(tx, id).await?;
        tx.tell('a', Some(generation), id);
    }
    Ok(Decided::Commit(true))
}
