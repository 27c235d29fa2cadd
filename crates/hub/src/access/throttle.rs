//! Failed authentications, rate-limited per source address (docs/security.md, "Failed
//! authentication costs its sender"): each source has a bucket of [`BURST`] failures that
//! refills at one per [`REFILL`]; past it, the next failure is answered 429 with
//! `Retry-After` instead of 401. A request whose token is good spends nothing, so a
//! client that authenticates never meets the limit; one that guesses meets it after
//! [`BURST`] tries, whatever route it tries (admin API, dashboard login, enrolment, the
//! agents' routes share one bucket per source).
//!
//! A source is an IPv4 address, or an IPv6 /64 (what one host is given). Buckets are
//! bounded ([`MAX_SOURCES`]): full ones are forgotten first, and past the bound every new
//! source shares one bucket, so a flood from many addresses throttles itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::util;

/// Failures a source may have in a burst.
pub(super) const BURST: f64 = 20.0;
/// One more failure is allowed each this long.
pub(super) const REFILL: Duration = Duration::from_secs(1);
/// Sources tracked at once.
const MAX_SOURCES: usize = 65_536;

/// A token bucket: `capacity` at most, filling at one per `every`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    pub(super) fn full(capacity: f64) -> Self {
        Self {
            level: capacity,
            at: Instant::now(),
        }
    }

    /// The level now, refilled since it was last looked at.
    fn refill(&mut self, capacity: f64, every: Duration) {
        let now = Instant::now();
        let refill = now.duration_since(self.at).as_secs_f64() / every.as_secs_f64();
        self.level = (self.level + refill).min(capacity);
        self.at = now;
    }

    /// Takes one, if there is one; else how long until there is.
    pub(super) fn take(&mut self, capacity: f64, every: Duration) -> Result<(), Duration> {
        self.refill(capacity, every);
        if self.level >= 1.0 {
            self.level -= 1.0;
            Ok(())
        } else {
            Err(every.mul_f64(1.0 - self.level))
        }
    }

    /// Whether it has filled up again (nothing to remember).
    pub(super) fn is_full(&self, capacity: f64, every: Duration) -> bool {
        let mut b = *self;
        b.refill(capacity, every);
        b.level >= capacity
    }
}

/// Where failures come from, as the limit counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4(std::net::Ipv4Addr),
    /// The /64 an address is in.
    V6(u64),
    /// A connection whose address is not known (never over TCP).
    Unknown,
    /// Every source past [`MAX_SOURCES`].
    Overflow,
}

impl Source {
    fn of(peer: Option<IpAddr>) -> Self {
        match peer.map(|ip| ip.to_canonical()) {
            Some(IpAddr::V4(a)) => Source::V4(a),
            Some(IpAddr::V6(a)) => Source::V6((u128::from(a) >> 64) as u64),
            None => Source::Unknown,
        }
    }
}

#[derive(Default)]
pub struct Throttle {
    buckets: Mutex<HashMap<Source, Bucket>>,
}

impl Throttle {
    /// A failed authentication from `peer`: `Some(wait)` when it is past its burst (the
    /// answer is then 429, `Retry-After: wait`).
    pub fn failed(&self, peer: Option<IpAddr>) -> Option<Duration> {
        let mut all = util::lock(&self.buckets);
        let source = Self::place(&mut all, Source::of(peer));
        all.entry(source)
            .or_insert_with(|| Bucket::full(BURST))
            .take(BURST, REFILL)
            .err()
    }

    /// `Some(wait)` when `peer` may not fail once more now: checked before work that a
    /// failure would make costly (an enrolment token looked up in the store).
    pub fn exhausted(&self, peer: Option<IpAddr>) -> Option<Duration> {
        let mut all = util::lock(&self.buckets);
        let source = Self::place(&mut all, Source::of(peer));
        let b = all.get_mut(&source)?;
        b.refill(BURST, REFILL);
        (b.level < 1.0).then(|| REFILL.mul_f64(1.0 - b.level))
    }

    /// The bucket `source` counts in: its own, or the shared one once the map is full
    /// of sources still failing.
    fn place(all: &mut HashMap<Source, Bucket>, source: Source) -> Source {
        if all.contains_key(&source) || all.len() < MAX_SOURCES {
            return source;
        }
        all.retain(|_, b| !b.is_full(BURST, REFILL));
        if all.len() < MAX_SOURCES {
            source
        } else {
            Source::Overflow
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_fails_a_burst_then_waits_and_its_neighbours_of_a_64_with_it() {
        let t = Throttle::default();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        for _ in 0..BURST as usize {
            assert_eq!(t.failed(Some(a)), None);
        }
        let wait = t.failed(Some(a)).expect("past its burst");
        assert!(wait <= REFILL, "{wait:?}");
        assert!(t.exhausted(Some(a)).is_some());
        let b: IpAddr = "10.0.0.2".parse().expect("ip");
        assert_eq!(t.failed(Some(b)), None, "another address has its own");
        assert_eq!(t.exhausted(Some(b)), None);
        // An IPv6 host's /64 is one source; an IPv4-mapped address is its IPv4 one.
        let v6 = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
        for _ in 0..BURST as usize {
            t.failed(v6("2001:db8:1:2::1"));
        }
        assert!(t.failed(v6("2001:db8:1:2:ffff::9")).is_some());
        assert!(t.failed(v6("2001:db8:1:3::1")).is_none());
        assert!(t.exhausted(v6("::ffff:10.0.0.1")).is_some());
    }

    #[test]
    fn a_bucket_refills_at_its_rate() {
        let mut b = Bucket::full(2.0);
        let every = Duration::from_millis(20);
        assert_eq!(b.take(2.0, every), Ok(()));
        assert_eq!(b.take(2.0, every), Ok(()));
        assert!(b.take(2.0, every).is_err());
        b.at -= every;
        assert_eq!(b.take(2.0, every), Ok(()));
        b.at -= every * 10;
        assert!(b.is_full(2.0, every));
    }
}
