//! The fleet's housekeeping, a task apart from the report flusher so that a slow store
//! delays neither for the other: done jobs past the hub's bound deleted (checked each
//! second, acted on once some job got done), and the jobs of agents gone past the
//! hub's patience ended ([`super::patience`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::MissedTickBehavior;

use super::{patience, Fleet};
use crate::store::Store;
use crate::util;

/// How often the done jobs are counted against the hub's bound.
const RETAIN_EVERY: Duration = Duration::from_secs(1);

/// The housekeeping task; stopped by [`Housekeeper::stop`].
pub struct Housekeeper(tokio::task::JoinHandle<()>);

impl Housekeeper {
    pub fn spawn<S: Store>(fleet: Arc<Fleet<S>>) -> Self {
        Self(tokio::spawn(async move {
            let mut retain = tokio::time::interval(RETAIN_EVERY);
            retain.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let every = patience::every(fleet.jobs.limits.agent_patience);
            let mut absent = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            absent.set_missed_tick_behavior(MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = retain.tick() => fleet.retain_jobs().await,
                    _ = absent.tick() => {
                        if let Err(e) = fleet.end_jobs_of_absent().await {
                            tracing::warn!(error = %util::error_chain(&e), "could not end the jobs of agents gone past the hub's patience (tried again)");
                        }
                    }
                }
            }
        }))
    }

    pub fn stop(self) {
        self.0.abort();
    }
}
