//! What a cache family reads of the prefix tree that hosts it: the queries every family
//! shares. A family's own trait adds what only it asks (`kvtier_mamba::StateTree`,
//! `kvtier_paged::SnapshotTree`).

use std::fmt::Debug;

/// The prefix tree as a hosted cache family reads it.
pub trait TreeView {
    /// A node's identity (stable while the node lives; a split keeps it on the suffix).
    type Node: Copy + Ord + Debug;

    /// The root (depth 0; holds no family state).
    fn root(&self) -> Self::Node;
    /// A node's parent (`None` for the root).
    fn parent(&self, node: Self::Node) -> Option<Self::Node>;
    /// A node's depth in tokens (its label's end).
    fn depth(&self, node: Self::Node) -> u32;
    /// The node's LRU order: last access time, then creation order.
    fn age(&self, node: Self::Node) -> (u64, u64);
    /// Device locks on the node (0 when its KV is not on device).
    fn device_refs(&self, node: Self::Node) -> u32;

    /// Whether someone holds a device lock on the node.
    fn device_locked(&self, node: Self::Node) -> bool {
        self.device_refs(node) > 0
    }
}
