//! What a job's proxy refused, counted by destination and reason: shown in the job's
//! status and summed in the runner's metrics.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::proto::egress::Denial;

/// Distinct (destination, reason) pairs kept per job; past it, refusals are still
/// counted, under one last entry, so a job trying a million names costs a few KiB.
pub(super) const MAX_KINDS: usize = 64;
/// More room kept for refusals of addresses (a literal, or a special address a name led
/// to): a job cannot hide its try at the metadata address behind a flood of names.
pub(super) const MAX_ADDRESS_KINDS: usize = 16;

/// Every job's refusals, for the runner's metrics.
pub static TOTAL: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, Default)]
pub struct Denials {
    kinds: Mutex<Kinds>,
    total: AtomicU64,
}

/// The kinds counted so far, and how many of them took the room kept for addresses.
#[derive(Debug, Default)]
struct Kinds {
    counts: BTreeMap<(String, String), u64>,
    addresses: usize,
}

impl Denials {
    /// Counts one refusal; how many this job has had.
    pub fn record(&self, destination: &str, reason: &str, address: bool) -> u64 {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        let mut kinds = crate::util::lock(&self.kinds);
        let mut key = (clip(destination), clip(reason));
        if !kinds.counts.contains_key(&key) {
            if address && kinds.addresses < MAX_ADDRESS_KINDS {
                kinds.addresses += 1;
            } else if kinds.counts.len() - kinds.addresses >= MAX_KINDS {
                key = (
                    "…".into(),
                    format!("more than {MAX_KINDS} kinds of refusal"),
                );
            }
        }
        *kinds.counts.entry(key).or_default() += 1;
        self.total.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The refusals so far, most frequent first.
    pub fn snapshot(&self) -> Vec<Denial> {
        let kinds = crate::util::lock(&self.kinds);
        let mut all: Vec<Denial> = kinds
            .counts
            .iter()
            .map(|((destination, reason), &count)| Denial {
                destination: destination.clone(),
                reason: reason.clone(),
                count,
            })
            .collect();
        all.sort_by_key(|d| std::cmp::Reverse(d.count));
        all
    }
}

/// What a job wrote, bounded: a destination or reason is shown, never trusted.
fn clip(s: &str) -> String {
    crate::util::prefix_bytes(s, 300).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_by_kind_and_bounded() {
        let d = Denials::default();
        for _ in 0..3 {
            d.record("a.example:443", "no rule", false);
        }
        for i in 0..(MAX_KINDS * 2) {
            d.record(&format!("h{i}.example:443"), "no rule", false);
        }
        // An address after the flood still has a line of its own.
        let n = d.record("169.254.169.254:80", "no rule allows the address", true);
        assert_eq!(n, 4 + 2 * MAX_KINDS as u64);
        let all = d.snapshot();
        assert_eq!(all.len(), MAX_KINDS + 2);
        assert_eq!(all[0].count, MAX_KINDS as u64 + 1, "{all:?}");
        assert_eq!(all[0].destination, "…");
        assert!(all.iter().any(|x| x.destination == "169.254.169.254:80"));
        assert_eq!(all.iter().map(|x| x.count).sum::<u64>(), n);
    }
}
