//! The audit log: each admin request that changes something, each refused one, each
//! enrolment and rotation, appended to the store (so every replica's lines are in one
//! log). A line holds who (the token's name, never the token), from where, what (the
//! route's pattern and the path's own values), and how it ended; never a body.

use std::sync::Arc;
use std::time::Duration;

use super::{Access, AccessError};
use crate::hub::store::Store;
use crate::proto::access::AuditEntry;
use crate::util;

/// How often old lines are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// The most lines one listing returns.
pub(crate) const MAX_LISTED: usize = 10_000;
/// The most of a field an audit line keeps.
const MAX_FIELD: usize = 512;

/// One line to write.
pub(crate) struct Audited<'a> {
    pub(crate) token: &'a str,
    pub(crate) peer: &'a str,
    pub(crate) action: &'a str,
    pub(crate) target: &'a str,
    pub(crate) outcome: &'a str,
}

impl<S: Store> Access<S> {
    /// Appends a line; a failure is logged (the request it records has happened).
    pub(crate) async fn audit(&self, a: Audited<'_>) {
        let cut = |s: &str| util::clip_to(s, MAX_FIELD).into_owned();
        let row = AuditEntry {
            seq: 0,
            at_ms: util::unix_now_ms(),
            token: cut(a.token),
            peer: cut(a.peer),
            action: cut(a.action),
            target: cut(a.target),
            outcome: cut(a.outcome),
        };
        if let Err(e) = self.store.append_audit(&row).await {
            tracing::error!(error = %util::error_chain(&e), action = %row.action, token = %row.token, "could not append to the audit log");
        }
    }

    /// The lines since `since_ms` (of `token` when given), oldest first, the newest
    /// [`MAX_LISTED`] at most.
    pub(crate) async fn audit_lines(
        &self,
        since_ms: u64,
        token: Option<&str>,
    ) -> Result<Vec<AuditEntry>, AccessError> {
        Ok(self.store.audit(since_ms, token, MAX_LISTED).await?)
    }
}

/// Deletes audit lines older than the retention, at start and hourly.
pub(crate) struct AuditPruner(tokio::task::JoinHandle<()>);

impl AuditPruner {
    pub(crate) fn spawn<S: Store>(store: Arc<S>, keep: Duration) -> Self {
        Self(tokio::spawn(async move {
            let mut tick = tokio::time::interval(PRUNE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let before = util::unix_now_ms().saturating_sub(keep.as_millis() as u64);
                match store.prune_audit(before).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(lines = n, "audit lines past their retention deleted"),
                    Err(e) => {
                        tracing::warn!(error = %util::error_chain(&e), "could not delete old audit lines (tried again in an hour)")
                    }
                }
            }
        }))
    }

    pub(crate) fn stop(self) {
        self.0.abort();
    }
}
