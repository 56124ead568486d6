//! The error type of this crate.

/// Errors raised by the radix cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RadixError {
    /// Token count not a multiple of the page size.
    #[error("{tokens} tokens is not a whole number of {page_size}-token pages")]
    Unaligned {
        /// Tokens given.
        tokens: usize,
        /// Page size.
        page_size: u32,
    },
    /// Insert was given a page list that does not cover exactly the new pages.
    #[error(
        "insert of {total} pages with a {prefix}-page prefix needs {expected} pages, got {got}"
    )]
    PageCountMismatch {
        /// Pages of the insert.
        total: u32,
        /// Pages already owned on the path.
        prefix: u32,
        /// Pages that should have been passed.
        expected: u32,
        /// Pages passed.
        got: usize,
    },
    /// The claimed prefix is not resident on the tier.
    #[error("the first {prefix} pages are not all resident on the inserted tier")]
    PrefixNotResident {
        /// Claimed prefix pages.
        prefix: u32,
    },
    /// A node id that no longer names a live node.
    #[error("stale or unknown tree node")]
    StaleNode,
    /// A host lease that is not exactly the host pool's usable pages.
    #[error("the host tier needs a lease of pages 1..={expected}, got {got} pages")]
    HostLease {
        /// Usable host pages of the config.
        expected: u32,
        /// Pages leased.
        got: u32,
    },
    /// Pages from another pool were passed.
    #[error(transparent)]
    Pool(#[from] kvtier_host::HostError),
}
