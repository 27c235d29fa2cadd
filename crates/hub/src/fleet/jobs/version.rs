//! The version of what an agent is sent of its jobs, apart from its generation: a job is
//! not a setting, and moving the generation for each one made every job a new desired
//! state on the host (written to disk there, and a reconciler's pass).
//!
//! Each such change takes the next number of the fleet's one counter in the store, which
//! becomes the agent's `jobs_version` there too; so every hub, a replica or a restarted
//! one, answers an agent with the same version for the same jobs. An answer carries the
//! version it was computed at and the agent echoes it:
//! - an echo below the version (a job given or a cancel asked since, or an answer lost
//!   on its way) is answered at once;
//! - an echo above it means another hub changed the agent's jobs and this one has not
//!   followed yet: it catches up with the store, or holds the poll until it follows
//!   (never answering from what it has, which would take a job back from the agent);
//! - an equal echo holds the poll until the version moves.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;

/// The versions of one agent's jobs; held polls wait on it beside the generation.
pub(in crate::fleet) struct JobsVersion(watch::Sender<u64>);

impl JobsVersion {
    /// As stored.
    pub(in crate::fleet) fn new(stored: u64) -> Self {
        Self(watch::Sender::new(stored))
    }

    /// The version now. Read before the jobs it names: a change in between then moves
    /// it past what the answer carries, and the next poll is answered at once.
    pub(in crate::fleet) fn current(&self) -> u64 {
        *self.0.borrow()
    }

    /// What the agent is sent of its jobs changed, as stored with `version`: its held
    /// polls answer. Never back: an older number (a change loaded late) changes nothing.
    /// Counted as a wake-up when a poll is held (`polls`).
    pub(in crate::fleet) fn advance(&self, version: u64, polls: &AtomicUsize) {
        let moved = self.0.send_if_modified(|v| {
            let newer = version > *v;
            if newer {
                *v = version;
            }
            newer
        });
        if moved && polls.load(Ordering::Relaxed) > 0 {
            crate::metrics::WAKEUPS.inc();
        }
    }

    pub(in crate::fleet) fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_only_moves_forward_and_wakes_on_a_move() {
        let v = JobsVersion::new(5);
        let polls = AtomicUsize::new(0);
        let rx = v.subscribe();
        v.advance(4, &polls);
        assert!(
            !rx.has_changed().expect("open"),
            "an older number is no move"
        );
        assert_eq!(v.current(), 5);
        v.advance(9, &polls);
        assert!(rx.has_changed().expect("open"));
        assert_eq!(v.current(), 9);
    }
}
