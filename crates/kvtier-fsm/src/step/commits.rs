//! Hybrid chunk commits: a chunk's pages published and its checkpoint settled when the
//! request's next row is admitted.

use kvtier_radix::{CacheOp, ChunkCommit};

use crate::SchedulerCore;
use crate::outbox::Target;
use crate::request::{Republish, Running};

impl SchedulerCore {
    /// Applies a committed chunk to its request: the published prefix (its new lock and
    /// page table) and the fresh checkpoint.
    pub(super) fn apply_commit(
        &mut self,
        key: usize,
        committed: kvtier_radix::Committed,
        republish: Option<Box<Republish>>,
    ) {
        let kvtier_radix::Committed {
            published,
            checkpoint,
        } = committed;
        let Some(run) = self.requests[key].state.running_mut() else {
            debug_assert!(false, "a commit for a request not running");
            return;
        };
        run.take_commit(published, republish.as_deref(), checkpoint);
    }

    /// Queues the publication of a running request's computed pages with the state at
    /// their end (`CacheOp::PublishDecode`); `retire` is its previous decode state.
    pub(crate) fn queue_publication(
        &mut self,
        key: usize,
        (publication, republish): (kvtier_radix::Publication, Republish),
        checkpoint: Option<(kvtier_mamba::Slot, Option<u32>)>,
        retire: Option<kvtier_radix::NodeId>,
        decode: bool,
    ) {
        let id = self.requests[key].id.clone();
        self.outbox.push(
            CacheOp::PublishDecode {
                publication,
                checkpoint,
                // A decode row that ends the next page gets a slot then.
                renew: false,
                retire,
                stops: None,
            },
            Target::PublishDecode {
                key,
                id,
                republish,
                decode,
            },
        );
    }

    /// A commit that was not admitted comes back: the pages go back in front of the
    /// request's own, the checkpoint back to its pair.
    pub(super) fn restore_commit(&mut self, key: usize, commit: ChunkCommit) {
        let Some(run) = self.requests[key].state.running_mut() else {
            debug_assert!(false, "a commit for a request not running");
            return;
        };
        let ChunkCommit {
            publication,
            checkpoint,
            ..
        } = commit;
        if let Some(p) = publication {
            run.landed(p.pages.len());
            let mut pages = p.pages;
            let rest = pages.append(&mut run.local_kv.pages);
            debug_assert!(rest.is_ok(), "pages of another pool");
            run.local_kv.pages = pages;
        }
        if let (Some(states), Some((slot, at))) = (run.family.states_mut(), checkpoint) {
            states.checkpoint = Some(slot);
            states.checkpoint_at = at;
        }
    }

    /// Records where the request's current prefill chunk leaves a state in its
    /// checkpoint slot (the checkpoint rule the worker applies).
    pub(super) fn track_checkpoint(&self, run: &mut Running) {
        let (begin, size) = (run.window_begin, run.window_size);
        let (ps, chunk) = (
            self.config.page_size,
            self.config.mamba.map_or(1, |m| m.chunk),
        );
        if let Some(states) = run.family.states_mut()
            && states.checkpoint.is_some()
        {
            states.checkpoint_at = kvtier_mamba::checkpoint_depth(begin, size, ps, chunk);
        }
    }
}
