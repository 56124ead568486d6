//! The error type of this crate.

/// What the Mamba family refuses or finds broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MambaError {
    /// The configuration is unusable.
    #[error("invalid Mamba config: {0}")]
    Config(&'static str),
    /// An invariant check failed.
    #[error("Mamba invariant broken: {0}")]
    Invariant(String),
}
