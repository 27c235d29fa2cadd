//! The jobs through the hub and their output, in PostgreSQL: the bodies of `crate::jobs`,
//! each change told to the other hubs at commit.

use super::PgStore;
use crate::jobs::{self, Appended, Assigned, Assignment, JobFilter, JobProgress, JobRow, JobStore};
use crate::{StoreError, Stream};

impl JobStore for PgStore {
    async fn insert_job(&self, job: &JobRow) -> Result<Option<(u64, Option<u64>)>, StoreError> {
        self.transact(async |t| jobs::insert(t, job).await).await
    }

    async fn assign_jobs(&self, batch: &[Assignment]) -> Result<Vec<Assigned>, StoreError> {
        self.transact(async |t| jobs::assign(t, batch).await).await
    }

    async fn end_queued(&self, id: &str, p: &JobProgress) -> Result<bool, StoreError> {
        self.transact(async |t| jobs::end_queued(t, id, p).await)
            .await
    }

    async fn update_jobs(
        &self,
        agent: &str,
        progress: Vec<(String, JobProgress)>,
        bump: bool,
    ) -> Result<Option<u64>, StoreError> {
        self.transact(async |t| jobs::update(t, agent, progress, bump).await)
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
        self.transact(async |t| jobs::append(t, job, stream, offset, &data, cap).await)
            .await
    }

    async fn read_output(
        &self,
        job: &str,
        stream: Stream,
        offset: u64,
        limit: usize,
    ) -> Result<Vec<u8>, StoreError> {
        self.plain(async |t| jobs::read_output(t, job, stream, offset, limit).await)
            .await
    }

    async fn get_job(&self, id: &str) -> Result<Option<JobRow>, StoreError> {
        self.plain(async |t| jobs::get(t, id).await).await
    }

    async fn job_agent(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.plain(async |t| jobs::agent_of(t, id).await).await
    }

    async fn list_jobs(
        &self,
        filter: JobFilter<'_>,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<JobRow>, StoreError> {
        self.plain(async |t| jobs::page(t, filter, before, limit).await)
            .await
    }

    async fn retain_jobs(&self, keep: usize) -> Result<usize, StoreError> {
        self.transact(async |t| jobs::retain(t, keep).await).await
    }
}
