//! The audit log: each admin request that changes something, each refused one, each
//! enrolment and rotation, appended to the store (so every replica's lines are in one
//! log). A line holds who (the token's name, never the token), from where, what (the
//! route's pattern and the path's own values), and how it ended; never a body.
//!
//! Refusals are many when someone guesses tokens, and each would be a synced row: they
//! are kept as one line per minute, source, token, route, target and outcome, whose
//! count grows ([`Refusals`]). The first refusal of its kind in a minute is written at
//! once (so that it is seen at once); the rest are added to its count every
//! [`FLUSH_EVERY`]. At most [`MAX_REFUSAL_LINES`] such lines are made a minute per
//! replica; past it, one more line counts every other refusal of that minute. What a
//! flood costs the audit log is bounded by that, whatever its rate (docs/security.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Access, AccessError};
use crate::proto::access::AuditEntry;
use crate::store::Store;
use crate::util;

/// How often old lines are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);
/// How often the counts of refusals alike are added to their lines.
pub(super) const FLUSH_EVERY: Duration = Duration::from_secs(5);
/// Refusal lines made a minute, at most, per replica (and one more for the rest).
pub(super) const MAX_REFUSAL_LINES: usize = 100;
/// A refusal line is kept in memory this many minutes at most (its count flushed).
const KEPT_MINUTES: u64 = 2;
/// The most lines one listing returns.
pub(super) const MAX_LISTED: usize = 10_000;
/// The most of a field an audit line keeps.
const MAX_FIELD: usize = 512;

/// One line to write.
pub struct Audited<'a> {
    pub token: &'a str,
    pub peer: &'a str,
    pub action: &'a str,
    pub target: &'a str,
    pub outcome: &'a str,
}

/// A refusal line: its minute, token, source, action, target and outcome.
type Kind = (u64, String, String, String, String, String);

/// A refusal line being counted: its `seq` once written, and the refusals alike not yet
/// added to its count.
struct Line {
    seq: Option<u64>,
    unwritten: u64,
}

/// The refusal lines of the last minutes (module doc).
#[derive(Default)]
pub(super) struct Refusals {
    lines: Mutex<RefusalLines>,
}

#[derive(Default)]
struct RefusalLines {
    minute: u64,
    /// Lines made in `minute`, the overflow line not counted.
    made: usize,
    open: HashMap<Kind, Line>,
}

impl<S: Store> Access<S> {
    /// Appends a line; a failure is logged (the request it records has happened).
    pub async fn audit(&self, a: Audited<'_>) {
        let row = entry(&a, util::unix_now_ms());
        self.append(&row).await;
    }

    async fn append(&self, row: &AuditEntry) -> Option<u64> {
        match self.store.append_audit(row).await {
            Ok(seq) => Some(seq),
            Err(e) => {
                tracing::error!(error = %util::error_chain(&e), action = %row.action, token = %row.token, "could not append to the audit log");
                None
            }
        }
    }

    /// Records a refused request: a new line for the first of its kind this minute, a
    /// count for the rest (module doc).
    pub async fn refused(&self, a: Audited<'_>) {
        let now = util::unix_now_ms();
        let minute = now / 60_000;
        let mut row = entry(&a, now);
        let kind = {
            let mut l = util::lock(&self.refusals.lines);
            if l.minute != minute {
                l.minute = minute;
                l.made = 0;
            }
            let mut kind: Kind = (
                minute,
                row.token.clone(),
                row.peer.clone(),
                row.action.clone(),
                row.target.clone(),
                row.outcome.clone(),
            );
            if !l.open.contains_key(&kind) && l.made >= MAX_REFUSAL_LINES {
                row.token = "*".into();
                row.peer = "*".into();
                row.action = "*".into();
                row.target = "-".into();
                row.outcome = format!(
                    "refusals past the {MAX_REFUSAL_LINES} lines a minute the audit log keeps of them (railgrid_auth_failures_total counts them all)"
                );
                kind = (
                    minute,
                    "*".into(),
                    "*".into(),
                    "*".into(),
                    "-".into(),
                    String::new(),
                );
            } else if !l.open.contains_key(&kind) {
                l.made += 1;
            }
            match l.open.get_mut(&kind) {
                Some(line) => {
                    line.unwritten += 1;
                    return;
                }
                None => {
                    l.open.insert(
                        kind.clone(),
                        Line {
                            seq: None,
                            unwritten: 0,
                        },
                    );
                }
            }
            kind
        };
        let seq = self.append(&row).await;
        if let Some(line) = util::lock(&self.refusals.lines).open.get_mut(&kind) {
            line.seq = seq;
        }
    }

    /// Adds the refusals counted since the last flush to their lines, and forgets the
    /// lines of minutes gone.
    pub async fn flush_refusals(&self) {
        let minute = util::unix_now_ms() / 60_000;
        let todo: Vec<(u64, u64)> = {
            let mut l = util::lock(&self.refusals.lines);
            let todo = l
                .open
                .values_mut()
                .filter_map(|line| {
                    let seq = line.seq?;
                    let n = std::mem::take(&mut line.unwritten);
                    (n > 0).then_some((seq, n))
                })
                .collect();
            l.open.retain(|k, line| {
                k.0 == minute || (line.seq.is_none() && k.0 + KEPT_MINUTES > minute)
            });
            todo
        };
        for (seq, n) in todo {
            if let Err(e) = self.store.add_audit_count(seq, n).await {
                tracing::error!(error = %util::error_chain(&e), line = seq, refusals = n, "could not count refusals in the audit log");
            }
        }
    }

    /// The lines since `since_ms` (of `token` when given), oldest first, the newest
    /// [`MAX_LISTED`] at most.
    pub async fn audit_lines(
        &self,
        since_ms: u64,
        token: Option<&str>,
    ) -> Result<Vec<AuditEntry>, AccessError> {
        Ok(self.store.audit(since_ms, token, MAX_LISTED).await?)
    }
}

/// A line of `a`, each field cut to what a line keeps.
fn entry(a: &Audited<'_>, at_ms: u64) -> AuditEntry {
    let cut = |s: &str| util::clip_to(s, MAX_FIELD).into_owned();
    AuditEntry {
        seq: 0,
        at_ms,
        token: cut(a.token),
        peer: cut(a.peer),
        action: cut(a.action),
        target: cut(a.target),
        outcome: cut(a.outcome),
        count: 1,
    }
}

/// Keeps the audit log: counts refusals into their lines every [`FLUSH_EVERY`], and
/// deletes lines older than the retention, at start and hourly.
pub struct AuditKeeper(tokio::task::JoinHandle<()>);

impl AuditKeeper {
    pub fn spawn<S: Store>(access: Arc<Access<S>>, keep: Duration) -> Self {
        Self(tokio::spawn(async move {
            let mut flush = tokio::time::interval(FLUSH_EVERY);
            flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut prune = tokio::time::interval(PRUNE_EVERY);
            prune.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    // Cancel-safe: an interval's tick is not lost by a select.
                    _ = flush.tick() => access.flush_refusals().await,
                    _ = prune.tick() => prune_once(&*access.store, keep).await,
                }
            }
        }))
    }

    /// Stops it; the caller flushes what is counted ([`Access::flush_refusals`]).
    pub fn stop(self) {
        self.0.abort();
    }
}

async fn prune_once<S: Store>(store: &S, keep: Duration) {
    let before = util::unix_now_ms().saturating_sub(keep.as_millis() as u64);
    match store.prune_audit(before).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(lines = n, "audit lines past their retention deleted"),
        Err(e) => {
            tracing::warn!(error = %util::error_chain(&e), "could not delete old audit lines (tried again in an hour)")
        }
    }
}
