//! Request-id lookup for the hot path.
//!
//! Events name requests by id, so every `advance` looks ids up. A `BTreeMap` lookup
//! costs a string comparison per tree level; this hash map costs one hash and one
//! comparison. It is only ever used for lookups — iteration order (which reaches plans)
//! always comes from the scheduler's ordered index.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use kvtier_types::RequestId;

/// Word-at-a-time folded-multiply hash: ids are short, so eight bytes per multiply beats
/// a byte loop (FNV cost 40 % of a W2 `advance`), and there is no per-process seed, so
/// runs stay reproducible. The 128-bit product folds its high half into the low one,
/// which hashbrown uses for buckets: ids differing only in their last byte still spread.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

const SEED: u64 = 0x243f_6a88_85a3_08d3;
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

impl IdHasher {
    #[inline]
    fn mix(&mut self, word: u64) {
        let product = u128::from(self.0 ^ SEED ^ word) * u128::from(MULTIPLIER);
        self.0 = (product as u64) ^ ((product >> 64) as u64);
    }
}

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let word: [u8; 8] = word.try_into().expect("chunks of eight");
            self.mix(u64::from_le_bytes(word));
        }
        let tail = words.remainder();
        // The length tags the tail, so "a" and "a\0" differ.
        let mut last = [0u8; 8];
        last[..tail.len()].copy_from_slice(tail);
        self.mix(u64::from_le_bytes(last) ^ ((tail.len() as u64) << 59));
    }

    #[inline]
    fn write_u8(&mut self, byte: u8) {
        self.mix(u64::from(byte));
    }
}

/// Id → request key.
pub(crate) type IdMap = HashMap<RequestId, usize, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::hash::BuildHasher;

    use super::*;

    fn hash(id: &str) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(RequestId::new(id))
    }

    #[test]
    fn equal_ids_hash_equal_and_the_tail_counts() {
        assert_eq!(hash("w2-r000123"), hash("w2-r000123"));
        assert_ne!(hash("a"), hash("a\0"));
        assert_ne!(hash(""), hash("\0"));
        assert_ne!(hash("12345678"), hash("1234567"));
    }

    #[test]
    fn patterned_ids_spread_over_the_low_bits() {
        // Ids of one width that differ in one byte at every position of a word: the
        // bucket index (low bits) must still tell them apart.
        for width in [4, 7, 8, 9, 16] {
            let ids: Vec<String> = (0..4096).map(|i| format!("{i:0width$}")).collect();
            let buckets: BTreeSet<u64> = ids.iter().map(|id| hash(id) & 0xfff).collect();
            // A uniform hash fills about 1 - 1/e of 4096 buckets (2589).
            assert!(
                buckets.len() > 2400,
                "width {width}: {} buckets",
                buckets.len()
            );
        }
    }
}
