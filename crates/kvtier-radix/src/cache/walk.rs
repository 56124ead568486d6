//! Prefix walks: the read-only probe, the committing match behind `match_prefix` and
//! `insert`, and the node split a match ending inside a label needs.

use kvtier_types::{Token, hash::PageHash};

use super::{RadixCore, TreeEvent};
use crate::NodeId;
use crate::node::TierRes;

/// Result of a read-only probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Probe {
    /// Leading pages resident on device.
    pub device_pages: u32,
    /// Leading pages readable on host.
    pub host_pages: u32,
    /// Of the device-matched pages, those not locked by anyone (they would stop being
    /// evictable once the match is locked).
    pub device_unlocked_pages: u32,
}

/// Result of a committed match: the deepest node of each tier's resident prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// Deepest node whose whole root path is on device (root when none).
    pub device: NodeId,
    /// Pages of that path.
    pub device_pages: u32,
    /// Deepest node whose whole root path is readable on host (root when none).
    pub host: NodeId,
    /// Pages of that path.
    pub host_pages: u32,
}

impl RadixCore {
    /// Read-only prefix match of whole pages: no split, no LRU touch.
    pub fn probe(&self, tokens: &[Token]) -> Probe {
        self.probe_resumed(tokens, None).0
    }

    /// [`Self::probe`], resumed where an earlier probe of the same tokens got to:
    /// `mark` is the deepest node whose whole label they matched then (labels never
    /// change and a split keeps a node's end, so while it lives its path is still theirs
    /// and is read from the nodes; only what lies below it is matched token by token).
    /// Returns the probe and the mark to resume from next time. A waiting request's
    /// prompt is probed every step: at a production trace's queue lengths, matching
    /// every prompt from the root was a quarter of the replay.
    pub(crate) fn probe_resumed(&self, tokens: &[Token], mark: Option<NodeId>) -> (Probe, NodeId) {
        let ps = self.page_size;
        let whole = (tokens.len() / ps) as u32;
        let mut start = mark.filter(|&m| self.is_live(m)).unwrap_or(self.root);
        while start != self.root && self.depth_pages(start) > whole {
            start = self.node(start).parent.expect("non-root");
        }
        let mut probe = self.probe_path(start);
        let depth = self.depth_pages(start);
        let (mut dev_alive, mut host_alive) =
            (probe.device_pages == depth, probe.host_pages == depth);
        let mut node = start;
        let mut pos = depth as usize * ps;
        while pos + ps <= tokens.len() && (dev_alive || host_alive) {
            let Some(child) = self.find_child(node, &tokens[pos..pos + ps]) else {
                break;
            };
            let c = self.node(child);
            let matched = self.common_pages(&c.tokens, &tokens[pos..]) as u32;
            if dev_alive && c.tiers[0].present() {
                probe.device_pages += matched;
                if c.tiers[0].refs == 0 {
                    probe.device_unlocked_pages += matched;
                }
            } else {
                dev_alive = false;
            }
            if host_alive && c.tiers[1].usable() {
                probe.host_pages += matched;
            } else {
                host_alive = false;
            }
            if (matched as usize) < c.pages(ps) as usize {
                break;
            }
            pos += matched as usize * ps;
            node = child;
        }
        debug_assert!(
            mark.is_none() || probe == self.probe_resumed(tokens, None).0,
            "a resumed probe is the probe"
        );
        (probe, node)
    }

    /// [`Self::probe`] of the tokens whose path ends exactly at `end` (a node locked for
    /// them, so it cannot have gone), read from the nodes alone: no token is compared.
    /// A retracted request's recovery asks this every step it waits.
    pub fn probe_path(&self, end: NodeId) -> Probe {
        let ps = self.page_size;
        // Each tier's prefix stops at the start of the shallowest node without it.
        let (mut device_end, mut host_end) = (self.depth_pages(end), self.depth_pages(end));
        let mut cur = end;
        while cur != self.root {
            let c = self.node(cur);
            if !c.tiers[0].present() {
                device_end = c.start_page;
            }
            if !c.tiers[1].usable() {
                host_end = c.start_page;
            }
            cur = c.parent.expect("non-root");
        }
        let mut unlocked = 0;
        let mut cur = end;
        while cur != self.root {
            let c = self.node(cur);
            if c.end_page(ps) <= device_end && c.tiers[0].refs == 0 {
                unlocked += c.pages(ps);
            }
            cur = c.parent.expect("non-root");
        }
        Probe {
            device_pages: device_end,
            host_pages: host_end,
            device_unlocked_pages: unlocked,
        }
    }

    /// [`Self::match_prefix`] of the tokens whose path ends exactly at `end` (a node
    /// locked for them), from the nodes alone: touches the path, and no token is
    /// compared (nothing is split: the path ends on a node boundary).
    pub fn match_path(&mut self, end: NodeId) -> Match {
        self.drain_releases();
        self.clock += 1;
        // Each tier's match is the parent of the shallowest node without it.
        let (mut device, mut host) = (end, end);
        let mut cur = end;
        while cur != self.root {
            self.touch(cur);
            let c = self.node(cur);
            let parent = c.parent.expect("non-root");
            if !c.tiers[0].present() {
                device = parent;
            }
            if !c.tiers[1].usable() {
                host = parent;
            }
            cur = parent;
        }
        Match {
            device,
            device_pages: self.depth_pages(device),
            host,
            host_pages: self.depth_pages(host),
        }
    }

    /// Whether `node`'s path is exactly the whole pages of `tokens` (it was locked for
    /// them): [`Self::probe_path`] and [`Self::match_path`] may then stand for
    /// [`Self::probe`] and [`Self::match_prefix`].
    pub(crate) fn ends_at(&self, node: NodeId, tokens: &[Token]) -> bool {
        self.is_live(node) && self.depth_pages(node) as usize * self.page_size == tokens.len()
    }

    /// The node whose path is exactly the whole pages of `tokens`, when one is cached
    /// (read-only).
    pub(crate) fn node_ending(&self, tokens: &[Token]) -> Option<NodeId> {
        let &(node, matched) = self.cached_path(tokens).last()?;
        let whole = matched == self.node(node).pages(self.page_size) as usize;
        (whole && self.depth_pages(node) as usize * self.page_size == tokens.len()).then_some(node)
    }

    /// Page hashes stored along the longest cached prefix of `tokens` (whole pages, any
    /// tier), without touching anything. Empty unless page hashes are kept.
    pub fn prefix_page_hashes(&self, tokens: &[Token]) -> Vec<PageHash> {
        let mut out = Vec::new();
        for (node, matched) in self.cached_path(tokens) {
            out.extend(self.node(node).page_hashes.iter().take(matched).copied());
        }
        out
    }

    /// The nodes along the longest cached prefix of `tokens` (whole pages, any tier),
    /// root excluded, each with its pages the prefix covers (all of them but perhaps
    /// the last node's), without touching anything.
    pub(crate) fn cached_path(&self, tokens: &[Token]) -> Vec<(NodeId, usize)> {
        let ps = self.page_size;
        let mut path = Vec::new();
        let mut node = self.root;
        let mut pos = 0;
        while pos + ps <= tokens.len() {
            let Some(child) = self.find_child(node, &tokens[pos..pos + ps]) else {
                break;
            };
            let c = self.node(child);
            let matched = self.common_pages(&c.tokens, &tokens[pos..]);
            path.push((child, matched));
            if matched < c.pages(ps) as usize {
                break;
            }
            pos += matched * ps;
            node = child;
        }
        path
    }

    /// Committing prefix match: splits the node where the match ends inside it and
    /// touches every matched node (re-keying leaves in the LRU order).
    pub fn match_prefix(&mut self, tokens: &[Token]) -> Match {
        self.walk(tokens).0
    }

    /// The committing walk behind `match_prefix` and `insert`. Also returns the deepest
    /// node whose label lies entirely within `tokens`, and its depth in pages.
    pub(super) fn walk(&mut self, tokens: &[Token]) -> (Match, NodeId, u32) {
        self.drain_releases();
        self.clock += 1;
        let root = self.root;
        let m = Match {
            device: root,
            device_pages: 0,
            host: root,
            host_pages: 0,
        };
        self.walk_on(m, [true, true], root, 0, tokens)
    }

    /// [`Self::walk`] for `tokens` whose path runs through `start` (its label ends where
    /// `tokens` has its first `depth_pages(start)` pages): touches `start` and the nodes
    /// above it, then walks on from there. The match covers the tiers `start` holds.
    pub(super) fn walk_from(&mut self, start: NodeId, tokens: &[Token]) -> (Match, NodeId, u32) {
        self.drain_releases();
        self.clock += 1;
        let mut cur = start;
        while cur != self.root {
            self.touch(cur);
            cur = self.node(cur).parent.expect("non-root");
        }
        let s = self.node(start);
        let (device, host) = (s.tiers[0].present(), s.tiers[1].usable());
        let pages = self.depth_pages(start);
        let at = |on: bool| if on { (start, pages) } else { (self.root, 0) };
        let ((device_node, device_pages), (host_node, host_pages)) = (at(device), at(host));
        let m = Match {
            device: device_node,
            device_pages,
            host: host_node,
            host_pages,
        };
        let pos = pages as usize * self.page_size;
        self.walk_on(m, [device, host], start, pos, tokens)
    }

    /// The committing walk from `node` (at token `pos`), extending `m` while its tiers
    /// stay `alive`.
    fn walk_on(
        &mut self,
        mut m: Match,
        [mut dev_alive, mut host_alive]: [bool; 2],
        mut node: NodeId,
        mut pos: usize,
        tokens: &[Token],
    ) -> (Match, NodeId, u32) {
        let ps = self.page_size;
        while pos + ps <= tokens.len() {
            let Some(mut child) = self.find_child(node, &tokens[pos..pos + ps]) else {
                break;
            };
            let matched = self.common_pages(&self.node(child).tokens, &tokens[pos..]);
            let full = matched == self.node(child).pages(ps) as usize;
            if !full {
                child = self.split(child, matched);
            }
            self.touch(child);
            let c = self.node(child);
            let end = c.end_page(ps);
            if dev_alive && c.tiers[0].present() {
                m.device = child;
                m.device_pages = end;
            } else {
                dev_alive = false;
            }
            if host_alive && c.tiers[1].usable() {
                m.host = child;
                m.host_pages = end;
            } else {
                host_alive = false;
            }
            pos += matched * ps;
            node = child;
            if !full {
                break;
            }
        }
        (m, node, (pos / ps) as u32)
    }

    /// Splits `id` after its first `k` pages; returns the new prefix node, which takes
    /// the first `k` pages of every tier and the same lock counts (every lock covering
    /// the suffix also covers the prefix). The suffix keeps its identity.
    pub(super) fn split(&mut self, id: NodeId, k: usize) -> NodeId {
        let ps = self.page_size;
        let (parent, start, prefix_tokens, last_access) = {
            let n = self.node_mut(id);
            let prefix_tokens: Vec<Token> = n.tokens.drain(..k * ps).collect();
            let start = n.start_page;
            n.start_page += k as u32;
            (
                n.parent.expect("split of root"),
                start,
                prefix_tokens,
                n.last_access,
            )
        };
        let x = self.new_node(parent, prefix_tokens, start);
        // Move per-tier pages and hashes.
        let (tiers, page_hashes, block_hashes) = {
            let n = self.node_mut(id);
            let mut tiers: [TierRes; 2] = Default::default();
            for (t, res) in n.tiers.iter_mut().enumerate() {
                tiers[t].refs = res.refs;
                tiers[t].valid = res.valid;
                tiers[t].pending = res.pending;
                if res.present() {
                    tiers[t].pages = res.pages.drain(..k).collect();
                }
            }
            let page_hashes = if n.page_hashes.is_empty() {
                Vec::new()
            } else {
                n.page_hashes.drain(..k).collect()
            };
            let total = k + n.tokens.len() / ps;
            let block_hashes = if n.block_hashes.len() == total {
                n.block_hashes.drain(..k).collect()
            } else {
                n.block_hashes.clear();
                Vec::new()
            };
            (tiers, page_hashes, block_hashes)
        };
        {
            let xn = self.node_mut(x);
            xn.tiers = tiers;
            xn.page_hashes = page_hashes;
            xn.block_hashes = block_hashes;
            xn.last_access = last_access;
        }
        // Relink: x takes id's place under parent (same first page, same key).
        {
            let children = &mut self.node_mut(parent).children;
            if let Some(slot) = children.iter_mut().find(|(_, c)| *c == id) {
                slot.1 = x;
            }
        }
        self.node_mut(id).parent = Some(x);
        self.add_child(x, id);
        if self.node(x).tiers[1].pending > 0 {
            for ticket in self.tickets.values_mut() {
                if let Some(pos) = ticket.nodes.iter().position(|&n| n == id) {
                    ticket.nodes.insert(pos + 1, x);
                }
            }
        }
        self.tree_event(TreeEvent::Split {
            prefix: x,
            suffix: id,
        });
        x
    }
}
