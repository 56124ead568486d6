//! Residency of a tier on a node: attaching and detaching its pages (keeping the page
//! counters, LRU leaves and KV events in step) and pruning nodes left without resources.

use kvtier_types::{PageId, Tier};

use super::{RadixCore, TreeEvent};
use crate::NodeId;

impl RadixCore {
    pub(super) fn attach(&mut self, id: NodeId, tier: Tier, pages: Vec<PageId>, valid: bool) {
        let t = tier.index();
        let ps = self.page_size;
        let n = self.node_mut(id);
        debug_assert!(!n.tiers[t].present());
        debug_assert_eq!(pages.len() * ps, n.tokens.len());
        let (count, locked) = (pages.len() as u64, n.tiers[t].refs > 0);
        n.tiers[t].pages = pages;
        n.tiers[t].valid = valid;
        self.cached_pages[t] += count;
        if locked {
            self.locked_pages[t] += count;
        }
        self.update_leaves(id, tier);
    }

    /// Takes a node's pages on `tier` back into the pool and tells the family
    /// (`evicted`: for room, see [`TreeEvent::KvLeft`]).
    pub(super) fn detach(&mut self, id: NodeId, tier: Tier, evicted: bool) {
        let t = tier.index();
        self.lru_remove(id, tier);
        let n = self.node_mut(id);
        let pages = std::mem::take(&mut n.tiers[t].pages);
        n.tiers[t].valid = false;
        let locked = n.tiers[t].refs > 0;
        if let Some(sink) = self.events.as_mut() {
            let n = &self.nodes[id.idx as usize];
            sink.removed(&n.block_hashes, tier.into());
        }
        self.cached_pages[t] -= pages.len() as u64;
        if locked {
            self.locked_pages[t] -= pages.len() as u64;
        }
        self.pools[t].free_ids(&pages);
        self.remember_dropped(id);
        if let Some(parent) = self.node(id).parent {
            self.update_leaf(parent, tier);
        }
        self.tree_event(TreeEvent::KvLeft {
            node: id,
            tier,
            evicted,
        });
    }

    /// Removes resource-less, unlocked, childless nodes from `id` upwards; returns the
    /// first survivor.
    pub(super) fn prune_up(&mut self, mut id: NodeId) -> NodeId {
        let first = id;
        while id != self.root {
            let n = self.node(id);
            let removable = n.children.is_empty()
                && n.tiers
                    .iter()
                    .all(|r| !r.present() && r.refs == 0 && r.pending == 0);
            if !removable {
                break;
            }
            let parent = n.parent.expect("non-root node has a parent");
            // Its family's state goes before it does, so the family never names a
            // removed node.
            self.tree_event(TreeEvent::Removing(id));
            self.remove_child(parent, id);
            self.nodes.remove(id.idx as usize);
            self.gens[id.idx as usize] = self.gens[id.idx as usize].wrapping_add(1);
            id = parent;
        }
        // A survivor that lost no child keeps its LRU key under the reference policies:
        // the reference re-keys a leaf only when the leaf set changes around it, and an
        // insert that found its pages already there changes nothing (a touch alone does
        // not move a leaf).
        if id != first || !self.policy.keys_leaves_lazily() {
            for tier in Tier::ALL {
                self.update_leaf(id, tier);
            }
        }
        id
    }
}
