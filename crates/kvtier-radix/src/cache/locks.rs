//! Node locks: a lock count per tier raised on a node and all its ancestors, taken as a
//! `NodeLock` handle or a bare pin, and released at once or through the release channel.

use kvtier_types::Tier;

use super::RadixCore;
use crate::{NodeId, NodeLock};

impl RadixCore {
    /// Locks `tier` on `node` and every ancestor.
    pub fn lock(&mut self, node: NodeId, tier: Tier) -> NodeLock {
        self.pin(node, tier);
        NodeLock {
            node,
            tier,
            home: Some(self.lock_releases.releaser()),
        }
    }

    /// Raises the `tier` lock count of `node` and its ancestors (a lock without a handle;
    /// undone by `release_lock`).
    pub(super) fn pin(&mut self, node: NodeId, tier: Tier) {
        debug_assert!(self.is_live(node));
        let t = tier.index();
        let mut cur = node;
        while cur != self.root {
            let n = self.node_mut(cur);
            n.tiers[t].refs += 1;
            let (first, pages, parent) = (n.tiers[t].refs == 1, n.tiers[t].pages.len(), n.parent);
            if first {
                self.locked_pages[t] += pages as u64;
            }
            cur = parent.expect("non-root node has a parent");
        }
    }

    /// Releases a lock now.
    pub fn unlock(&mut self, mut lock: NodeLock) {
        lock.home = None;
        self.release_lock(lock.node, lock.tier);
    }

    /// Releases a lock on a request's published path. `transient`: a lock the
    /// reference never takes (reference policies), so a node it leaves unlocked keeps
    /// its place in the LRU order instead of being keyed again by its last access, as a
    /// release of one of the reference's own locks does.
    pub(crate) fn release_published(&mut self, mut lock: NodeLock, transient: bool) {
        lock.home = None;
        self.release(lock.node, lock.tier, !transient);
    }

    pub(super) fn release_lock(&mut self, node: NodeId, tier: Tier) {
        self.release(node, tier, true);
    }

    fn release(&mut self, node: NodeId, tier: Tier, rekey: bool) {
        if !self.is_live(node) {
            debug_assert!(false, "lock on a removed node {node:?}");
            return;
        }
        let t = tier.index();
        let mut cur = node;
        let mut emptied = Vec::new();
        while cur != self.root {
            let n = self.node_mut(cur);
            debug_assert!(n.tiers[t].refs > 0, "lock count underflow");
            n.tiers[t].refs = n.tiers[t].refs.saturating_sub(1);
            let (now_zero, pages, in_lru, parent) = (
                n.tiers[t].refs == 0,
                n.tiers[t].pages.len(),
                n.tiers[t].lru.is_some(),
                n.parent,
            );
            if now_zero {
                self.locked_pages[t] -= pages as u64;
                if tier == Tier::Device {
                    self.device_unpinned += 1;
                }
                if in_lru && rekey {
                    self.lru_insert(cur, tier);
                }
                if pages == 0 {
                    emptied.push(cur);
                }
            }
            cur = parent.expect("non-root node has a parent");
        }
        // A copy rolled back while locked leaves a hollow node; prune it once free.
        for id in emptied {
            if self.is_live(id) {
                self.prune_up(id);
            }
        }
    }
}
