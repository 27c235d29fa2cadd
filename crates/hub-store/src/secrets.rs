//! Secrets as the hub's database keeps them: sealed (docs/security.md, "Secrets"). The
//! store sees a name, a version, a selector, who set it, and bytes it cannot read; the
//! key that opens them is a file beside the hub, never a row.
//!
//! Every change takes the `secret_seq` row first: its lock makes two hubs' changes take
//! turns, so that the check that all values are sealed under one key, and a version
//! compared before it is set, hold until commit.

use std::future::Future;

use super::StoreError;
use crate::exec::{args, next_seq, Decided, Param, Row, Tx};
use crate::sql;
pub(crate) use crate::sql::SECRET_COLUMNS as COLUMNS;

/// The migration that makes the secrets' table (portable SQL).
pub const MIGRATION: &str = "INSERT INTO meta (key, value) VALUES ('secret_seq', 0);
    CREATE TABLE job_secrets (
        name TEXT PRIMARY KEY,
        version BIGINT NOT NULL,
        selector TEXT,
        sealed BLOB NOT NULL,
        key_id TEXT NOT NULL,
        set_by TEXT NOT NULL,
        set_ms BIGINT NOT NULL
    );";

/// The counter whose row every change takes first (the module doc).
pub const TURN: &str = "secret_seq";
/// One secret, sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub name: String,
    pub version: u64,
    pub selector: Option<String>,
    /// Nonce and ciphertext (`hub::secrets::key`).
    pub sealed: Vec<u8>,
    /// The fingerprint of the key that sealed it.
    pub key_id: String,
    pub set_by: String,
    pub set_ms: u64,
}

/// How a compared write ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Put {
    Done,
    /// The secret's version was not the one compared (another hub set or removed it).
    Moved,
    /// Other secrets are sealed under another key: this one.
    OtherKey(String),
}

pub trait SecretStore: Send + Sync + 'static {
    /// Every secret, by name.
    fn secrets(&self) -> impl Future<Output = Result<Vec<SecretRow>, StoreError>> + Send;

    /// The secrets named, those that exist.
    fn secrets_named(
        &self,
        names: &[String],
    ) -> impl Future<Output = Result<Vec<SecretRow>, StoreError>> + Send;

    /// Writes `row` if the secret's version is still `previous` (`None`: it does not
    /// exist) and every secret, this one's older version too, is sealed under
    /// `row.key_id` (a hub that missed a rotation cannot seal under a key no file holds).
    fn put_secret(
        &self,
        row: &SecretRow,
        previous: Option<u64>,
    ) -> impl Future<Output = Result<Put, StoreError>> + Send;

    /// Removes a secret if it is still at `version`; that version, if it was.
    fn remove_secret(
        &self,
        name: &str,
        version: u64,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Replaces every secret's sealed value and key at once, if each is still at the
    /// version in `rows`, sealed under key `from`, and no other exists (a rotation).
    fn reseal_secrets(
        &self,
        rows: &[SecretRow],
        from: &str,
    ) -> impl Future<Output = Result<Put, StoreError>> + Send;
}

// The bodies both backends run (crate::exec): each backend's `SecretStore` only opens
// the transaction and runs one.

fn secret_row(mut r: Row) -> Result<SecretRow, StoreError> {
    Ok(SecretRow {
        name: r.text(0)?,
        version: r.u64(1)?,
        selector: r.opt_text(2)?,
        sealed: r.bytes(3)?,
        key_id: r.text(4)?,
        set_by: r.text(5)?,
        set_ms: r.u64(6)?,
    })
}

pub(crate) async fn all(tx: &mut impl Tx) -> Result<Vec<SecretRow>, StoreError> {
    let rows = tx.query(sql::SECRETS_ALL, &[]).await?;
    rows.into_iter().map(secret_row).collect()
}

/// By name: one statement for any number of names (`IN ($1, …)`, both dialects').
pub(crate) async fn named(
    tx: &mut impl Tx,
    names: &[String],
) -> Result<Vec<SecretRow>, StoreError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = (1..=names.len()).map(|i| format!("${i}")).collect();
    let statement = format!(
        "SELECT {COLUMNS} FROM job_secrets WHERE name IN ({}) ORDER BY name",
        list.join(", ")
    );
    let args: Vec<Param<'_>> = names.iter().map(Param::from).collect();
    let rows = tx.query(&statement, &args).await?;
    rows.into_iter().map(secret_row).collect()
}

pub(crate) async fn put(
    tx: &mut impl Tx,
    row: &SecretRow,
    previous: Option<u64>,
) -> Result<Decided<Put>, StoreError> {
    next_seq(tx, TURN).await?;
    if let Some(mut other) = tx
        .query_opt(sql::OTHER_SECRET_KEY, &args![&row.key_id])
        .await?
    {
        return Ok(Decided::Rollback(Put::OtherKey(other.text(0)?)));
    }
    let now = match tx.query_opt(sql::SECRET_VERSION, &args![&row.name]).await? {
        Some(mut r) => Some(r.u64(0)?),
        None => None,
    };
    if now != previous {
        return Ok(Decided::Rollback(Put::Moved));
    }
    let put = args![
        &row.name,
        row.version,
        &row.selector,
        &row.sealed,
        &row.key_id,
        &row.set_by,
        row.set_ms
    ];
    tx.execute(sql::SECRET_PUT, &put).await?;
    Ok(Decided::Commit(Put::Done))
}

pub(crate) async fn remove(
    tx: &mut impl Tx,
    name: &str,
    version: u64,
) -> Result<Decided<Option<u64>>, StoreError> {
    next_seq(tx, TURN).await?;
    let gone = match tx
        .query_opt(sql::SECRET_DELETE, &args![name, version])
        .await?
    {
        Some(mut r) => Some(r.u64(0)?),
        None => None,
    };
    Ok(Decided::Commit(gone))
}

pub(crate) async fn reseal(
    tx: &mut impl Tx,
    rows: &[SecretRow],
    from: &str,
) -> Result<Decided<Put>, StoreError> {
    next_seq(tx, TURN).await?;
    let count = match tx.query_opt(sql::SECRET_COUNT, &[]).await? {
        Some(mut r) => r.u64(0)?,
        None => 0,
    };
    if count != rows.len() as u64 {
        return Ok(Decided::Rollback(Put::Moved));
    }
    for row in rows {
        let reseal = args![&row.sealed, &row.key_id, &row.name, row.version, from];
        if tx.execute(sql::SECRET_RESEAL, &reseal).await? != 1 {
            // Not half a rotation: what was resealed before goes too.
            return Ok(Decided::Rollback(Put::Moved));
        }
    }
    Ok(Decided::Commit(Put::Done))
}
