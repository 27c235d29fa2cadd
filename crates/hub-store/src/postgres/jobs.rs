//! The jobs through the hub and their output, in PostgreSQL.

use std::collections::HashMap;

use super::*;

impl JobStore for PgStore {
    async fn insert_job(&self, job: &JobRow) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let spec = encode(&self.url, "a job spec to store", &job.spec)?;
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let queued = job.agent.is_empty();
        let generation = if queued {
            None
        } else {
            Some(jobs_moved(&tx, &job.agent, &self.url).await?)
        };
        let seq = next_seq(&tx, "job_seq", &self.url).await?;
        let n = tx
            .execute(
                sql::JOB_INSERT,
                &[
                    &job.id,
                    &seq,
                    &job.agent,
                    &spec,
                    &(job.created_ms as i64),
                    &job.progress.state,
                    &job.selector,
                    &i64::from(job.priority),
                    &job.queue_deadline_ms.map(|m| m as i64),
                    &job.group,
                    &i64::from(job.attempt),
                    &i64::from(job.retries),
                    &job.avoid,
                    &job.scope,
                ],
            )
            .await
            .map_err(&e)?;
        if n == 0 {
            return Ok(None);
        }
        if queued {
            self.commit_queued(tx, &job.id).await?;
        } else {
            self.commit_change(tx, &job.agent, generation).await?;
        }
        Ok(Some((u64_of(seq), generation)))
    }

    async fn assign_jobs(&self, batch: &[Assignment]) -> Result<Vec<Assigned>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The generation counter's row first, as every change takes it: its lock orders
        // this round after every other change in flight (another replica's assignments
        // to the same agents included), so the counts below are the counts at commit.
        tx.execute(
            "SELECT value FROM meta WHERE key = 'generation' FOR UPDATE",
            &[],
        )
        .await
        .map_err(&e)?;
        let count = tx.prepare_cached(sql::AGENT_OPEN_JOBS).await.map_err(&e)?;
        // A row another replica assigned meanwhile no longer has `agent = ''` when this
        // statement gets its lock: nothing changes.
        let assign = tx.prepare_cached(sql::JOB_ASSIGN).await.map_err(&e)?;
        let mut open: HashMap<&str, u64> = HashMap::new();
        let mut given: Vec<(&str, u64)> = Vec::new();
        let mut out = Vec::with_capacity(batch.len());
        for a in batch {
            let n = match open.get(a.agent.as_str()) {
                Some(n) => *n,
                None => u64_of(tx.query_one(&count, &[&a.agent]).await.map_err(&e)?.get(0)),
            };
            open.insert(&a.agent, n);
            if n >= a.max_open as u64 {
                out.push(Assigned::Full);
                continue;
            }
            if tx.execute(&assign, &[&a.job, &a.agent]).await.map_err(&e)? == 0 {
                out.push(Assigned::Gone);
                continue;
            }
            open.insert(&a.agent, n + 1);
            let generation = match given.iter().find(|(g, _)| *g == a.agent) {
                Some((_, g)) => *g,
                None => {
                    let g = jobs_moved(&tx, &a.agent, &self.url).await?;
                    given.push((&a.agent, g));
                    g
                }
            };
            out.push(Assigned::To(generation));
        }
        self.commit_changes(tx, &given).await?;
        Ok(out)
    }

    async fn end_queued(&self, id: &str, p: &JobProgress) -> Result<bool, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let n = tx
            .execute(
                sql::QUEUED_JOB_END,
                &[
                    &id,
                    &p.state,
                    &(p.cancel_requested as i64),
                    &p.error,
                    &p.finished_ms.map(|m| m as i64),
                    &(p.done as i64),
                ],
            )
            .await
            .map_err(&e)?;
        if n == 0 {
            return Ok(false);
        }
        self.commit_queued(tx, id).await?;
        Ok(true)
    }

    async fn update_jobs(
        &self,
        agent: &str,
        jobs: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<Option<u64>, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        let generation = if bump {
            Some(jobs_moved(&tx, agent, &self.url).await?)
        } else {
            None
        };
        // Each replica writes from its own copy of the job: the statement keeps what
        // another may have written meanwhile. A cancel asked stays asked, an ended job's
        // outcome stays as it ended, and a done job is not touched.
        let stmt = tx.prepare_cached(sql::JOB_PROGRESS).await.map_err(&e)?;
        // In id order, as every replica locks them.
        let mut jobs = jobs;
        jobs.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (id, p) in &jobs {
            let truncated = p
                .runner_truncated
                .as_ref()
                .map(|t| encode(&self.url, "a truncation to store", t))
                .transpose()?;
            let denied = (!p.egress_denied.is_empty())
                .then(|| encode(&self.url, "egress refusals to store", &p.egress_denied))
                .transpose()?;
            tx.execute(
                &stmt,
                &[
                    id,
                    &p.state,
                    &(p.cancel_requested as i64),
                    &p.exit_code.map(i64::from),
                    &p.signal.map(i64::from),
                    &p.error,
                    &p.finished_ms.map(|m| m as i64),
                    &(p.stdout_bytes as i64),
                    &(p.stderr_bytes as i64),
                    &truncated,
                    &(p.done as i64),
                    &p.started_ms.map(|m| m as i64),
                    &denied,
                ],
            )
            .await
            .map_err(&e)?;
        }
        self.commit_change(tx, agent, generation).await?;
        Ok(generation)
    }

    async fn append_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        data: bytes::Bytes,
        cap: u64,
    ) -> Result<Appended, StoreError> {
        let e = self.err();
        let s = stream.name();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // The job's row locked: an upload through another replica (an agent that moved
        // mid-upload, its first request still in flight) waits, then sees this length.
        let lens = tx
            .query_opt(
                &format!("SELECT {s}_length, {s}_stored, done FROM jobs WHERE id = $1 FOR UPDATE"),
                &[&job],
            )
            .await
            .map_err(&e)?;
        let Some(row) = lens else {
            return Ok(Appended::NoJob);
        };
        let stored = u64_of(row.get(1));
        let done = row.get::<_, i64>(2) != 0;
        let (skip, keep, length) =
            match plan_append(u64_of(row.get(0)), stored, done, offset, data.len(), cap) {
                AppendPlan::Answer(a) => return Ok(a),
                AppendPlan::Take { skip, keep, length } => (skip, keep, length),
            };
        if keep > 0 {
            tx.execute(
                sql::OUTPUT_INSERT,
                &[&job, &s, &(stored as i64), &&data[skip..skip + keep]],
            )
            .await
            .map_err(&e)?;
        }
        tx.execute(
            &format!("UPDATE jobs SET {s}_length = $2, {s}_stored = $3 WHERE id = $1"),
            &[&job, &(length as i64), &((stored + keep as u64) as i64)],
        )
        .await
        .map_err(&e)?;
        notify(&tx, &self.payload('o', 0, job)).await.map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(Appended::Length(length))
    }

    async fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<u8>, StoreError> {
        let conn = self.conn().await?;
        let offset = offset.min(i64::MAX as u64);
        let stmt = conn
            .prepare_cached(sql::OUTPUT_FROM)
            .await
            .map_err(self.err())?;
        let rows = conn
            .query(&stmt, &[&job, &stream.name(), &(offset as i64)])
            .await
            .map_err(self.err())?;
        let mut out = Vec::new();
        for row in rows {
            let start = u64_of(row.get(0));
            let data: &[u8] = row.get(1);
            let from = offset.saturating_sub(start).min(data.len() as u64) as usize;
            let take = (data.len() - from).min(limit - out.len());
            out.extend_from_slice(&data[from..from + take]);
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let conn = self.conn().await?;
        let mut rows = self.select_jobs(&conn, sql::JOB_BY_ID, &[&id]).await?;
        Ok(rows.pop())
    }

    async fn job_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(sql::JOB_AGENT, &[&id])
            .await
            .map_err(self.err())?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn list_jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<JobRow>, StoreError> {
        let conn = self.conn().await?;
        let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
        let limit = limit as i64;
        self.select_jobs(
            &conn,
            sql::JOBS_PAGE,
            &[
                &filter.agent,
                &filter.selector,
                &filter.group,
                &before,
                &limit,
            ],
        )
        .await
    }

    async fn retain_jobs(&self, keep: usize) -> Result<usize, StoreError> {
        let e = self.err();
        let mut conn = self.conn().await?;
        let tx = conn.transaction().await.map_err(&e)?;
        // Every replica retains: one at a time, the others skip this round.
        let got: bool = tx
            .query_one(
                "SELECT pg_try_advisory_xact_lock($1)",
                &[&(MIGRATION_LOCK + 1)],
            )
            .await
            .map_err(&e)?
            .get(0);
        if !got {
            return Ok(0);
        }
        let done: i64 = tx.query_one(sql::DONE_JOBS, &[]).await.map_err(&e)?.get(0);
        let over = (u64_of(done) as usize).saturating_sub(keep);
        if over == 0 {
            return Ok(0);
        }
        let ids: Vec<String> = tx
            .query(sql::OLDEST_DONE_JOBS, &[&(over as i64)])
            .await
            .map_err(&e)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.execute("DELETE FROM job_output WHERE job = ANY($1)", &[&ids])
            .await
            .map_err(&e)?;
        tx.execute("DELETE FROM jobs WHERE id = ANY($1)", &[&ids])
            .await
            .map_err(&e)?;
        tx.commit().await.map_err(&e)?;
        Ok(ids.len())
    }
}

/// What `agent` is sent of its jobs changed: the change takes the next number of the
/// counter, which becomes the agent's jobs' version (the other hubs answer it so too).
async fn jobs_moved(
    tx: &deadpool_postgres::Transaction<'_>,
    agent: &str,
    url: &str,
) -> Result<u64, StoreError> {
    let version = next_generation(tx, url).await?;
    tx.execute(sql::AGENT_SET_JOBS_VERSION, &[&agent, &(version as i64)])
        .await
        .map_err(|source| StoreError::Postgres {
            url: url.to_owned(),
            source,
        })?;
    Ok(version)
}
