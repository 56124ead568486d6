//! The paged-cache family of kvtier: page groups for sliding-window and compressed-state
//! models (gpt-oss, DeepSeek-V4).
//!
//! Such models keep, beside or instead of token-paged KV, *groups* of pages with their
//! own geometry: full-history groups (a chain over the prefix), sliding-window groups
//! (pages leave as the window moves on) and state groups (only the trailing window at a
//! depth matters). A prefix is reusable only where every group it needs is complete
//! there. This crate holds the family's pieces (spec/hybrid-l3.md §2 and §6):
//!
//! * [`GroupSpec`]: a group's geometry, retention and role; [`PoolBudget`] sizes pools;
//! * [`GroupPool`]: its pages (LIFO, page 0 reserved), counting failed allocations;
//! * [`PageTable`]: a request's table with its compact view and base page; acquisition
//!   that changes nothing on failure, the sliding release from an op's first position,
//!   commits and checkpoints into snapshot [`Segment`]s;
//! * [`Adjunct`]: which groups a prefix needs, the alignment `A` and the completeness
//!   flags; [`cap_match`]: the windowed match cap over a chain of snapshots;
//!   [`admit_chunk`]: admission credit without the reference's over-credit (#249);
//! * [`PagedFamily`]: snapshots on the nodes of a prefix tree read through
//!   [`SnapshotTree`]: commits at multiples of `A` that never split a snapshot node,
//!   terminal continuation, the detach of superseded state windows (#460), admission
//!   with pruning and cascade, snapshots dropped with their node's KV;
//! * [`MidflightGate`]: whether and how far a prefix is published while its request
//!   still runs.

mod adjunct;
mod admission;
mod budget;
mod error;
mod family;
mod gate;
mod matching;
mod pool;
mod table;

pub use adjunct::{Adjunct, Completeness, Snapshot};
pub use admission::{AdmitView, GroupNeed, admit_chunk, checkpointed_credit, group_need};
pub use budget::PoolBudget;
pub use error::PagedError;
pub use family::{
    GroupStats, PagedFamily, PagedReport, PagedStats, PendingCommit, RequestTables, SnapshotTree,
    Starved,
};
pub use gate::{CacheShape, MidflightGate};
pub use kvtier_types::{GroupKind, GroupRole, GroupSpec, Retention};
pub use matching::{GroupHit, PagedHit, cap_match};
pub use pool::GroupPool;
pub use table::{PageTable, Released, Segment};
