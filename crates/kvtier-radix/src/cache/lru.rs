//! The per-tier LRU order of leaves: touching a node on a committed match, and keeping
//! each tier's LRU set equal to its leaves as copies come and go.
//!
//! kvtier keys a leaf by the logical time it was last used *or* became a leaf, and a
//! touch re-keys it at once (exact LRU). Under `Policy::Reference` a leaf is keyed by
//! its node's last access when it becomes a leaf or is unlocked, and a touch alone does
//! not move it (the reference's order: spec/cache-core.md §5.2).

use kvtier_types::Tier;

use super::RadixCore;
use crate::NodeId;

impl RadixCore {
    pub(super) fn touch(&mut self, id: NodeId) {
        let clock = self.clock;
        self.node_mut(id).last_access = clock;
        if self.policy.keys_leaves_lazily() {
            return;
        }
        for tier in Tier::ALL {
            if self.node(id).tiers[tier.index()].lru.is_some() {
                self.lru_insert(id, tier);
            }
        }
    }

    pub(super) fn lru_insert(&mut self, id: NodeId, tier: Tier) {
        let t = tier.index();
        let n = self.node(id);
        let time = if self.policy.keys_leaves_lazily() {
            n.last_access
        } else {
            self.clock
        };
        let key = (time, n.seq, id);
        if let Some(old) = self.node_mut(id).tiers[t].lru.replace(key) {
            self.lru[t].remove(&old);
        }
        self.lru[t].insert(key);
    }

    pub(super) fn lru_remove(&mut self, id: NodeId, tier: Tier) {
        let t = tier.index();
        if let Some(old) = self.node_mut(id).tiers[t].lru.take() {
            self.lru[t].remove(&old);
        }
    }

    pub(super) fn is_leaf(&self, id: NodeId, tier: Tier) -> bool {
        let t = tier.index();
        let n = self.node(id);
        id != self.root
            && n.tiers[t].present()
            && !n
                .children
                .iter()
                .any(|&(_, c)| self.node(c).tiers[t].present())
    }

    pub(super) fn update_leaf(&mut self, id: NodeId, tier: Tier) {
        if id == self.root {
            return;
        }
        if self.is_leaf(id, tier) {
            self.lru_insert(id, tier);
        } else {
            self.lru_remove(id, tier);
        }
    }

    pub(super) fn update_leaves(&mut self, id: NodeId, tier: Tier) {
        self.update_leaf(id, tier);
        if let Some(parent) = self.node(id).parent {
            self.update_leaf(parent, tier);
        }
    }
}
