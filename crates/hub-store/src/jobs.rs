//! The jobs through the hub and their output: what the store keeps of each, the rule an
//! upload follows, and the bodies both backends run (crate::exec).
//!
//! Lock order where other hubs write too: a change that moves an agent's jobs' version
//! takes the generation counter's row first, as every change to a scope does, then the
//! job rows (in id order when several): two hubs' changes take turns rather than
//! deadlock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::LazyLock;

use crate::exec::{args, filled, next_generation, next_seq, Decided, Lock, Param, Row, Tx};
use crate::proto::job::{JobSpec, Truncation};
use crate::{encode, sql, u64_of, StoreError, Stream};

/// What changes about a hub job as its agent reports it (or as it is cancelled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobProgress {
    /// `pending`, or the runner's state.
    pub state: String,
    pub cancel_requested: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub finished_ms: Option<u64>,
    /// When the hub first heard the job had reached its agent's runner (hub clock).
    pub started_ms: Option<u64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub runner_truncated: Option<Truncation>,
    /// What the job's egress proxy refused, as its agent last reported it.
    pub egress_denied: Vec<crate::proto::egress::Denial>,
    /// Ended, and all of its output the hub will hold is there.
    pub done: bool,
}

/// One hub job, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    pub id: String,
    /// Submission order, over the whole hub.
    pub seq: u64,
    /// Empty while a selected job waits in the fleet's queue.
    pub agent: String,
    pub spec: JobSpec,
    pub created_ms: u64,
    pub progress: JobProgress,
    /// The selector it was routed by (canonical text), for a selected job.
    pub selector: Option<String>,
    pub priority: u8,
    /// When a queued job nobody took ends `expired` (Unix ms).
    pub queue_deadline_ms: Option<u64>,
    /// The fan-out it is a member of.
    pub group: Option<String>,
    /// 1 for a job as submitted; `n` for `ID.n`, its retry after attempt `n - 1` was lost.
    pub attempt: u32,
    /// Retries left, should this attempt end `lost`.
    pub retries: u8,
    /// The agent the previous attempt was lost on: another one is preferred.
    pub avoid: Option<String>,
    /// The selector of the scoped token that submitted it: only agents whose hub labels
    /// match may take it.
    pub scope: Option<String>,
    /// How much of each stream the hub has acknowledged, and how much of it it keeps
    /// (less, past its cap).
    pub stdout_length: u64,
    pub stderr_length: u64,
    pub stdout_stored: u64,
    pub stderr_stored: u64,
}

impl JobRow {
    /// A queued job running `true`, every other field at its default: where a test
    /// builds the row it needs, field by field.
    pub fn queued(id: &str) -> Self {
        Self {
            id: id.into(),
            seq: 0,
            agent: String::new(),
            spec: JobSpec::from_argv(["true"]),
            created_ms: 0,
            progress: JobProgress {
                state: crate::proto::fleet_job::QUEUED.into(),
                ..JobProgress::default()
            },
            selector: None,
            priority: crate::proto::fleet_job::DEFAULT_PRIORITY,
            queue_deadline_ms: None,
            group: None,
            attempt: 1,
            retries: 0,
            avoid: None,
            scope: None,
            stdout_length: 0,
            stderr_length: 0,
            stdout_stored: 0,
            stderr_stored: 0,
        }
    }
}

/// The outcome of an output upload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// The stream's acknowledged length now.
    Length(u64),
    /// The upload starts past the acknowledged length, which it names: nothing taken.
    Gap(u64),
    NoJob,
}

/// What an upload does to a stream, by the one rule every store follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendPlan {
    /// Nothing to write: the answer.
    Answer(Appended),
    /// Write `data[skip..skip + keep]` at the stored end; the stream is `length` long then.
    Take {
        skip: usize,
        keep: usize,
        length: u64,
    },
}

/// An upload of `len` bytes at `offset` to a stream the hub acknowledged `length` bytes
/// of and keeps `stored` of (at most `cap`). What the hub has already is the same bytes
/// (a spool is append-only): only what lies past `length` is new, and a job `done` takes
/// nothing more.
pub fn plan_append(
    length: u64,
    stored: u64,
    done: bool,
    offset: u64,
    len: usize,
    cap: u64,
) -> AppendPlan {
    if done {
        return AppendPlan::Answer(Appended::Length(length));
    }
    if offset > length {
        return AppendPlan::Answer(Appended::Gap(length));
    }
    let skip = length - offset;
    if skip >= len as u64 {
        return AppendPlan::Answer(Appended::Length(length));
    }
    let new = len - skip as usize;
    AppendPlan::Take {
        skip: skip as usize,
        keep: (new as u64).min(cap.saturating_sub(stored)) as usize,
        length: length + new as u64,
    }
}

/// What [`JobStore::assign_jobs`] did with one assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assigned {
    /// The job is the agent's now; the change took this number of the fleet's counter,
    /// the agent's jobs' version now (its scope keeps its generation: jobs are not
    /// settings).
    To(u64),
    /// The job is no longer queued (another hub assigned it, or it ended): nothing changed.
    Gone,
    /// The agent has as many open jobs as it may: nothing changed.
    Full,
}

/// One assignment of a dispatch round: queued job `job` to `agent`, if the agent has
/// fewer than `max_open` jobs not done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub job: String,
    pub agent: String,
    pub max_open: usize,
}

/// Which jobs a listing shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobFilter<'a> {
    pub agent: Option<&'a str>,
    /// Jobs routed by this selector (canonical text).
    pub selector: Option<&'a str>,
    /// The members of one fan-out.
    pub group: Option<&'a str>,
}

/// The jobs through the hub and their output, as the hub's database keeps them; the same
/// rules as [`crate::Store`].
pub trait JobStore: Send + Sync + 'static {
    /// Adds a job (its `seq` is assigned here). A job for an agent takes the next number
    /// of the fleet's counter, which becomes the agent's `jobs_version` (so that every
    /// hub answers the agent alike, and the other hubs' check for a missed change covers
    /// it), but moves no scope's generation (jobs are not settings); a queued one (no
    /// agent yet) takes none. Either tells the other hubs. Returns (seq, the number
    /// taken), or `None` when the id is taken.
    fn insert_job(
        &self,
        job: &JobRow,
    ) -> impl Future<Output = Result<Option<(u64, Option<u64>)>, StoreError>> + Send;

    /// Gives each queued job of `batch` to its agent if the job is still queued and the
    /// agent has fewer than its `max_open` jobs not done (counting the batch's own), in
    /// one transaction: the store decides, so that two hubs never hand one job out twice,
    /// nor one agent more than it may take. Each agent given a job takes the next
    /// number of the fleet's counter, as [`Self::insert_job`] does. One outcome per
    /// assignment, in order.
    fn assign_jobs(
        &self,
        batch: &[Assignment],
    ) -> impl Future<Output = Result<Vec<Assigned>, StoreError>> + Send;

    /// Ends the queued job `id` as `progress` says (cancelled, expired), if it is still
    /// queued; false when it is not (assigned meanwhile, or ended).
    fn end_queued(
        &self,
        id: &str,
        progress: &JobProgress,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Records what changed about some of `agent`'s jobs, in one transaction; with `bump`
    /// (what the agent is sent changed) the change takes the next number of the fleet's
    /// counter, as [`Self::insert_job`] does, which is returned.
    fn update_jobs(
        &self,
        agent: &str,
        jobs: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> impl Future<Output = Result<Option<u64>, StoreError>> + Send;

    /// Appends to a stream what of `data` (uploaded at `offset`) lies past the length
    /// acknowledged, keeping at most `cap` bytes of the stream.
    fn append_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: bytes::Bytes,
        cap: u64,
    ) -> impl Future<Output = Result<Appended, StoreError>> + Send;

    /// Up to `limit` bytes of what the hub keeps of a stream, from `offset`.
    fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<u8>, StoreError>> + Send;

    fn get_job(&self, id: &str) -> impl Future<Output = Result<Option<JobRow>, StoreError>> + Send;

    /// The agent of a job, without the rest of it.
    fn job_agent(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Jobs newest first, as `filter` picks them, below `before` (a seq), at most `limit`.
    fn list_jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<JobRow>, StoreError>> + Send;

    /// Deletes the oldest done jobs and their output beyond the newest `keep`; returns
    /// how many went.
    fn retain_jobs(&self, keep: usize) -> impl Future<Output = Result<usize, StoreError>> + Send;
}

// The bodies both backends run (crate::exec): each backend's `JobStore` only opens the
// transaction and runs one.

/// What `agent` is sent of its jobs changed: the change takes the next number of the
/// counter, which becomes the agent's jobs' version.
async fn jobs_moved(tx: &mut impl Tx, agent: &str) -> Result<u64, StoreError> {
    let version = next_generation(tx).await?;
    tx.execute(sql::AGENT_SET_JOBS_VERSION, &args![agent, version])
        .await?;
    Ok(version)
}

/// A job row, its JSON columns decoded; one that does not decode is an error that names
/// the job and its database.
fn job_row(mut r: Row) -> Result<JobRow, StoreError> {
    let id = r.text(0)?;
    let corrupt = |what: &str, r: &Row| {
        let (path, what) = (r.store.to_string(), format!("the {what} of job {id:?}"));
        move |source| StoreError::Corrupt { path, what, source }
    };
    let spec = r.text(3)?;
    let spec = serde_json::from_str(&spec).map_err(corrupt("spec", &r))?;
    let runner_truncated = r
        .opt_text(13)?
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt("truncation", &r))?;
    let egress_denied = r
        .opt_text(28)?
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(corrupt("egress refusals", &r))?
        .unwrap_or_default();
    Ok(JobRow {
        seq: r.u64(1)?,
        agent: r.text(2)?,
        spec,
        created_ms: r.u64(4)?,
        progress: JobProgress {
            state: r.text(5)?,
            cancel_requested: r.int(6)? != 0,
            exit_code: r.opt_int(7)?.map(|c| c as i32),
            signal: r.opt_int(8)?.map(|s| s as i32),
            error: r.opt_text(9)?,
            finished_ms: r.opt_u64(10)?,
            started_ms: r.opt_u64(19)?,
            stdout_bytes: r.u64(11)?,
            stderr_bytes: r.u64(12)?,
            runner_truncated,
            egress_denied,
            done: r.int(14)? != 0,
        },
        stdout_length: r.u64(15)?,
        stderr_length: r.u64(16)?,
        stdout_stored: r.u64(17)?,
        stderr_stored: r.u64(18)?,
        selector: r.opt_text(20)?,
        priority: r.int(21)?.clamp(0, i64::from(u8::MAX)) as u8,
        queue_deadline_ms: r.opt_u64(22)?,
        group: r.opt_text(23)?,
        attempt: r.int(24)?.clamp(1, i64::from(u32::MAX)) as u32,
        retries: r.int(25)?.clamp(0, i64::from(u8::MAX)) as u8,
        avoid: r.opt_text(26)?,
        scope: r.opt_text(27)?,
        id,
    })
}

/// The jobs a query of `JOB_COLUMNS` answered.
pub(crate) async fn select(
    tx: &mut impl Tx,
    statement: &str,
    args: &[Param<'_>],
) -> Result<Vec<JobRow>, StoreError> {
    let rows = tx.query(statement, args).await?;
    rows.into_iter().map(job_row).collect()
}

pub(crate) async fn insert(
    tx: &mut impl Tx,
    job: &JobRow,
) -> Result<Decided<Option<(u64, Option<u64>)>>, StoreError> {
    let spec = encode(tx.name(), "a job spec to store", &job.spec)?;
    let queued = job.agent.is_empty();
    // The counter's row first: the lock order (module doc).
    let version = if queued {
        None
    } else {
        Some(jobs_moved(tx, &job.agent).await?)
    };
    let seq = next_seq(tx, "job_seq").await?;
    let p = &job.progress;
    let inserted = tx
        .execute(
            sql::JOB_INSERT,
            &args![
                &job.id,
                seq,
                &job.agent,
                spec.as_str(),
                job.created_ms,
                &p.state,
                &job.selector,
                i64::from(job.priority),
                job.queue_deadline_ms,
                &job.group,
                i64::from(job.attempt),
                i64::from(job.retries),
                &job.avoid,
                &job.scope,
            ],
        )
        .await?;
    if inserted == 0 {
        // The id is taken: the numbers taken go back with the rest.
        return Ok(Decided::Rollback(None));
    }
    if queued {
        tx.tell('q', None, &job.id);
    } else {
        tx.tell('a', version, &job.agent);
    }
    Ok(Decided::Commit(Some((u64_of(seq), version))))
}

pub(crate) async fn assign(
    tx: &mut impl Tx,
    batch: &[Assignment],
) -> Result<Decided<Vec<Assigned>>, StoreError> {
    if tx.shared() {
        // The counter's row first, as every change takes it: its lock orders this round
        // after every other change in flight (another hub's assignments to the same
        // agents included), so the counts below are the counts at commit.
        tx.query(sql::GENERATION_LOCKED, &[]).await?;
    }
    let mut open: HashMap<&str, u64> = HashMap::new();
    let mut given: Vec<(&str, u64)> = Vec::new();
    let mut out = Vec::with_capacity(batch.len());
    for a in batch {
        let n = match open.get(a.agent.as_str()) {
            Some(n) => *n,
            None => match tx.query_opt(sql::AGENT_OPEN_JOBS, &args![&a.agent]).await? {
                Some(mut row) => row.u64(0)?,
                None => 0,
            },
        };
        open.insert(&a.agent, n);
        if n >= a.max_open as u64 {
            out.push(Assigned::Full);
            continue;
        }
        // A row another hub assigned meanwhile no longer has `agent = ''` when this
        // statement gets its lock: nothing changes.
        if tx
            .execute(sql::JOB_ASSIGN, &args![&a.job, &a.agent])
            .await?
            == 0
        {
            out.push(Assigned::Gone);
            continue;
        }
        open.insert(&a.agent, n + 1);
        let version = match given.iter().find(|(g, _)| *g == a.agent) {
            Some((_, v)) => *v,
            None => {
                let v = jobs_moved(tx, &a.agent).await?;
                given.push((&a.agent, v));
                v
            }
        };
        out.push(Assigned::To(version));
    }
    for (agent, version) in given {
        tx.tell('a', Some(version), agent);
    }
    Ok(Decided::Commit(out))
}

pub(crate) async fn end_queued(
    tx: &mut impl Tx,
    id: &str,
    p: &JobProgress,
) -> Result<Decided<bool>, StoreError> {
    let ended = tx
        .execute(
            sql::QUEUED_JOB_END,
            &args![
                id,
                &p.state,
                i64::from(p.cancel_requested),
                &p.error,
                p.finished_ms,
                i64::from(p.done),
            ],
        )
        .await?;
    if ended == 0 {
        return Ok(Decided::Rollback(false));
    }
    tx.tell('q', None, id);
    Ok(Decided::Commit(true))
}

pub(crate) async fn update(
    tx: &mut impl Tx,
    agent: &str,
    mut jobs: Vec<(String, JobProgress)>,
    bump: bool,
) -> Result<Decided<Option<u64>>, StoreError> {
    let version = if bump {
        Some(jobs_moved(tx, agent).await?)
    } else {
        None
    };
    // In id order, as every hub locks them.
    jobs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    for (id, p) in &jobs {
        let truncated = p
            .runner_truncated
            .as_ref()
            .map(|t| encode(tx.name(), "a truncation to store", t))
            .transpose()?;
        let denied = (!p.egress_denied.is_empty())
            .then(|| encode(tx.name(), "egress refusals to store", &p.egress_denied))
            .transpose()?;
        // Each hub writes from its own copy of the job (a reconcile whose client went
        // away, written after a newer one): the statement keeps a cancel asked, an ended
        // job's outcome, and a done job whole.
        tx.execute(
            sql::JOB_PROGRESS,
            &args![
                id,
                &p.state,
                i64::from(p.cancel_requested),
                p.exit_code.map(i64::from),
                p.signal.map(i64::from),
                &p.error,
                p.finished_ms,
                p.stdout_bytes,
                p.stderr_bytes,
                &truncated,
                i64::from(p.done),
                p.started_ms,
                &denied,
            ],
        )
        .await?;
    }
    tx.tell('a', version, agent);
    Ok(Decided::Commit(version))
}

pub(crate) async fn append(
    tx: &mut impl Tx,
    job: &str,
    stream: Stream,
    offset: u64,
    data: &[u8],
    cap: u64,
) -> Result<Decided<Appended>, StoreError> {
    let s = stream.name();
    // The job's row locked where other hubs write: an upload through another one (an
    // agent that moved mid-upload, its first request still in flight) waits, then sees
    // this length.
    let lock = if tx.shared() { " FOR UPDATE" } else { "" };
    let read = format!("SELECT {s}_length, {s}_stored, done FROM jobs WHERE id = $1{lock}");
    let Some(mut row) = tx.query_opt(&read, &args![job]).await? else {
        return Ok(Decided::Rollback(Appended::NoJob));
    };
    let stored = row.u64(1)?;
    let done = row.int(2)? != 0;
    let (skip, keep, length) = match plan_append(row.u64(0)?, stored, done, offset, data.len(), cap)
    {
        AppendPlan::Answer(a) => return Ok(Decided::Rollback(a)),
        AppendPlan::Take { skip, keep, length } => (skip, keep, length),
    };
    if keep > 0 {
        let chunk = &data[skip..skip + keep];
        tx.execute(sql::OUTPUT_INSERT, &args![job, s, stored, chunk])
            .await?;
    }
    let write = format!("UPDATE jobs SET {s}_length = $2, {s}_stored = $3 WHERE id = $1");
    tx.execute(&write, &args![job, length, stored + keep as u64])
        .await?;
    tx.tell('o', None, job);
    Ok(Decided::Commit(Appended::Length(length)))
}

pub(crate) async fn read_output(
    tx: &mut impl Tx,
    job: &str,
    stream: Stream,
    offset: u64,
    limit: usize,
) -> Result<Vec<u8>, StoreError> {
    let offset = offset.min(i64::MAX as u64);
    // From the chunk that holds `offset` (the last one starting at or before it), by the
    // primary key: no scan of the chunks before.
    let rows = tx
        .query(sql::OUTPUT_FROM, &args![job, stream.name(), offset])
        .await?;
    let mut out = Vec::new();
    for mut row in rows {
        let start = row.u64(0)?;
        let data = row.bytes(1)?;
        let from = offset.saturating_sub(start).min(data.len() as u64) as usize;
        let take = (data.len() - from).min(limit - out.len());
        out.extend_from_slice(&data[from..from + take]);
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

pub(crate) async fn get(tx: &mut impl Tx, id: &str) -> Result<Option<JobRow>, StoreError> {
    Ok(select(tx, sql::JOB_BY_ID, &args![id]).await?.pop())
}

pub(crate) async fn agent_of(tx: &mut impl Tx, id: &str) -> Result<Option<String>, StoreError> {
    match tx.query_opt(sql::JOB_AGENT, &args![id]).await? {
        Some(mut row) => row.text(0).map(Some),
        None => Ok(None),
    }
}

pub(crate) async fn page(
    tx: &mut impl Tx,
    filter: JobFilter<'_>,
    before: Option<u64>,
    limit: usize,
) -> Result<Vec<JobRow>, StoreError> {
    let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
    let page = args![filter.agent, filter.selector, filter.group, before, limit];
    select(tx, sql::JOBS_PAGE, &page).await
}

pub(crate) async fn retain(tx: &mut impl Tx, keep: usize) -> Result<Decided<usize>, StoreError> {
    // Every hub retains: one at a time, the others skip this round.
    if !tx.try_lock(Lock::Retention).await? {
        return Ok(Decided::Rollback(0));
    }
    let done = match tx.query_opt(sql::DONE_JOBS, &[]).await? {
        Some(mut row) => row.u64(0)? as usize,
        None => 0,
    };
    let over = done.saturating_sub(keep);
    if over == 0 {
        return Ok(Decided::Rollback(0));
    }
    // The newest of the oldest `over`: every done job up to it goes, in two statements
    // whatever their number.
    let Some(mut last) = tx
        .query_opt(sql::OLDEST_DONE_UP_TO, &args![over - 1])
        .await?
    else {
        return Ok(Decided::Rollback(0));
    };
    let last = last.int(0)?;
    // The jobs first, then the output of exactly those: a job another hub ends between
    // two statements is either gone whole or kept whole, never left without its row.
    let gone = tx.query(sql::DONE_JOBS_DELETE, &args![last]).await?;
    let ids = gone
        .into_iter()
        .map(|mut row| row.text(0))
        .collect::<Result<Vec<_>, _>>()?;
    for chunk in ids.chunks(IDS_AT_ONCE) {
        let list: Vec<Param<'_>> = filled(chunk, IDS_AT_ONCE).map(Param::from).collect();
        tx.execute(&OUTPUT_OF_JOBS_DELETE, &list).await?;
    }
    Ok(Decided::Commit(ids.len()))
}

/// Jobs whose output one statement deletes ([`filled`]: one prepared statement serves
/// any number).
const IDS_AT_ONCE: usize = 64;

static OUTPUT_OF_JOBS_DELETE: LazyLock<String> = LazyLock::new(|| {
    let list: Vec<String> = (1..=IDS_AT_ONCE).map(|i| format!("${i}")).collect();
    format!("DELETE FROM job_output WHERE job IN ({})", list.join(", "))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_takes_only_what_lies_past_the_acknowledged_length() {
        use AppendPlan::{Answer, Take};
        // (length, stored, done, offset, len, cap) → plan
        let cases = [
            (
                (0, 0, false, 0, 3, 8),
                Take {
                    skip: 0,
                    keep: 3,
                    length: 3,
                },
            ),
            ((3, 3, false, 0, 3, 8), Answer(Appended::Length(3))),
            (
                (3, 3, false, 2, 4, 8),
                Take {
                    skip: 1,
                    keep: 3,
                    length: 6,
                },
            ),
            ((6, 6, false, 9, 1, 8), Answer(Appended::Gap(6))),
            (
                (6, 6, false, 6, 5, 8),
                Take {
                    skip: 0,
                    keep: 2,
                    length: 11,
                },
            ),
            (
                (11, 8, false, 11, 4, 8),
                Take {
                    skip: 0,
                    keep: 0,
                    length: 15,
                },
            ),
            ((5, 5, true, 5, 4, 8), Answer(Appended::Length(5))),
            ((5, 5, true, 9, 4, 8), Answer(Appended::Length(5))),
        ];
        for ((length, stored, done, offset, len, cap), want) in cases {
            assert_eq!(
                plan_append(length, stored, done, offset, len, cap),
                want,
                "{length} {stored} {done} {offset} {len} {cap}"
            );
        }
    }
}
