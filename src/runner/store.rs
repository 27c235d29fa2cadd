//! Durable job records: SQLite in WAL mode at `<state>/runner/jobs.db`.
//!
//! Every state change is committed before it is acted on or reported, so a killed runner
//! leaves records that say what was running (pid and process start time included) for the
//! next one to reconcile. WAL with `synchronous=NORMAL` survives any process crash; only
//! a power loss may drop the last commits. All calls block: use them off the runtime.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::spec::JobSpec;

/// Schema migrations, applied in order; `user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
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
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Starting,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    Lost,
    Rejected,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::TimedOut => "timed_out",
            JobState::Lost => "lost",
            JobState::Rejected => "rejected",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => JobState::Queued,
            "starting" => JobState::Starting,
            "running" => JobState::Running,
            "succeeded" => JobState::Succeeded,
            "failed" => JobState::Failed,
            "cancelled" => JobState::Cancelled,
            "timed_out" => JobState::TimedOut,
            "lost" => JobState::Lost,
            "rejected" => JobState::Rejected,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        !matches!(
            self,
            JobState::Queued | JobState::Starting | JobState::Running
        )
    }
}

/// One job as stored and as the API reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRecord {
    pub seq: i64,
    pub id: String,
    pub owner: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub pid: Option<i32>,
    /// Process start time (clock ticks since boot, Linux): with `pid`, the job's identity.
    pub start_time: Option<u64>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    /// Which confinement applied: "rlimits", "none".
    pub confinement: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
}

/// How a job ended, as recorded.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("job database {path}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("job database {path} has schema version {found}, newer than this runner knows ({known}): run a newer railgrid")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: usize,
    },
    #[error("stored spec of job {id} in {path} is unreadable")]
    Spec {
        path: PathBuf,
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The result of inserting a job with a client-chosen id.
pub enum Inserted {
    New(JobRecord),
    /// Same id, same spec: the earlier job.
    Existing(JobRecord),
    /// Same id, another spec.
    Conflict(JobRecord),
}

pub struct Store {
    path: PathBuf,
    conn: Mutex<Connection>,
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const COLUMNS: &str = "seq, id, owner, spec, state, pid, start_time, exit_code, signal, error, confinement, \
     stdout_bytes, stderr_bytes, stdout_truncated, stderr_truncated, created_ms, started_ms, finished_ms";

impl Store {
    /// Opens (creating, mode 0600 through the runner's umask) and migrates the database.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let sql = |source| StoreError::Sql {
            path: path.to_owned(),
            source,
        };
        let conn = Connection::open(path).map_err(sql)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(sql)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(sql)?;
        if version as usize > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                path: path.to_owned(),
                found: version,
                known: MIGRATIONS.len(),
            });
        }
        for (i, m) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.unchecked_transaction().map_err(sql)?;
            tx.execute_batch(m).map_err(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)
                .map_err(sql)?;
            tx.commit().map_err(sql)?;
        }
        Ok(Self {
            path: path.to_owned(),
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let conn = crate::util::lock(&self.conn);
        f(&conn).map_err(|source| StoreError::Sql {
            path: self.path.clone(),
            source,
        })
    }

    fn record(&self, row: &Row<'_>) -> rusqlite::Result<Result<JobRecord, StoreError>> {
        let id: String = row.get(1)?;
        let spec_text: String = row.get(3)?;
        let state_text: String = row.get(4)?;
        let spec = match serde_json::from_str(&spec_text) {
            Ok(s) => s,
            Err(source) => {
                return Ok(Err(StoreError::Spec {
                    path: self.path.clone(),
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
            id,
        }))
    }

    fn query(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let rows = self.with(|c| {
            let mut stmt = c.prepare_cached(sql)?;
            let rows = stmt.query_map(params, |r| self.record(r))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter().collect()
    }

    /// Inserts a queued job, or finds the job that already has this id.
    pub fn insert(&self, id: &str, spec: &JobSpec) -> Result<Inserted, StoreError> {
        let canonical = spec.canonical();
        if let Some(existing) = self.get(id)? {
            return Ok(if existing.spec.canonical() == canonical {
                Inserted::Existing(existing)
            } else {
                Inserted::Conflict(existing)
            });
        }
        let now = now_ms();
        // ON CONFLICT: a concurrent submission of the same id may have won since the check;
        // then this one is a resubmission, not an error.
        let inserted = self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let n = tx.execute(
                "INSERT INTO jobs (id, owner, spec, state, created_ms) VALUES (?1, ?2, ?3, 'queued', ?4) \
                 ON CONFLICT(id) DO NOTHING",
                params![id, spec.owner(), canonical, now],
            )?;
            if n == 1 {
                tx.execute(
                    "INSERT INTO transitions (job_seq, state, at_ms) VALUES (last_insert_rowid(), 'queued', ?1)",
                    params![now],
                )?;
            }
            tx.commit()?;
            Ok(n == 1)
        })?;
        let rec = self.get(id)?.ok_or_else(|| StoreError::Sql {
            path: self.path.clone(),
            source: rusqlite::Error::QueryReturnedNoRows,
        })?;
        Ok(match (inserted, rec.spec.canonical() == canonical) {
            (true, _) => Inserted::New(rec),
            (false, true) => Inserted::Existing(rec),
            (false, false) => Inserted::Conflict(rec),
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1");
        let rec = self.with(|c| {
            c.query_row(&sql, params![id], |r| self.record(r))
                .optional()
        })?;
        rec.transpose()
    }

    /// Newest first, optionally filtered, paged by `before` (a `seq`).
    pub fn list(
        &self,
        state: Option<JobState>,
        owner: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR owner = ?2) \
             AND (?3 IS NULL OR seq < ?3) ORDER BY seq DESC LIMIT ?4"
        );
        self.query(
            &sql,
            params![state.map(JobState::as_str), owner, before, limit],
        )
    }

    /// Jobs in these states, oldest first.
    pub fn in_states(&self, states: &[JobState]) -> Result<Vec<JobRecord>, StoreError> {
        let list: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let sql = format!(
            "SELECT {COLUMNS} FROM jobs WHERE state IN ({}) ORDER BY seq",
            list.iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(",")
        );
        self.query(&sql, [])
    }

    fn transition(
        &self,
        id: &str,
        state: JobState,
        extra: &str,
        p: &[&dyn rusqlite::ToSql],
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let sql = format!("UPDATE jobs SET state = ?1{extra} WHERE id = ?2");
        self.with(|c| {
            let tx = c.unchecked_transaction()?;
            let state_text = state.as_str();
            let mut all: Vec<&dyn rusqlite::ToSql> = vec![&state_text, &id];
            all.extend_from_slice(p);
            tx.execute(&sql, all.as_slice())?;
            tx.execute(
                "INSERT INTO transitions (job_seq, state, at_ms) SELECT seq, ?1, ?2 FROM jobs WHERE id = ?3",
                params![state.as_str(), now, id],
            )?;
            tx.commit()
        })
    }

    /// `admitted_ms` is when the scheduler took the job off the queue: it becomes the
    /// job's `started_ms`, so start times follow admission order (FIFO) even when several
    /// jobs launch at once.
    pub fn mark_starting(&self, id: &str, admitted_ms: i64) -> Result<(), StoreError> {
        self.transition(id, JobState::Starting, ", started_ms = ?3", &[&admitted_ms])
    }

    pub fn mark_running(
        &self,
        id: &str,
        pid: i32,
        start_time: Option<u64>,
        confinement: &str,
    ) -> Result<(), StoreError> {
        let st = start_time.map(|t| t as i64);
        self.transition(
            id,
            JobState::Running,
            ", pid = ?3, start_time = ?4, confinement = ?5",
            &[&pid, &st, &confinement],
        )
    }

    pub fn mark_finished(&self, id: &str, state: JobState, o: &Outcome) -> Result<(), StoreError> {
        let now = now_ms();
        self.transition(
            id,
            state,
            ", exit_code = ?3, signal = ?4, error = ?5, stdout_bytes = ?6, stderr_bytes = ?7, \
             stdout_truncated = ?8, stderr_truncated = ?9, finished_ms = ?10",
            &[
                &o.exit_code,
                &o.signal,
                &o.error,
                &(o.stdout_bytes as i64),
                &(o.stderr_bytes as i64),
                &o.stdout_truncated,
                &o.stderr_truncated,
                &now,
            ],
        )
    }

    pub fn delete(&self, id: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute("DELETE FROM jobs WHERE id = ?1", params![id])
                .map(|_| ())
        })
    }

    /// Up to `limit` finished jobs, oldest first: `(id, spooled bytes)`.
    pub fn finished_oldest_first(&self, limit: u32) -> Result<Vec<(String, u64)>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, stdout_bytes + stderr_bytes FROM jobs \
                 WHERE state NOT IN ('queued', 'starting', 'running') ORDER BY seq LIMIT ?1",
            )?;
            let rows = stmt.query_map(params![limit], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
            })?;
            rows.collect()
        })
    }

    /// How many finished jobs there are and how many spooled bytes they hold.
    pub fn finished_totals(&self) -> Result<(usize, u64), StoreError> {
        self.with(|c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(stdout_bytes + stderr_bytes), 0) FROM jobs \
                 WHERE state NOT IN ('queued', 'starting', 'running')",
                [],
                |r| Ok((r.get::<_, i64>(0)? as usize, r.get::<_, i64>(1)? as u64)),
            )
        })
    }

    /// State changes of one job, oldest first.
    pub fn transitions(&self, id: &str) -> Result<Vec<(String, i64)>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT t.state, t.at_ms FROM transitions t JOIN jobs j ON j.seq = t.job_seq \
                 WHERE j.id = ?1 ORDER BY t.rowid",
            )?;
            let rows = stmt.query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(argv: &[&str]) -> JobSpec {
        JobSpec::from_argv(argv.iter().copied())
    }

    #[test]
    fn insert_is_idempotent_by_id_and_spec() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("jobs.db")).unwrap();
        assert!(matches!(
            store.insert("a", &spec(&["true"])).unwrap(),
            Inserted::New(_)
        ));
        assert!(matches!(
            store.insert("a", &spec(&["true"])).unwrap(),
            Inserted::Existing(_)
        ));
        assert!(matches!(
            store.insert("a", &spec(&["false"])).unwrap(),
            Inserted::Conflict(_)
        ));
    }

    #[test]
    fn transitions_are_recorded_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let store = Store::open(&path).unwrap();
            store.insert("a", &spec(&["true"])).unwrap();
            store.mark_starting("a", now_ms()).unwrap();
            store.mark_running("a", 1234, Some(99), "rlimits").unwrap();
            let o = Outcome {
                exit_code: Some(0),
                stdout_bytes: 5,
                ..Outcome::default()
            };
            store.mark_finished("a", JobState::Succeeded, &o).unwrap();
        }
        let store = Store::open(&path).unwrap();
        let rec = store.get("a").unwrap().unwrap();
        assert_eq!(rec.state, JobState::Succeeded);
        assert_eq!(
            (rec.pid, rec.start_time, rec.exit_code, rec.stdout_bytes),
            (Some(1234), Some(99), Some(0), 5)
        );
        let states: Vec<String> = store
            .transitions("a")
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(states, ["queued", "starting", "running", "succeeded"]);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        Store::open(&path).unwrap();
        let c = Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
        drop(c);
        assert!(matches!(
            Store::open(&path),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }
}
