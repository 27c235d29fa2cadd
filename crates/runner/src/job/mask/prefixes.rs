//! Whether the end of the output so far may be the start of a secret: those bytes are
//! held back until the next read or the end of the stream says what they are.

use std::collections::HashSet;

/// Hashes of every proper prefix of every pattern, mixed with its length: the end of
/// the output is looked up in one pass over it. A collision only holds bytes back a
/// little longer.
pub(super) struct Prefixes {
    hashes: HashSet<u64, Mixed>,
    longest: usize,
}

impl Prefixes {
    pub(super) fn new(patterns: &[Vec<u8>]) -> Self {
        let total = patterns.iter().map(Vec::len).sum();
        let mut hashes = HashSet::with_capacity_and_hasher(total, Mixed::default());
        for p in patterns {
            let mut h = 0u64;
            for (k, &b) in p[..p.len() - 1].iter().enumerate() {
                h = h.wrapping_mul(BASE).wrapping_add(u64::from(b));
                hashes.insert(mix(h, k + 1));
            }
        }
        Self {
            hashes,
            longest: patterns.iter().map(Vec::len).max().unwrap_or(0),
        }
    }

    /// The length of the longest end of `data` that may be the start (not the whole) of
    /// a pattern.
    pub(super) fn open(&self, data: &[u8]) -> usize {
        let (mut h, mut power, mut found) = (0u64, 1u64, 0);
        for k in 1..self.longest.min(data.len() + 1) {
            h = h.wrapping_add(u64::from(data[data.len() - k]).wrapping_mul(power));
            power = power.wrapping_mul(BASE);
            if self.hashes.contains(&mix(h, k)) {
                found = k;
            }
        }
        found
    }
}

/// The keys are hashes already, mixed with their length: hashing them again (SipHash, a
/// few dozen lookups a read of output) was a measurable part of masking.
type Mixed = std::hash::BuildHasherDefault<AsIs>;

#[derive(Default)]
struct AsIs(u64);

impl std::hash::Hasher for AsIs {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

const BASE: u64 = 0x100_0000_01b3;

fn mix(h: u64, len: usize) -> u64 {
    h ^ (len as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}
