//! Hashes along a path: FNV-1a block hashes for KV events, SHA-256 rolling page hashes
//! for L3 keys, both derived from the tokens; and the emission and draining of KV events.

use kvtier_types::{KvEvent, Medium, hash::PageHash, hash::block_hash};

use super::RadixCore;
use crate::NodeId;

impl RadixCore {
    /// Path from the root's child down to `id`.
    fn path(&self, id: NodeId) -> Vec<NodeId> {
        let mut path = Vec::new();
        let mut cur = id;
        while cur != self.root {
            path.push(cur);
            cur = self.node(cur).parent.expect("non-root node has a parent");
        }
        path.reverse();
        path
    }

    fn last_block_hash(&self, id: NodeId) -> Option<u64> {
        if id == self.root {
            None
        } else {
            self.node(id).block_hashes.last().copied()
        }
    }

    /// Computes missing block hashes root→`id`.
    pub(super) fn ensure_block_hashes(&mut self, id: NodeId) {
        let ps = self.page_size;
        for node in self.path(id) {
            let n = self.node(node);
            if n.block_hashes.len() == n.pages(ps) as usize {
                continue;
            }
            let mut parent = self.last_block_hash(n.parent.expect("non-root"));
            let hashes: Vec<u64> = n
                .tokens
                .chunks_exact(ps)
                .map(|page| {
                    let h = block_hash(parent, page);
                    parent = Some(h);
                    h
                })
                .collect();
            self.node_mut(node).block_hashes = hashes;
        }
    }

    /// Computes missing SHA-256 page hashes root→`id`, always from the tokens and the
    /// chain above, never from a caller's list.
    pub(super) fn ensure_page_hashes(&mut self, id: NodeId) {
        let ps = self.page_size;
        for node in self.path(id) {
            let n = self.node(node);
            if n.page_hashes.len() == n.pages(ps) as usize {
                continue;
            }
            let parent = n.parent.expect("non-root");
            let prior = if parent == self.root {
                None
            } else {
                self.node(parent).page_hashes.last().copied()
            };
            let hashes = kvtier_types::hash::rolling_page_hashes(prior.as_ref(), &n.tokens, ps);
            self.node_mut(node).page_hashes = hashes;
        }
    }

    /// Rolling page hashes of the path root→`id` (empty unless page hashes are kept).
    pub fn path_page_hashes(&self, id: NodeId) -> Vec<PageHash> {
        self.path(id)
            .into_iter()
            .flat_map(|n| self.node(n).page_hashes.iter().copied())
            .collect()
    }

    /// Publishes `id`'s pages as stored on `medium` (those not published there yet).
    pub(super) fn emit_stored(&mut self, id: NodeId, medium: Medium) {
        if self.events.is_none() {
            return;
        }
        self.ensure_block_hashes(id);
        let ps = self.page_size;
        let n = &self.nodes[id.idx as usize];
        let mut parent = self.last_block_hash(n.parent.expect("non-root"));
        if let Some(sink) = self.events.as_mut() {
            for (page, &h) in n.tokens.chunks_exact(ps).zip(&n.block_hashes) {
                sink.stored(h, parent, page, ps as u32, medium);
                parent = Some(h);
            }
        }
    }

    /// Publishes, root first, the pages of `end`'s path whose rolling page hashes are
    /// among `backed_up` as stored in L3.
    pub(crate) fn emit_backed_up(&mut self, end: NodeId, backed_up: &[PageHash]) {
        if self.events.is_none() || !self.is_live(end) {
            return;
        }
        let wanted: std::collections::HashSet<&PageHash> = backed_up.iter().collect();
        self.ensure_block_hashes(end);
        let ps = self.page_size;
        let mut parent = None;
        for node in self.path(end) {
            let n = &self.nodes[node.idx as usize];
            let pages = n.tokens.chunks_exact(ps).zip(&n.block_hashes);
            for (i, (page, &h)) in pages.enumerate() {
                let stored = n.page_hashes.get(i).is_some_and(|p| wanted.contains(p));
                if let (true, Some(sink)) = (stored, self.events.as_mut()) {
                    sink.stored(h, parent, page, ps as u32, Medium::Storage);
                }
                parent = Some(h);
            }
        }
    }

    /// Takes the buffered KV events.
    pub fn drain_events(&mut self) -> Vec<KvEvent> {
        self.events
            .as_mut()
            .map(|s| std::mem::take(&mut s.buffer))
            .unwrap_or_default()
    }
}
