//! Request-id lookup for the hot path.
//!
//! Events name requests by id, so every `advance` looks ids up. A `BTreeMap` lookup
//! costs a string comparison per tree level; this hash map costs one hash and one
//! comparison. It is only ever used for lookups — iteration order (which reaches plans)
//! always comes from the scheduler's ordered index.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use kvtier_types::RequestId;

/// FNV-1a over the id's bytes: fast for short ids, and no per-process random seed.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// Id → request key.
pub(crate) type IdMap = HashMap<RequestId, usize, BuildHasherDefault<IdHasher>>;
