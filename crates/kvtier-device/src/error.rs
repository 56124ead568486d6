//! The error type of this crate.

use kvtier_types::{PageId, Tier};

/// Why a device operation was refused. Nothing was copied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// The host arena refused a page: busy with another transfer, or out of range.
    #[error(transparent)]
    Host(#[from] kvtier_host::HostError),
    /// A transfer pair of a kind this arena does not hold.
    #[error("{0} transfer pairs are not KV pages")]
    WrongKind(&'static str),
    /// No usable CUDA device: no driver, no GPU, or none visible to this process
    /// (feature `cuda`).
    #[cfg(feature = "cuda")]
    #[error(
        "no CUDA device: {call} returned {code} ({name}: {message}); CUDA driver: {}, runtime: {}",
        cuda_version(*.driver_version),
        cuda_version(*.runtime_version)
    )]
    NoCudaDevice {
        /// The CUDA runtime call that failed, e.g. `cudaGetDeviceCount`.
        call: String,
        /// Its `cudaError_t`.
        code: i32,
        /// The error's name, e.g. `cudaErrorInsufficientDriver`.
        name: String,
        /// The runtime's description of the error.
        message: String,
        /// `cudaDriverGetVersion`: 0 when no driver is loaded.
        driver_version: u32,
        /// `cudaRuntimeGetVersion`: the CUDA runtime linked in.
        runtime_version: u32,
    },
    /// A CUDA runtime call failed (feature `cuda`). What the call was part of copied
    /// nothing, or may have copied part of its batch if the failure came from a kernel.
    #[cfg(feature = "cuda")]
    #[error("CUDA error: {call} returned {code} ({name}: {message})")]
    Cuda {
        /// The CUDA runtime call (or kernel launch) that failed.
        call: String,
        /// Its `cudaError_t`.
        code: i32,
        /// The error's name.
        name: String,
        /// The runtime's description of the error.
        message: String,
    },
}

/// A CUDA version number (`1000 * major + 10 * minor`) as `major.minor`; 0 is "none".
#[cfg(feature = "cuda")]
fn cuda_version(version: u32) -> String {
    if version == 0 {
        "none".to_owned()
    } else {
        format!("{}.{}", version / 1000, version % 1000 / 10)
    }
}
