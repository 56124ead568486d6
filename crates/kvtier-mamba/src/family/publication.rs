//! States published on nodes, retired, discarded and allocated.

use std::fmt::Debug;

use super::*;
use crate::{Slot, SlotId};

impl<N: Copy + Ord + Debug> MambaFamily<N> {
    /// Attaches `slot` to `node` as the state after its prefix. A node that already
    /// has a device state keeps it and the new slot is freed: both hold the same state,
    /// and the old one may be what a row of this plan copies or a write-back reads.
    /// The reference replaces it and frees the old slot at once (C.10 in
    /// docs/notes/mamba-reference.md); under its policy kvtier replaces it too where no
    /// row of this plan copies the old slot, so later slot ids stay the reference's,
    /// but one a write-back in flight reads is freed only at its acknowledgement.
    /// Returns whether it was attached.
    pub fn publish<T: StateTree<Node = N>>(&mut self, tree: &T, node: N, slot: Slot) -> bool {
        let held = self.device_slot(node).is_some();
        if held
            && self.config.policy.replaces_a_node_state_at_once()
            && !self.protected.contains(&node)
        {
            let id = self.device.adopt(slot);
            let a = self.attached.entry(node).or_default();
            a.device_off = None;
            // A host copy of a state off the node's depth goes with it.
            let stale_host = a.host_off.take().and_then(|_| a.host.take());
            if let Some(old) = a.device.replace(id) {
                if self.pending.get(&node).is_some_and(|p| p.reads == old) {
                    let earlier = self.retiring.insert(node, old);
                    debug_assert!(earlier.is_none(), "a copy reads one slot");
                } else {
                    self.device.release(old);
                }
            }
            if let Some(host) = stale_host {
                self.host.release(host);
            }
            self.track(tree, node);
            self.stats.replaced += 1;
            return true;
        }
        if node == tree.root() || held {
            self.device.free(slot);
            self.stats.discarded += 1;
            return false;
        }
        debug_assert!(
            tree.depth(node).is_multiple_of(self.config.page_size),
            "a state off a page boundary"
        );
        let id = self.device.adopt(slot);
        self.attached.entry(node).or_default().device = Some(id);
        self.track(tree, node);
        self.stats.published += 1;
        true
    }

    /// Caches a stopped request's `slot` on `node` although it holds the state after
    /// `at` tokens (`None`: never written), not after the node's own (the reference
    /// policies only: the reference caches it there, C.3). A node that holds a device
    /// state already, or a write-back in flight, keeps it and the slot is freed; a host
    /// state alone does not stop it, as the reference looks at the device state only.
    /// Returns whether it was attached.
    pub fn publish_off_depth<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        node: N,
        slot: Slot,
        at: Option<u32>,
    ) -> bool {
        debug_assert!(
            self.config.policy.is_reference(),
            "states off their depth are the reference's"
        );
        let occupied = self.device_slot(node).is_some();
        if node == tree.root() || occupied || self.pending.contains_key(&node) {
            self.device.free(slot);
            self.stats.discarded += 1;
            return false;
        }
        let id = self.device.adopt(slot);
        let a = self.attached.entry(node).or_default();
        a.device = Some(id);
        a.device_off = Some(at.unwrap_or(UNWRITTEN));
        self.track(tree, node);
        self.stats.published += 1;
        true
    }

    /// Drops `node`'s device state because a deeper one on the same request's path
    /// supersedes it — unless a row of this plan or a write-back still reads it. A host
    /// copy stays.
    pub fn retire<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if self.pinned_on_device(tree, node) {
            return;
        }
        if let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.retired += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// A load-back into these device slots failed: the nodes they are attached to lose
    /// those device states (their host copies stay).
    pub fn discard_slots<T: StateTree<Node = N>>(&mut self, tree: &T, slots: &[SlotId]) {
        let nodes: Vec<N> = self
            .attached
            .iter()
            .filter(|(_, a)| a.device.is_some_and(|s| slots.contains(&s)))
            .map(|(&n, _)| n)
            .collect();
        for node in nodes {
            if let Some(slot) = self.take_device(node) {
                self.leaves.remove(&node);
                self.device.release(slot);
                self.update_leaf(tree, tree.parent(node));
            }
        }
    }

    /// Frees a request's slot that holds nothing worth caching.
    pub fn discard(&mut self, slot: Slot) {
        self.device.free(slot);
        self.stats.discarded += 1;
    }

    /// A retracted request's slot that the reference caches at the root (C.9 in
    /// docs/notes/mamba-reference.md; reference policies only): the first is held for
    /// good, as the reference holds it (nothing finds, evicts or frees a state at the
    /// root, so its pool is one slot smaller from then on); later ones are freed, as the
    /// reference frees a slot it finds the node holding a state for. A pool that would
    /// be left without room for a request's pair frees it too: there the reference
    /// stalls for good, and kvtier does not follow it. Returns whether it was held.
    pub fn hold_at_root(&mut self, slot: Slot) -> bool {
        debug_assert!(
            self.config.policy.is_reference(),
            "a state at the root is the reference's"
        );
        if self.at_root.is_some() || self.config.device_slots <= REQUEST_SLOTS {
            self.discard(slot);
            return false;
        }
        self.at_root = Some(self.device.adopt(slot));
        true
    }

    /// A fresh device slot for a request (its working or checkpoint slot), if one is
    /// free. Admission made room beforehand.
    pub fn allocate(&mut self) -> Option<Slot> {
        self.device.allocate()
    }
}
