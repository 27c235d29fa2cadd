//! The job database's schema and its reads: migrations, the column list, and turning a
//! row into a [`JobRecord`].

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::JobStoreError;
use crate::proto::job::{JobRecord, JobState};

/// Schema migrations, applied in order; `user_version` records how many ran.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: jobs and their state transitions.
    "CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        pid INTEGER,
        start_time INTEGER,
        exit_code INTEGER,
        signal INTEGER,
        error TEXT,
        confinement TEXT,
        stdout_bytes INTEGER NOT NULL DEFAULT 0,
        stderr_bytes INTEGER NOT NULL DEFAULT 0,
        stdout_truncated INTEGER NOT NULL DEFAULT 0,
        stderr_truncated INTEGER NOT NULL DEFAULT 0,
        created_ms INTEGER NOT NULL,
        started_ms INTEGER,
        finished_ms INTEGER
    );
    CREATE INDEX jobs_state ON jobs(state);
    CREATE INDEX jobs_owner ON jobs(owner);
    CREATE TABLE transitions (
        job_seq INTEGER NOT NULL REFERENCES jobs(seq) ON DELETE CASCADE,
        state TEXT NOT NULL,
        at_ms INTEGER NOT NULL
    );
    CREATE INDEX transitions_job ON transitions(job_seq);",
    // 2: `*_bytes` count what a job produced, past the cap too; retention needs what is
    // on disk, which until now was what `*_bytes` held.
    "ALTER TABLE jobs ADD COLUMN spooled_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE jobs SET spooled_bytes = stdout_bytes + stderr_bytes;",
    // 3: why a job's spooled output is shorter than what it printed (JSON, see
    // `Truncation`); NULL when it is not, as for every job recorded before.
    "ALTER TABLE jobs ADD COLUMN output_truncated TEXT;",
    // 4: what the job's egress proxy refused (JSON, see `Denial`); NULL when nothing.
    "ALTER TABLE jobs ADD COLUMN egress_denied TEXT;",
];

macro_rules! columns {
    () => {
        "seq, id, owner, spec, state, pid, start_time, exit_code, signal, error, confinement, \
         stdout_bytes, stderr_bytes, stdout_truncated, stderr_truncated, created_ms, started_ms, \
         finished_ms, output_truncated, egress_denied"
    };
}

pub(super) const GET: &str = concat!("SELECT ", columns!(), " FROM jobs WHERE id = ?1");

pub(super) fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> JobStoreError + '_ {
    move |source| JobStoreError::Sql {
        path: path.to_owned(),
        source,
    }
}

pub(super) fn connect(path: &Path) -> Result<Connection, JobStoreError> {
    let conn = Connection::open(path).map_err(sql(path))?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sql(path))?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sql(path))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(sql(path))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sql(path))?;
    Ok(conn)
}

pub(super) fn migrate(conn: &Connection, path: &Path) -> Result<(), JobStoreError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql(path))?;
    if version as usize > MIGRATIONS.len() {
        return Err(JobStoreError::TooNew {
            path: path.to_owned(),
            found: version,
            known: MIGRATIONS.len(),
        });
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.unchecked_transaction().map_err(sql(path))?;
        tx.execute_batch(m).map_err(sql(path))?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(sql(path))?;
        tx.commit().map_err(sql(path))?;
    }
    Ok(())
}

pub(super) fn record(
    path: &Path,
    row: &Row<'_>,
) -> rusqlite::Result<Result<JobRecord, JobStoreError>> {
    let id: String = row.get(1)?;
    let spec_text: String = row.get(3)?;
    let state_text: String = row.get(4)?;
    let spec = match serde_json::from_str(&spec_text) {
        Ok(s) => s,
        Err(source) => {
            return Ok(Err(JobStoreError::Spec {
                path: path.to_owned(),
                id,
                source,
            }))
        }
    };
    Ok(Ok(JobRecord {
        seq: row.get(0)?,
        owner: row.get(2)?,
        spec,
        state: JobState::parse(&state_text).unwrap_or(JobState::Lost),
        pid: row.get(5)?,
        start_time: row.get::<_, Option<i64>>(6)?.map(|t| t as u64),
        exit_code: row.get(7)?,
        signal: row.get(8)?,
        error: row.get(9)?,
        confinement: row.get(10)?,
        stdout_bytes: row.get::<_, i64>(11)? as u64,
        stderr_bytes: row.get::<_, i64>(12)? as u64,
        stdout_truncated: row.get(13)?,
        stderr_truncated: row.get(14)?,
        created_ms: row.get(15)?,
        started_ms: row.get(16)?,
        finished_ms: row.get(17)?,
        output_truncated: row
            .get::<_, Option<String>>(18)?
            .and_then(|t| serde_json::from_str(&t).ok()),
        egress_denied: row
            .get::<_, Option<String>>(19)?
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default(),
        commit_pending: false,
        id,
    }))
}

pub(super) fn get_on(
    c: &Connection,
    path: &Path,
    id: &str,
) -> Result<Option<JobRecord>, JobStoreError> {
    let mut stmt = c.prepare_cached(GET).map_err(sql(path))?;
    stmt.query_row(params![id], |r| record(path, r))
        .optional()
        .map_err(sql(path))?
        .transpose()
}

pub(super) fn query_on(
    c: &Connection,
    path: &Path,
    sql_text: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<JobRecord>, JobStoreError> {
    let rows = c
        .prepare_cached(sql_text)
        .and_then(|mut stmt| {
            stmt.query_map(params, |r| record(path, r))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql(path))?;
    rows.into_iter().collect()
}
