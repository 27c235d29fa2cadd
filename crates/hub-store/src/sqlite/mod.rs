//! The embedded store: one SQLite file in the hub's data dir, WAL with
//! `synchronous=FULL`: a change the hub has answered for (an enrolment, a desired change)
//! survives a crash of the hub and a power cut. Reports come in batches (one transaction
//! a second at most), so the fsync per commit costs little.
//!
//! One connection behind a mutex, used from blocking threads: the hub's writes are few
//! and its reads come from memory.

mod access;
mod dump;
mod exec;
mod jobs;
mod rollouts;
mod secrets;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use self::exec::run_now;
use super::{Enrol, HaltRow, Labels, ReleaseRow, ReportRow, Snapshot, Store, StoreError};
use crate::encode;
use crate::fleet;
use crate::migrations::MIGRATIONS;
use crate::proto::hub::DesiredSettings;

pub struct SqliteStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Opens (creating and migrating) `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let name = path.display().to_string();
        let err = |source| StoreError::Sqlite {
            path: name.clone(),
            source,
        };
        let mut conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(err)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(err)?;
        if version > MIGRATIONS.len() as i64 {
            return Err(StoreError::NewerSchema {
                path: name,
                found: version,
                known: MIGRATIONS.len(),
            });
        }
        for (n, sql) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            let tx = conn.transaction().map_err(err)?;
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(None, "user_version", (n + 1) as i64)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(Self {
            path: path.to_owned(),
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection, on a blocking thread.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection, &str) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let conn = self.conn.clone();
        let name = self.path.display().to_string();
        tokio::task::spawn_blocking(move || f(&mut crate::util::lock(&conn), &name))
            .await
            .map_err(StoreError::Worker)?
    }
}

fn sql(path: &str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sqlite {
        path: path.to_owned(),
        source,
    }
}

/// The bodies of `crate::fleet`, run on the worker thread: reads on the one connection
/// (which is theirs alone meanwhile, so they see one state), changes in a transaction.
impl Store for SqliteStore {
    async fn load(&self) -> Result<Snapshot, StoreError> {
        self.plain(|t| run_now(fleet::load(t))).await
    }

    async fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
        reuse_revoked: bool,
    ) -> Result<Enrol, StoreError> {
        let (id, hash) = (id.to_owned(), token_sha256.to_owned());
        self.transact(move |t| run_now(fleet::enrol(t, &id, &hash, now, reuse_revoked)))
            .await
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<Option<u64>, StoreError> {
        let id = id.to_owned();
        self.transact(move |t| run_now(fleet::revoke(t, &id, now)))
            .await
    }

    async fn renumber(&self) -> Result<u64, StoreError> {
        self.transact(|t| run_now(fleet::renumber(t))).await
    }

    async fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        base: Option<&DesiredSettings>,
    ) -> Result<Result<u64, DesiredSettings>, StoreError> {
        let json = encode(
            &self.path.display().to_string(),
            "desired settings to store",
            settings,
        )?;
        let (scope, base) = (scope.to_owned(), base.cloned());
        self.transact(move |t| run_now(fleet::set_scope(t, &scope, &json, base.as_ref())))
            .await
    }

    async fn record_reports(&self, batch: Vec<ReportRow>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.transact(move |t| run_now(fleet::record_reports(t, batch)))
            .await
    }

    async fn put_release(&self, row: &ReleaseRow) -> Result<u64, StoreError> {
        let row = row.clone();
        self.transact(move |t| run_now(fleet::put_release(t, &row)))
            .await
    }

    async fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
    ) -> Result<Option<(u64, Labels)>, StoreError> {
        let (id, set, remove) = (id.to_owned(), set.clone(), remove.to_vec());
        self.transact(move |t| run_now(fleet::change_labels(t, &id, &set, &remove)))
            .await
    }

    async fn set_halt(&self, version: &str, halt: Option<&HaltRow>) -> Result<u64, StoreError> {
        let (version, halt) = (version.to_owned(), halt.cloned());
        self.transact(move |t| run_now(fleet::set_halt(t, &version, halt.as_ref())))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hub.db");
        drop(SqliteStore::open(&path).expect("open"));
        let conn = Connection::open(&path).expect("raw");
        conn.pragma_update(None, "user_version", 99).expect("bump");
        drop(conn);
        match SqliteStore::open(&path) {
            Err(StoreError::NewerSchema { found: 99, .. }) => {}
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a newer schema was accepted"),
        }
    }
}
