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

use rusqlite::{params, Connection, OptionalExtension};

use super::{
    merge_labels, plan_append, AgentRow, AppendPlan, Appended, Assigned, Assignment, Enrol,
    HaltRow, JobFilter, JobProgress, JobRow, JobStore, Labels, ReleaseRow, ReportRow, ScopeRow,
    Snapshot, Store, StoreError, Stream,
};
use crate::migrations::MIGRATIONS;
use crate::parse_settings;
use crate::proto::desired::MAX_GENERATION;
use crate::proto::hub::DesiredSettings;
use crate::sql::{self, lite};

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

fn next_generation(tx: &rusqlite::Transaction<'_>, path: &str) -> Result<u64, StoreError> {
    let g: Option<i64> = tx
        .query_row(
            &lite(sql::GENERATION_NEXT),
            params![MAX_GENERATION as i64],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql(path))?;
    g.map(u64_of)
        .ok_or_else(|| StoreError::GenerationsExhausted(path.to_owned()))
}

use crate::{encode, opt_u64, u64_of};

/// The next number of the counter `key` in `meta` (jobs, rollouts, enrolment tokens,
/// audit lines).
fn next_seq(tx: &rusqlite::Transaction<'_>, key: &str, path: &str) -> Result<i64, StoreError> {
    tx.query_row(&lite(sql::SEQ_NEXT), params![key], |r| r.get(0))
        .map_err(sql(path))
}

/// Gives `scope` the next generation.
fn bump_scope(tx: &rusqlite::Transaction<'_>, scope: &str, path: &str) -> Result<u64, StoreError> {
    let generation = next_generation(tx, path)?;
    tx.execute(
        &lite(sql::DESIRED_PUT_GENERATION),
        params![scope, generation as i64],
    )
    .map_err(sql(path))?;
    Ok(generation)
}

/// A change to one scope that moves it: its generation is bumped, the change commits,
/// and the generation is returned.
fn bump_and_commit(
    tx: rusqlite::Transaction<'_>,
    scope: &str,
    path: &str,
) -> Result<u64, StoreError> {
    let generation = bump_scope(&tx, scope, path)?;
    tx.commit().map_err(sql(path))?;
    Ok(generation)
}

/// The raw columns of a job row, parsed afterwards (outside rusqlite's row closure, so
/// that a record that does not parse is an error that names it).
type RawJob = (
    (String, i64, String, String, i64, String, i64),
    (Option<i64>, Option<i64>, Option<String>, Option<i64>),
    (i64, i64, Option<String>, i64),
    (i64, i64, i64, i64, Option<i64>),
    (Option<String>, i64, Option<i64>, Option<String>),
    (i64, i64, Option<String>, Option<String>, Option<String>),
);

fn raw_job(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawJob> {
    Ok((
        (
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
        ),
        (r.get(7)?, r.get(8)?, r.get(9)?, r.get(10)?),
        (r.get(11)?, r.get(12)?, r.get(13)?, r.get(14)?),
        (r.get(15)?, r.get(16)?, r.get(17)?, r.get(18)?, r.get(19)?),
        (r.get(20)?, r.get(21)?, r.get(22)?, r.get(23)?),
        (r.get(24)?, r.get(25)?, r.get(26)?, r.get(27)?, r.get(28)?),
    ))
}

fn job_row(path: &str, raw: RawJob) -> Result<JobRow, StoreError> {
    let (
        (id, seq, agent, spec, created_ms, state, cancel),
        (code, signal, error, finished),
        rest,
        lens,
        (selector, priority, queue_deadline, group),
        (attempt, retries, avoid, scope, denied),
    ) = raw;
    let corrupt = |what: String| {
        let path = path.to_owned();
        move |source| StoreError::Corrupt { path, what, source }
    };
    let spec = serde_json::from_str(&spec).map_err(corrupt(format!("the spec of job {id:?}")))?;
    let (stdout_bytes, stderr_bytes, truncated, done) = rest;
    let runner_truncated = truncated
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt(format!("the truncation of job {id:?}")))?;
    let egress_denied = denied
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt(format!("the egress refusals of job {id:?}")))?
        .unwrap_or_default();
    Ok(JobRow {
        seq: u64_of(seq),
        agent,
        spec,
        created_ms: u64_of(created_ms),
        progress: JobProgress {
            state,
            cancel_requested: cancel != 0,
            exit_code: code.map(|c| c as i32),
            signal: signal.map(|s| s as i32),
            error,
            finished_ms: opt_u64(finished),
            started_ms: opt_u64(lens.4),
            stdout_bytes: u64_of(stdout_bytes),
            stderr_bytes: u64_of(stderr_bytes),
            runner_truncated,
            egress_denied,
            done: done != 0,
        },
        stdout_length: u64_of(lens.0),
        stderr_length: u64_of(lens.1),
        stdout_stored: u64_of(lens.2),
        stderr_stored: u64_of(lens.3),
        selector,
        priority: priority.clamp(0, i64::from(u8::MAX)) as u8,
        queue_deadline_ms: opt_u64(queue_deadline),
        group,
        attempt: attempt.clamp(1, i64::from(u32::MAX)) as u32,
        retries: retries.clamp(0, i64::from(u8::MAX)) as u8,
        avoid,
        scope,
        id,
    })
}

fn select_jobs(
    conn: &Connection,
    path: &str,
    query: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<JobRow>, StoreError> {
    let e = sql(path);
    let mut stmt = conn.prepare_cached(query).map_err(&e)?;
    let raws = stmt
        .query_map(params, raw_job)
        .map_err(&e)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(&e)?;
    raws.into_iter().map(|raw| job_row(path, raw)).collect()
}

impl Store for SqliteStore {
    async fn load(&self) -> Result<Snapshot, StoreError> {
        self.with(|conn, path| {
            let e = sql(path);
            let generation: i64 = conn
                .query_row(&lite(sql::GENERATION), [], |r| r.get(0))
                .map_err(&e)?;
            let mut stmt = conn
                .prepare(
                    "SELECT a.id, a.token_sha256, a.enrolled_at, a.revoked_at, a.last_seen,
                         a.observed_generation, a.report, a.labels, a.next_token_sha256,
                         a.rotate_asked, a.token_issued_ms, COALESCE(j.version, 0)
                     FROM agents a LEFT JOIN agent_jobs j ON j.agent = a.id ORDER BY a.id",
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
                        labels: r.get(7)?,
                        next_token_sha256: r.get(8)?,
                        rotate_asked: r.get::<_, i64>(9)? != 0,
                        token_issued_ms: opt_u64(r.get(10)?),
                        jobs_version: u64_of(r.get(11)?),
                    })
                })
                .map_err(&e)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(&e)?;
            let mut stmt = conn.prepare(&lite(sql::DESIRED_ALL)).map_err(&e)?;
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
                let settings =
                    serde_json::from_str(&settings).map_err(|source| StoreError::Corrupt {
                        path: path.to_owned(),
                        what: format!("desired settings of scope {scope:?}"),
                        source,
                    })?;
                scopes.push(ScopeRow {
                    scope,
                    generation: generation.max(0) as u64,
                    settings,
                });
            }
            let open_jobs = select_jobs(conn, path, &lite(sql::OPEN_JOBS), [])?;
            let releases = conn
                .prepare(&lite(sql::RELEASES_ALL))
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| {
                        Ok(ReleaseRow {
                            version: r.get(0)?,
                            os: r.get(1)?,
                            arch: r.get(2)?,
                            size: u64_of(r.get(3)?),
                            sha256: r.get(4)?,
                            signature: r.get(5)?,
                            key_id: r.get(6)?,
                            published_at: u64_of(r.get(7)?),
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(&e)?;
            let halts = conn
                .prepare(&lite(sql::HALTS_ALL))
                .and_then(|mut stmt| {
                    stmt.query_map([], |r| {
                        Ok(HaltRow {
                            version: r.get(0)?,
                            agent: r.get(1)?,
                            reason: r.get(2)?,
                            halted_at: u64_of(r.get(3)?),
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(&e)?;
            Ok(Snapshot {
                agents,
                scopes,
                open_jobs,
                generation: generation.max(0) as u64,
                releases,
                halts,
            })
        })
        .await
    }

    async fn enrol(
        &self,
        id: &str,
        token_sha256: &str,
        now: u64,
        reuse_revoked: bool,
    ) -> Result<Enrol, StoreError> {
        let (id, hash) = (id.to_owned(), token_sha256.to_owned());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let existing: Option<Option<i64>> = tx
                .query_row(&lite(sql::AGENT_REVOKED_AT), params![id], |r| r.get(0))
                .optional()
                .map_err(&e)?;
            match existing {
                Some(None) => return Ok(Enrol::Exists),
                Some(Some(_)) if !reuse_revoked => return Ok(Enrol::Revoked),
                // A new agent under the id: none of the old one's own settings.
                Some(Some(_)) => {
                    tx.execute(&lite(sql::DESIRED_CLEAR), params![id])
                        .map_err(&e)?;
                }
                None => {}
            }
            tx.execute(&lite(sql::AGENT_ADD), params![id, hash, now as i64])
                .map_err(&e)?;
            bump_and_commit(tx, &id, path).map(Enrol::Done)
        })
        .await
    }

    async fn revoke(&self, id: &str, now: u64) -> Result<Option<u64>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let n = tx
                .execute(&lite(sql::AGENT_REVOKE), params![id, now as i64])
                .map_err(&e)?;
            if n == 0 {
                return Ok(None);
            }
            bump_and_commit(tx, &id, path).map(Some)
        })
        .await
    }

    async fn renumber(&self) -> Result<u64, StoreError> {
        self.with(|conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let was: i64 = tx
                .query_row(&lite(sql::GENERATION), [], |r| r.get(0))
                .map_err(&e)?;
            for statement in super::RENUMBER {
                tx.execute(statement, []).map_err(&e)?;
            }
            tx.commit().map_err(&e)?;
            Ok(u64_of(was))
        })
        .await
    }

    async fn set_scope(
        &self,
        scope: &str,
        settings: &DesiredSettings,
        base: Option<&DesiredSettings>,
    ) -> Result<Result<u64, DesiredSettings>, StoreError> {
        let scope = scope.to_owned();
        let base = base.cloned();
        let json = serde_json::to_string(settings).map_err(|source| StoreError::Corrupt {
            path: self.path.display().to_string(),
            what: "desired settings to store".into(),
            source,
        })?;
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            if let Some(base) = base {
                let stored: Option<String> = tx
                    .query_row(&lite(sql::DESIRED_SETTINGS), params![scope], |r| r.get(0))
                    .optional()
                    .map_err(&e)?;
                let stored = parse_settings(path, &scope, stored.as_deref())?;
                if stored != base {
                    return Ok(Err(stored));
                }
            }
            let generation = next_generation(&tx, path)?;
            tx.execute(
                &lite(sql::DESIRED_PUT),
                params![scope, generation as i64, json],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(Ok(generation))
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

    async fn put_release(&self, row: &ReleaseRow) -> Result<u64, StoreError> {
        let row = row.clone();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            tx.execute(
                &lite(sql::RELEASE_PUT),
                params![
                    row.version,
                    row.os,
                    row.arch,
                    row.size as i64,
                    row.sha256,
                    row.signature,
                    row.key_id,
                    row.published_at as i64
                ],
            )
            .map_err(&e)?;
            bump_and_commit(tx, "", path)
        })
        .await
    }

    async fn change_labels(
        &self,
        id: &str,
        set: &Labels,
        remove: &[String],
    ) -> Result<Option<(u64, Labels)>, StoreError> {
        let (id, set, remove) = (id.to_owned(), set.clone(), remove.to_vec());
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let stored: Option<String> = tx
                .query_row(&lite(sql::AGENT_LABELS), params![id], |r| r.get(0))
                .optional()
                .map_err(&e)?;
            let Some(stored) = stored else {
                return Ok(None);
            };
            let (labels, json) = merge_labels(path, &id, &stored, &set, &remove)?;
            tx.execute(&lite(sql::AGENT_SET_LABELS), params![id, json])
                .map_err(&e)?;
            let generation = bump_and_commit(tx, &id, path)?;
            Ok(Some((generation, labels)))
        })
        .await
    }

    async fn set_halt(&self, version: &str, halt: Option<&HaltRow>) -> Result<u64, StoreError> {
        let version = version.to_owned();
        let halt = halt.cloned();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            match halt {
                Some(h) => tx.execute(
                    &lite(sql::HALT_PUT),
                    params![version, h.agent, h.reason, h.halted_at as i64],
                ),
                None => tx.execute(&lite(sql::HALT_DELETE), params![version]),
            }
            .map_err(&e)?;
            bump_and_commit(tx, "", path)
        })
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
