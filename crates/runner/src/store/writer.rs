//! The writer thread: every write of the job database goes through it, in groups (one
//! transaction, one commit, for whatever is queued when it wakes), each write in its own
//! savepoint; state changes the database refuses for a reason that may pass are held,
//! in order, shown to reads, and tried again with backoff.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{params, Connection, ErrorCode};
use tokio::sync::oneshot;

use super::schema::sql;
use super::{JobStoreError, Outcome, Pending, Recorded};
use crate::proto::job::{JobRecord, JobState};

/// Runs a write's statements (or, when told the batch's transaction is gone, only fails);
/// returns what to tell its caller once the batch's commit succeeded (`None`) or failed
/// (`Some(reason, full)`).
pub(super) type Write = Box<dyn FnOnce(&Connection, Lost) -> (Reply, bool) + Send>;

/// Whether the batch's transaction is gone when a write's turn comes, and whether the disk
/// was full when it went: the writes after it then fail as that one did (507, not 500).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lost {
    No,
    Yes { full: bool },
}
pub(super) type Reply = Box<dyn FnOnce(Option<&(String, bool)>) + Send>;

/// What the writer is sent: a one-off write, or a state change it holds until committed.
pub(super) enum Msg {
    Write(Write),
    Change(Transition, oneshot::Sender<Result<Recorded, JobStoreError>>),
}

/// More writes than this wait for the next transaction, so that no caller waits behind an
/// unbounded batch.
pub(super) const MAX_BATCH: usize = 256;
/// Changes held in memory beyond which new jobs are refused. Each job makes at most
/// four, and the jobs that make them are bounded by the queue and `max_jobs`.
pub const MAX_HELD: usize = 4096;
/// The first pause before held changes are tried again; it doubles up to `MAX_RETRY`,
/// and any successful write in between tries them at once.
pub(super) const FIRST_RETRY: Duration = Duration::from_millis(100);
pub(super) const MAX_RETRY: Duration = Duration::from_secs(5);

/// A job state change as data, so that one the database refused can be tried again and
/// shown meanwhile.
#[derive(Debug, Clone)]
pub(super) struct Transition {
    pub(super) id: String,
    /// When it happened (not when it was committed).
    pub(super) at_ms: i64,
    pub(super) change: Change,
}

#[derive(Debug, Clone)]
pub(super) enum Change {
    Starting {
        admitted_ms: i64,
    },
    Running {
        pid: i32,
        start_time: Option<u64>,
        confinement: String,
    },
    Finished {
        state: JobState,
        outcome: Box<Outcome>,
    },
}

/// The statement of a state change: `state` is ?1, the job's id ?2, the extra columns
/// from ?3 on. Built at compile time, so a transition formats nothing.
macro_rules! update {
    ($set:literal) => {
        concat!("UPDATE jobs SET state = ?1", $set, " WHERE id = ?2")
    };
}

impl Transition {
    pub(super) fn state(&self) -> JobState {
        match &self.change {
            Change::Starting { .. } => JobState::Starting,
            Change::Running { .. } => JobState::Running,
            Change::Finished { state, .. } => *state,
        }
    }

    /// Sets the job's columns and records the transition. Running it twice changes nothing
    /// more than running it once, but for a second row in `transitions`: it is only run
    /// again when the first did not commit.
    pub(super) fn apply_sql(&self, c: &Connection, path: &Path) -> Result<(), JobStoreError> {
        let state = self.state().as_str();
        let id = &self.id;
        match &self.change {
            Change::Starting { admitted_ms } => c
                .prepare_cached(update!(", started_ms = ?3"))
                .and_then(|mut s| s.execute(params![state, id, admitted_ms])),
            Change::Running {
                pid,
                start_time,
                confinement,
            } => c
                .prepare_cached(update!(", pid = ?3, start_time = ?4, confinement = ?5"))
                .and_then(|mut s| {
                    s.execute(params![
                        state,
                        id,
                        pid,
                        start_time.map(|t| t as i64),
                        confinement
                    ])
                }),
            Change::Finished { outcome: o, .. } => {
                let truncated = o
                    .output_truncated
                    .as_ref()
                    .and_then(|t| serde_json::to_string(t).ok());
                let denied = (!o.egress_denied.is_empty())
                    .then(|| serde_json::to_string(&o.egress_denied).ok())
                    .flatten();
                c.prepare_cached(update!(
                    ", exit_code = ?3, signal = ?4, error = ?5, stdout_bytes = ?6, \
                     stderr_bytes = ?7, stdout_truncated = ?8, stderr_truncated = ?9, \
                     finished_ms = ?10, output_truncated = ?11, spooled_bytes = ?12, \
                     egress_denied = ?13"
                ))
                .and_then(|mut s| {
                    s.execute(params![
                        state,
                        id,
                        o.exit_code,
                        o.signal,
                        o.error,
                        o.stdout_bytes as i64,
                        o.stderr_bytes as i64,
                        o.stdout_truncated,
                        o.stderr_truncated,
                        self.at_ms,
                        truncated,
                        o.spooled_bytes as i64,
                        denied
                    ])
                })
            }
        }
        .and_then(|_| {
            c.prepare_cached(
                "INSERT INTO transitions (job_seq, state, at_ms) SELECT seq, ?1, ?2 FROM jobs WHERE id = ?3",
            )?
            .execute(params![state, self.at_ms, id])
        })
        .map(|_| ())
        .map_err(sql(path))
    }

    /// What the record looks like with this change, as `apply_sql` would make it.
    pub(super) fn apply_to(&self, rec: &mut JobRecord) {
        rec.state = self.state();
        rec.commit_pending = true;
        match &self.change {
            Change::Starting { admitted_ms } => rec.started_ms = Some(*admitted_ms),
            Change::Running {
                pid,
                start_time,
                confinement,
            } => {
                rec.pid = Some(*pid);
                rec.start_time = *start_time;
                rec.confinement = Some(confinement.clone());
            }
            Change::Finished { outcome: o, .. } => {
                rec.exit_code = o.exit_code;
                rec.signal = o.signal;
                rec.error = o.error.clone();
                rec.stdout_bytes = o.stdout_bytes;
                rec.stderr_bytes = o.stderr_bytes;
                rec.stdout_truncated = o.stdout_truncated;
                rec.stderr_truncated = o.stderr_truncated;
                rec.output_truncated = o.output_truncated.clone();
                rec.egress_denied = o.egress_denied.clone();
                rec.finished_ms = Some(self.at_ms);
            }
        }
    }
}

/// The state changes the writer holds, per job, oldest first: what reads lay over the
/// database until they are committed.
#[derive(Default)]
pub(super) struct Held {
    pub(super) by_job: HashMap<String, VecDeque<Transition>>,
    /// How many, readable without the lock: reads skip it while nothing is held, so they
    /// never make a submission or the health check wait.
    pub(super) count: Arc<AtomicUsize>,
}

impl Held {
    pub(super) fn push(&mut self, t: &Transition) {
        self.by_job
            .entry(t.id.clone())
            .or_default()
            .push_back(t.clone());
        self.count.fetch_add(1, Ordering::SeqCst);
    }

    /// Forgets the oldest held change of `id`: changes of a job commit in order.
    pub(super) fn pop(&mut self, id: &str) {
        if let Some(q) = self.by_job.get_mut(id) {
            if q.pop_front().is_some() {
                self.count.fetch_sub(1, Ordering::SeqCst);
            }
            if q.is_empty() {
                self.by_job.remove(id);
            }
        }
    }

    pub(super) fn apply(&self, rec: &mut JobRecord) {
        for t in self.by_job.get(&rec.id).into_iter().flatten() {
            t.apply_to(rec);
        }
    }
}

/// Runs `f` in a savepoint of the batch's transaction: undone alone when it fails.
pub(super) fn in_savepoint<T>(
    c: &Connection,
    path: &Path,
    f: impl FnOnce(&Connection, &Path) -> Result<T, JobStoreError>,
) -> Result<T, JobStoreError> {
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

/// A state change the writer has not committed yet, and whom to tell when it is.
pub(super) struct Unsaved {
    pub(super) t: Transition,
    pub(super) reply: Answer,
}

pub(super) enum Answer {
    /// Its caller waits for the first try.
    First(oneshot::Sender<Result<Recorded, JobStoreError>>),
    /// Its caller was told `Held`, and waits for the commit.
    Later(oneshot::Sender<Result<(), JobStoreError>>),
}

/// One write of a batch, once run, before its commit.
pub(super) enum Step {
    Write(Reply),
    Change(Unsaved, Tried),
}

pub(super) enum Tried {
    Applied,
    /// Not run, or run and refused for a reason that may pass: held for the next try.
    Deferred,
    Failed(JobStoreError),
}

/// The writer thread's state. It takes whatever is queued, runs it in one transaction,
/// commits once and answers each write; held changes go first when they are due, and a
/// change never overtakes one queued before it.
pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) path: Arc<Path>,
    pub(super) held: Arc<Mutex<Held>>,
    /// Changes not committed yet, oldest first; `held` shows the same to reads.
    pub(super) unsaved: VecDeque<Unsaved>,
    pub(super) retry_at: Instant,
    pub(super) backoff: crate::util::Doubling,
    #[cfg(test)]
    pub(super) faults: Arc<std::sync::atomic::AtomicU32>,
}

impl Writer {
    /// Ends when the store is dropped, after one last try of what it holds.
    pub(super) fn run(mut self, queue: mpsc::Receiver<Msg>) {
        loop {
            let first = if self.unsaved.is_empty() {
                match queue.recv() {
                    Ok(m) => Some(m),
                    Err(_) => break,
                }
            } else {
                match queue.recv_timeout(self.retry_at.saturating_duration_since(Instant::now())) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut msgs: Vec<Msg> = first.into_iter().collect();
            while msgs.len() < MAX_BATCH {
                match queue.try_recv() {
                    Ok(m) => msgs.push(m),
                    Err(_) => break,
                }
            }
            let retry = !self.unsaved.is_empty() && Instant::now() >= self.retry_at;
            self.batch(msgs, retry);
        }
        if !self.unsaved.is_empty() {
            self.batch(Vec::new(), true);
        }
        for u in self.unsaved.drain(..) {
            tracing::error!(db = %self.path.display(), job = %u.t.id, state = u.t.state().as_str(), "the runner stops before this job state change could be recorded: the next runner reconciles the job");
        }
    }

    /// Test hook: fails the next change as a full disk would.
    pub(super) fn fault(&self) -> Option<JobStoreError> {
        #[cfg(test)]
        {
            let take = self
                .faults
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if take.is_ok() {
                return Some(JobStoreError::Sql {
                    path: self.path.to_path_buf(),
                    source: rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                        Some("injected".into()),
                    ),
                });
            }
        }
        None
    }

    /// One transaction: the held changes first when `retry`, then `msgs` in order.
    pub(super) fn batch(&mut self, msgs: Vec<Msg>, retry: bool) {
        let episode = !self.unsaved.is_empty();
        // If BEGIN fails (something else holds the database past the busy timeout), the
        // whole batch fails at once rather than each write waiting out the timeout again.
        let began = self.conn.execute_batch("BEGIN IMMEDIATE");
        if let Err(e) = &began {
            tracing::error!(db = %self.path.display(), error = %e, "could not begin a transaction for job records");
        }
        let in_tx = began.is_ok();
        // Some errors (SQLITE_FULL, IOERR, NOMEM) roll the whole transaction back, not
        // just the savepoint. The writes after that must not run on their own in
        // autocommit while their batch is reported failed: they fail too.
        let mut lost = !in_tx;
        // Why the transaction went, when a write or change rolled it back.
        let mut lost_full = false;
        // A change waits behind every change queued before it that is not committed, so
        // that a job's changes land in order.
        let mut blocked = !retry && !self.unsaved.is_empty();
        let mut attempted = false;
        let mut refused = false;
        let mut writes = false;
        let earlier = if retry {
            std::mem::take(&mut self.unsaved)
        } else {
            VecDeque::new()
        };
        let mut steps = Vec::with_capacity(earlier.len() + msgs.len());
        let mut change = |w: &Self, u: Unsaved, lost: &mut bool, lost_full: &mut bool| {
            if blocked || *lost {
                blocked = true;
                return Step::Change(u, Tried::Deferred);
            }
            attempted = true;
            let r = match w.fault() {
                Some(e) => Err(e),
                None => in_savepoint(&w.conn, &w.path, |c, p| u.t.apply_sql(c, p)),
            };
            let rolled_back = !*lost && in_tx && w.conn.is_autocommit();
            *lost = *lost || rolled_back;
            if rolled_back && matches!(&r, Err(e) if e.is_disk_full()) {
                *lost_full = true;
            }
            match r {
                Ok(()) => Step::Change(u, Tried::Applied),
                Err(e) if e.is_transient() => {
                    tracing::debug!(db = %w.path.display(), job = %u.t.id, error = %crate::error_chain(&e), "a job state change was refused");
                    blocked = true;
                    refused = true;
                    Step::Change(u, Tried::Deferred)
                }
                Err(e) => Step::Change(u, Tried::Failed(e)),
            }
        };
        for u in earlier {
            steps.push(change(self, u, &mut lost, &mut lost_full));
        }
        for m in msgs {
            match m {
                Msg::Write(w) => {
                    writes = true;
                    let state = if lost {
                        Lost::Yes { full: lost_full }
                    } else {
                        Lost::No
                    };
                    let (reply, full) = w(&self.conn, state);
                    let rolled_back = !lost && in_tx && self.conn.is_autocommit();
                    lost = lost || rolled_back;
                    lost_full = lost_full || (rolled_back && full);
                    steps.push(Step::Write(reply));
                }
                Msg::Change(t, tx) => steps.push(change(
                    self,
                    Unsaved {
                        t,
                        reply: Answer::First(tx),
                    },
                    &mut lost,
                    &mut lost_full,
                )),
            }
        }
        let failed = if in_tx {
            self.conn.execute_batch("COMMIT").err().map(|e| {
                let _ = self.conn.execute_batch("ROLLBACK");
                if !episode {
                    tracing::error!(db = %self.path.display(), error = %e, "could not commit job records");
                }
                // A transaction already rolled back for a full disk fails its COMMIT with
                // "no transaction is active": the disk is still why.
                let full = lost_full || e.sqlite_error_code() == Some(ErrorCode::DiskFull);
                (e.to_string(), full)
            })
        } else {
            None
        };
        let committed = in_tx && failed.is_none();
        let mut applied = false;
        for step in steps {
            match step {
                Step::Write(reply) => reply(failed.as_ref()),
                Step::Change(u, Tried::Applied) if committed => {
                    applied = true;
                    self.saved(u);
                }
                Step::Change(u, Tried::Applied | Tried::Deferred) => self.hold(u),
                Step::Change(u, Tried::Failed(e)) => self.fail(u, e),
            }
        }
        let now = Instant::now();
        if self.unsaved.is_empty() {
            if episode {
                tracing::info!(db = %self.path.display(), "every held job state change is now recorded");
            }
            self.backoff.reset();
        } else if (retry || attempted) && (refused || !committed) {
            if !episode {
                tracing::warn!(db = %self.path.display(), held = self.unsaved.len(), "could not record job state changes (is the disk full?): holding them in memory and trying again until they are");
            }
            self.retry_at = now + self.backoff.pause();
        } else if committed && (applied || writes) {
            // Something was just written: there is room again, so the held go next.
            self.retry_at = now;
        }
    }

    pub(super) fn saved(&mut self, u: Unsaved) {
        match u.reply {
            Answer::First(tx) => {
                let _ = tx.send(Ok(Recorded::Committed));
            }
            Answer::Later(tx) => {
                crate::util::lock(&self.held).pop(&u.t.id);
                let _ = tx.send(Ok(()));
            }
        }
    }

    /// Keeps `u` for the next try; the first time, shows it to reads before its caller
    /// learns it is held.
    pub(super) fn hold(&mut self, u: Unsaved) {
        let reply = match u.reply {
            Answer::First(tx) => {
                crate::util::lock(&self.held).push(&u.t);
                let (later, rx) = oneshot::channel();
                let _ = tx.send(Ok(Recorded::Held(Pending {
                    rx,
                    path: self.path.clone(),
                })));
                Answer::Later(later)
            }
            later => later,
        };
        self.unsaved.push_back(Unsaved { t: u.t, reply });
    }

    pub(super) fn fail(&mut self, u: Unsaved, e: JobStoreError) {
        tracing::error!(db = %self.path.display(), job = %u.t.id, state = u.t.state().as_str(), error = %crate::error_chain(&e), "could not record a job's change");
        match u.reply {
            Answer::First(tx) => {
                let _ = tx.send(Err(e));
            }
            Answer::Later(tx) => {
                crate::util::lock(&self.held).pop(&u.t.id);
                let _ = tx.send(Err(e));
            }
        }
    }
}
