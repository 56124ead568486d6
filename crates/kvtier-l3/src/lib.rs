//! The L3 tier of kvtier: where KV pages go when they leave device and host memory.
//!
//! * [`Namespace`] formats every key, for every verb: model, KV dtype, KV layout, page
//!   size and tensor-parallel geometry, then the page's full-chain SHA-256 rolling hash.
//! * [`L3Backend`] is the one trait every store implements: batch exists (consecutive
//!   hits from the start), batch get into page buffers, batch put from page buffers,
//!   remove, stats, and the capabilities a backend really has.
//! * [`LocalStore`] is the embedded default: a bounded memory tier over a bounded disk
//!   directory, checksummed write-once objects that survive a restart, and
//!   prefetch-on-exist (an existence query may promote disk-only objects to memory in the
//!   background).
//! * [`L3Core`] is the L3 store actor's core: lookups at submit, and each plan's
//!   prefetches (L3 → host pages) and backups (host pages → L3), straight between the
//!   backend and the host arena it shares with the device actor.
//! * [`MooncakeStore`] talks to a real Mooncake cluster through its C ABI, loaded at run
//!   time (`dlopen`) by a small C++ shim behind `cxx`.
//!
//! Feature `testing` (off by default; turn it on in dev-dependencies only) adds
//! `kvtier_l3::testing`, which finds the Mooncake cluster `cargo xtask mooncake run`
//! describes, or starts a `mooncake_master` of a test's own, for tests here and in
//! downstream crates.

mod backend;
mod codec;
mod error;
mod key;
mod local;
mod mooncake;
pub mod protocol;
mod segments;
mod shared;
mod tier;

pub use backend::{Capabilities, L3Backend, L3Stats, PutOutcome};
pub use error::L3Error;
pub use key::{L3Key, Namespace};
pub use local::{LocalStore, LocalStoreConfig};
#[cfg(feature = "testing")]
pub use mooncake::testing;
pub use mooncake::{MooncakeConfig, MooncakeStore};
pub use protocol::{L3Msg, L3Reply};
pub use segments::payload_extents;
pub use shared::SharedStore;
pub use tier::{L3Core, L3Faults, L3TierStats, LOOKUP_CHUNK, NoL3Faults};
