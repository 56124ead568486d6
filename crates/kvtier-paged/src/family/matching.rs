//! The windowed match cap: how deep a match may go, up to the deepest snapshot its groups
//! can resume from.

use std::fmt::Debug;

use super::*;
use crate::{PagedHit, Snapshot, cap_match};

impl<N: Copy + Ord + Debug> PagedFamily<N> {
    fn path<T: SnapshotTree<Node = N>>(tree: &T, node: N) -> Vec<N> {
        let mut path = Vec::new();
        let mut cur = Some(node);
        while let Some(n) = cur {
            if n == tree.root() {
                break;
            }
            path.push(n);
            cur = tree.parent(n);
        }
        path.reverse();
        path
    }

    /// The capped hit on the path to `deepest` (the deepest *token-matched* node of
    /// one tier), with the node the hit ends at (the root for none).
    pub fn cap_match<T: SnapshotTree<Node = N>>(&self, tree: &T, deepest: N) -> (PagedHit, N) {
        let path = Self::path(tree, deepest);
        let nodes: Vec<N> = path
            .iter()
            .copied()
            .filter(|n| self.snapshots.contains_key(n))
            .collect();
        let chain: Vec<&Snapshot> = nodes.iter().map(|n| &self.snapshots[n]).collect();
        let hit = cap_match(&self.adjunct, &chain);
        let node = match hit.snapshots {
            0 => tree.root(),
            k => nodes[k - 1],
        };
        (hit, node)
    }
}
