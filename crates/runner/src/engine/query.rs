//! Reads: a job's record or a page of them from the store, with the live output counters of
//! running jobs laid over them, and `wait` for a job's committed end.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{blocking, Engine, EngineError};
use crate::job;
use crate::proto::job::{JobRecord, JobState};

/// What [`Engine::wait_until`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The job runs, or is over: it has left the queue and started its process.
    Started,
    /// The job's end is committed.
    Ended,
}

impl Until {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "started" => Some(Until::Started),
            "ended" => Some(Until::Ended),
            _ => None,
        }
    }
}

impl Engine {
    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, EngineError> {
        let store = self.inner.store.clone();
        let id = id.to_owned();
        let mut rec = blocking(move || store.get(&id)).await??;
        if let Some(r) = rec.as_mut() {
            self.overlay_live(r);
        }
        Ok(rec)
    }

    pub async fn list(
        &self,
        state: Option<JobState>,
        owner: Option<String>,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<JobRecord>, EngineError> {
        let store = self.inner.store.clone();
        let mut recs =
            blocking(move || store.list(state, owner.as_deref(), before, limit)).await??;
        for r in &mut recs {
            self.overlay_live(r);
        }
        Ok(recs)
    }

    /// Running jobs report their output counters (bytes produced, kept or not) and why
    /// output was cut, live.
    fn overlay_live(&self, rec: &mut JobRecord) {
        let s = self.sched();
        if let Some(run) = s.running.get(&rec.id) {
            if let Some(st) = &run.stdout {
                rec.stdout_bytes = st.produced.load(Ordering::Relaxed);
                rec.stdout_truncated = st.truncated.load(Ordering::Relaxed);
            }
            if let Some(st) = &run.stderr {
                rec.stderr_bytes = st.produced.load(Ordering::Relaxed);
                rec.stderr_truncated = st.truncated.load(Ordering::Relaxed);
            }
            if let (Some(out), Some(err)) = (&run.stdout, &run.stderr) {
                rec.output_truncated = job::truncation(out, err);
            }
            if let Some(d) = &run.denials {
                rec.egress_denied = d.snapshot();
            }
        }
    }

    /// Waits until the job's end is committed or `timeout` passes; returns the record. An
    /// end held in memory (a full disk) is shown with `commit_pending` until it is written.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<JobRecord, EngineError> {
        self.wait_until(id, Until::Ended, timeout).await
    }

    /// Waits until the job has reached `until` or `timeout` passes; returns the record.
    pub async fn wait_until(
        &self,
        id: &str,
        until: Until,
        timeout: Duration,
    ) -> Result<JobRecord, EngineError> {
        let deadline = Instant::now() + timeout;
        let mut activity = self.activity();
        loop {
            // While the scheduler holds the job it has not ended (nor, while it is queued,
            // started): no need to ask the store.
            let pending = match until {
                Until::Ended => self.is_active(id),
                Until::Started => self.is_queued(id),
            };
            if !pending {
                let rec = self
                    .get(id)
                    .await?
                    .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })?;
                let reached = match until {
                    Until::Ended => rec.state.is_terminal() && !rec.commit_pending,
                    Until::Started => !matches!(rec.state, JobState::Queued | JobState::Starting),
                };
                if reached {
                    return Ok(rec);
                }
            }
            tokio::select! {
                // Cancel-safe: `changed` only observes the channel.
                r = activity.changed() => if r.is_err() { break },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        self.get(id)
            .await?
            .ok_or_else(|| EngineError::NotFound { id: id.to_owned() })
    }

    fn is_queued(&self, id: &str) -> bool {
        self.sched().queue.iter().any(|q| q.id == id)
    }

    /// True while the job is queued or running in this runner.
    fn is_active(&self, id: &str) -> bool {
        let s = self.sched();
        s.running.contains_key(id) || s.queue.iter().any(|q| q.id == id)
    }
}
