//! Write-backs (device → host): tickets, the pins they hold on both tiers while in
//! flight, their acknowledgement (publish or roll back), and demotion of written-back copies.

use kvtier_types::{Medium, PageId, StateObject, Tier, TransferPair, hash::PageHash};

use super::{RadixCore, TreeEvent};
use crate::NodeId;

/// A write-back in flight: the nodes whose host copies it fills. Acknowledge it with
/// [`RadixCore::write_back_done`] exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a write-back ticket must be acknowledged with write_back_done"]
pub struct WriteBackTicket(u64);

/// What a write-back ticket covers. While it is in flight its path is pinned on both
/// tiers (the device pages are being read, the host pages written).
#[derive(Debug)]
pub(super) struct Ticket {
    /// Nodes whose host copies it fills, leaf→root.
    pub(super) nodes: Vec<NodeId>,
    /// The deepest node of the path, pinned on both tiers.
    pub(super) pinned: Option<NodeId>,
    /// Nodes whose recurrent states it copies too (hybrid models): exactly these get
    /// their host copies when it is acknowledged.
    pub(super) states: Vec<NodeId>,
}

/// What a successful write-back made readable on host (see `write_back_done`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WrittenBack {
    /// Host pages, root first.
    pub host_pages: Vec<PageId>,
    /// Their rolling page hashes (empty unless page hashes are kept).
    pub page_hashes: Vec<PageHash>,
    /// The deepest written node (lock it on host to pin the pages).
    pub deepest: Option<NodeId>,
    /// Hybrid models: the host states it made valid, each with the hash of the last
    /// page of its node (empty unless page hashes are kept).
    pub states: Vec<StateObject>,
}

impl RadixCore {
    /// Attaches host pages to device `nodes` for a write-back (nodes already holding a
    /// pending host copy get the same host pages again). The copies stay pending —
    /// invisible to host matches — until [`Self::write_back_done`], and the path stays
    /// pinned on both tiers until then, so neither side of the copy can be evicted. Returns the ticket to
    /// acknowledge and the (device page → host page) pairs, or `None` (nothing attached)
    /// if the pool is short.
    pub fn attach_for_write_back(
        &mut self,
        nodes: &[NodeId],
    ) -> Option<(WriteBackTicket, Vec<TransferPair>)> {
        self.drain_releases();
        let need = self.pages_needed(Tier::Host, nodes) as usize;
        let mut ids = self.pools[1].allocate_ids(need)?;
        let ps = self.page_size;
        let mut pairs = Vec::new();
        for &node in nodes {
            if !self.node(node).tiers[1].present() {
                let n = self.node(node).pages(ps) as usize;
                let rest = ids.split_off(n);
                let mine = std::mem::replace(&mut ids, rest);
                self.attach(node, Tier::Host, mine, false);
            }
            let n = self.node_mut(node);
            n.tiers[1].pending += 1;
            let pairs_of = n.tiers[0].pages.iter().zip(&n.tiers[1].pages);
            pairs.extend(pairs_of.map(|(&d, &h)| TransferPair::kv(d, h)));
        }
        let pinned = nodes.first().copied();
        if let Some(deepest) = pinned {
            self.pin(deepest, Tier::Device);
            self.pin(deepest, Tier::Host);
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(
            ticket,
            Ticket {
                nodes: nodes.to_vec(),
                pinned,
                states: Vec::new(),
            },
        );
        Some((WriteBackTicket(ticket), pairs))
    }

    /// Completes a write-back. On success its host copies become readable; on failure a
    /// copy no other write-back is still filling is rolled back to the pool (the device
    /// copy stays authoritative). An unknown ticket is ignored. Returns, root first, the
    /// host pages the write-back made readable and their page hashes (empty when hashes
    /// are not kept): what an L3 backup should store.
    pub fn write_back_done(&mut self, ticket: WriteBackTicket, success: bool) -> WrittenBack {
        self.drain_releases();
        let Some(Ticket {
            nodes,
            pinned,
            states,
        }) = self.tickets.remove(&ticket.0)
        else {
            debug_assert!(false, "write-back ticket acknowledged twice");
            return WrittenBack::default();
        };
        for &node in &nodes {
            if !self.is_live(node) {
                debug_assert!(false, "write-back node removed while in flight");
                continue;
            }
            let res = &mut self.node_mut(node).tiers[1];
            res.pending = res.pending.saturating_sub(1);
            if success {
                res.valid = true;
            } else if res.pending == 0 && !res.valid && res.present() {
                self.detach(node, Tier::Host, false);
            }
        }
        let mut written = WrittenBack::default();
        if success {
            // Root first: the backup's pages in order, and the KV events of pages
            // readable on host now.
            for &node in nodes.iter().rev() {
                if !self.is_live(node) || !self.node(node).tiers[1].usable() {
                    continue;
                }
                let n = self.node(node);
                written.host_pages.extend_from_slice(&n.tiers[1].pages);
                if n.page_hashes.len() == n.tiers[1].pages.len() {
                    written.page_hashes.extend_from_slice(&n.page_hashes);
                }
                self.emit_stored(node, Medium::Host);
            }
            written.deepest = nodes.first().copied().filter(|&n| self.is_live(n));
        }
        // The states first, while the copy still pins the path (a demotion they allow
        // waits for the pin to go).
        if !states.is_empty() {
            self.with_family(|family, tree| family.write_back_done(tree, &states, success));
        }
        let written_states: Vec<StateObject> = if success && self.keep_page_hashes {
            states
                .iter()
                .filter(|&&n| self.is_live(n))
                .filter_map(|&n| {
                    let slot = self.states()?.host_slot(n)?;
                    let page_hash = *self.node(n).page_hashes.last()?;
                    Some(StateObject { slot, page_hash })
                })
                .collect()
        } else {
            Vec::new()
        };
        written.states = written_states;
        if let Some(deepest) = pinned {
            self.release_lock(deepest, Tier::Device);
            self.release_lock(deepest, Tier::Host);
        }
        for node in nodes {
            if self.is_live(node) {
                self.prune_up(node);
            }
        }
        written
    }

    /// Adds the family's half to write-back `ticket` of `nodes` (a hybrid model's device
    /// states without a host copy get host slots, reserved until the acknowledgement).
    /// Returns the family's copies.
    pub(crate) fn attach_family_write_back(
        &mut self,
        ticket: WriteBackTicket,
        nodes: &[NodeId],
    ) -> Vec<TransferPair> {
        let (pairs, states) =
            self.with_family(|family, tree| family.prepare_write_back(tree, nodes));
        if !states.is_empty()
            && let Some(t) = self.tickets.get_mut(&ticket.0)
        {
            t.states = states;
        }
        pairs
    }

    /// Write-backs attached and not yet acknowledged.
    pub fn pending_write_backs(&self) -> usize {
        self.tickets.len()
    }

    /// Frees device copies that are also readable on host, from `from` towards the root,
    /// stopping at a locked copy, a copy missing on host, or a node with a device child.
    pub fn demote(&mut self, from: NodeId) {
        self.drain_releases();
        let mut cur = from;
        while cur != self.root {
            if !self.is_live(cur) {
                return;
            }
            let n = self.node(cur);
            let parent = n.parent.expect("non-root");
            if !n.tiers[0].present() {
                cur = parent;
                continue;
            }
            if !n.tiers[1].usable() || n.tiers[0].refs != 0 {
                break;
            }
            // A device state with a host copy goes even when a device child keeps the
            // node's KV on device.
            self.tree_event(TreeEvent::Demoting(cur));
            let n = self.node(cur);
            if n.children
                .iter()
                .any(|&(_, c)| self.node(c).tiers[0].present())
            {
                break;
            }
            self.detach(cur, Tier::Device, false);
            cur = parent;
        }
    }
}
