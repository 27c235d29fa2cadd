//! The embedded store: one SQLite file in the hub's data dir, WAL with
//! `synchronous=FULL`: a change the hub has answered for (an enrolment, a desired change)
//! survives a crash of the hub and a power cut. Reports come in batches (one transaction
//! a second at most), so the fsync per commit costs little.
//!
//! One connection behind a mutex, used from blocking threads: the hub's writes are few
//! and its reads come from memory.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension};

use super::{AgentRow, ReportRow, ScopeRow, Snapshot, Store, StoreError};
use crate::proto::hub::DesiredSettings;

/// Schema migrations, applied in order; `user_version` records how many ran. Portable
/// SQL: the same statements run on PostgreSQL.
const MIGRATIONS: &[&str] = &["CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value BIGINT NOT NULL
    );
    INSERT INTO meta (key, value) VALUES ('generation', 0);
    CREATE TABLE agents (
        id TEXT PRIMARY KEY,
        token_sha256 TEXT NOT NULL,
        enrolled_at BIGINT NOT NULL,
        revoked_at BIGINT,
        last_seen BIGINT,
        observed_generation BIGINT NOT NULL DEFAULT 0,
        report TEXT
    );
    CREATE TABLE desired (
        scope TEXT PRIMARY KEY,
        generation BIGINT NOT NULL,
        settings TEXT NOT NULL
    );"];

/// Takes the next generation, above `past`.
const NEXT_GENERATION: &str =
    "UPDATE meta SET value = CASE WHEN value > ?1 THEN value + 1 ELSE ?1 + 1 END
     WHERE key = 'generation' RETURNING value";

pub(crate) struct SqliteStore {
    path: PathBuf,
    conn: Arc<Mutex<Connection>>,
}

impl SqliteStore {
    /// Opens (creating and migrating) `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, StoreError> {
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

fn next_generation(tx: &rusqlite::Transaction<'_>, past: u64) -> rusqlite::Result<u64> {
    let g: i64 = tx.query_row(NEXT_GENERATION, params![past as i64], |r| r.get(0))?;
    Ok(g as u64)
}

fn opt_u64(v: Option<i64>) -> Option<u64> {
    v.map(|n| n.max(0) as u64)
}

impl Store for SqliteStore {
    async fn load(&self) -> Result<Snapshot, StoreError> {
        self.with(|conn, path| {
            let e = sql(path);
            let generation: i64 = conn
                .query_row("SELECT value FROM meta WHERE key = 'generation'", [], |r| {
                    r.get(0)
                })
                .map_err(&e)?;
            let mut stmt = conn
                .prepare(
                    "SELECT id, token_sha256, enrolled_at, revoked_at, last_seen, observed_generation, report
                     FROM agents ORDER BY id",
                )
                .map_err(&e)?;
            let agents = stmt
                .query_map([], |r| {
                    Ok(AgentRow {
                        id: r.get(0)?,
                        token_sha256: r.get(1)?,
                        enrolled_at: r.get::<_, i64>(2)?.max(0) as u64,
                        revoked_at: opt_u64(r.get(3)?),
                        last_seen: opt_u64(r.get(4)?),
                        observed_generation: r.get::<_, i64>(5)?.max(0) as u64,
                        report: r.get(6)?,
                    })
                })
                .map_err(&e)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&e)?;
            let mut stmt = conn
                .prepare("SELECT scope, generation, settings FROM desired ORDER BY scope")
                .map_err(&e)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .map_err(&e)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&e)?;
            let mut scopes = Vec::with_capacity(rows.len());
            for (scope, generation, settings) in rows {
                let settings = serde_json::from_str(&settings).map_err(|source| {
                    StoreError::Corrupt {
                        path: path.to_owned(),
                        what: format!("desired settings of scope {scope:?}"),
                        source,
                    }
                })?;
                scopes.push(ScopeRow {
                    scope,
                    generation: generation.max(0) as u64,
                    settings,
                });
            }
            Ok(Snapshot {
                agents,
                scopes,
                generation: generation.max(0) as u64,
            })
        })
        .await
    }

    async fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
    ) -> Result<Option<u64>, StoreError> {
        let (id, hash) = (id.to_owned(), token_sha256.to_owned());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let existing: Option<Option<i64>> = tx
                .query_row(
                    "SELECT revoked_at FROM agents WHERE id = ?1",
                    params![id],
                    |r| r.get(0),
                )
                .optional()
                .map_err(&e)?;
            if matches!(existing, Some(None)) {
                return Ok(None);
            }
            tx.execute(
                "INSERT INTO agents (id, token_sha256, enrolled_at, observed_generation)
                 VALUES (?1, ?2, ?3, 0)
                 ON CONFLICT (id) DO UPDATE SET token_sha256 = excluded.token_sha256,
                     enrolled_at = excluded.enrolled_at, revoked_at = NULL",
                params![id, hash, now as i64],
            )
            .map_err(&e)?;
            let generation = next_generation(&tx, 0).map_err(&e)?;
            tx.execute(
                "INSERT INTO desired (scope, generation, settings) VALUES (?1, ?2, '{}')
                 ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation",
                params![id, generation as i64],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(Some(generation))
        })
        .await
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            let n = conn
                .execute(
                    "UPDATE agents SET revoked_at = ?2 WHERE id = ?1",
                    params![id, now as i64],
                )
                .map_err(sql(path))?;
            Ok(n > 0)
        })
        .await
    }

    async fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        past: u64,
    ) -> Result<u64, StoreError> {
        let scope = scope.to_owned();
        let json = serde_json::to_string(settings).map_err(|source| StoreError::Corrupt {
            path: self.path.display().to_string(),
            what: "desired settings to store".into(),
            source,
        })?;
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let generation = next_generation(&tx, past).map_err(&e)?;
            tx.execute(
                "INSERT INTO desired (scope, generation, settings) VALUES (?1, ?2, ?3)
                 ON CONFLICT (scope) DO UPDATE SET generation = excluded.generation,
                     settings = excluded.settings",
                params![scope, generation as i64, json],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(generation)
        })
        .await
    }

    async fn record_reports(&self, batch: Vec<ReportRow>) -> Result<(), StoreError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            {
                let mut stmt = tx
                    .prepare_cached(
                        "UPDATE agents SET last_seen = ?2, observed_generation = ?3, report = ?4
                         WHERE id = ?1",
                    )
                    .map_err(&e)?;
                for r in &batch {
                    stmt.execute(params![
                        r.id,
                        r.seen_at as i64,
                        r.observed_generation as i64,
                        r.report
                    ])
                    .map_err(&e)?;
                }
            }
            tx.commit().map_err(&e)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(max_jobs: usize) -> DesiredSettings {
        DesiredSettings {
            max_jobs: Some(max_jobs),
            ..DesiredSettings::default()
        }
    }

    #[tokio::test]
    async fn what_is_stored_is_loaded_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hub.db");
        let store = SqliteStore::open(&path).expect("open");
        let g1 = store.enrol("a", "hash-a", 100).await.expect("enrol");
        assert_eq!(g1, Some(1));
        assert_eq!(store.enrol("a", "other", 101).await.expect("again"), None);
        let g2 = store.set_scope("", &settings(4), 0).await.expect("fleet");
        assert_eq!(g2, 2);
        // Past a generation an agent reported: the counter jumps over it.
        let g3 = store.set_scope("a", &settings(1), 40).await.expect("agent");
        assert_eq!(g3, 41);
        store
            .record_reports(vec![ReportRow {
                id: "a".into(),
                seen_at: 200,
                observed_generation: 41,
                report: "{}".into(),
            }])
            .await
            .expect("reports");
        assert!(store.revoke("a", 300).await.expect("revoke"));
        assert!(!store.revoke("nobody", 300).await.expect("revoke"));
        drop(store);

        let store = SqliteStore::open(&path).expect("reopen");
        let snap = store.load().await.expect("load");
        assert_eq!(snap.generation, 41);
        assert_eq!(snap.agents.len(), 1);
        let a = &snap.agents[0];
        assert_eq!(
            (a.revoked_at, a.last_seen, a.observed_generation),
            (Some(300), Some(200), 41)
        );
        assert_eq!(a.token_sha256, "hash-a");
        assert_eq!(snap.scopes.len(), 2);
        assert_eq!(snap.scopes[0].scope, "");
        assert_eq!(snap.scopes[0].settings, settings(4));
        assert_eq!(snap.scopes[1].generation, 41);
        // A revoked agent re-enrols with a new token and a new generation.
        let g = store.enrol("a", "hash-b", 400).await.expect("re-enrol");
        assert_eq!(g, Some(42));
    }

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
