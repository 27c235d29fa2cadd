//! How often the agent asks its hub: a token bucket that paces reconciles whatever the
//! hub answers, and the capped, jittered backoff after a failure.

use std::time::Duration;

use tokio::time::Instant;

/// Reconciles are paced by a bucket: a burst of [`BURST`] at once, then at most [`RATE`]
/// a second, whatever the hub answers. A job through the hub takes about four (taken,
/// reported, ended, answered), so the rate bounds a host's jobs through the hub one after
/// another, not its jobs at once (one reconcile carries them all). A hub that keeps answering with something new cannot make this loop a
/// busy one, and one that answers at once with nothing new is asked again only after its
/// `poll_interval_secs` (see [`HELD`]).
const BURST: f64 = 50.0;
const RATE: f64 = 50.0;
/// The first and the longest pause after a failure.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The pause before the `failures`-th retry in a row: 1 s, 2 s, 4 s … up to 60 s, each
/// drawn from the upper half of its step by `random` (and never under 1 s), so that
/// agents that lost their hub together do not all come back in the same instant.
pub(super) fn backoff_delay(failures: u32, random: u32) -> Duration {
    let step = BACKOFF_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX);
    let full = u64::try_from(step.as_millis()).unwrap_or(u64::MAX);
    let half = full / 2;
    let extra = (full - half) * u64::from(random) / u64::from(u32::MAX);
    Duration::from_millis(half + extra).max(BACKOFF_FIRST)
}

/// Consecutive failures, and the pause before the next try.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    pub(super) failures: u32,
}

impl Backoff {
    pub(super) fn next(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        // Without randomness the pauses are those of the upper bound: still capped.
        backoff_delay(self.failures, getrandom::u32().unwrap_or(u32::MAX))
    }

    pub(super) fn reset(&mut self) {
        self.failures = 0;
    }
}

/// The bucket that paces reconciles ([`BURST`], [`RATE`]).
pub(super) struct Pace {
    tokens: f64,
    at: Instant,
}

impl Pace {
    pub(super) fn new() -> Self {
        Self {
            tokens: BURST,
            at: Instant::now(),
        }
    }

    /// Takes a reconcile; `Some(instant)` to wait for first when the bucket is empty.
    pub(super) fn take(&mut self) -> Option<Instant> {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.at).as_secs_f64() * RATE).min(BURST);
        self.at = now;
        self.tokens -= 1.0;
        (self.tokens < 0.0).then(|| now + Duration::from_secs_f64(-self.tokens / RATE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_one_second_up_to_a_minute_with_jitter() {
        // The upper bound of each step, then the lower half.
        let steps: Vec<u64> = (1..=9)
            .map(|n| backoff_delay(n, u32::MAX).as_secs())
            .collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        let lows: Vec<u64> = (1..=8)
            .map(|n| backoff_delay(n, 0).as_millis() as u64)
            .collect();
        assert_eq!(lows, [1000, 1000, 2000, 4000, 8000, 16000, 30000, 30000]);
        // Between the bounds, and never past the cap however many failures.
        let mid = backoff_delay(5, u32::MAX / 2);
        assert!(
            mid > Duration::from_secs(8) && mid < Duration::from_secs(16),
            "{mid:?}"
        );
        assert_eq!(backoff_delay(u32::MAX, u32::MAX), BACKOFF_MAX);
        assert_eq!(backoff_delay(0, 0), BACKOFF_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn reconciles_come_in_a_burst_then_fifty_a_second() {
        let mut pace = Pace::new();
        for _ in 0..50 {
            assert_eq!(pace.take(), None);
        }
        let t0 = Instant::now();
        let wait = pace.take().expect("the bucket is empty");
        assert_eq!(wait - t0, Duration::from_millis(20));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Refilled to the burst, no further.
        for _ in 0..50 {
            assert_eq!(pace.take(), None);
        }
        assert!(pace.take().is_some());
    }

    #[test]
    fn a_success_starts_the_backoff_over() {
        let mut b = Backoff::default();
        let first = b.next();
        assert!(
            first >= BACKOFF_FIRST && first <= Duration::from_secs(1),
            "{first:?}"
        );
        for _ in 0..20 {
            assert!(b.next() <= BACKOFF_MAX);
        }
        assert!(b.next() >= BACKOFF_MAX / 2);
        b.reset();
        assert_eq!(b.next(), BACKOFF_FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pauses_of_a_long_outage_add_up_as_promised() {
        // Ten minutes of failures: about one try a minute once the cap is reached, and
        // never a try within a second of the one before.
        let mut b = Backoff::default();
        let start = Instant::now();
        let mut tries = 0;
        while start.elapsed() < Duration::from_secs(600) {
            let pause = b.next();
            assert!(pause >= BACKOFF_FIRST);
            tokio::time::sleep(pause).await;
            tries += 1;
        }
        assert!((13..=26).contains(&tries), "{tries} tries in ten minutes");
    }
}
