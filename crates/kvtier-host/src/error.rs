//! The error type of this crate.

use kvtier_types::PageId;

/// Errors raised by page pools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// Two page sets from different pools were combined.
    #[error("page sets belong to different pools ({0} and {1})")]
    PoolMismatch(u32, u32),
    /// A split asked for more pages than the set holds.
    #[error("cannot take {wanted} pages from a set of {held}")]
    NotEnoughPages {
        /// Pages asked for.
        wanted: usize,
        /// Pages held.
        held: usize,
    },
    /// A page id outside `1..total` was named.
    #[error("page {page} is outside the pool's range 1..{total}")]
    PageOutOfRange {
        /// The page.
        page: PageId,
        /// Pool size including page 0.
        total: u32,
    },
    /// The host arena could not be allocated.
    #[error("cannot allocate a host arena of {pages} pages of {page_bytes} bytes")]
    ArenaAllocation {
        /// Pages asked for (page 0 included).
        pages: u32,
        /// Bytes per page.
        page_bytes: u64,
    },
    /// A page is borrowed by another transfer (a pin is missing somewhere).
    #[error("host page {page} is busy with another transfer")]
    PageBusy {
        /// The page.
        page: PageId,
    },
}
