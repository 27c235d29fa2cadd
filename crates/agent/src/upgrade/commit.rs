//! The new agent's side of an upgrade: waiting until it is healthy (its runner serving for
//! the settle period, one reconcile answered), then committing; a watcher revived when
//! the one the switch started is gone, and the hub told when it cannot be reached.

use std::time::{Duration, Instant};

use super::record::{self, Upgrade};
use super::*;

impl UpgradeTask {
    /// Waits until this new agent is healthy (its runner served `/v1/health` for the
    /// settle period, one reconcile answered), then commits. The watcher's deadline
    /// bounds the wait; nothing here gives up.
    pub(super) async fn commit(&mut self, u: Upgrade) {
        self.set(PENDING_COMMIT, Some(&u.to), None);
        let settle = self.ctx.cfg.upgrade.settle;
        let mut healthy_since: Option<Instant> = None;
        let mut said_away: Option<Instant> = None;
        let needs_hub = self.ctx.link.borrow().is_some();
        tracing::info!(version = %u.to, settle = %humantime::format_duration(settle), attempts = u.attempts, "upgrade pending: committing once healthy");
        loop {
            let (running, enabled) = {
                let o = self.ctx.observed.borrow();
                (o.runner.state == State::Running, o.desired.runner.enabled)
            };
            let healthy = if !enabled {
                true
            } else if running {
                match self.ctx.runner.client().await {
                    Ok(c) => matches!(
                        tokio::time::timeout(HEALTH_TIMEOUT, c.health()).await,
                        Ok(Ok(_))
                    ),
                    Err(_) => false,
                }
            } else {
                false
            };
            self.revive_watcher(&u).await;
            if healthy {
                healthy_since.get_or_insert_with(Instant::now);
            } else {
                healthy_since = None;
            }
            let settled = healthy_since.is_some_and(|t| t.elapsed() >= settle);
            // Any answer since this process started: the hub round trip of this agent.
            let contact = *self.ctx.reached.borrow();
            let reached = !needs_hub || contact.answered > 0;
            if settled
                && !reached
                && contact.away
                && said_away.is_none_or(|t: Instant| t.elapsed() >= HUB_AWAY_EVERY)
            {
                // Healthy here, and only the hub is missing: the watcher waits for it
                // (up to the record's hub_wait) instead of blaming this version.
                if said_away.is_none() {
                    tracing::info!(version = %u.to, "healthy on this host; the hub is out of reach: waiting for it to commit the upgrade");
                }
                said_away = Some(Instant::now());
                self.say_hub_away(&u).await;
            }
            if settled && reached {
                match self.try_commit(&u).await {
                    Ok(true) => {
                        tracing::info!(version = %u.to, "upgrade committed");
                        self.set(COMMITTED, Some(&u.to), None);
                        return;
                    }
                    Ok(false) => {
                        // Rolled back under us: the watcher is stopping this agent.
                        self.set(
                            ROLLED_BACK,
                            Some(&u.to),
                            Some("rolled back by the watcher before the commit".into()),
                        );
                        return;
                    }
                    Err(e) => self.set(PENDING_COMMIT, Some(&u.to), Some(crate::error_chain(&e))),
                }
            }
            tokio::select! {
                () = tokio::time::sleep(HEALTH_EVERY) => {}
                // Cancel-safe: a watch receiver keeps its seen-version between polls.
                _ = self.stopping.changed() => return,
            }
        }
    }

    /// After a rollback without blame (the new version never reached its hub): if this,
    /// the previous binary, reaches the hub within [`HUB_PROOF`], the hub was not away,
    /// the new version's link to it was broken: it is blamed after all (remembered as bad,
    /// reported `rolled_back`, so the hub halts it). Nothing is retried meanwhile.
    pub(super) async fn blame_if_hub_answers(&mut self, u: Upgrade) {
        if self.ctx.link.borrow().is_none() {
            return;
        }
        let mut reached = self.ctx.reached.clone();
        let answered = tokio::select! {
            // Cancel-safe: both only observe their channels.
            r = tokio::time::timeout(HUB_PROOF, reached.wait_for(|c| c.answered > 0)) => {
                r.is_ok_and(|r| r.is_ok())
            }
            _ = self.stopping.changed() => return,
        };
        if !answered {
            return;
        }
        let why = format!(
            "{}; but the previous version reached the hub at once, so version {} was at fault",
            u.reason.clone().unwrap_or_default(),
            u.to
        );
        let (dir, sha, reason) = (
            self.ctx.cfg.state_dir.clone(),
            u.to_sha256.clone(),
            why.clone(),
        );
        let to = u.to.clone();
        let blamed = tokio::task::spawn_blocking(move || {
            record::update(&dir, |r| {
                let Some(u) = r
                    .upgrade
                    .as_mut()
                    .filter(|u| u.to_sha256 == sha && u.blameless)
                else {
                    return (false, false);
                };
                u.phase = Phase::RolledBack;
                u.blameless = false;
                u.reason = Some(reason.clone());
                r.remember_bad(&to, &reason);
                (true, true)
            })
        })
        .await;
        if matches!(blamed, Ok(Ok(true))) {
            tracing::warn!(version = %u.to, "a rollback without blame is blamed on the version after all: this agent reached the hub at once");
            self.set(ROLLED_BACK, Some(&u.to), Some(why));
        }
    }

    /// Tells the watcher, through the record, that this agent is healthy on its host and
    /// cannot reach its hub.
    pub(super) async fn say_hub_away(&self, u: &Upgrade) {
        let (dir, sha) = (self.ctx.cfg.state_dir.clone(), u.to_sha256.clone());
        let said = tokio::task::spawn_blocking(move || {
            record::try_update(&dir, |r| match r.upgrade.as_mut() {
                Some(u) if u.to_sha256 == sha && u.phase == Phase::Pending => {
                    let now = crate::util::unix_now();
                    u.healthy_at.get_or_insert(now);
                    u.hub_away_at = Some(now);
                    (true, ())
                }
                _ => (false, ()),
            })
        })
        .await;
        match said {
            // Said; or the lock was busy, and it is said again at the next turn.
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %crate::error_chain(&e), "could not tell the upgrade's watcher that the hub is out of reach")
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not tell the upgrade's watcher that the hub is out of reach")
            }
        }
    }

    /// The watcher of this pending upgrade died (a reboot in the commit window, a kill):
    /// a new one is started from `<exe>.prev`, the previous binary's bytes, checked by
    /// SHA-256, so that the rollback still never depends on this binary.
    pub(super) async fn revive_watcher(&self, u: &Upgrade) {
        let state_dir = self.ctx.cfg.state_dir.clone();
        let log = service::log_path(&self.ctx.cfg.log_dir);
        let stop = self.ctx.cfg.runner.stop_grace
            + crate::reconciler::REAP_TIMEOUT
            + Duration::from_secs(5);
        let to_sha = u.to_sha256.clone();
        let _ = tokio::task::spawn_blocking(move || {
            watcher::revive(
                &state_dir,
                &to_sha,
                watcher::Renew::Keep,
                stop,
                &log,
                &std::env::args_os().skip(1).collect::<Vec<_>>(),
            )
        })
        .await;
    }

    /// `Ok(true)` once committed; `Ok(false)` when the record no longer allows it.
    pub(super) async fn try_commit(&self, u: &Upgrade) -> Result<bool, UpgradeError> {
        let state_dir = self.ctx.cfg.state_dir.clone();
        let to_sha = u.to_sha256.clone();
        loop {
            let (dir, sha) = (state_dir.clone(), to_sha.clone());
            let out = tokio::task::spawn_blocking(move || {
                record::try_update(&dir, |r| match r.upgrade.as_mut() {
                    Some(u) if u.to_sha256 == sha && u.phase == Phase::Pending => {
                        u.phase = Phase::Committed;
                        u.finished_at = Some(crate::util::unix_now());
                        (true, true)
                    }
                    _ => (false, false),
                })
            })
            .await
            .map_err(|source| UpgradeError::Task {
                what: "commit",
                source,
            })??;
            match out {
                Some(done) => return Ok(done),
                // The watcher holds the lock: it is rolling back, or about to see the
                // commit; ask again shortly.
                None => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}
