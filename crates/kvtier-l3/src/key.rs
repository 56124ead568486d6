//! Keys: one formatter for every verb.

use std::fmt;

use kvtier_types::hash::PageHash;

use crate::L3Error;

/// An L3 object key: `kvtier/v1/{model}/{dtype}/{layout}/p{page_size}/tp{rank}of{size}/{hash}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct L3Key(String);

impl L3Key {
    /// A key read back from a stored object.
    pub(crate) fn from_stored(key: String) -> Self {
        Self(key)
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for L3Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything that makes the same tokens' KV different bytes: two deployments that
/// differ in any field must never share objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    prefix: String,
}

impl Namespace {
    /// Builds a namespace; components may not contain `/` or be empty.
    pub fn new(
        model: &str,
        kv_dtype: &str,
        kv_layout: &str,
        page_size: u32,
        tp_size: u32,
        tp_rank: u32,
    ) -> Result<Self, L3Error> {
        for (name, value) in [
            ("model", model),
            ("kv_dtype", kv_dtype),
            ("kv_layout", kv_layout),
        ] {
            if value.is_empty() || value.contains('/') || value.chars().any(char::is_whitespace) {
                return Err(L3Error::InvalidNamespace(format!("{name} {value:?}")));
            }
        }
        if page_size == 0 || tp_size == 0 || tp_rank >= tp_size {
            return Err(L3Error::InvalidNamespace(format!(
                "page size {page_size}, tensor-parallel rank {tp_rank} of {tp_size}"
            )));
        }
        Ok(Self {
            prefix: format!(
                "kvtier/v1/{model}/{kv_dtype}/{kv_layout}/p{page_size}/tp{tp_rank}of{tp_size}"
            ),
        })
    }

    /// The key of a page, from its rolling hash.
    pub fn key(&self, page: &PageHash) -> L3Key {
        let mut key = String::with_capacity(self.prefix.len() + 65);
        key.push_str(&self.prefix);
        key.push('/');
        page.push_hex(&mut key);
        L3Key(key)
    }

    /// Keys of consecutive pages.
    pub fn keys(&self, pages: &[PageHash]) -> Vec<L3Key> {
        pages.iter().map(|h| self.key(h)).collect()
    }

    /// The key of the recurrent state after the page whose rolling hash is `page`
    /// (hybrid models): in the page's namespace, never equal to a page's key.
    pub fn state_key(&self, page: &PageHash) -> L3Key {
        let mut key = String::with_capacity(self.prefix.len() + 71);
        key.push_str(&self.prefix);
        key.push_str("/state/");
        page.push_hex(&mut key);
        L3Key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Namespace {
        Namespace::new("llama-3-8b", "bf16", "page-first", 64, 2, 1).unwrap()
    }

    #[test]
    fn keys_carry_the_whole_namespace() {
        let h = PageHash([0xab; 32]);
        let key = ns().key(&h);
        assert_eq!(
            key.as_str(),
            format!(
                "kvtier/v1/llama-3-8b/bf16/page-first/p64/tp1of2/{}",
                "ab".repeat(32)
            )
        );
    }

    #[test]
    fn any_namespace_difference_changes_the_key() {
        let h = PageHash([1; 32]);
        let base = ns().key(&h);
        let others = [
            Namespace::new("llama-3-70b", "bf16", "page-first", 64, 2, 1),
            Namespace::new("llama-3-8b", "fp8", "page-first", 64, 2, 1),
            Namespace::new("llama-3-8b", "bf16", "layer-first", 64, 2, 1),
            Namespace::new("llama-3-8b", "bf16", "page-first", 16, 2, 1),
            Namespace::new("llama-3-8b", "bf16", "page-first", 64, 4, 1),
            Namespace::new("llama-3-8b", "bf16", "page-first", 64, 2, 0),
        ];
        for other in others {
            assert_ne!(other.unwrap().key(&h), base);
        }
    }

    #[test]
    fn a_state_key_is_never_a_page_key() {
        let h = PageHash([7; 32]);
        let (page, state) = (ns().key(&h), ns().state_key(&h));
        assert_ne!(page, state);
        assert!(
            state
                .as_str()
                .starts_with("kvtier/v1/llama-3-8b/bf16/page-first/p64/tp1of2/")
        );
        assert!(state.as_str().ends_with(&"07".repeat(32)));
    }

    #[test]
    fn bad_components_are_refused() {
        assert!(Namespace::new("", "bf16", "pf", 64, 1, 0).is_err());
        assert!(Namespace::new("a/b", "bf16", "pf", 64, 1, 0).is_err());
        assert!(Namespace::new("m", "bf16", "pf", 0, 1, 0).is_err());
        assert!(Namespace::new("m", "bf16", "pf", 64, 2, 2).is_err());
    }
}
