//! Retention: the oldest finished jobs, records and files together, are deleted once the
//! runner keeps more of them (or more spooled output) than its limits allow. The totals are
//! kept in memory, so that a job's end needs no count from the store.

use super::{blocking, Engine, EngineError};

/// Finished jobs kept, known without asking the store on every job's end.
#[derive(Debug, Default)]
pub(super) struct Totals {
    pub(super) count: usize,
    pub(super) bytes: u64,
}

/// How many of the oldest finished jobs retention looks at per pass.
const RETAIN_BATCH: u32 = 64;

impl Engine {
    pub(super) fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        crate::util::lock(&self.inner.totals)
    }

    pub(super) fn count_finished(&self, bytes: u64) {
        let mut t = self.totals();
        t.count += 1;
        t.bytes += bytes;
    }

    /// Deletes the oldest finished jobs, records and files together, beyond the count and
    /// spool-size bounds.
    pub(super) async fn retain(&self) -> Result<(), EngineError> {
        // One pass at a time: two passes would delete the same oldest jobs and count them twice.
        let _pass = self.inner.retention.lock().await;
        let (max_jobs, max_bytes) = (
            self.inner.cfg.max_finished_jobs,
            self.inner.cfg.max_spool_bytes,
        );
        let over = |t: &Totals| t.count > max_jobs || t.bytes > max_bytes;
        if !over(&self.totals()) {
            return Ok(());
        }
        let store = self.inner.store.clone();
        let finished = blocking(move || store.finished_oldest_first(RETAIN_BATCH)).await??;
        for (id, b) in finished {
            if !over(&self.totals()) {
                break;
            }
            let paths = self.inner.paths.clone();
            let rid = id.clone();
            blocking(move || {
                let _ = std::fs::remove_dir_all(paths.spool_dir(&rid));
                let _ = std::fs::remove_dir_all(paths.workspace(&rid));
            })
            .await?;
            self.inner.store.delete(&id).await?;
            let mut t = self.totals();
            t.count = t.count.saturating_sub(1);
            t.bytes = t.bytes.saturating_sub(b);
        }
        Ok(())
    }
}
