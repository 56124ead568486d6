//! Hybrid decode publication: a decoding request's new full pages go into the tree.

use kvtier_radix::CacheOp;

use crate::SchedulerCore;
use crate::outbox::Target;
use crate::request::State;

impl SchedulerCore {
    /// A decoding hybrid request (or a plain window model's, up to its cap) whose tokens
    /// crossed a page boundary (it had `before` tokens) publishes its new full pages with its checkpoint, which holds the state at
    /// their end when the decode row that reached it copied it there. kvtier then gives
    /// it a fresh checkpoint for the next boundary; the reference frees the checkpoint
    /// and caches no state past the prompt (HYBRID-WORKLOADS.md §4.2).
    pub(super) fn publish_decoded(&mut self, key: usize, before: usize) {
        let ps = self.config.page_size;
        // A family's cache makes every published prefix safe to reuse.
        let cap = match (&self.config.mamba, &self.config.paged) {
            (None, None) => self.config.midflight_publish_max_pages.unwrap_or(u32::MAX),
            _ => u32::MAX,
        };
        let publishable = |n: usize| ((n.saturating_sub(1) / ps as usize) as u32).min(cap);
        let now = publishable(self.requests[key].tokens.len());
        if now <= publishable(before) {
            return;
        }
        let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let Some(run) = state.running_mut() else {
            self.requests[key].state = state;
            return;
        };
        let retire = run.decode_state.take();
        let publication = self.requests[key].publication(run, now, ps);
        let checkpoint = publication
            .is_some()
            .then(|| run.family.states_mut().and_then(|s| s.take_checkpoint()))
            .flatten();
        self.requests[key].state = state;
        let Some(publication) = publication else {
            return;
        };
        // The reference publishes a decode's checkpoint only where its prefill-chunk rule
        // says so for the result's tokens (with pages of one token: every decode), and
        // frees it otherwise (C.2 in docs/notes/mamba-reference.md).
        let chunk_rule = self.config.policy.checkpoints_decodes_by_the_chunk_rule();
        let chunk_rule_frees = || {
            let (n, chunk) = (
                self.requests[key].tokens.len() as u32,
                self.config.mamba.map_or(1, |m| m.chunk),
            );
            kvtier_mamba::checkpoint_depth(before as u32, n - before as u32, ps, chunk).is_none()
        };
        let checkpoint = checkpoint.map(|(slot, at)| {
            let kept = !(chunk_rule && chunk_rule_frees());
            (slot, at.filter(|_| kept))
        });
        let retire = if chunk_rule { None } else { retire };
        self.queue_publication(key, publication, checkpoint, retire, true);
    }

    /// Paged models: a decoding (or retracted) request's group tables give back the
    /// pages its row reserved past the tokens it now has (after the publication above),
    /// as the reference rewinds them at each result; the next decode takes what it needs.
    pub(super) fn rewind_tables(&mut self, key: usize) {
        let r = &self.requests[key];
        let Some(tables) = r.state.tables() else {
            return;
        };
        let op = CacheOp::RewindTables {
            key: tables.key(),
            tokens: r.tokens.len() as u32,
        };
        self.outbox.push(op, Target::Ignore);
    }
}
