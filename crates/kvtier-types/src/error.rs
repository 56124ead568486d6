//! The error type of this crate: invalid configuration and malformed hash input.

/// Errors raised by the shared types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TypesError {
    /// A configuration field has a value the scheduler cannot work with.
    #[error("invalid config: {field} {problem}")]
    InvalidConfig {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// A page hash was not 64 lowercase hex characters.
    #[error("malformed page hash {0:?}: expected 64 lowercase hex characters")]
    MalformedPageHash(String),
}
