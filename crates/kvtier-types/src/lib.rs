//! Shared vocabulary of kvtier.
//!
//! Everything another crate of ours needs to agree on lives here: ids, the scheduler
//! configuration and its validation, request specs, the [`ExecutionPlan`] handed to the
//! engine each step, the [`EngineEvent`]s it reports back, and both page-hash systems
//! (SHA-256 rolling page hashes for L3 keys, FNV-1a block hashes for KV events), and
//! the toy [`engine_rule`] the simulators, tests and examples answer plans with.
//! This crate imports no other crate of ours.

pub mod actor;
mod config;
pub mod engine_rule;
mod error;
mod event;
pub mod hash;
mod histogram;
mod ids;
mod paged;
mod plan;
mod policy;
mod request;
mod tree;

pub use actor::{ActorCore, ActorName, Placement};
pub use config::{MambaSettings, PagedSettings, Role, SchedulerConfig};
pub use error::TypesError;
pub use event::{EngineEvent, KvEvent, Medium};
pub use histogram::{DURATION_BOUNDS, Histogram, WallClock};
pub use ids::{OpId, PageId, RequestId, SlotId, Tier, Token};
pub use paged::{GroupKind, GroupRole, GroupSpec, Retention};
pub use plan::{
    AbortNotice, AbortReason, BackupOp, ExecutionPlan, ForwardBatch, ForwardRow, GroupTable,
    LoadBackOp, MambaRow, PrefetchOp, RowKind, StateObject, TransferKind, TransferPair,
    WriteBackOp,
};
pub use policy::Policy;
pub use request::{LookupAsk, RequestSpec, lookup_pages};
pub use tree::TreeView;
