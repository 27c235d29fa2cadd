//! Durable job records: SQLite in WAL mode at `<state>/runner/jobs.db`.
//!
//! Every state change is committed before it is acted on or reported, so a killed runner
//! leaves records that say what was running (pid and process start time included) for the
//! next one to reconcile. WAL with `synchronous=NORMAL` survives any process crash; only
//! a power loss may drop the last commits. Writes go through one writer thread that
//! commits in groups (see [`Store`]); reads block: use them off the runtime.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::oneshot;

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
    // 2: `*_bytes` count what a job produced, past the cap too; retention needs what is
    // on disk, which until now was what `*_bytes` held.
    "ALTER TABLE jobs ADD COLUMN spooled_bytes INTEGER NOT NULL DEFAULT 0;
    UPDATE jobs SET spooled_bytes = stdout_bytes + stderr_bytes;",
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
    /// Bytes the job wrote to each stream, including those past the cap.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Bytes of both streams kept in the spool files: what retention frees.
    pub spooled_bytes: u64,
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
    #[error("job database {path}: commit failed: {reason}")]
    Commit { path: PathBuf, reason: String },
    #[error("job database {path}: its writer thread has stopped")]
    WriterGone { path: PathBuf },
    #[error("job database {path}: could not start its writer thread")]
    Thread {
        path: PathBuf,
        #[source]
        source: std::io::Error,
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

/// The job database: one writer thread that commits in groups, and one connection for
/// reads, which WAL lets run beside the writer.
///
/// Writes are queued to the writer and return a [`Pending`] that resolves once the
/// transaction holding them has been committed. Whatever is queued when the writer wakes
/// goes into one transaction, so N jobs changing state at once cost one commit, not N;
/// each write runs in its own savepoint, so one failing write does not undo the others.
pub struct Store {
    path: Arc<Path>,
    read: Mutex<Connection>,
    writes: Option<mpsc::Sender<Write>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// Runs a write's statements (or, when told the batch's transaction is gone, only fails);
/// returns what to tell its caller once the batch's commit succeeded (`None`) or failed
/// (`Some(reason)`).
type Write = Box<dyn FnOnce(&Connection, bool) -> Reply + Send>;
type Reply = Box<dyn FnOnce(Option<&str>) + Send>;

/// More writes than this wait for the next transaction, so that no caller waits behind an
/// unbounded batch.
const MAX_BATCH: usize = 256;

/// A queued write: `.await` it, or [`Pending::wait`] outside the runtime. Dropping it does
/// not cancel the write; a failure nobody waits for is logged.
#[must_use = "a write's failure is only seen by awaiting it"]
pub struct Pending<T> {
    rx: oneshot::Receiver<Result<T, StoreError>>,
    path: Arc<Path>,
}

impl<T> Pending<T> {
    /// Blocks until the write has been committed. Not on a runtime thread.
    pub fn wait(self) -> Result<T, StoreError> {
        let path = self.path;
        self.rx.blocking_recv().unwrap_or_else(|_| {
            Err(StoreError::WriterGone {
                path: path.to_path_buf(),
            })
        })
    }
}

impl<T> std::future::Future for Pending<T> {
    type Output = Result<T, StoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(StoreError::WriterGone {
                    path: self.path.to_path_buf(),
                })
            })
        })
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

macro_rules! columns {
    () => {
        "seq, id, owner, spec, state, pid, start_time, exit_code, signal, error, confinement, \
         stdout_bytes, stderr_bytes, stdout_truncated, stderr_truncated, created_ms, started_ms, \
         finished_ms"
    };
}

const GET: &str = concat!("SELECT ", columns!(), " FROM jobs WHERE id = ?1");

/// The statement of a state change: `state` is ?1, the job's id ?2, the extra columns
/// from ?3 on. Built at compile time, so a transition formats nothing.
macro_rules! update {
    ($set:literal) => {
        concat!("UPDATE jobs SET state = ?1", $set, " WHERE id = ?2")
    };
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |source| StoreError::Sql {
        path: path.to_owned(),
        source,
    }
}

fn connect(path: &Path) -> Result<Connection, StoreError> {
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

fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(sql(path))?;
    if version as usize > MIGRATIONS.len() {
        return Err(StoreError::TooNew {
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

fn record(path: &Path, row: &Row<'_>) -> rusqlite::Result<Result<JobRecord, StoreError>> {
    let id: String = row.get(1)?;
    let spec_text: String = row.get(3)?;
    let state_text: String = row.get(4)?;
    let spec = match serde_json::from_str(&spec_text) {
        Ok(s) => s,
        Err(source) => {
            return Ok(Err(StoreError::Spec {
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
        id,
    }))
}

fn get_on(c: &Connection, path: &Path, id: &str) -> Result<Option<JobRecord>, StoreError> {
    let mut stmt = c.prepare_cached(GET).map_err(sql(path))?;
    stmt.query_row(params![id], |r| record(path, r))
        .optional()
        .map_err(sql(path))?
        .transpose()
}

/// Runs `f` in a savepoint of the batch's transaction: undone alone when it fails.
fn in_savepoint<T>(
    c: &Connection,
    path: &Path,
    f: impl FnOnce(&Connection, &Path) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    c.execute_batch("SAVEPOINT write").map_err(sql(path))?;
    let result = f(c, path).and_then(|v| {
        c.execute_batch("RELEASE write").map_err(sql(path))?;
        Ok(v)
    });
    if result.is_err() {
        // Undone, and the savepoint closed, so no later write nests in a leftover one.
        let _ = c.execute_batch("ROLLBACK TO write; RELEASE write");
    }
    result
}

/// The writer thread: takes whatever writes are queued, runs them in one transaction,
/// commits once and answers each. Ends when the store is dropped.
fn write_loop(conn: Connection, path: Arc<Path>, queue: mpsc::Receiver<Write>) {
    let mut batch = Vec::new();
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(w) => batch.push(w),
                Err(_) => break,
            }
        }
        // If BEGIN fails (something else holds the database past the busy timeout), the
        // whole batch fails at once rather than each write waiting out the timeout again.
        let began = conn.execute_batch("BEGIN IMMEDIATE");
        if let Err(e) = &began {
            tracing::error!(db = %path.display(), error = %e, "could not begin a transaction for job records");
        }
        let in_tx = began.is_ok();
        // Some errors (SQLITE_FULL, IOERR, NOMEM) roll the whole transaction back, not
        // just the savepoint. The writes after that must not run on their own in
        // autocommit while their batch is reported failed: they fail too.
        let mut lost = !in_tx;
        let replies: Vec<Reply> = batch
            .drain(..)
            .map(|w| {
                let reply = w(&conn, lost);
                lost = lost || (in_tx && conn.is_autocommit());
                reply
            })
            .collect();
        let failed = if in_tx {
            conn.execute_batch("COMMIT").err().map(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                tracing::error!(db = %path.display(), error = %e, "could not commit job records");
                e.to_string()
            })
        } else {
            None
        };
        for reply in replies {
            reply(failed.as_deref());
        }
    }
}

impl Store {
    /// Opens (creating, mode 0600 through the runner's umask) and migrates the database,
    /// and starts its writer thread.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let writer_conn = connect(path)?;
        migrate(&writer_conn, path)?;
        let read = connect(path)?;
        read.pragma_update(None, "query_only", true)
            .map_err(sql(path))?;
        let path: Arc<Path> = path.into();
        let (tx, rx) = mpsc::channel();
        let wpath = path.clone();
        let writer = std::thread::Builder::new()
            .name("jobs-db-writer".into())
            .spawn(move || write_loop(writer_conn, wpath, rx))
            .map_err(|source| StoreError::Thread {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            path,
            read: Mutex::new(read),
            writes: Some(tx),
            writer: Some(writer),
        })
    }

    /// Queues `f` for the writer.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Path) -> Result<T, StoreError> + Send + 'static,
    ) -> Pending<T> {
        let (tx, rx) = oneshot::channel();
        let path = self.path.clone();
        let w: Write = Box::new(move |conn, lost| {
            let result = if lost {
                Err(StoreError::Commit {
                    path: path.to_path_buf(),
                    reason: "its transaction could not begin, or an earlier write rolled it back"
                        .into(),
                })
            } else {
                in_savepoint(conn, &path, f)
            };
            Box::new(move |failed: Option<&str>| {
                let result = match (result, failed) {
                    (Ok(_), Some(reason)) => Err(StoreError::Commit {
                        path: path.to_path_buf(),
                        reason: reason.to_owned(),
                    }),
                    (r, _) => r,
                };
                if let Err(Err(e)) = tx.send(result) {
                    tracing::error!(error = %crate::error_chain(&e), "could not record a job's change");
                }
            })
        });
        if let Some(writes) = &self.writes {
            // A send fails only when the writer thread is gone; the dropped reply channel
            // then tells the caller.
            let _ = writes.send(w);
        }
        Pending {
            rx,
            path: self.path.clone(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let conn = crate::util::lock(&self.read);
        f(&conn).map_err(sql(&self.path))
    }

    fn query(
        &self,
        sql_text: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let rows = self.with(|c| {
            let mut stmt = c.prepare_cached(sql_text)?;
            let rows = stmt.query_map(params, |r| record(&self.path, r))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })?;
        rows.into_iter().collect()
    }

    /// Inserts a queued job, or finds the job that already has this id.
    pub fn insert(&self, id: &str, spec: &JobSpec) -> Pending<Inserted> {
        let (id, owner, canonical) = (id.to_owned(), spec.owner().to_owned(), spec.canonical());
        self.write(move |c, path| {
            if let Some(existing) = get_on(c, path, &id)? {
                return Ok(if existing.spec.canonical() == canonical {
                    Inserted::Existing(existing)
                } else {
                    Inserted::Conflict(existing)
                });
            }
            let now = now_ms();
            c.prepare_cached(
                "INSERT INTO jobs (id, owner, spec, state, created_ms) VALUES (?1, ?2, ?3, 'queued', ?4)",
            )
            .and_then(|mut s| s.execute(params![id, owner, canonical, now]))
            .and_then(|_| {
                c.prepare_cached(
                    "INSERT INTO transitions (job_seq, state, at_ms) VALUES (last_insert_rowid(), 'queued', ?1)",
                )?
                .execute(params![now])
            })
            .map_err(sql(path))?;
            let rec = get_on(c, path, &id)?.ok_or_else(|| StoreError::Sql {
                path: path.to_owned(),
                source: rusqlite::Error::QueryReturnedNoRows,
            })?;
            Ok(Inserted::New(rec))
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<JobRecord>, StoreError> {
        let conn = crate::util::lock(&self.read);
        get_on(&conn, &self.path, id)
    }

    /// Newest first, optionally filtered, paged by `before` (a `seq`).
    pub fn list(
        &self,
        state: Option<JobState>,
        owner: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, StoreError> {
        self.query(
            concat!(
                "SELECT ",
                columns!(),
                " FROM jobs WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR owner = ?2) \
                 AND (?3 IS NULL OR seq < ?3) ORDER BY seq DESC LIMIT ?4"
            ),
            params![state.map(JobState::as_str), owner, before, limit],
        )
    }

    /// Jobs in these states, oldest first.
    pub fn in_states(&self, states: &[JobState]) -> Result<Vec<JobRecord>, StoreError> {
        let list: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
        let sql_text = format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM jobs WHERE state IN ({}) ORDER BY seq"
            ),
            list.iter()
                .map(|s| format!("'{s}'"))
                .collect::<Vec<_>>()
                .join(",")
        );
        self.query(&sql_text, [])
    }

    /// Sets the job's state with `update` (see `update!`; `values` are bound from ?3 on)
    /// and records the transition.
    fn transition(
        &self,
        id: &str,
        state: JobState,
        update: &'static str,
        values: Vec<Value>,
    ) -> Pending<()> {
        let id = id.to_owned();
        self.write(move |c, path| {
            let now = now_ms();
            let state_text = state.as_str();
            let mut all: Vec<&dyn rusqlite::ToSql> = vec![&state_text, &id];
            all.extend(values.iter().map(|v| v as &dyn rusqlite::ToSql));
            c.prepare_cached(update)
                .and_then(|mut s| s.execute(all.as_slice()))
                .and_then(|_| {
                    c.prepare_cached(
                        "INSERT INTO transitions (job_seq, state, at_ms) SELECT seq, ?1, ?2 FROM jobs WHERE id = ?3",
                    )?
                    .execute(params![state_text, now, id])
                })
                .map(|_| ())
                .map_err(sql(path))
        })
    }

    /// `admitted_ms` is when the scheduler took the job off the queue: it becomes the
    /// job's `started_ms`, so start times follow admission order (FIFO) even when several
    /// jobs launch at once.
    pub fn mark_starting(&self, id: &str, admitted_ms: i64) -> Pending<()> {
        self.transition(
            id,
            JobState::Starting,
            update!(", started_ms = ?3"),
            vec![admitted_ms.into()],
        )
    }

    pub fn mark_running(
        &self,
        id: &str,
        pid: i32,
        start_time: Option<u64>,
        confinement: &str,
    ) -> Pending<()> {
        self.transition(
            id,
            JobState::Running,
            update!(", pid = ?3, start_time = ?4, confinement = ?5"),
            vec![
                pid.into(),
                start_time.map(|t| t as i64).into(),
                confinement.to_owned().into(),
            ],
        )
    }

    pub fn mark_finished(&self, id: &str, state: JobState, o: &Outcome) -> Pending<()> {
        self.transition(
            id,
            state,
            update!(
                ", exit_code = ?3, signal = ?4, error = ?5, stdout_bytes = ?6, stderr_bytes = ?7, \
                 stdout_truncated = ?8, stderr_truncated = ?9, finished_ms = ?10, \
                 spooled_bytes = ?11"
            ),
            vec![
                o.exit_code.into(),
                o.signal.into(),
                o.error.clone().into(),
                (o.stdout_bytes as i64).into(),
                (o.stderr_bytes as i64).into(),
                o.stdout_truncated.into(),
                o.stderr_truncated.into(),
                now_ms().into(),
                (o.spooled_bytes as i64).into(),
            ],
        )
    }

    pub fn delete(&self, id: &str) -> Pending<()> {
        let id = id.to_owned();
        self.write(move |c, path| {
            c.prepare_cached("DELETE FROM jobs WHERE id = ?1")
                .and_then(|mut s| s.execute(params![id]))
                .map(|_| ())
                .map_err(sql(path))
        })
    }

    /// Up to `limit` finished jobs, oldest first: `(id, spooled bytes)`.
    pub fn finished_oldest_first(&self, limit: u32) -> Result<Vec<(String, u64)>, StoreError> {
        self.with(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, spooled_bytes FROM jobs \
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
                "SELECT COUNT(*), COALESCE(SUM(spooled_bytes), 0) FROM jobs \
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

impl Drop for Store {
    /// Lets the writer finish what is queued, so every write a caller was promised lands.
    fn drop(&mut self) {
        self.writes = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
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
            store.insert("a", &spec(&["true"])).wait().unwrap(),
            Inserted::New(_)
        ));
        assert!(matches!(
            store.insert("a", &spec(&["true"])).wait().unwrap(),
            Inserted::Existing(_)
        ));
        assert!(matches!(
            store.insert("a", &spec(&["false"])).wait().unwrap(),
            Inserted::Conflict(_)
        ));
    }

    #[test]
    fn transitions_are_recorded_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let store = Store::open(&path).unwrap();
            store.insert("a", &spec(&["true"])).wait().unwrap();
            store.mark_starting("a", now_ms()).wait().unwrap();
            store
                .mark_running("a", 1234, Some(99), "rlimits")
                .wait()
                .unwrap();
            let o = Outcome {
                exit_code: Some(0),
                stdout_bytes: 5,
                ..Outcome::default()
            };
            store
                .mark_finished("a", JobState::Succeeded, &o)
                .wait()
                .unwrap();
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

    /// Returns once the writer is busy in a write that ends when the returned sender is
    /// used, so that the writes queued meanwhile share the next batch. The held write's own
    /// result is of no interest.
    fn hold_writer(store: &Store) -> (std::sync::mpsc::Sender<()>, Pending<()>) {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (inside, entered) = std::sync::mpsc::channel::<()>();
        let held = store.write(move |_, _| {
            inside.send(()).ok();
            wait.recv().ok();
            Ok(())
        });
        entered.recv().unwrap();
        (go, held)
    }

    #[test]
    fn a_failing_write_does_not_undo_the_others_committed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("jobs.db")).unwrap();
        let (go, held) = hold_writer(&store);
        let b = store.insert("b", &spec(&["true"]));
        // Half done, then failing: its first half must not be committed.
        let bad = store.write(|c, path| {
            c.execute_batch(
                "INSERT INTO jobs (id, owner, spec, state, created_ms) VALUES ('d', '', '{}', 'queued', 0); \
                 INSERT INTO no_such_table VALUES (1);",
            )
            .map_err(sql(path))
        });
        let c = store.insert("c", &spec(&["true"]));
        go.send(()).unwrap();
        let _ = held.wait();
        assert!(matches!(b.wait().unwrap(), Inserted::New(_)));
        assert!(matches!(bad.wait(), Err(StoreError::Sql { .. })));
        assert!(matches!(c.wait().unwrap(), Inserted::New(_)));
        drop(store);
        let store = Store::open(&dir.path().join("jobs.db")).unwrap();
        assert!(store.get("b").unwrap().is_some());
        assert!(store.get("c").unwrap().is_some());
        assert!(store.get("d").unwrap().is_none());
    }

    #[test]
    fn writes_after_a_rolled_back_transaction_fail_rather_than_commit_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("jobs.db")).unwrap();
        let (go, held) = hold_writer(&store);
        let a = store.insert("a", &spec(&["true"]));
        // What SQLITE_FULL does to a transaction, on purpose.
        let rollback = store.write(|c, path| c.execute_batch("ROLLBACK").map_err(sql(path)));
        let c = store.insert("c", &spec(&["true"]));
        go.send(()).unwrap();
        let _ = held.wait();
        let _ = rollback.wait();
        assert!(
            a.wait().is_err(),
            "a write that was rolled back reported success"
        );
        assert!(
            c.wait().is_err(),
            "a write after the rollback reported success"
        );
        assert!(store.get("a").unwrap().is_none());
        assert!(store.get("c").unwrap().is_none());
        // The writer goes on.
        assert!(matches!(
            store.insert("d", &spec(&["true"])).wait().unwrap(),
            Inserted::New(_)
        ));
    }

    #[test]
    fn writes_queued_before_the_store_is_dropped_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            let store = Store::open(&path).unwrap();
            for i in 0..100 {
                drop(store.insert(&format!("j{i}"), &spec(&["true"])));
            }
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.in_states(&[JobState::Queued]).unwrap().len(), 100);
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

    #[test]
    fn records_from_before_produced_counts_keep_their_spooled_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        {
            // A database as the first schema left it: `*_bytes` were the bytes kept.
            let c = Connection::open(&path).unwrap();
            c.execute_batch(MIGRATIONS[0]).unwrap();
            c.pragma_update(None, "user_version", 1).unwrap();
            c.execute(
                "INSERT INTO jobs (id, owner, spec, state, created_ms, stdout_bytes, stderr_bytes) \
                 VALUES ('old', 'o', '{}', 'succeeded', 0, 7, 3)",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.finished_totals().unwrap(), (1, 10));
        store.insert("new", &spec(&["true"])).wait().unwrap();
        let o = Outcome {
            stdout_bytes: 5_000,
            spooled_bytes: 1_024,
            ..Outcome::default()
        };
        store
            .mark_finished("new", JobState::Succeeded, &o)
            .wait()
            .unwrap();
        assert_eq!(store.get("new").unwrap().unwrap().stdout_bytes, 5_000);
        assert_eq!(store.finished_totals().unwrap(), (2, 1_034));
        assert_eq!(
            store.finished_oldest_first(10).unwrap(),
            vec![("old".to_owned(), 10), ("new".to_owned(), 1_024)]
        );
    }
}
