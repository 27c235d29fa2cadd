//! The jobs through the hub and their output, in SQLite.

use std::collections::HashMap;

use super::*;

impl JobStore for SqliteStore {
    async fn insert_job(&self, job: &JobRow) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let job = job.clone();
        self.with(move |conn, path| {
            let e = sql(path);
            let spec = encode(path, "a job spec to store", &job.spec)?;
            let tx = conn.transaction().map_err(&e)?;
            let taken: Option<i64> = tx
                .query_row("SELECT seq FROM jobs WHERE id = ?1", params![job.id], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(&e)?;
            if taken.is_some() {
                return Ok(None);
            }
            let seq = next_seq(&tx, "job_seq", path)?;
            tx.execute(
                &lite(sql::JOB_INSERT),
                params![
                    job.id,
                    seq,
                    job.agent,
                    spec,
                    job.created_ms as i64,
                    job.progress.state,
                    job.selector,
                    i64::from(job.priority),
                    job.queue_deadline_ms.map(|m| m as i64),
                    job.group,
                    i64::from(job.attempt),
                    i64::from(job.retries),
                    job.avoid,
                    job.scope,
                ],
            )
            .map_err(&e)?;
            let generation = if job.agent.is_empty() {
                None
            } else {
                Some(jobs_moved(&tx, &job.agent, path)?)
            };
            tx.commit().map_err(&e)?;
            Ok(Some((u64_of(seq), generation)))
        })
        .await
    }

    async fn update_jobs(
        &self,
        agent: &str,
        jobs: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<Option<u64>, StoreError> {
        let agent = agent.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            {
                let mut stmt = tx
                    // As on PostgreSQL: a write computed from an older copy of the job
                    // (a reconcile whose client went away, written after a newer one)
                    // keeps a cancel asked, an ended job's outcome, and a done job whole.
                    .prepare_cached(&lite(sql::JOB_PROGRESS))
                    .map_err(&e)?;
                for (id, p) in &jobs {
                    let truncated = p
                        .runner_truncated
                        .as_ref()
                        .map(|t| encode(path, "a truncation to store", t))
                        .transpose()?;
                    let denied = (!p.egress_denied.is_empty())
                        .then(|| encode(path, "egress refusals to store", &p.egress_denied))
                        .transpose()?;
                    stmt.execute(params![
                        id,
                        p.state,
                        p.cancel_requested as i64,
                        p.exit_code.map(i64::from),
                        p.signal.map(i64::from),
                        p.error,
                        p.finished_ms.map(|m| m as i64),
                        p.stdout_bytes as i64,
                        p.stderr_bytes as i64,
                        truncated,
                        p.done as i64,
                        p.started_ms.map(|m| m as i64),
                        denied,
                    ])
                    .map_err(&e)?;
                }
            }
            let generation = if bump {
                Some(jobs_moved(&tx, &agent, path)?)
            } else {
                None
            };
            tx.commit().map_err(&e)?;
            Ok(generation)
        })
        .await
    }

    async fn assign_jobs(&self, batch: &[Assignment]) -> Result<Vec<Assigned>, StoreError> {
        let batch = batch.to_vec();
        self.with(move |conn, path| {
            let e = sql(path);
            // One writer at a time: the counts and the changes see the same rows.
            let tx = conn.transaction().map_err(&e)?;
            let mut open: HashMap<&str, u64> = HashMap::new();
            let mut given: HashMap<&str, u64> = HashMap::new();
            let mut out = Vec::with_capacity(batch.len());
            for a in &batch {
                let count = match open.get(a.agent.as_str()) {
                    Some(n) => *n,
                    None => {
                        let n: i64 = tx
                            .prepare_cached(&lite(sql::AGENT_OPEN_JOBS))
                            .and_then(|mut s| s.query_row(params![a.agent], |r| r.get(0)))
                            .map_err(&e)?;
                        u64_of(n)
                    }
                };
                open.insert(&a.agent, count);
                if count >= a.max_open as u64 {
                    out.push(Assigned::Full);
                    continue;
                }
                let n = tx
                    .prepare_cached(&lite(sql::JOB_ASSIGN))
                    .and_then(|mut s| s.execute(params![a.job, a.agent]))
                    .map_err(&e)?;
                if n == 0 {
                    out.push(Assigned::Gone);
                    continue;
                }
                open.insert(&a.agent, count + 1);
                let generation = match given.get(a.agent.as_str()) {
                    Some(g) => *g,
                    None => jobs_moved(&tx, &a.agent, path)?,
                };
                given.insert(&a.agent, generation);
                out.push(Assigned::To(generation));
            }
            tx.commit().map_err(&e)?;
            Ok(out)
        })
        .await
    }

    async fn end_queued(&self, id: &str, p: &JobProgress) -> Result<bool, StoreError> {
        let (id, p) = (id.to_owned(), p.clone());
        self.with(move |conn, path| {
            let n = conn
                .execute(
                    &lite(sql::QUEUED_JOB_END),
                    params![
                        id,
                        p.state,
                        p.cancel_requested as i64,
                        p.error,
                        p.finished_ms.map(|m| m as i64),
                        p.done as i64,
                    ],
                )
                .map_err(sql(path))?;
            Ok(n > 0)
        })
        .await
    }

    async fn append_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: bytes::Bytes,
        cap: u64,
    ) -> Result<Appended, StoreError> {
        let job = job.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            let s = stream.name();
            let tx = conn.transaction().map_err(&e)?;
            let lens: Option<(i64, i64, i64)> = tx
                .query_row(
                    &format!("SELECT {s}_length, {s}_stored, done FROM jobs WHERE id = ?1"),
                    params![job],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(&e)?;
            let Some((length, stored, done)) = lens else {
                return Ok(Appended::NoJob);
            };
            let stored = u64_of(stored);
            let (skip, keep, length) =
                match plan_append(u64_of(length), stored, done != 0, offset, data.len(), cap) {
                    AppendPlan::Answer(a) => return Ok(a),
                    AppendPlan::Take { skip, keep, length } => (skip, keep, length),
                };
            if keep > 0 {
                tx.execute(
                    &lite(sql::OUTPUT_INSERT),
                    params![job, s, stored as i64, &data[skip..skip + keep]],
                )
                .map_err(&e)?;
            }
            tx.execute(
                &format!("UPDATE jobs SET {s}_length = ?2, {s}_stored = ?3 WHERE id = ?1"),
                params![job, length as i64, (stored + keep as u64) as i64],
            )
            .map_err(&e)?;
            tx.commit().map_err(&e)?;
            Ok(Appended::Length(length))
        })
        .await
    }

    async fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let job = job.to_owned();
        self.with(move |conn, path| {
            let e = sql(path);
            let mut stmt = conn
                .prepare_cached(
                    // From the chunk that holds `offset` (the last one starting at or
                    // before it), by the primary key: no scan of the chunks before.
                    &lite(sql::OUTPUT_FROM),
                )
                .map_err(&e)?;
            let offset = offset.min(i64::MAX as u64);
            let mut rows = stmt
                .query(params![job, stream.name(), offset as i64])
                .map_err(&e)?;
            let mut out = Vec::new();
            while let Some(row) = rows.next().map_err(&e)? {
                let start = u64_of(row.get(0).map_err(&e)?);
                let data = row.get_ref(1).map_err(&e)?.as_blob().map_err(|err| {
                    e(rusqlite::Error::FromSqlConversionFailure(
                        1,
                        rusqlite::types::Type::Blob,
                        Box::new(err),
                    ))
                })?;
                let from = offset.saturating_sub(start).min(data.len() as u64) as usize;
                let take = (data.len() - from).min(limit - out.len());
                out.extend_from_slice(&data[from..from + take]);
                if out.len() >= limit {
                    break;
                }
            }
            Ok(out)
        })
        .await
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            let mut rows = select_jobs(conn, path, &lite(sql::JOB_BY_ID), params![id])?;
            Ok(rows.pop())
        })
        .await
    }

    async fn job_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.with(move |conn, path| {
            conn.prepare_cached(&lite(sql::JOB_AGENT))
                .and_then(|mut stmt| stmt.query_row(params![id], |r| r.get(0)).optional())
                .map_err(sql(path))
        })
        .await
    }

    async fn list_jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<JobRow>, StoreError> {
        let agent = filter.agent.map(str::to_owned);
        let selector = filter.selector.map(str::to_owned);
        let group = filter.group.map(str::to_owned);
        self.with(move |conn, path| {
            let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
            select_jobs(
                conn,
                path,
                &lite(sql::JOBS_PAGE),
                params![agent, selector, group, before, limit as i64],
            )
        })
        .await
    }

    async fn retain_jobs(&self, keep: usize) -> Result<usize, StoreError> {
        self.with(move |conn, path| {
            let e = sql(path);
            let tx = conn.transaction().map_err(&e)?;
            let done: i64 = tx
                .query_row(&lite(sql::DONE_JOBS), [], |r| r.get(0))
                .map_err(&e)?;
            let over = (u64_of(done) as usize).saturating_sub(keep);
            if over == 0 {
                return Ok(0);
            }
            let ids: Vec<String> = {
                let mut stmt = tx
                    .prepare_cached(&lite(sql::OLDEST_DONE_JOBS))
                    .map_err(&e)?;
                let ids = stmt
                    .query_map(params![over as i64], |r| r.get(0))
                    .map_err(&e)?
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(&e)?;
                ids
            };
            for id in &ids {
                tx.execute("DELETE FROM job_output WHERE job = ?1", params![id])
                    .map_err(&e)?;
                tx.execute("DELETE FROM jobs WHERE id = ?1", params![id])
                    .map_err(&e)?;
            }
            tx.commit().map_err(&e)?;
            Ok(ids.len())
        })
        .await
    }
}

/// What `agent` is sent of its jobs changed: the change takes the next number of the
/// counter, which becomes the agent's jobs' version.
fn jobs_moved(tx: &rusqlite::Transaction<'_>, agent: &str, path: &str) -> Result<u64, StoreError> {
    let version = next_generation(tx, path)?;
    tx.execute(
        &lite(sql::AGENT_SET_JOBS_VERSION),
        params![agent, version as i64],
    )
    .map_err(sql(path))?;
    Ok(version)
}
