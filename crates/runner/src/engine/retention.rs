//! Retention: the oldest finished jobs, records and files together, are deleted once the
//! runner keeps more of them or more spooled output than its limits allow; beyond the
//! bound on bytes kept in all (spools and workspaces: a build's workspace holds its
//! checkout and its artifacts) the oldest workspaces go first. `railgrid job prune`
//! deletes by hand. A running or queued job's files, or a workspace one works in, are
//! never touched, nor the newest finished job's workspace. The totals are kept in memory,
//! so that a job's end needs no count from the store; a workspace is measured once, when
//! its job ends, and again when it goes.

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

/// The workspace of another job that `spec`'s `cwd` lies in (`../ID/…`), if any.
pub(super) fn foreign_workspace(spec: &crate::proto::job::JobSpec) -> Option<String> {
    let rest = spec.cwd.as_deref()?.strip_prefix("../")?;
    let id = rest.split('/').next()?;
    (!id.is_empty() && id != "." && id != "..").then(|| id.to_owned())
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

    /// At start, in the background: the workspaces of the finished jobs the store holds
    /// (a shared checkout in the work root, no job's workspace, is not counted).
    pub(super) async fn measure_kept(&self) -> Result<(), EngineError> {
        let _pass = self.inner.retention.lock().await;
        let store = self.inner.store.clone();
        let finished = blocking(move || store.finished_oldest_first(u32::MAX)).await??;
        let paths = self.inner.paths.clone();
        let ws = blocking(move || {
            finished
                .iter()
                .map(|(id, _)| dir_size(&paths.workspace(id)))
                .sum::<u64>()
        })
        .await?;
        self.totals().kept += ws;
        Ok(())
    }

    /// Workspaces no retention may touch: those of running and queued jobs, and those
    /// their `cwd` lies in.
    fn workspaces_in_use(&self) -> std::collections::HashSet<String> {
        let s = self.sched();
        let mut used: std::collections::HashSet<String> = s.running.keys().cloned().collect();
        used.extend(s.running.values().filter_map(|r| r.uses.clone()));
        for q in &s.queue {
            used.insert(q.id.clone());
            if let Some(spec) = &q.spec {
                used.extend(foreign_workspace(spec));
            }
        }
        used
    }

    /// Keeps finished jobs within their bounds: beyond the count or the spool bound the
    /// oldest go, record, output and workspace together; beyond the kept-bytes bound the
    /// oldest workspaces go (their records and output stay, within the other bounds),
    /// never the newest finished job's (its agent may not have reported it yet) nor one
    /// a running or queued job uses.
    pub(super) async fn retain(&self) -> Result<(), EngineError> {
        let cfg = &self.inner.cfg;
        let (max_jobs, max_spool, max_kept) = (
            cfg.max_finished_jobs,
            cfg.max_spool_bytes,
            cfg.max_kept_bytes,
        );
        self.delete_oldest(|t| t.count > max_jobs || t.bytes > max_spool)
            .await?;
        if self.totals().kept > max_kept {
            self.free_workspaces(max_kept).await?;
        }
        Ok(())
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
        let mut skipped = 0;
        while over(&self.totals()) {
            let store = self.inner.store.clone();
            let batch = RETAIN_BATCH + skipped;
            let finished = blocking(move || store.finished_oldest_first(batch)).await??;
            if finished.len() <= skipped as usize {
                break;
            }
            let in_use = self.workspaces_in_use();
            for (id, spooled) in finished.into_iter().skip(skipped as usize) {
                if !over(&self.totals()) {
                    return Ok(());
                }
                if in_use.contains(&id) {
                    // A running job works in it: kept, record and all.
                    skipped += 1;
                    continue;
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

    /// Removes the oldest finished jobs' workspaces until what is kept fits `max_kept`.
    async fn free_workspaces(&self, max_kept: u64) -> Result<(), EngineError> {
        let _pass = self.inner.retention.lock().await;
        let store = self.inner.store.clone();
        let mut finished = blocking(move || store.finished_oldest_first(u32::MAX)).await??;
        // The newest finished job's stays, whatever it holds.
        finished.pop();
        let in_use = self.workspaces_in_use();
        for (id, _) in finished {
            if self.totals().kept <= max_kept {
                break;
            }
            if in_use.contains(&id) {
                continue;
            }
            let path = self.inner.paths.workspace(&id);
            let freed = blocking(move || {
                let n = dir_size(&path);
                if n > 0 {
                    let _ = std::fs::remove_dir_all(&path);
                }
                n
            })
            .await?;
            if freed > 0 {
                tracing::info!(job = %id, bytes = freed, "removed a finished job's workspace: finished jobs keep more than max_kept_bytes");
            }
            let mut t = self.totals();
            t.kept = t.kept.saturating_sub(freed);
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
