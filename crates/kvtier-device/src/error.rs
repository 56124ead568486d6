//! The error type of this crate.

use kvtier_types::{PageId, Tier};

/// Why a device operation was refused. Nothing was copied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    /// The KV geometry is unusable.
    #[error("invalid KV geometry: {0}")]
    InvalidGeometry(String),
    /// The arenas could not be allocated.
    #[error("cannot allocate {bytes} bytes of KV arenas")]
    Allocation {
        /// Bytes asked for.
        bytes: u64,
    },
    /// A page id outside `1..pages` of its arena (page 0 is reserved).
    #[error("{tier:?} page {page} is outside 1..{pages}")]
    PageOutOfRange {
        /// The arena.
        tier: Tier,
        /// The page.
        page: PageId,
        /// Arena size including page 0.
        pages: u32,
    },
    /// A layer range outside the model's layers.
    #[error("layers {first}..{end} exceed the model's {layers} layers")]
    LayerOutOfRange {
        /// First layer asked for.
        first: u32,
        /// One past the last layer asked for.
        end: u32,
        /// Layers of the model.
        layers: u32,
    },
    /// A transfer pair of a kind this arena does not hold.
    #[error("{0} transfer pairs are not KV pages")]
    WrongKind(&'static str),
}
