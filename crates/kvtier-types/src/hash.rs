//! The two page-hash systems.
//!
//! * [`PageHash`]: SHA-256 rolling hash of a page and everything before it. L3 keys are
//!   built from it, so it must depend only on the tokens and the page's absolute index.
//!   Per page: SHA-256(previous page's 32 raw bytes, omitted for the first page ‖ each
//!   token as 4 bytes little-endian).
//! * [`block_hash`]: FNV-1a-64 identity of a page for KV-cache events, chained through
//!   the parent page's block hash.

use sha2::{Digest, Sha256};
use std::fmt;

use crate::{Token, TypesError};

/// SHA-256 rolling page hash. Displays as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub [u8; 32]);

/// Appends `bytes` in lowercase hex to `out`. L3 keys and object file names are
/// formatted on the transfer path, thousands per op: a table beats `write!` per byte.
pub fn push_hex(bytes: &[u8], out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}

impl PageHash {
    /// Appends the lowercase hex form to `out`.
    pub fn push_hex(&self, out: &mut String) {
        push_hex(&self.0, out);
    }

    /// Hash of `tokens` (one page) chained after `prior` (`None` for the first page).
    pub fn chain(prior: Option<&PageHash>, tokens: &[Token]) -> PageHash {
        let mut hasher = Sha256::new();
        if let Some(prior) = prior {
            hasher.update(prior.0);
        }
        for &t in tokens {
            hasher.update((t as u32).to_le_bytes());
        }
        PageHash(hasher.finalize().into())
    }

    /// Lowercase hex form.
    pub fn to_hex(&self) -> String {
        let mut hex = String::with_capacity(64);
        self.push_hex(&mut hex);
        hex
    }

    /// Parses the 64-character lowercase hex form.
    pub fn from_hex(s: &str) -> Result<PageHash, TypesError> {
        let bad = || TypesError::MalformedPageHash(s.to_owned());
        let bytes = s.as_bytes();
        if bytes.len() != 64 {
            return Err(bad());
        }
        let nibble = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let (hi, lo) = (
                nibble(pair[0]).ok_or_else(bad)?,
                nibble(pair[1]).ok_or_else(bad)?,
            );
            out[i] = hi << 4 | lo;
        }
        Ok(PageHash(out))
    }
}

impl fmt::Display for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for PageHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PageHash({self})")
    }
}

/// Rolling hashes of every full page of `tokens`, chained from `prior`.
pub fn rolling_page_hashes(
    prior: Option<&PageHash>,
    tokens: &[Token],
    page_size: usize,
) -> Vec<PageHash> {
    let mut out = Vec::with_capacity(tokens.len() / page_size.max(1));
    let mut last = prior.copied();
    for page in tokens.chunks_exact(page_size) {
        let h = PageHash::chain(last.as_ref(), page);
        out.push(h);
        last = Some(h);
    }
    out
}

const FNV_OFFSET: u64 = 14_695_981_039_346_656_037;
const FNV_PRIME: u64 = 1_099_511_628_211;

#[inline]
fn fnv_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// FNV-1a-64 block hash of one page for KV events. Stream: a flag byte (1 when a parent
/// exists), the parent's hash as 8 bytes LE, the token count as 8 bytes LE, then each
/// token as 4 bytes LE.
pub fn block_hash(parent: Option<u64>, tokens: &[Token]) -> u64 {
    let mut h = fnv_bytes(FNV_OFFSET, &[u8::from(parent.is_some())]);
    if let Some(p) = parent {
        h = fnv_bytes(h, &p.to_le_bytes());
    }
    h = fnv_bytes(h, &(tokens.len() as u64).to_le_bytes());
    for &t in tokens {
        h = fnv_bytes(h, &(t as u32).to_le_bytes());
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    const H12: &str = "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f";
    const H34: &str = "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c";

    #[test]
    fn page_hash_vectors_match_the_reference() {
        let hashes = rolling_page_hashes(None, &[1, 2, 3, 4], 2);
        assert_eq!(hashes.len(), 2);
        assert_eq!(hashes[0].to_hex(), H12);
        assert_eq!(hashes[1].to_hex(), H34);
    }

    #[test]
    fn chained_suffix_equals_full_chain() {
        let first = PageHash::from_hex(H12).unwrap();
        let suffix = rolling_page_hashes(Some(&first), &[3, 4, 5], 2);
        assert_eq!(suffix.len(), 1, "partial trailing page is not hashed");
        assert_eq!(suffix[0].to_hex(), H34);
    }

    #[test]
    fn hex_round_trip_and_rejects_garbage() {
        let h = PageHash::from_hex(H12).unwrap();
        assert_eq!(PageHash::from_hex(&h.to_hex()).unwrap(), h);
        assert!(PageHash::from_hex("abc").is_err());
        assert!(PageHash::from_hex(&H12.to_uppercase()).is_err());
    }

    #[test]
    fn block_hash_vectors_match_the_reference() {
        let first = block_hash(None, &[1, 2]);
        assert_eq!(first, 15_057_981_579_580_773_918);
        assert_eq!(block_hash(Some(first), &[3, 4]), 1_701_542_150_546_744_594);
    }
}
