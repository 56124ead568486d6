//! What the tree tells the family: KV evicted or demoted, a node removed.

use std::fmt::Debug;

use super::*;

impl<N: Copy + Ord + Debug> MambaFamily<N> {
    /// The node's device KV was evicted: its device state goes with it.
    pub fn on_device_evicted<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.dropped_with_kv += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// The node's device KV is being demoted (its host copy stays): a device state that
    /// also has a host copy goes; one without stays (it is the only copy).
    pub fn on_device_demoted<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        let both = self
            .attached
            .get(&node)
            .is_some_and(|a| a.device.is_some() && a.host.is_some());
        if both && let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.device_demoted += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// The node's host KV was evicted: its host state, and a host slot a write-back
    /// reserved for it, go.
    pub fn on_host_evicted(&mut self, node: N) {
        if let Some(copy) = self.pending.remove(&node) {
            self.host.release(copy.host);
        }
        if let Some(slot) = self.take_host(node) {
            self.host.release(slot);
            self.stats.host_dropped_with_kv += 1;
        }
        self.to_demote.remove(&node);
    }

    /// The node is about to be removed from the tree: everything attached to it goes
    /// first, so no set names a node that no longer exists (#357).
    pub fn on_node_removed<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        self.leaves.remove(&node);
        if let Some(old) = self.retiring.remove(&node) {
            self.device.release(old);
        }
        if let Some(slot) = self.take_device(node) {
            self.device.release(slot);
            self.update_leaf(tree, tree.parent(node));
        }
        self.on_host_evicted(node);
    }
}
