//! FNV-1a 64, the digest of HYBRID-WORKLOADS.md §2: fed little-endian `i64`s, strings
//! (length, then bytes) and lists (length, then items).

/// FNV-1a 64 over little-endian i64 values (§2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(crate) fn i(&mut self, v: i64) {
        self.bytes(&v.to_le_bytes());
    }

    pub(crate) fn s(&mut self, s: &str) {
        self.i(s.len() as i64);
        self.bytes(s.as_bytes());
    }

    pub(crate) fn v(&mut self, xs: &[i64]) {
        self.i(xs.len() as i64);
        for &x in xs {
            self.i(x);
        }
    }
}
