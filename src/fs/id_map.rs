//! Maps keyed by the node ids and handles the daemon hands out.
//!
//! Every request looks its node id or handle up (often twice: the read-only guard
//! and the server), and std's SipHash was 5% of a GETATTR's CPU. The keys are
//! counters the daemon allocates, never values the guest chooses, so there is no
//! collision flood to defend against: one multiplication (Fibonacci hashing) spreads
//! sequential ids over the table's buckets and its control bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` keyed by a daemon-allocated `u64` id.
pub type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are meant; anything else still hashes, byte by byte.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn sequential_ids_spread_over_low_and_high_bits() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let low: std::collections::HashSet<u64> =
            (1..=1024u64).map(|i| b.hash_one(i) & 1023).collect();
        assert_eq!(low.len(), 1024, "1024 sequential ids fill 1024 buckets");
        let top: std::collections::HashSet<u64> =
            (1..=1024u64).map(|i| b.hash_one(i) >> 57).collect();
        assert!(
            top.len() > 100,
            "the top 7 bits (control bytes) vary: {}",
            top.len()
        );
    }

    #[test]
    fn a_map_works_as_a_map() {
        let mut m: IdMap<&str> = IdMap::default();
        m.insert(1, "root");
        m.insert(u64::MAX, "last");
        assert_eq!(m.get(&1), Some(&"root"));
        assert_eq!(m.get(&u64::MAX), Some(&"last"));
        assert_eq!(m.get(&2), None);
    }
}
