//! Radix prefix cache of kvtier.
//!
//! A radix tree over whole pages of tokens. Each node may hold a device copy (L1), a host
//! copy (L2), or both, with a lock count per tier. The cache owns the device page pool
//! and the host page pool; pages outside the tree travel as `OwnedPages`.
//!
//! Behaviour follows the reference scheduler's prefix cache (spec/cache-core.md) with its
//! known bugs fixed:
//! * probing is read-only (no split, no LRU touch); only admission commits a match;
//! * a committed touch re-keys the node in the LRU order (exact LRU, logical clock);
//! * eviction is transactional: it runs only when it can free enough pages;
//! * nodes evicted together are pruned children-first, so no resource-less node remains;
//! * a host copy attached for a write-back is *pending* until acknowledged, and a failed
//!   write-back rolls it back instead of publishing garbage;
//! * page hashes are always derived from the tokens and the page's absolute position.
//!
//! Invariants (checked by [`RadixCore::check_invariants`] in tests and debug builds):
//! 1. every usable page of each pool is free, in exactly one node, or held outside;
//! 2. labels are whole pages; a node's depth is its parent's depth plus its label;
//! 3. presence of each tier is closed towards the root on every path;
//! 4. lock counts never go negative; a locked node is never evicted, demoted or pruned;
//! 5. each LRU set holds exactly the unpinned-or-pinned leaves of its tier.

mod batch;
mod cache;
mod error;
mod events;
mod hybrid;
mod lock;
mod node;
mod paged;
pub mod protocol;
mod reference;
mod tokens;

pub use batch::{
    Admission, AdmitProgram, Attached, BackupSource, CacheBatch, CacheOp, CacheReply,
    CheckpointNeed, ChunkCommit, Committed, Denial, FamilyAsk, FamilyGrant, FamilyHold,
    FamilyRelease, FinalStates, Intent, OpResult, Outcome, PrefetchCheck, PrefetchSkip,
    PrefetchStart, Publication, Released, RetractOutcome, RetractedHandles, StateGrant, StopLock,
    grow,
};
pub(crate) use cache::Hosted;
pub use cache::{
    CacheConfig, CacheFamily, CachedState, Dense, FamilyLease, GroupTables, InsertResult, Match,
    Probe, RadixCore, TablesKey, TreeEvent, TreeStats, WriteBackTicket, WrittenBack,
};
pub use error::{PageOwner, RadixError, Violation};
pub use lock::NodeLock;
pub use node::NodeId;
pub use protocol::{RadixMsg, RadixReply};
pub use tokens::TokenRef;
