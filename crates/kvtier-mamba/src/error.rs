//! The error type of this crate.

use kvtier_types::OpId;

/// Why the Mamba family refused a message. A refused message changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MambaError {
    /// The configuration is unusable.
    #[error("invalid Mamba config: {0}")]
    Config(&'static str),
    /// A state needs a prefix of at least one full page.
    #[error("a state follows at least one full page; the path is empty")]
    EmptyPath,
    /// A request-local pair is published at a depth other than its checkpoint's.
    #[error("a checkpoint for depth {slot_depth} published at depth {depth}")]
    DepthMismatch {
        /// The depth it was published at.
        depth: u32,
        /// The depth its state follows.
        slot_depth: u32,
    },
    /// A write-back acknowledgement for an op this family never prepared.
    #[error("no state write-back {0} is in flight")]
    UnknownWriteBack(OpId),
    /// A write-back id already in flight.
    #[error("state write-back {0} is already in flight")]
    DuplicateWriteBack(OpId),
    /// An invariant check failed.
    #[error("Mamba invariant broken: {0}")]
    Invariant(String),
}
