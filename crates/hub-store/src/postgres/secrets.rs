//! Sealed secrets, in PostgreSQL: the bodies of `crate::secrets`, each change behind the
//! `secret_seq` row's lock (that module's doc).

use super::PgStore;
use crate::secrets::{self, Put, SecretRow, SecretStore};
use crate::StoreError;

impl SecretStore for PgStore {
    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        self.plain(async |t| secrets::all(t).await).await
    }

    async fn secrets_named(&self, names: &[String]) -> Result<Vec<SecretRow>, StoreError> {
        self.plain(async |t| secrets::named(t, names).await).await
    }

    async fn put_secret(&self, row: &SecretRow, previous: Option<u64>) -> Result<Put, StoreError> {
        self.transact(async |t| secrets::put(t, row, previous).await)
            .await
    }

    async fn remove_secret(&self, name: &str, version: u64) -> Result<Option<u64>, StoreError> {
        self.transact(async |t| secrets::remove(t, name, version).await)
            .await
    }

    async fn reseal_secrets(&self, rows: &[SecretRow], from: &str) -> Result<Put, StoreError> {
        self.transact(async |t| secrets::reseal(t, rows, from).await)
            .await
    }
}
