//! What the tree tells the family (KV evicted, a node removed), and pruning under
//! pressure.

use std::fmt::Debug;

use super::*;

impl<N: Copy + Ord + Debug> PagedFamily<N> {
    /// The node's device KV was evicted: its snapshot goes with it.
    pub fn on_kv_evicted(&mut self, node: N) {
        if self.detach(node) {
            self.stats.dropped_kv_evict += 1;
        }
    }

    /// The node was removed from the tree.
    pub fn on_node_removed(&mut self, node: N) {
        if self.detach(node) {
            self.stats.dropped_node_destroy += 1;
        }
    }

    /// Whether a running request may read the snapshot on `node`: a device lock on it
    /// (or, as the reference tests, on any ancestor).
    pub(super) fn pinned<T: SnapshotTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        if !self.pin_by_path {
            return tree.device_refs(node) > 0;
        }
        let mut cur = Some(node);
        while let Some(n) = cur {
            if n == tree.root() {
                return false;
            }
            if tree.device_refs(n) > 0 {
                return true;
            }
            cur = tree.parent(n);
        }
        false
    }

    /// Frees snapshot pages for an admission: oldest snapshot first (deeper first on a
    /// tie), never one a running request pins. State-starved: strip the state groups
    /// of one snapshot that has any. History-starved: drop one snapshot whole, with
    /// every unpinned snapshot below it.
    pub fn prune<T: SnapshotTree<Node = N>>(&mut self, tree: &T, kind: Starved) -> bool {
        self.prune_sparing(tree, kind, None)
    }

    /// [`Self::prune`], never touching the path to `spare`.
    pub(super) fn prune_sparing<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        kind: Starved,
        spare: Option<N>,
    ) -> bool {
        // The hit's path is spared; but a state prune may strip an ancestor whose
        // depth lies a whole window below the hit's: the hit reads no state page of it.
        let window = self.adjunct.max_continuation_window();
        let spared = |n: N| {
            spare.is_some_and(|s| {
                let on_path = s == n || Self::descends_from(tree, s, n);
                let below_window = tree.depth(n) + window <= tree.depth(s);
                on_path && (kind == Starved::History || !below_window)
            })
        };
        let mut candidates: Vec<(PruneOrder, N)> = self
            .snapshots
            .keys()
            .map(|&n| {
                let (time, seq) = tree.age(n);
                ((time, std::cmp::Reverse(tree.depth(n)), seq), n)
            })
            .collect();
        candidates.sort();
        let unpinned = candidates
            .iter()
            .map(|&(_, n)| n)
            .filter(|&n| !self.pinned(tree, n) && !spared(n));
        match kind {
            Starved::State => {
                let victim = unpinned.into_iter().find(|n| {
                    let c = self.adjunct.completeness(&self.snapshots[n]);
                    c.state || c.continuation
                });
                let Some(victim) = victim else {
                    return false;
                };
                self.detach_state(victim);
                self.stats.prune_state_only += 1;
                true
            }
            Starved::History => {
                let Some(victim) = unpinned.into_iter().next() else {
                    return false;
                };
                self.detach(victim);
                self.stats.prune_full += 1;
                let below: Vec<N> = self
                    .snapshots
                    .keys()
                    .copied()
                    .filter(|&n| {
                        Self::descends_from(tree, n, victim) && !self.pinned(tree, n) && !spared(n)
                    })
                    .collect();
                for n in below {
                    self.detach(n);
                    self.stats.prune_cascade += 1;
                }
                true
            }
        }
    }

    fn descends_from<T: SnapshotTree<Node = N>>(tree: &T, node: N, ancestor: N) -> bool {
        let mut cur = tree.parent(node);
        while let Some(n) = cur {
            if n == ancestor {
                return true;
            }
            cur = tree.parent(n);
        }
        false
    }
}
