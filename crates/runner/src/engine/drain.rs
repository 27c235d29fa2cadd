//! The runner's drain (docs/design.md, "Drain"): while one is in force, a new job is
//! refused (503, with the drain's reason) and the jobs the runner has go on; at the
//! drain's deadline what is left is cancelled, each job saying why. A resubmission of a job
//! the runner already has is still answered (200): the agent's follower of a hub job that
//! was taken just before the drain finds it, and nothing runs twice.
//!
//! The agent decides the drain (from its hub, the host's `railgrid agent drain`, an
//! upgrade waiting to switch) and sets it here; the runner keeps it in `drain.json`, so a
//! runner restarted during a drain refuses new jobs from its first request, before the
//! agent has set it again.
//!
//! Task: the *deadline task* (`spawn_drain_deadline`): sleeps until the deadline of the
//! drain in force and cancels every running and queued job then; it ends with the engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::admission::Cancel;
use super::{blocking, Engine, EngineError};
use crate::proto::drain::{Drain, DrainView};

/// The drain in force, inside the runner's state directory.
pub(super) const DRAIN_FILE: &str = "drain.json";
/// A drain file is a few hundred bytes; a larger one is not ours.
const MAX_FILE: u64 = 64 * 1024;

#[derive(Debug, Error)]
pub enum DrainError {
    #[error("could not keep the drain in {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// The drain kept by an earlier runner. One that cannot be read is taken as a drain (its
/// reason says why): a host that was told to take no new job keeps to it until told
/// otherwise.
pub(super) fn load(path: &Path) -> Option<Drain> {
    let bytes = match crate::small_file::read(path, MAX_FILE) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(unreadable(path, &e)),
    };
    match serde_json::from_slice::<Drain>(&bytes) {
        Ok(d) if d.check().is_ok() => Some(d),
        Ok(_) => Some(unreadable(path, &"it is not a valid drain")),
        Err(e) => Some(unreadable(path, &e)),
    }
}

fn unreadable(path: &Path, e: &dyn std::fmt::Display) -> Drain {
    tracing::warn!(path = %path.display(), error = %e, "the drain kept by the last runner cannot be read: draining until the agent says otherwise");
    Drain {
        reason: crate::util::clip_to(
            &format!("{} could not be read ({e})", path.display()),
            crate::proto::drain::MAX_REASON / 2,
        )
        .into_owned(),
        since_ms: crate::util::unix_now_ms(),
        deadline_ms: None,
    }
}

/// Keeps `drain` in `path` (0600, replaced atomically), or removes the file; both durable.
fn persist(path: &Path, drain: Option<&Drain>) -> std::io::Result<()> {
    match drain {
        Some(d) => {
            let bytes = serde_json::to_vec(d).map_err(std::io::Error::other)?;
            crate::util::write_atomic(path, &bytes, 0o600)
        }
        None => {
            let (Some(parent), Some(name)) =
                (path.parent(), path.file_name().and_then(|n| n.to_str()))
            else {
                return Ok(());
            };
            let dir = crate::sys::dirfd::Dir::open(parent)?;
            match dir.remove_file(name) {
                Ok(()) => dir.sync(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

/// What a job ended by `drain`'s deadline says of it.
pub(super) fn deadline_reason(drain: &Drain) -> Arc<str> {
    format!("drain deadline ({})", drain.reason).into()
}

impl Engine {
    /// The drain in force and the jobs it waits for.
    pub fn drain_view(&self) -> DrainView {
        let (running, queued) = self.job_counts();
        DrainView {
            drain: self.inner.drain.borrow().clone(),
            running: running as u64,
            queued: queued as u64,
        }
    }

    /// Puts `drain` in force (`None` ends the one in force), kept before it is answered.
    /// Setting the drain in force again changes nothing.
    pub async fn set_drain(&self, drain: Option<Drain>) -> Result<DrainView, EngineError> {
        if let Some(d) = &drain {
            d.check().map_err(DrainError::Invalid)?;
        }
        if *self.inner.drain.borrow() == drain {
            return Ok(self.drain_view());
        }
        let path = self.inner.drain_file.clone();
        let kept = drain.clone();
        blocking(move || persist(&path, kept.as_ref()))
            .await?
            .map_err(|source| DrainError::Write {
                path: self.inner.drain_file.clone(),
                source,
            })?;
        match &drain {
            Some(d) => {
                tracing::info!(reason = %d.reason, deadline_ms = ?d.deadline_ms, "draining: new jobs are refused")
            }
            None => tracing::info!("drain ended: new jobs are taken"),
        }
        self.inner.drain.send_replace(drain);
        self.bump();
        Ok(self.drain_view())
    }

    /// Starts the deadline task, which holds the engine only weakly.
    pub(super) fn spawn_drain_deadline(&self) {
        let inner = Arc::downgrade(&self.inner);
        let mut drains = self.inner.drain.subscribe();
        tokio::spawn(async move {
            loop {
                let drain = drains.borrow_and_update().clone();
                let deadline = drain.as_ref().and_then(|d| d.deadline_ms);
                if let (Some(drain), Some(at)) = (drain, deadline) {
                    let wait = Duration::from_millis(at.saturating_sub(crate::util::unix_now_ms()));
                    tokio::select! {
                        // Cancel-safe: sleeping holds no state.
                        _ = tokio::time::sleep(wait) => {
                            let Some(inner) = inner.upgrade() else { return };
                            Engine { inner }.cancel_at_deadline(&drain).await;
                        }
                        // Cancel-safe: `changed` only observes the channel.
                        r = drains.changed() => {
                            if r.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                }
                if drains.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Cancels every running job (SIGTERM, kill grace, SIGKILL) and every queued one, each
    /// recorded with the drain's reason.
    async fn cancel_at_deadline(&self, drain: &Drain) {
        let why = deadline_reason(drain);
        let queued = {
            let mut s = self.sched();
            for run in s.running.values() {
                run.cancel.send_if_modified(|c| {
                    let first = c.is_none();
                    if first {
                        *c = Some(Cancel {
                            why: Some(why.clone()),
                        });
                    }
                    first
                });
            }
            tracing::warn!(reason = %drain.reason, running = s.running.len(), queued = s.queue.len(), "the drain's deadline passed: cancelling the jobs left");
            s.queue.drain(..).map(|q| q.id).collect::<Vec<_>>()
        };
        for id in queued {
            let error = format!("cancelled while queued: {why}");
            if let Err(e) = self.finish_queued(&id, error).await {
                tracing::error!(job = %id, error = %crate::error_chain(&e), "could not record the job's cancel");
            }
        }
    }
}
