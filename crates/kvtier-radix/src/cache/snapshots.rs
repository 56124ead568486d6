//! The paged-cache family hosted on the tree (window and compressed-state models): the
//! radix cache owns the family's group pools and the snapshots on its nodes, tells it
//! when a node's device KV goes or a node is removed (a snapshot is reusable only with
//! the KV of its prefix), and splits nodes where its commits ask.
//!
//! A split keeps the node, and so its snapshot, on the suffix: a snapshot never moves
//! off its depth, and the family's commits never cut a snapshot node.

use kvtier_paged::{PagedFamily, RequestTables, SnapshotTree};
use kvtier_types::Tier;

use super::{CacheFamily, Hosted, RadixCore, TreeEvent, TreeStats};
use crate::{NodeId, Violation};

/// The snapshots' hooks: a snapshot is reusable only with the device KV of its prefix,
/// so it goes with that KV, whatever took it.
impl CacheFamily for PagedFamily<NodeId> {
    fn name(&self) -> &'static str {
        "paged"
    }

    fn on_tree_event(&mut self, _tree: &RadixCore, event: TreeEvent) {
        match event {
            TreeEvent::KvLeft {
                node,
                tier: Tier::Device,
                ..
            } => self.on_kv_evicted(node),
            TreeEvent::Removing(node) => self.on_node_removed(node),
            // A split keeps the node, and so its snapshot, on the suffix.
            TreeEvent::KvLeft { .. } | TreeEvent::Demoting(_) | TreeEvent::Split { .. } => {}
        }
    }

    fn report(&mut self, tree: &RadixCore, stats: &mut TreeStats) {
        let mut report = PagedFamily::report(self);
        report.live_tables = tree.tables.all().count();
        stats.groups = Some(Box::new(report));
    }

    /// Every snapshot sits on a live node with device KV, at its node's depth, a
    /// multiple of the alignment, and every group page is free, owned by one running
    /// request's table, or held by one snapshot.
    fn check_invariants(&mut self, tree: &RadixCore) -> Result<(), Violation> {
        PagedFamily::check_invariants(self, tree.tables.all())
            .map_err(|e| Violation::Snapshot(e.to_string()))?;
        let a = self.adjunct().alignment();
        for node in self.snapshot_nodes() {
            let problem = if !tree.is_live(node) {
                Some("on a removed node".to_owned())
            } else if !tree.node(node).tiers[0].present() {
                Some("on a node without device KV".to_owned())
            } else {
                let depth = tree.depth_pages(node) * tree.page_size as u32;
                let at = self.snapshot(node).map_or(0, |s| s.prefix_len);
                (at != depth || !depth.is_multiple_of(a))
                    .then(|| format!("at {at} tokens on a node {depth} deep (alignment {a})"))
            };
            if let Some(problem) = problem {
                return Err(Violation::Snapshot(format!("{node:?}: {problem}")));
            }
        }
        Ok(())
    }
}

impl SnapshotTree for RadixCore {
    fn for_each_tables(&self, f: &mut dyn FnMut(&RequestTables)) {
        self.tables.all().for_each(f);
    }

    fn split_at(&mut self, below: NodeId, depth: u32) -> Option<NodeId> {
        let ps = self.page_size as u32;
        if depth == 0 || !depth.is_multiple_of(ps) || !self.is_live(below) {
            return None;
        }
        let page = depth / ps;
        if page > self.depth_pages(below) {
            return None;
        }
        // The node whose label spans `page` on the path to `below`.
        let mut node = below;
        while let Some(parent) = self.node(node).parent {
            if self.depth_pages(parent) < page {
                break;
            }
            node = parent;
        }
        if self.depth_pages(node) == page {
            return Some(node);
        }
        let k = page - self.node(node).start_page;
        Some(self.split(node, k as usize))
    }
}

impl RadixCore {
    /// Whether the tree hosts a paged-cache family.
    pub fn has_snapshots(&self) -> bool {
        matches!(self.family, Hosted::Paged(_))
    }

    /// The paged-cache family, read-only.
    pub fn snapshots(&self) -> Option<&PagedFamily<NodeId>> {
        match &self.family {
            Hosted::Paged(family) => Some(family.as_ref()),
            _ => None,
        }
    }

    pub(super) fn snapshots_mut(&mut self) -> Option<&mut PagedFamily<NodeId>> {
        match &mut self.family {
            Hosted::Paged(family) => Some(family.as_mut()),
            _ => None,
        }
    }

    /// Runs `f` on the paged-cache family with the tree to read and split; `None`
    /// without a family.
    pub fn with_snapshots<R>(
        &mut self,
        f: impl FnOnce(&mut PagedFamily<NodeId>, &mut RadixCore) -> R,
    ) -> Option<R> {
        let mut family = match std::mem::replace(&mut self.family, Hosted::Dense) {
            Hosted::Paged(family) => family,
            other => {
                self.family = other;
                return None;
            }
        };
        let result = f(&mut family, self);
        self.family = Hosted::Paged(family);
        Some(result)
    }
}
