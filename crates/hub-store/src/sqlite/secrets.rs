//! Sealed secrets, in SQLite: the bodies of `crate::secrets`, run on the worker thread.

use super::exec::run_now;
use super::SqliteStore;
use crate::secrets::{self, Put, SecretRow, SecretStore};
use crate::StoreError;

impl SecretStore for SqliteStore {
    async fn secrets(&self) -> Result<Vec<SecretRow>, StoreError> {
        self.plain(|t| run_now(secrets::all(t))).await
    }

    async fn secrets_named(&self, names: &[String]) -> Result<Vec<SecretRow>, StoreError> {
        let names = names.to_vec();
        self.plain(move |t| run_now(secrets::named(t, &names)))
            .await
    }

    async fn put_secret(&self, row: &SecretRow, previous: Option<u64>) -> Result<Put, StoreError> {
        let row = row.clone();
        self.transact(move |t| run_now(secrets::put(t, &row, previous)))
            .await
    }

    async fn remove_secret(&self, name: &str, version: u64) -> Result<Option<u64>, StoreError> {
        let name = name.to_owned();
        self.transact(move |t| run_now(secrets::remove(t, &name, version)))
            .await
    }

    async fn reseal_secrets(&self, rows: &[SecretRow], from: &str) -> Result<Put, StoreError> {
        let (rows, from) = (rows.to_vec(), from.to_owned());
        self.transact(move |t| run_now(secrets::reseal(t, &rows, &from)))
            .await
    }
}
