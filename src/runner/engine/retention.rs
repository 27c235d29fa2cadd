//! Retention: the oldest finished jobs, records and files together, are deleted once the
//! runner keeps more of them, more spooled output, or more bytes in all (spools and
//! workspaces: a build's workspace holds its checkout and its artifacts) than its limits
//! allow; `railgrid job prune` deletes them by hand. A running or queued job's files are
//! never touched. The totals are kept in memory, so that a job's end needs no count from
//! the store; a workspace is measured once, when its job ends, and again when it goes.

use std::path::Path;

use super::{blocking, Engine, EngineError};

/// Finished jobs kept, known without asking the store on every job's end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    pub count: usize,
    /// Spooled output of finished jobs.
    pub bytes: u64,
    /// Spooled output and workspaces of finished jobs.
    pub kept: u64,
}

/// How many of the oldest finished jobs retention looks at per pass.
const RETAIN_BATCH: u32 = 64;
/// Entries a workspace's measure looks at, at most: a tree larger than that counts what
/// was seen (the budget then errs on keeping).
const MEASURE_MAX_ENTRIES: usize = 1_000_000;

/// The bytes a directory tree holds (blocks in use), symlinks not followed, other file
/// systems not entered; 0 when it is not there.
pub(super) fn dir_size(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(root) else {
        return 0;
    };
    let dev = top.dev();
    let mut total = top.blocks() * 512;
    let mut dirs = vec![root.to_owned()];
    let mut seen = 0;
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MEASURE_MAX_ENTRIES {
                return total;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != dev {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    total
}

impl Engine {
    pub(super) fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        crate::util::lock(&self.inner.totals)
    }

    /// What finished jobs keep now: for health and `agent status`.
    pub fn kept(&self) -> Totals {
        *self.totals()
    }

    /// A job ended with `spooled` bytes of output; its workspace is measured now.
    pub(super) async fn count_finished(&self, id: &str, spooled: u64) {
        let workspace = self.inner.paths.workspace(id);
        let ws = blocking(move || dir_size(&workspace)).await.unwrap_or(0);
        let mut t = self.totals();
        t.count += 1;
        t.bytes += spooled;
        t.kept += spooled + ws;
    }

    /// Deletes the oldest finished jobs, records and files together, beyond the count,
    /// spool-size and kept-bytes bounds.
    pub(super) async fn retain(&self) -> Result<(), EngineError> {
        let cfg = &self.inner.cfg;
        let (max_jobs, max_spool, max_kept) = (
            cfg.max_finished_jobs,
            cfg.max_spool_bytes,
            cfg.max_kept_bytes,
        );
        self.delete_oldest(|t| t.count > max_jobs || t.bytes > max_spool || t.kept > max_kept)
            .await
            .map(drop)
    }

    /// `railgrid job prune`: deletes the oldest finished jobs until `keep` are left.
    /// Returns how many went and the bytes they held.
    pub async fn prune(&self, keep: usize) -> Result<(usize, u64), EngineError> {
        let before = self.kept();
        self.delete_oldest(|t| t.count > keep).await?;
        let after = self.kept();
        Ok((
            before.count.saturating_sub(after.count),
            before.kept.saturating_sub(after.kept),
        ))
    }

    /// Deletes finished jobs, oldest first, while `over` holds.
    async fn delete_oldest(&self, over: impl Fn(&Totals) -> bool) -> Result<(), EngineError> {
        // One pass at a time: two passes would delete the same oldest jobs and count them twice.
        let _pass = self.inner.retention.lock().await;
        while over(&self.totals()) {
            let store = self.inner.store.clone();
            let finished = blocking(move || store.finished_oldest_first(RETAIN_BATCH)).await??;
            if finished.is_empty() {
                break;
            }
            for (id, spooled) in finished {
                if !over(&self.totals()) {
                    return Ok(());
                }
                let paths = self.inner.paths.clone();
                let rid = id.clone();
                let ws = blocking(move || {
                    let ws = dir_size(&paths.workspace(&rid));
                    let _ = std::fs::remove_dir_all(paths.spool_dir(&rid));
                    let _ = std::fs::remove_dir_all(paths.workspace(&rid));
                    ws
                })
                .await?;
                self.inner.store.delete(&id).await?;
                let mut t = self.totals();
                t.count = t.count.saturating_sub(1);
                t.bytes = t.bytes.saturating_sub(spooled);
                t.kept = t.kept.saturating_sub(spooled + ws);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_is_measured_by_its_blocks_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/big"), vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("link")).unwrap();
        let n = dir_size(dir.path());
        assert!((1 << 20..4 << 20).contains(&n), "{n}");
        assert_eq!(dir_size(&dir.path().join("missing")), 0);
    }
}
