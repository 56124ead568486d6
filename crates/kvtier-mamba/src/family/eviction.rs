//! State leaves and their eviction by `(time, seq)`.

use std::collections::BTreeSet;
use std::fmt::Debug;

use super::*;
use crate::SlotId;

impl<N: Copy + Ord + Debug> MambaFamily<N> {
    /// Whether `node` holds a device state and no direct child does (the reference's
    /// leaf rule; the default policy asks about every descendant instead).
    fn is_direct_leaf<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        node != tree.root()
            && self.device_slot(node).is_some()
            && tree.children(node).all(|c| self.device_slot(c).is_none())
    }

    /// Reference tracking: a node that became a leaf is tracked, and its parent, no
    /// longer a leaf, is not (the parent is never added here).
    pub(super) fn track<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if node == tree.root() {
            return;
        }
        if self.is_direct_leaf(tree, node) {
            self.leaves.insert(node);
        }
        if let Some(p) = tree.parent(node)
            && p != tree.root()
            && !self.is_direct_leaf(tree, p)
        {
            self.leaves.remove(&p);
        }
    }

    pub(super) fn update_leaf<T: StateTree<Node = N>>(&mut self, tree: &T, node: Option<N>) {
        let Some(node) = node.filter(|&n| n != tree.root()) else {
            return;
        };
        if self.is_direct_leaf(tree, node) {
            self.leaves.insert(node);
        } else {
            self.leaves.remove(&node);
        }
    }

    /// Nodes whose device state may be evicted now, with their LRU keys, in no order:
    /// leaves (reference: as tracked; default: no device state anywhere below), neither
    /// `protected` nor locked on device.
    pub(super) fn candidates<T: StateTree<Node = N>>(
        &self,
        tree: &T,
        protected: Option<N>,
    ) -> Vec<Aged<N>> {
        let leaves: Vec<N> = if self.config.policy.tracks_state_leaves_incrementally() {
            self.leaves.iter().copied().collect()
        } else {
            // Mark every node above a device state (a chain stops where an earlier one
            // marked); the unmarked device states are the leaves.
            let mut above = vec![false; tree.index_bound()];
            let devices = self.attached.iter().filter(|(_, a)| a.device.is_some());
            for (&node, _) in devices.clone() {
                let mut cur = tree.parent(node);
                while let Some(p) = cur {
                    let seen = &mut above[tree.index(p)];
                    if *seen {
                        break;
                    }
                    *seen = true;
                    cur = tree.parent(p);
                }
            }
            devices
                .filter(|(n, _)| !above[tree.index(**n)])
                .map(|(&n, _)| n)
                .collect()
        };
        leaves
            .into_iter()
            .filter(|&n| Some(n) != protected && !self.pinned_on_device(tree, n))
            .map(|n| (tree.age(n), n))
            .collect()
    }

    /// Whether a state cannot be evicted now. The reference keeps every state whose KV is
    /// locked on device (a running request's whole path: its states fill the pool and
    /// starve admissions); kvtier keeps only those a row of this plan copies from and
    /// those a write-back is reading.
    pub(super) fn pinned_on_device<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        if self.config.policy.pins_every_state_on_a_locked_path() {
            return tree.on_device(node) && tree.device_locked(node);
        }
        self.protected.contains(&node) || self.pending.contains_key(&node)
    }

    /// A new plan: the last plan's copies have been made.
    pub fn begin_plan(&mut self) {
        self.protected.clear();
    }

    /// A row of this plan copies `node`'s state: it stays until the next plan.
    pub fn protect(&mut self, node: N) {
        self.protected.insert(node);
    }

    /// Evicts up to `n` device states, least recently used leaves first (the KV stays: a
    /// prefix then caps at a shallower state). Returns how many went.
    pub fn evict<T: StateTree<Node = N>>(&mut self, tree: &T, n: u32, protected: Option<N>) -> u32 {
        let cands = self.candidates(tree, protected);
        self.evict_from(tree, n, protected, cands)
    }

    /// [`Self::evict`] from these candidates (`Self::candidates`, oldest first).
    fn evict_from<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        n: u32,
        protected: Option<N>,
        mut cands: Vec<Aged<N>>,
    ) -> u32 {
        let mut evicted = 0;
        while evicted < n {
            // The oldest by `(time, seq)`, then node id: a total order, never an address.
            let Some(oldest) = (0..cands.len()).min_by_key(|&i| cands[i]) else {
                break;
            };
            let (_, leaf) = cands.swap_remove(oldest);
            if let Some(slot) = self.take_device(leaf) {
                self.device.release(slot);
                evicted += 1;
                self.stats.device_evicted += 1;
            }
            self.leaves.remove(&leaf);
            let Some(parent) = tree.parent(leaf).filter(|&p| p != tree.root()) else {
                continue;
            };
            if evicted == n && !self.config.policy.tracks_state_leaves_incrementally() {
                // Enough: whether the parent is a leaf now is for the next eviction to find.
                break;
            }
            let parent_is_leaf = if self.config.policy.tracks_state_leaves_incrementally() {
                self.is_direct_leaf(tree, parent)
            } else {
                self.device_slot(parent).is_some()
                    && self
                        .candidates(tree, protected)
                        .iter()
                        .any(|&(_, c)| c == parent)
            };
            if parent_is_leaf {
                self.leaves.insert(parent);
                if Some(parent) != protected && !self.pinned_on_device(tree, parent) {
                    cands.push((tree.age(parent), parent));
                }
            }
        }
        evicted
    }

    /// Makes `need` device slots free, evicting states if it must (never `protected`).
    /// The default policy evicts nothing when that cannot succeed; the reference evicts
    /// what it can either way.
    pub fn ensure_device<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        need: u32,
        protected: Option<N>,
    ) -> bool {
        let free = self.device.available();
        if free >= need {
            return true;
        }
        let cands = self.candidates(tree, protected);
        // Transactional (default policy): evict only what can succeed. The leaves alone
        // often suffice; else count what a cascade of evictions could reach.
        let leaves = cands.len() as u32;
        if !self.config.policy.evicts_without_a_fit()
            && free + leaves < need
            && free + self.evictable(tree, protected) < need
        {
            return false;
        }
        self.evict_from(tree, need - free, protected, cands);
        self.device.available() >= need
    }

    /// Whether `need` device slots could be made free (nothing changes).
    pub fn could_free<T: StateTree<Node = N>>(&mut self, tree: &T, need: u32) -> bool {
        let free = self.device.available();
        free >= need || free + self.evictable(tree, None) >= need
    }

    /// Device states a cascade of leaf evictions could reach (default policy).
    fn evictable<T: StateTree<Node = N>>(&self, tree: &T, protected: Option<N>) -> u32 {
        // A pinned state keeps every state above it from becoming a leaf.
        let mut blocked = BTreeSet::new();
        for (&node, a) in &self.attached {
            if a.device.is_some() && (Some(node) == protected || self.pinned_on_device(tree, node))
            {
                let mut cur = Some(node);
                while let Some(n) = cur {
                    if !blocked.insert(n) {
                        break;
                    }
                    cur = tree.parent(n);
                }
            }
        }
        self.attached
            .iter()
            .filter(|(n, a)| a.device.is_some() && !blocked.contains(*n))
            .count() as u32
    }

    pub(super) fn take_device(&mut self, node: N) -> Option<SlotId> {
        let a = self.attached.get_mut(&node)?;
        let slot = a.device.take();
        a.device_off = None;
        if a.device.is_none() && a.host.is_none() {
            self.attached.remove(&node);
        }
        slot
    }

    pub(super) fn take_host(&mut self, node: N) -> Option<SlotId> {
        let a = self.attached.get_mut(&node)?;
        let slot = a.host.take();
        a.host_off = None;
        if a.device.is_none() && a.host.is_none() {
            self.attached.remove(&node);
        }
        slot
    }
}
