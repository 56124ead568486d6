//! KV memory of kvtier and the page-copy kernel library that moves it.
//!
//! * [`KvGeometry`]: model KV geometry (layers, K/V planes, heads, head dim, dtype), which
//!   gives bytes per token per layer and per page.
//! * [`KvArenas`]: the device arena (layer-first) and the host arena (page-first, one page
//!   holding all its layers contiguously), allocated once, page-aligned and zeroed, and
//!   the batched page copies between them: device→host (write-back), host→device
//!   (load-back, all layers or one layer range for layer-wise overlap), device→device,
//!   and page zeroing.
//!
//! The copies run in the C++ kernel library in `cpp/`, behind a `cxx` bridge: a CPU
//! backend built with the system C++ compiler, multi-threaded for large batches. Every
//! page id and layer range is checked here before any byte moves, so a bad request is a
//! typed error, never an out-of-bounds copy.
//!
//! With the cargo feature `cuda`, the module `cuda` adds the CUDA backend
//! (`cpp/kernels_cuda.cu`, compiled by nvcc for sm_80 and sm_90): a device probe and
//! `cuda::CudaArenas`, the same arenas and operations in GPU and pinned host memory.

mod arenas;
pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_ffi;
mod error;
mod executor;
mod ffi;
mod geometry;
pub mod protocol;

pub use arenas::{DeviceView, ItemMut, KvArenas, StateGeometry};
pub use error::DeviceError;
pub use executor::{
    CopyFaults, DeviceCore, DeviceStats, FailEveryNth, ModelRunner, NewRequest, NoCopyFaults,
};
pub use geometry::KvGeometry;
pub use protocol::{DeviceMsg, DeviceReply};
