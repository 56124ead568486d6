//! Paths across tiers: what a root path holds or lacks on each tier, the pages it would
//! need, and the load-back that attaches fresh device pages to host-only nodes.

use kvtier_types::{Medium, PageId, Tier, TransferPair};

use super::RadixCore;
use crate::NodeId;

impl RadixCore {
    /// Device pages of the path root→`id` (every node on it must be on device).
    pub fn device_path_pages(&self, id: NodeId, out: &mut Vec<PageId>) {
        let start = out.len();
        let mut cur = id;
        while cur != self.root {
            let n = self.node(cur);
            debug_assert!(n.tiers[0].present(), "device path has a gap");
            out.extend(n.tiers[0].pages.iter().rev());
            cur = n.parent.expect("non-root");
        }
        out[start..].reverse();
    }

    /// Nodes from `from` towards the root lacking a readable copy on `tier`, stopping at
    /// the first that has one. Leaf→root order.
    pub fn nodes_without(&self, tier: Tier, from: NodeId) -> Vec<NodeId> {
        let t = tier.index();
        let mut out = Vec::new();
        let mut cur = from;
        while cur != self.root {
            let n = self.node(cur);
            if n.tiers[t].usable() {
                break;
            }
            out.push(cur);
            cur = n.parent.expect("non-root");
        }
        out
    }

    /// Pages a set of nodes would need on `tier` (nodes already holding a pending copy
    /// need none).
    pub fn pages_needed(&self, tier: Tier, nodes: &[NodeId]) -> u32 {
        let ps = self.page_size;
        nodes
            .iter()
            .filter(|&&n| !self.node(n).tiers[tier.index()].present())
            .map(|&n| self.node(n).pages(ps))
            .sum()
    }

    /// Attaches fresh device pages to host-only `nodes` for a load-back. Returns the
    /// (host page → device page) pairs, or `None` (nothing attached) if the pool is short.
    pub fn attach_for_load_back(&mut self, nodes: &[NodeId]) -> Option<Vec<TransferPair>> {
        self.drain_releases();
        let need = self.pages_needed(Tier::Device, nodes) as usize;
        let mut ids = self.pools[0].allocate_ids(need)?;
        let ps = self.page_size;
        let mut pairs = Vec::with_capacity(need);
        let mut attached = Vec::with_capacity(nodes.len());
        for &node in nodes {
            let n = self.node(node).pages(ps) as usize;
            let rest = ids.split_off(n);
            let mine = std::mem::replace(&mut ids, rest);
            let host = &self.node(node).tiers[1].pages;
            pairs.extend(
                host.iter()
                    .zip(&mine)
                    .map(|(&h, &d)| TransferPair::kv(h, d)),
            );
            self.attach(node, Tier::Device, mine, true);
            attached.push(node);
        }
        if let (true, Some(&deepest)) = (self.keep_page_hashes, nodes.first()) {
            self.ensure_page_hashes(deepest);
        }
        for &node in attached.iter().rev() {
            self.emit_stored(node, Medium::Device);
        }
        Some(pairs)
    }

    /// Takes back the device copies a failed load-back attached: every node whose device
    /// pages are among `pages` is left with its host copy only, and its device pages go
    /// back to the pool. Device copies below them go too (another load-back of the same
    /// plan may have extended the failed path): a device copy needs its parent's. The
    /// requests that read them must have let go first (their locks are drained here); a
    /// node still locked on device keeps its copy. Returns the pages freed.
    pub fn discard_load_back(&mut self, pages: &[PageId]) -> u32 {
        self.drain_releases();
        let failed: std::collections::BTreeSet<PageId> = pages.iter().copied().collect();
        let mut stack: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.tiers[0].pages.iter().any(|p| failed.contains(p)))
            .map(|(idx, _)| NodeId {
                idx: idx as u32,
                gen_: self.gens[idx],
            })
            .collect();
        let mut doomed = Vec::new();
        while let Some(id) = stack.pop() {
            let n = self.node(id);
            stack.extend(
                n.children
                    .iter()
                    .map(|&(_, child)| child)
                    .filter(|&child| self.node(child).tiers[0].present()),
            );
            doomed.push((n.end_page(self.page_size), id));
        }
        // Deepest first, so every detach leaves a node whose children hold no device copy.
        doomed.sort_unstable_by(|a, b| b.cmp(a));
        doomed.dedup();
        let mut freed = 0;
        for (_, id) in doomed {
            let n = self.node(id);
            debug_assert!(
                n.tiers[1].present(),
                "a loaded-back node without its host copy"
            );
            if n.tiers[0].refs > 0 {
                debug_assert!(false, "a failed load-back's node is still locked on device");
                continue;
            }
            let host_copy = n.tiers[1].present();
            freed += n.tiers[0].pages.len() as u32;
            self.detach(id, Tier::Device, true);
            if !host_copy {
                self.prune_up(id);
            }
        }
        freed
    }
}
