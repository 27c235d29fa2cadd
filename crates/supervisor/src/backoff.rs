//! The restart pause.
//!
//! Rule: the first unexpected exit waits `initial`; each further *consecutive* unexpected
//! exit doubles the wait, up to `max`. A child that ran for at least `stable` before it
//! exited is taken as having recovered, so the next wait starts again at `initial`.
//! A host that is wedged is retried forever, but never faster than this.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    pause: crate::util::Doubling,
    stable: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration, stable: Duration) -> Self {
        Self {
            pause: crate::util::Doubling::new(initial, max),
            stable,
        }
    }

    /// The pause before the next start, given how long the child that just exited ran.
    pub fn after_exit(&mut self, ran_for: Duration) -> Duration {
        if ran_for >= self.stable {
            self.pause.reset();
        }
        self.pause.pause()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn doubles_caps_and_resets_after_a_stable_run() {
        let mut b = Backoff::new(100 * MS, Duration::from_secs(1), Duration::from_secs(10));
        let mut seen = Vec::new();
        for _ in 0..6 {
            let started = Instant::now();
            tokio::time::advance(5 * MS).await;
            let delay = b.after_exit(started.elapsed());
            seen.push(delay.as_millis());
            tokio::time::sleep(delay).await;
        }
        assert_eq!(seen, vec![100, 200, 400, 800, 1000, 1000]);

        // A child that stays up for the stable period resets the pause.
        let started = Instant::now();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(b.after_exit(started.elapsed()), 100 * MS);
        // ...and the count starts again from there.
        assert_eq!(b.after_exit(MS), 200 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_just_short_of_stable_does_not_reset() {
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(60),
            Duration::from_secs(10),
        );
        assert_eq!(b.after_exit(Duration::ZERO), Duration::from_secs(1));
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert_eq!(b.after_exit(started.elapsed()), Duration::from_secs(2));
    }

    #[test]
    fn the_cap_holds_for_any_number_of_exits() {
        let max = Duration::from_secs(60);
        let mut b = Backoff::new(Duration::from_secs(1), max, Duration::from_secs(10));
        for _ in 0..200 {
            assert!(b.after_exit(Duration::ZERO) <= max);
        }
        assert_eq!(b.after_exit(Duration::ZERO), max);
    }

    #[test]
    fn an_initial_pause_above_the_cap_is_capped() {
        let mut b = Backoff::new(
            Duration::from_secs(90),
            Duration::from_secs(60),
            Duration::from_secs(10),
        );
        assert_eq!(b.after_exit(Duration::ZERO), Duration::from_secs(60));
    }
}
