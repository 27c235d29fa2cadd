//! Durable job records: SQLite in WAL mode at `<state>/runner/jobs.db`.
//!
//! Every state change is committed before it is acted on or reported, so a killed runner
//! leaves records that say what was running (pid and process start time included) for the
//! next one to reconcile. WAL with `synchronous=NORMAL` survives any process crash; only
//! a power loss may drop the last commits. Writes go through one writer thread that
//! commits in groups (see [`Store`]); reads block: use them off the runtime.
//!
//! A state change the database refuses for want of room (`SQLITE_FULL`, an I/O error, a
//! lock held too long) is not dropped: the writer holds it in memory, in order, and tries
//! again with backoff until it is committed. Meanwhile reads show it (`commit_pending`),
//! so the API never reports a job that ended as still running. New jobs are refused while
//! the disk is full or too many changes are held (see [`JobStoreError::is_disk_full`]).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use rusqlite::{params, Connection, ErrorCode};
use thiserror::Error;
use tokio::sync::oneshot;

use crate::proto::job::{JobRecord, JobSpec, JobState, Truncation};

// Before the rest: its `columns!` macro is used below.
#[macro_use]
mod schema;
mod writer;

use schema::{connect, get_on, migrate, query_on, sql};
pub use writer::MAX_HELD;
use writer::{
    in_savepoint, Change, Held, Lost, Msg, Transition, Write, Writer, FIRST_RETRY, MAX_RETRY,
};

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
    pub output_truncated: Option<Truncation>,
    pub egress_denied: Vec<crate::proto::egress::Denial>,
}

#[derive(Debug, Error)]
pub enum JobStoreError {
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
    #[error("job database {path}: the disk is full ({reason}): free space on its file system and try again")]
    Full { path: PathBuf, reason: String },
    #[error("job database {path}: {count} job state changes wait in memory to be written (is its disk full?): no new jobs until they are")]
    Backlog { path: PathBuf, count: usize },
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

impl JobStoreError {
    /// The write failed for want of room: the API answers 507, not 500.
    pub fn is_disk_full(&self) -> bool {
        match self {
            JobStoreError::Full { .. } | JobStoreError::Backlog { .. } => true,
            JobStoreError::Sql { source, .. } => {
                source.sqlite_error_code() == Some(ErrorCode::DiskFull)
            }
            _ => false,
        }
    }

    /// Worth trying again later: the same write may well succeed once there is room, the
    /// lock is free, or the I/O error has passed.
    fn is_transient(&self) -> bool {
        match self {
            JobStoreError::Commit { .. } | JobStoreError::Full { .. } => true,
            JobStoreError::Sql { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(
                    ErrorCode::DiskFull
                        | ErrorCode::SystemIoFailure
                        | ErrorCode::DatabaseBusy
                        | ErrorCode::DatabaseLocked
                        | ErrorCode::OutOfMemory
                        | ErrorCode::CannotOpen
                        // A file system remounted read-only (errors=remount-ro after an
                        // I/O error) may come back: until then the change stays held and
                        // shown, never dropped so that a record would go backwards.
                        | ErrorCode::ReadOnly
                )
            ),
            _ => false,
        }
    }
}

/// The result of inserting a job with a client-chosen id.
pub enum Inserted {
    New(JobRecord),
    /// Same id, same spec: the earlier job.
    Existing(JobRecord),
    /// Same id, another spec.
    Conflict(JobRecord),
}

/// What became of a state change once the writer first tried it.
pub enum Recorded {
    Committed,
    /// Not committed yet (the disk is full?): held in memory and shown by reads, retried
    /// until it is; the pending resolves then.
    Held(Pending<()>),
}

/// The job database: one writer thread that commits in groups, and one connection for
/// reads, which WAL lets run beside the writer.
///
/// Writes are queued to the writer and return a [`Pending`] that resolves once the
/// transaction holding them has been committed. Whatever is queued when the writer wakes
/// goes into one transaction, so N jobs changing state at once cost one commit, not N;
/// each write runs in its own savepoint, so one failing write does not undo the others.
/// State changes (`mark_*`) that cannot be committed are held and retried (see
/// [`Recorded::Held`]).
pub struct Store {
    path: Arc<Path>,
    read: Mutex<Connection>,
    /// State changes the writer holds; locked before `read` whenever both are.
    held: Arc<Mutex<Held>>,
    held_count: Arc<AtomicUsize>,
    /// With this many changes held, new jobs are refused.
    max_held: usize,
    writes: Option<mpsc::Sender<Msg>>,
    writer: Option<std::thread::JoinHandle<()>>,
    #[cfg(test)]
    faults: Arc<std::sync::atomic::AtomicU32>,
}

/// A queued write: `.await` it, or [`Pending::wait`] outside the runtime. Dropping it does
/// not cancel the write; a failure nobody waits for is logged.
#[must_use = "a write's failure is only seen by awaiting it"]
pub struct Pending<T> {
    rx: oneshot::Receiver<Result<T, JobStoreError>>,
    path: Arc<Path>,
}

impl<T> Pending<T> {
    /// Blocks until the write has been committed. Not on a runtime thread.
    pub fn wait(self) -> Result<T, JobStoreError> {
        let path = self.path;
        self.rx.blocking_recv().unwrap_or_else(|_| {
            Err(JobStoreError::WriterGone {
                path: path.to_path_buf(),
            })
        })
    }

    /// A pending that has already failed.
    fn failed(path: Arc<Path>, e: JobStoreError) -> Self {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Err(e));
        Self { rx, path }
    }
}

impl<T> std::future::Future for Pending<T> {
    type Output = Result<T, JobStoreError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.rx).poll(cx).map(|r| {
            r.unwrap_or_else(|_| {
                Err(JobStoreError::WriterGone {
                    path: self.path.to_path_buf(),
                })
            })
        })
    }
}

/// Milliseconds since the Unix epoch, as the database keeps them.
pub fn now_ms() -> i64 {
    crate::util::unix_now_ms() as i64
}

impl Store {
    /// Opens (creating, mode 0600 through the runner's umask) and migrates the database,
    /// and starts its writer thread.
    pub fn open(path: &Path) -> Result<Self, JobStoreError> {
        let writer_conn = connect(path)?;
        migrate(&writer_conn, path)?;
        let read = connect(path)?;
        read.pragma_update(None, "query_only", true)
            .map_err(sql(path))?;
        let path: Arc<Path> = path.into();
        let (tx, rx) = mpsc::channel();
        let held = Held::default();
        let held_count = held.count.clone();
        let held = Arc::new(Mutex::new(held));
        #[cfg(test)]
        let faults = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let writer = Writer {
            conn: writer_conn,
            path: path.clone(),
            held: held.clone(),
            unsaved: VecDeque::new(),
            retry_at: Instant::now(),
            backoff: crate::util::Doubling::new(FIRST_RETRY, MAX_RETRY),
            #[cfg(test)]
            faults: faults.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("jobs-db-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(|source| JobStoreError::Thread {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self {
            path,
            read: Mutex::new(read),
            held,
            held_count,
            max_held: MAX_HELD,
            writes: Some(tx),
            writer: Some(writer),
            #[cfg(test)]
            faults,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many state changes wait in memory to be committed.
    pub fn held_count(&self) -> usize {
        self.held_count.load(Ordering::SeqCst)
    }

    fn send(&self, m: Msg) {
        if let Some(writes) = &self.writes {
            // A send fails only when the writer thread is gone; the dropped reply channel
            // then tells the caller.
            let _ = writes.send(m);
        }
    }

    /// Queues `f` for the writer.
    fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, &Path) -> Result<T, JobStoreError> + Send + 'static,
    ) -> Pending<T> {
        let (tx, rx) = oneshot::channel();
        let path = self.path.clone();
        let w: Write = Box::new(move |conn, lost| {
            let result = match lost {
                Lost::No => in_savepoint(conn, &path, f),
                Lost::Yes { full: true } => Err(JobStoreError::Full {
                    path: path.to_path_buf(),
                    reason: "an earlier write in its transaction found the disk full".into(),
                }),
                Lost::Yes { full: false } => Err(JobStoreError::Commit {
                    path: path.to_path_buf(),
                    reason: "its transaction could not begin, or an earlier write rolled it back"
                        .into(),
                }),
            };
            let full = matches!(&result, Err(e) if e.is_disk_full());
            let reply: writer::Reply = Box::new(move |failed: Option<&(String, bool)>| {
                let result = match (result, failed) {
                    (Ok(_), Some((reason, true))) => Err(JobStoreError::Full {
                        path: path.to_path_buf(),
                        reason: reason.to_owned(),
                    }),
                    (Ok(_), Some((reason, false))) => Err(JobStoreError::Commit {
                        path: path.to_path_buf(),
                        reason: reason.to_owned(),
                    }),
                    (r, _) => r,
                };
                if let Err(Err(e)) = tx.send(result) {
                    tracing::error!(error = %crate::error_chain(&e), "could not record a job's change");
                }
            });
            (reply, full)
        });
        self.send(Msg::Write(w));
        Pending {
            rx,
            path: self.path.clone(),
        }
    }

    /// Inserts a queued job, or finds the job that already has this id. Refused with
    /// [`JobStoreError::Full`] when the disk is full, or [`JobStoreError::Backlog`] while
    /// [`MAX_HELD`] changes wait to be written.
    pub fn insert(&self, id: &str, spec: &JobSpec) -> Pending<Inserted> {
        let held = self.held_count();
        if held >= self.max_held {
            return Pending::failed(
                self.path.clone(),
                JobStoreError::Backlog {
                    path: self.path.to_path_buf(),
                    count: held,
                },
            );
        }
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
            .map_err(|source| match source.sqlite_error_code() {
                Some(ErrorCode::DiskFull) => JobStoreError::Full {
                    path: path.to_owned(),
                    reason: source.to_string(),
                },
                _ => sql(path)(source),
            })?;
            let rec = get_on(c, path, &id)?.ok_or_else(|| JobStoreError::Sql {
                path: path.to_owned(),
                source: rusqlite::Error::QueryReturnedNoRows,
            })?;
            Ok(Inserted::New(rec))
        })
    }

    /// The record, with the changes held in memory laid over it.
    pub fn get(&self, id: &str) -> Result<Option<JobRecord>, JobStoreError> {
        if self.held_count() == 0 {
            let conn = crate::util::lock(&self.read);
            return get_on(&conn, &self.path, id);
        }
        // Held across the read, so a change committed meanwhile is seen either in the
        // row or in `held` (applying it to a row that has it changes nothing).
        let held = crate::util::lock(&self.held);
        let conn = crate::util::lock(&self.read);
        let mut rec = get_on(&conn, &self.path, id)?;
        if let Some(r) = rec.as_mut() {
            held.apply(r);
        }
        Ok(rec)
    }

    /// Newest first, optionally filtered, paged by `before` (a `seq`); with the changes
    /// held in memory laid over them, filters included.
    pub fn list(
        &self,
        state: Option<JobState>,
        owner: Option<&str>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, JobStoreError> {
        const LIST: &str = concat!(
            "SELECT ",
            columns!(),
            " FROM jobs WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR owner = ?2) \
             AND (?3 IS NULL OR seq < ?3) ORDER BY seq DESC LIMIT ?4"
        );
        let query = |conn: &Connection, limit: usize| {
            query_on(
                conn,
                &self.path,
                LIST,
                params![state.map(JobState::as_str), owner, before, limit as i64],
            )
        };
        if self.held_count() == 0 {
            return query(&crate::util::lock(&self.read), limit as usize);
        }
        // As in `get`.
        let held = crate::util::lock(&self.held);
        let conn = crate::util::lock(&self.read);
        // Held changes may move jobs out of the filter (so ask for as many more) or
        // into it (so look at each of them).
        let mut recs = query(&conn, limit as usize + held.by_job.len())?;
        for id in held.by_job.keys() {
            if !recs.iter().any(|r| &r.id == id) {
                recs.extend(get_on(&conn, &self.path, id)?);
            }
        }
        for r in &mut recs {
            held.apply(r);
        }
        recs.retain(|r| {
            state.is_none_or(|s| r.state == s)
                && owner.is_none_or(|o| r.owner == o)
                && before.is_none_or(|b| r.seq < b)
        });
        recs.sort_by_key(|r| std::cmp::Reverse(r.seq));
        recs.truncate(limit as usize);
        Ok(recs)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, JobStoreError> {
        let conn = crate::util::lock(&self.read);
        f(&conn).map_err(sql(&self.path))
    }

    /// Jobs in these states as committed, oldest first.
    pub fn in_states(&self, states: &[JobState]) -> Result<Vec<JobRecord>, JobStoreError> {
        let conn = crate::util::lock(&self.read);
        query_on(&conn, &self.path, &in_states_sql(states), [])
    }

    /// The records in `states`, read without opening the database for writing: no
    /// migration, no writer thread, nothing created. For ending a dead runner's jobs when
    /// the database cannot be opened as usual (a newer schema left by a newer build, or a
    /// migration that needs room on a full disk): which processes to stop is known still.
    pub fn read_only_in_states(
        path: &Path,
        states: &[JobState],
    ) -> Result<Vec<JobRecord>, JobStoreError> {
        use rusqlite::OpenFlags;
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql(path))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql(path))?;
        query_on(&conn, path, &in_states_sql(states), [])
    }

    /// Queues a state change. It resolves after the first try: committed, or held and
    /// retried until it is.
    fn transition(&self, id: &str, change: Change) -> Pending<Recorded> {
        let (tx, rx) = oneshot::channel();
        let t = Transition {
            id: id.to_owned(),
            at_ms: now_ms(),
            change,
        };
        self.send(Msg::Change(t, tx));
        Pending {
            rx,
            path: self.path.clone(),
        }
    }

    /// `admitted_ms` is when the scheduler took the job off the queue: it becomes the
    /// job's `started_ms`, so start times follow admission order (FIFO) even when several
    /// jobs launch at once.
    pub fn mark_starting(&self, id: &str, admitted_ms: i64) -> Pending<Recorded> {
        self.transition(id, Change::Starting { admitted_ms })
    }

    pub fn mark_running(
        &self,
        id: &str,
        pid: i32,
        start_time: Option<u64>,
        confinement: &str,
    ) -> Pending<Recorded> {
        self.transition(
            id,
            Change::Running {
                pid,
                start_time,
                confinement: confinement.to_owned(),
            },
        )
    }

    pub fn mark_finished(&self, id: &str, state: JobState, o: &Outcome) -> Pending<Recorded> {
        self.transition(
            id,
            Change::Finished {
                state,
                outcome: Box::new(o.clone()),
            },
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
    pub fn finished_oldest_first(&self, limit: u32) -> Result<Vec<(String, u64)>, JobStoreError> {
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
    pub fn finished_totals(&self) -> Result<(usize, u64), JobStoreError> {
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
    pub fn transitions(&self, id: &str) -> Result<Vec<(String, i64)>, JobStoreError> {
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

/// The records in `states`, oldest first. Columns are only ever added, so a newer schema
/// reads with this one's list.
fn in_states_sql(states: &[JobState]) -> String {
    format!(
        concat!(
            "SELECT ",
            columns!(),
            " FROM jobs WHERE state IN ({}) ORDER BY seq"
        ),
        states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(",")
    )
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
mod tests;
