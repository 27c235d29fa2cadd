//! The jobs through the hub and their output, in SQLite: the bodies of `crate::jobs`, run
//! on the worker thread.

use super::exec::run_now;
use super::SqliteStore;
use crate::jobs::{self, Appended, Assigned, Assignment, JobFilter, JobProgress, JobRow, JobStore};
use crate::{StoreError, Stream};

impl JobStore for SqliteStore {
    async fn insert_job(&self, job: &JobRow) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        let job = job.clone();
        self.transact(move |t| run_now(jobs::insert(t, &job))).await
    }

    async fn assign_jobs(&self, batch: &[Assignment]) -> Result<Vec<Assigned>, StoreError> {
        let batch = batch.to_vec();
        self.transact(move |t| run_now(jobs::assign(t, &batch)))
            .await
    }

    async fn end_queued(&self, id: &str, p: &JobProgress) -> Result<bool, StoreError> {
        let (id, p) = (id.to_owned(), p.clone());
        self.transact(move |t| run_now(jobs::end_queued(t, &id, &p)))
            .await
    }

    async fn update_jobs(
        &self,
        agent: &str,
        progress: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<Option<u64>, StoreError> {
        let agent = agent.to_owned();
        self.transact(move |t| run_now(jobs::update(t, &agent, progress, bump)))
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
        self.transact(move |t| run_now(jobs::append(t, &job, stream, offset, &data, cap)))
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
        self.plain(move |t| run_now(jobs::read_output(t, &job, stream, offset, limit)))
            .await
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        let id = id.to_owned();
        self.plain(move |t| run_now(jobs::get(t, &id))).await
    }

    async fn job_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.plain(move |t| run_now(jobs::agent_of(t, &id))).await
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
        self.plain(move |t| {
            let filter = JobFilter {
                agent: agent.as_deref(),
                selector: selector.as_deref(),
                group: group.as_deref(),
            };
            run_now(jobs::page(t, filter, before, limit))
        })
        .await
    }

    async fn retain_jobs(&self, keep: usize) -> Result<usize, StoreError> {
        self.transact(move |t| run_now(jobs::retain(t, keep))).await
    }
}
