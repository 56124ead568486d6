//! The error type of this crate.

/// Why an L3 operation failed. A failed L3 operation is a cache miss for the caller,
/// never wrong KV.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum L3Error {
    /// A namespace component that cannot appear in a key.
    #[error("invalid key namespace: {0}")]
    InvalidNamespace(String),
    /// Buffers and keys of a batch do not pair up.
    #[error("batch of {keys} keys with {buffers} buffers")]
    BatchMismatch {
        /// Keys given.
        keys: usize,
        /// Buffers given.
        buffers: usize,
    },
    /// The store's directory or a file in it could not be used.
    #[error("L3 store I/O on {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Invalid store configuration.
    #[error("invalid L3 store config: {0}")]
    Config(String),
}
