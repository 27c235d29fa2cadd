//! Held polls, counted while they live, and the answers a change owes them.
//!
//! A change wakes every poll held on the agents it reaches. Until each of those has its
//! answer, the next reports of agents answered a moment ago wait (at most
//! [`ANSWERS_FIRST`]): on a hub that wakes ten thousand polls at once, those reports
//! would otherwise take turns with the answers still owed, and the last agent would learn
//! of the change only once most of the fleet's next reports had been read.

use super::*;

/// The longest a reconcile waits for the answers a change still owes.
const ANSWERS_FIRST: Duration = Duration::from_millis(500);

/// What the fleet counts of its held polls.
#[derive(Default)]
pub(super) struct Holds {
    /// Long polls held now, over all agents.
    pub(super) held: AtomicUsize,
    /// Held polls a change woke that have not ended yet (the sum of each agent's
    /// `AgentState::woken`).
    owed: AtomicUsize,
    /// Told when `owed` comes to zero.
    paid: tokio::sync::Notify,
}

impl Holds {
    /// `entry`'s generation rose: each poll held on it now owes an answer. Counted under
    /// the agent's lock, as each [`Held`] is, so that no poll is counted twice or after
    /// it ended.
    pub(super) fn woken(&self, entry: &AgentEntry) {
        let mut st = util::lock(&entry.state);
        let held = entry.polls.load(Ordering::Relaxed);
        let more = held.saturating_sub(st.woken);
        st.woken = held;
        self.owed.fetch_add(more, Ordering::AcqRel);
    }

    /// Waits while polls a change woke are still owed their answers, at most
    /// [`ANSWERS_FIRST`]; at once when none is.
    pub(super) async fn answers_first(&self) {
        let deadline = tokio::time::Instant::now() + ANSWERS_FIRST;
        loop {
            let paid = self.paid.notified();
            tokio::pin!(paid);
            // Registered before the count is read: a last answer in between still wakes it.
            paid.as_mut().enable();
            if self.owed.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, paid).await.is_err() {
                return;
            }
        }
    }
}

/// Counts a held poll, for its agent's `connected` and the hub's `polls_held`, while it
/// lives: a poll whose client goes away is dropped mid-wait, and must uncount itself (and
/// the answer it was owed, if a change woke it).
pub(super) struct Held<'a> {
    entry: &'a AgentEntry,
    holds: &'a Holds,
}

impl<'a> Held<'a> {
    pub(super) fn new(entry: &'a AgentEntry, holds: &'a Holds) -> Self {
        let _st = util::lock(&entry.state);
        entry.polls.fetch_add(1, Ordering::Relaxed);
        holds.held.fetch_add(1, Ordering::Relaxed);
        Self { entry, holds }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut st = util::lock(&self.entry.state);
        self.entry.polls.fetch_sub(1, Ordering::Relaxed);
        self.holds.held.fetch_sub(1, Ordering::Relaxed);
        if st.woken > 0 {
            st.woken -= 1;
            if self.holds.owed.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.holds.paid.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt as _;

    fn entry() -> Arc<AgentEntry> {
        let own = Scope {
            generation: 1,
            settings: DesiredSettings::default(),
        };
        AgentEntry::new("a".into(), AgentState::new("h".into(), 0, own), false, 1)
    }

    #[tokio::test]
    async fn a_reconcile_waits_for_the_answers_a_change_owes_and_no_longer() {
        let holds = Holds::default();
        let (a, b) = (entry(), entry());
        // Nothing owed: no wait.
        tokio::time::timeout(Duration::from_millis(50), holds.answers_first())
            .await
            .expect("no wait");
        let (ha, hb) = (Held::new(&a, &holds), Held::new(&b, &holds));
        let _a2 = Held::new(&a, &holds);
        holds.woken(&a);
        holds.woken(&a);
        assert_eq!(holds.owed.load(Ordering::Acquire), 2, "each poll once");
        let waiting = holds.answers_first();
        tokio::pin!(waiting);
        assert!(waiting.as_mut().now_or_never().is_none());
        // A poll no change woke ends: nothing paid.
        drop(hb);
        assert_eq!(holds.owed.load(Ordering::Acquire), 2);
        drop(ha);
        assert!(waiting.as_mut().now_or_never().is_none());
        drop(_a2);
        assert_eq!(holds.owed.load(Ordering::Acquire), 0);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken once all is paid");
        // A poll started after the change owes nothing.
        let _late = Held::new(&a, &holds);
        assert_eq!(holds.owed.load(Ordering::Acquire), 0);
        assert_eq!(holds.held.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_that_never_comes_holds_a_reconcile_half_a_second_at_most() {
        let holds = Holds::default();
        let a = entry();
        let _held = Held::new(&a, &holds);
        holds.woken(&a);
        let t = tokio::time::Instant::now();
        holds.answers_first().await;
        assert_eq!(t.elapsed(), ANSWERS_FIRST);
    }
}
