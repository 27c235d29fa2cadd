//! The version of what an agent is sent of its jobs, apart from its generation: a job is
//! not a setting, and moving the generation for each one made every job a new desired
//! state on the host (written to disk there, and a reconciler's pass).
//!
//! An answer carries the version it was computed at (`jobs_version`) and the agent
//! echoes it; a poll whose echo differs is answered at once, and a held poll wakes when
//! the version moves. So a job given, or a cancel asked, reaches the agent as a settings
//! change does, and an answer lost on its way (a connection cut) is made good by the next
//! poll rather than by the next change.
//!
//! Kept in memory only: each hub process starts every agent's version at a random number
//! of its own, so that a restarted hub, or another replica, never takes an echo of an
//! old one for its own (it answers at once, once, and is echoed from then on).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use tokio::sync::watch;

use crate::proto::desired::MAX_GENERATION;

/// The versions of one agent's jobs; held polls wait on it beside the generation.
pub(in crate::fleet) struct JobsVersion(watch::Sender<u64>);

impl JobsVersion {
    pub(in crate::fleet) fn new() -> Self {
        Self(watch::Sender::new(epoch()))
    }

    /// The version now. Read before the jobs it names: a change in between then moves
    /// it past what the answer carries, and the next poll is answered at once.
    pub(in crate::fleet) fn current(&self) -> u64 {
        *self.0.borrow()
    }

    /// What the agent is sent of its jobs changed: its held polls answer. Counted as a
    /// wake-up when one is held (`polls`).
    pub(in crate::fleet) fn moved(&self, polls: &AtomicUsize) {
        // Within JSON's exact integers, as generations are.
        self.0.send_modify(|v| *v = (*v + 1) % MAX_GENERATION);
        if polls.load(Ordering::Relaxed) > 0 {
            crate::metrics::WAKEUPS.inc();
        }
    }

    pub(in crate::fleet) fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

/// This process's first version of every agent's jobs.
fn epoch() -> u64 {
    static EPOCH: OnceLock<u64> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No worse than a clock: only another process's numbers must differ.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes = nanos.to_le_bytes();
        }
        u64::from_le_bytes(bytes) % MAX_GENERATION
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_moves_and_stays_an_exact_json_number() {
        let v = JobsVersion::new();
        let polls = AtomicUsize::new(0);
        let first = v.current();
        assert!(first < MAX_GENERATION);
        let rx = v.subscribe();
        v.moved(&polls);
        assert_ne!(v.current(), first);
        assert!(rx.has_changed().expect("open"));
        let top = JobsVersion(watch::Sender::new(MAX_GENERATION - 1));
        top.moved(&polls);
        assert_eq!(top.current(), 0);
    }
}
