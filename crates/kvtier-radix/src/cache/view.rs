//! The tree as the cache families it hosts read it: the queries every family shares
//! ([`TreeView`]); each family's own are beside its hosting (`states.rs`, `snapshots.rs`).

use kvtier_types::TreeView;

use super::RadixCore;
use crate::NodeId;

impl TreeView for RadixCore {
    type Node = NodeId;

    fn root(&self) -> NodeId {
        self.root
    }

    fn parent(&self, node: NodeId) -> Option<NodeId> {
        self.node(node).parent
    }

    fn depth(&self, node: NodeId) -> u32 {
        self.node(node).end_page(self.page_size) * self.page_size as u32
    }

    fn age(&self, node: NodeId) -> (u64, u64) {
        let n = self.node(node);
        (n.last_access, n.seq)
    }

    fn device_refs(&self, node: NodeId) -> u32 {
        let d = &self.node(node).tiers[0];
        if d.present() { d.refs } else { 0 }
    }
}
