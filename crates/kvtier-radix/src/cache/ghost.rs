//! Pages the cache dropped: the block hashes of the most recent pages evicted from
//! their last tier, so that a prompt's miss can be told apart — evicted (a lost hit)
//! or never cached (not one). Kept only with `CacheConfig::lost_hits`.

use std::collections::{HashSet, VecDeque};

use kvtier_types::Token;
use kvtier_types::hash::block_hash;

use super::RadixCore;
use crate::NodeId;

/// The block hashes of dropped pages, the most recent `capacity` of them.
#[derive(Debug)]
pub(crate) struct Ghost {
    /// Membership only; never iterated, so its order reaches no decision.
    set: HashSet<u64>,
    order: VecDeque<u64>,
    capacity: usize,
}

impl Ghost {
    pub fn new(capacity: usize) -> Self {
        Self {
            set: HashSet::new(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    fn remember(&mut self, hash: u64) {
        if !self.set.insert(hash) {
            return;
        }
        self.order.push_back(hash);
        if self.order.len() > self.capacity
            && let Some(oldest) = self.order.pop_front()
        {
            self.set.remove(&oldest);
        }
        debug_assert_eq!(self.set.len(), self.order.len());
    }
}

impl RadixCore {
    /// `id` left its last tier: its pages join the ghost.
    pub(super) fn remember_dropped(&mut self, id: NodeId) {
        if self.ghost.is_none() || self.node(id).tiers.iter().any(|t| t.present()) {
            return;
        }
        self.ensure_block_hashes(id);
        let hashes = std::mem::take(&mut self.nodes[id.idx as usize].block_hashes);
        if let Some(ghost) = self.ghost.as_mut() {
            for &h in &hashes {
                ghost.remember(h);
            }
        }
        self.nodes[id.idx as usize].block_hashes = hashes;
    }

    /// An admitted first chunk's lost hits past its `begin_pages` (with a ghost): the
    /// pages the tree holds past its reuse (a hybrid model's cap, host pages not loaded
    /// back), then the pages in a row that the cache dropped.
    pub(crate) fn lost_hits(&mut self, tokens: &[Token], begin_pages: u32) -> Option<(u32, u32)> {
        self.ghost.as_ref()?;
        let probe = self.probe(tokens);
        let capped = probe
            .device_pages
            .max(probe.host_pages)
            .saturating_sub(begin_pages);
        Some((
            capped,
            self.dropped_pages_after(tokens, begin_pages + capped),
        ))
    }

    /// Of `tokens`' full pages after the first `hit_pages`, how many in a row the cache
    /// held once and dropped (0 without a ghost).
    pub fn dropped_pages_after(&self, tokens: &[Token], hit_pages: u32) -> u32 {
        let Some(ghost) = self.ghost.as_ref().filter(|g| !g.set.is_empty()) else {
            return 0;
        };
        let mut parent = None;
        let mut dropped = 0;
        for (i, page) in tokens.chunks_exact(self.page_size).enumerate() {
            let h = block_hash(parent, page);
            parent = Some(h);
            if i < hit_pages as usize {
                continue;
            }
            if !ghost.set.contains(&h) {
                break;
            }
            dropped += 1;
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ghost_keeps_the_most_recent_hashes() {
        let mut ghost = Ghost::new(2);
        for h in [1, 2, 2, 3] {
            ghost.remember(h);
        }
        assert!(!ghost.set.contains(&1), "the oldest went");
        assert!(ghost.set.contains(&2) && ghost.set.contains(&3));
    }
}
