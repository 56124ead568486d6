//! The error type of this crate.

/// What the paged-cache family refuses or finds broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PagedError {
    /// A group or adjunct configuration is unusable.
    #[error("invalid paged-cache config: {0}")]
    Config(String),
    /// A group id no group has.
    #[error("unknown paged-cache group `{0}`")]
    UnknownGroup(String),
    /// A group's pool cannot cover an acquisition; the table is unchanged.
    #[error("paged-cache group `{group}` is out of pages: {needed} needed, {free} free")]
    OutOfPages {
        /// The group.
        group: String,
        /// Pages the acquisition needed.
        needed: u32,
        /// Pages the pool had free.
        free: u32,
    },
    /// An operation on a table that its state does not allow (a programming error of
    /// the caller, reported rather than panicking).
    #[error("paged-cache table of group `{group}`: {problem}")]
    Table {
        /// The group.
        group: String,
        /// What was wrong.
        problem: String,
    },
    /// An invariant check failed.
    #[error("paged-cache invariant broken: {0}")]
    Invariant(String),
}
