//! The fleet's open jobs, apart from its agents: which agent holds each job it was sent,
//! the queue of selected jobs no agent has yet, and the signals that wake what waits on
//! them (the dispatcher; `job wait` and `job logs --follow`).
//!
//! Its index and queue are the jobs module's alone; the fleet's other parts go through
//! the methods here. Lock order within (a part of the fleet's, docs/design.md): `index`
//! → `queue`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::{watch, Notify};

use super::queue::Queue;
use super::JobLimits;
use crate::fleet::AgentEntry;
use crate::util;

pub(in crate::fleet) struct JobBoard {
    /// The agent of each open job it was sent.
    pub(super) index: RwLock<HashMap<String, Arc<AgentEntry>>>,
    /// Selected jobs no agent has yet ([`super::queue`]).
    pub(super) queue: Mutex<Queue>,
    /// Wakes the [`Dispatcher`](super::queue::Dispatcher).
    pub(super) dispatch: Notify,
    /// Moves on every change to any job (its state, its output).
    activity: watch::Sender<u64>,
    /// Jobs done since retention last ran.
    done: AtomicUsize,
    pub(in crate::fleet) limits: JobLimits,
}

impl JobBoard {
    pub(in crate::fleet) fn new(
        index: HashMap<String, Arc<AgentEntry>>,
        limits: JobLimits,
    ) -> Self {
        Self {
            index: RwLock::new(index),
            queue: Mutex::new(Queue::new(limits.priority_aging)),
            dispatch: Notify::new(),
            activity: watch::Sender::new(0),
            done: AtomicUsize::new(0),
            limits,
        }
    }

    /// The agent that holds job `id`, if it was sent to one and is open.
    pub(in crate::fleet) fn agent_of(&self, id: &str) -> Option<Arc<AgentEntry>> {
        util::read(&self.index).get(id).cloned()
    }

    pub(in crate::fleet) fn queued_len(&self) -> usize {
        util::lock(&self.queue).len()
    }

    /// Each lane's selector, its depth and when its oldest job was submitted (Unix ms).
    pub(in crate::fleet) fn queue_depths(&self) -> Vec<(String, u64, u64)> {
        util::lock(&self.queue).depths()
    }

    /// Some job changed: wakes `job wait` and `job logs --follow`.
    pub(in crate::fleet) fn moved(&self) {
        self.activity.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(in crate::fleet) fn activity(&self) -> watch::Receiver<u64> {
        self.activity.subscribe()
    }

    /// `n` more jobs got done: retention has work.
    pub(in crate::fleet) fn count_done(&self, n: usize) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether some job got done since the last call.
    pub(in crate::fleet) fn take_done(&self) -> bool {
        self.done.swap(0, Ordering::Relaxed) > 0
    }
}
