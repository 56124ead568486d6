//! The radix cache's message protocol: one [`CacheBatch`] per scheduler call.
//!
//! The scheduler (request FSM) never calls the cache directly. Each `advance` and each
//! `next_plan` sends one batch of [`CacheOp`]s; the cache executes them in order and
//! answers one [`CacheReply`] with a [`OpResult`] per op, in the same order. Handles
//! (locks, page sets) travel inside ops and results by move.
//!
//! Admission is an [`AdmitProgram`]: the scheduler orders the candidates and sets the
//! token budget, the row and slot limits; the cache decides, candidate by candidate,
//! what fits, because every fit decision depends on the cache as the earlier candidates
//! left it (evictions, locks on shared prefixes, load-backs). Executing the program
//! where the cache lives gives exactly the decisions of a sequential loop, in one
//! message.
//!
//! The vocabulary is in `op` (ops and their results) and `program` (the admission
//! program's intents and outcomes); the executor in `run_op` (one op), `admit` (the
//! admission loop), `first_chunk` and `recovery`.

mod admit;
mod family;
mod first_chunk;
mod op;
mod program;
mod recovery;
mod run_op;

pub use family::{FamilyGrant, FamilyHold, FamilyRelease};
pub(crate) use first_chunk::{ChunkFamily, ChunkShape, FirstChunkAsk, Halt, Pinned};
pub use kvtier_mamba::CheckpointNeed;
pub use op::{
    Attached, BackupSource, CacheOp, FinalStates, OpResult, Released, RetractOutcome, StopLock,
};
pub use program::{
    Admission, AdmitProgram, ChunkCommit, Committed, Denial, FamilyAsk, Intent, Outcome,
    PrefetchCheck, PrefetchSkip, PrefetchStart, RetractedHandles, StateGrant,
};

use kvtier_host::OwnedPages;

use crate::TokenRef;
use crate::{NodeId, RadixCore, TablesKey};

/// Pages to allocate for `n` more token slots when the last page has `tail_free` free
/// slots, and the free slots left afterwards. The scheduler's page accounting and the
/// cache's allocations both use it, so they agree.
pub fn grow(tail_free: u32, n: u32, page_size: u32) -> (u32, u32) {
    if n <= tail_free {
        return (0, tail_free - n);
    }
    let need = n - tail_free;
    let used = need % page_size;
    (
        need.div_ceil(page_size),
        if used == 0 { 0 } else { page_size - used },
    )
}

/// One batch of cache operations, executed in order.
#[derive(Debug, Default)]
pub struct CacheBatch {
    /// The operations.
    pub ops: Vec<CacheOp>,
}

/// The answer to a [`CacheBatch`]: one result per op, same order.
#[derive(Debug, Default)]
pub struct CacheReply {
    /// The results.
    pub results: Vec<OpResult>,
}

/// A publication into the tree: a request's computed full pages `prefix..` of `tokens`.
#[derive(Debug)]
pub struct Publication {
    /// The request's tokens up to the last published page.
    pub tokens: TokenRef,
    /// Pages of the request already in the tree.
    pub prefix: u32,
    /// The request's own pages for pages `prefix..` (duplicates go back to the pool).
    pub pages: OwnedPages,
    /// The node its published prefix ends at, which it holds locked on device (the
    /// insert walks on from there instead of from the root); `None`: the root.
    pub at: Option<NodeId>,
    /// Paged models: the request's group tables, committed into snapshots up to the
    /// published node.
    pub tables: Option<TablesKey>,
}

impl RadixCore {
    /// Executes a batch in order.
    pub fn execute(&mut self, batch: CacheBatch) -> CacheReply {
        self.drain_releases();
        let mut handed_over = Vec::new();
        let results = batch
            .ops
            .into_iter()
            .map(|op| self.execute_op(op, &mut handed_over))
            .collect();
        // A lock nobody took is released by its drop all the same.
        debug_assert!(
            handed_over.is_empty(),
            "handed over, not taken: {handed_over:?}"
        );
        CacheReply { results }
    }
}

#[cfg(test)]
mod tests {
    use super::grow;

    #[test]
    fn grow_uses_the_tail_first() {
        assert_eq!(grow(3, 2, 4), (0, 1));
        assert_eq!(grow(3, 3, 4), (0, 0));
        assert_eq!(grow(1, 5, 4), (1, 0));
        assert_eq!(grow(1, 6, 4), (2, 3));
        assert_eq!(grow(0, 0, 4), (0, 0));
    }
}
