//! Secrets as the hub's database keeps them: sealed (docs/security.md, "Secrets"). The
//! store sees a name, a version, a selector, who set it, and bytes it cannot read; the
//! key that opens them is a file beside the hub, never a row.
//!
//! Every change takes the `secret_seq` row first: its lock makes two hubs' changes take
//! turns, so that the check that all values are sealed under one key, and a version
//! compared before it is set, hold until commit.

use std::future::Future;

use super::StoreError;
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
