//! The radix cache core: walk, split, insert, lock, evict, demote, write-back tracking.

use std::collections::{BTreeMap, BTreeSet};

use kvtier_host::{OwnedPages, PagePool, ReleaseQueue};
use kvtier_types::{KvEvent, PageId, Tier, Token, TransferPair, hash::PageHash, hash::block_hash};
use slab::Slab;

use crate::events::EventSink;
use crate::node::{LruKey, Node, TierRes, page_key};
use crate::{NodeId, NodeLock, RadixError};

/// What the cache needs to know at construction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per page (positive).
    pub page_size: u32,
    /// Device pool size including page 0.
    pub device_pages: u32,
    /// Host pool size including page 0 (0 or 1: no host pool).
    pub host_pages: u32,
    /// Collect device-tier KV events.
    pub kv_events: bool,
    /// Keep SHA-256 rolling page hashes on every node (needed for L3 keys).
    pub page_hashes: bool,
}

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

/// Result of an insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertResult {
    /// The node ending at the inserted length.
    pub last_node: NodeId,
    /// Pages newly attached (the rest were duplicates and went back to the pool).
    pub inserted_pages: u32,
}

/// A write-back in flight: the nodes whose host copies it fills. Acknowledge it with
/// [`RadixCache::write_back_done`] exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[must_use = "a write-back ticket must be acknowledged with write_back_done"]
pub struct WriteBackTicket(u64);

/// What a write-back ticket covers. While it is in flight its path is pinned on both
/// tiers (the device pages are being read, the host pages written).
#[derive(Debug)]
struct Ticket {
    /// Nodes whose host copies it fills, leaf→root.
    nodes: Vec<NodeId>,
    /// The deepest node of the path, pinned on both tiers.
    pinned: Option<NodeId>,
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
}

/// Counters of the tree for stats and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeStats {
    /// Live nodes, root excluded.
    pub nodes: usize,
    /// Pages held by tree nodes, per tier (device, host).
    pub cached_pages: [u64; 2],
    /// Of those, pages locked by someone.
    pub locked_pages: [u64; 2],
    /// Free pages per tier.
    pub free_pages: [u32; 2],
}

/// The radix prefix cache with device and host tiers.
#[derive(Debug)]
pub struct RadixCache {
    page_size: usize,
    nodes: Slab<Node>,
    /// Generation per slab slot, bumped when a node is removed.
    gens: Vec<u32>,
    root: NodeId,
    pools: [PagePool; 2],
    lru: [BTreeSet<LruKey>; 2],
    cached_pages: [u64; 2],
    locked_pages: [u64; 2],
    clock: u64,
    next_seq: u64,
    keep_page_hashes: bool,
    events: Option<EventSink>,
    lock_releases: ReleaseQueue<(NodeId, Tier)>,
    /// Write-backs in flight → the nodes they fill, leaf→root. A split of a covered node
    /// adds the new prefix node, so every pending copy is acknowledged.
    tickets: BTreeMap<u64, Ticket>,
    next_ticket: u64,
    /// The host allocator's lease behind the host tier, returned when the cache goes.
    host_lease: Option<OwnedPages>,
}

impl RadixCache {
    /// An empty cache with fresh pools.
    pub fn new(config: &CacheConfig) -> Self {
        let mut nodes = Slab::new();
        let idx = nodes.insert(Node {
            parent: None,
            children: Vec::new(),
            tokens: Vec::new(),
            start_page: 0,
            tiers: Default::default(),
            seq: 0,
            last_access: 0,
            page_hashes: Vec::new(),
            block_hashes: Vec::new(),
        });
        Self {
            page_size: config.page_size.max(1) as usize,
            nodes,
            gens: vec![0; idx + 1],
            root: NodeId {
                idx: idx as u32,
                gen_: 0,
            },
            pools: [
                PagePool::new(config.device_pages),
                PagePool::new(config.host_pages),
            ],
            lru: [BTreeSet::new(), BTreeSet::new()],
            cached_pages: [0; 2],
            locked_pages: [0; 2],
            clock: 0,
            next_seq: 1,
            keep_page_hashes: config.page_hashes,
            events: config.kv_events.then(EventSink::default),
            lock_releases: ReleaseQueue::new(),
            tickets: BTreeMap::new(),
            next_ticket: 1,
            host_lease: None,
        }
    }

    /// A cache whose host tier is a lease from the host allocator: exactly the host
    /// pool's usable pages `1..host_pages`. The lease goes back when the cache is dropped.
    pub fn with_host_lease(config: &CacheConfig, lease: OwnedPages) -> Result<Self, RadixError> {
        let mut ids = lease.ids().to_vec();
        ids.sort_unstable();
        let expected = config.host_pages.saturating_sub(1) as usize;
        if ids.len() != expected || ids.iter().enumerate().any(|(i, &p)| p as usize != i + 1) {
            return Err(RadixError::HostLease {
                expected: expected as u32,
                got: lease.len() as u32,
            });
        }
        let mut cache = Self::new(config);
        cache.host_lease = Some(lease);
        Ok(cache)
    }

    /// Tokens per page.
    pub fn page_size(&self) -> u32 {
        self.page_size as u32
    }

    /// The root node (empty prefix).
    pub fn root(&self) -> NodeId {
        self.root
    }

    // ----- node access -------------------------------------------------------------

    #[inline]
    fn node(&self, id: NodeId) -> &Node {
        debug_assert!(self.is_live(id), "stale node {id:?}");
        &self.nodes[id.idx as usize]
    }

    #[inline]
    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        debug_assert!(self.is_live(id), "stale node {id:?}");
        &mut self.nodes[id.idx as usize]
    }

    /// Whether `id` names a live node.
    pub fn is_live(&self, id: NodeId) -> bool {
        self.nodes.contains(id.idx as usize) && self.gens[id.idx as usize] == id.gen_
    }

    /// Absolute depth of a node in pages.
    pub fn depth_pages(&self, id: NodeId) -> u32 {
        self.node(id).end_page(self.page_size)
    }

    fn new_node(&mut self, parent: NodeId, tokens: Vec<Token>, start_page: u32) -> NodeId {
        let seq = self.next_seq;
        self.next_seq += 1;
        let idx = self.nodes.insert(Node {
            parent: Some(parent),
            children: Vec::new(),
            tokens,
            start_page,
            tiers: Default::default(),
            seq,
            last_access: self.clock,
            page_hashes: Vec::new(),
            block_hashes: Vec::new(),
        });
        if self.gens.len() <= idx {
            self.gens.resize(idx + 1, 0);
        }
        NodeId {
            idx: idx as u32,
            gen_: self.gens[idx],
        }
    }

    fn find_child(&self, parent: NodeId, page: &[Token]) -> Option<NodeId> {
        let key = page_key(page);
        let children = &self.node(parent).children;
        let start = children.partition_point(|&(k, _)| k < key);
        children[start..]
            .iter()
            .take_while(|&&(k, _)| k == key)
            .map(|&(_, c)| c)
            .find(|&c| &self.node(c).tokens[..self.page_size] == page)
    }

    fn add_child(&mut self, parent: NodeId, child: NodeId) {
        let key = page_key(&self.node(child).tokens[..self.page_size]);
        let children = &mut self.node_mut(parent).children;
        let at = children.partition_point(|&(k, _)| k <= key);
        children.insert(at, (key, child));
    }

    fn remove_child(&mut self, parent: NodeId, child: NodeId) {
        let children = &mut self.node_mut(parent).children;
        if let Some(pos) = children.iter().position(|&(_, c)| c == child) {
            children.remove(pos);
        }
    }

    /// Pages of `label` (whole pages) matching `tokens` from the start.
    #[inline]
    fn common_pages(&self, label: &[Token], tokens: &[Token]) -> usize {
        let whole = label.len().min(tokens.len()) / self.page_size;
        if label[..whole * self.page_size] == tokens[..whole * self.page_size] {
            return whole;
        }
        label
            .chunks_exact(self.page_size)
            .zip(tokens.chunks_exact(self.page_size))
            .take_while(|(a, b)| a == b)
            .count()
    }

    fn check_aligned(&self, tokens: &[Token]) -> Result<(), RadixError> {
        if !tokens.len().is_multiple_of(self.page_size) {
            return Err(RadixError::Unaligned {
                tokens: tokens.len(),
                page_size: self.page_size(),
            });
        }
        Ok(())
    }

    // ----- release channel ------------------------------------------------------

    /// Applies releases of dropped locks and page sets. Every mutating call does this
    /// first, so callers never observe a dropped handle as still held.
    pub fn drain_releases(&mut self) {
        let mut released = Vec::new();
        self.lock_releases.drain(|item| released.push(item));
        for (node, tier) in released {
            self.release_lock(node, tier);
        }
        self.pools[0].drain_returns();
        self.pools[1].drain_returns();
    }

    // ----- probe and match ---------------------------------------------------------

    /// Read-only prefix match of whole pages: no split, no LRU touch.
    pub fn probe(&self, tokens: &[Token]) -> Probe {
        let ps = self.page_size;
        let mut probe = Probe::default();
        let (mut dev_alive, mut host_alive) = (true, true);
        let mut node = self.root;
        let mut pos = 0;
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
        probe
    }

    /// Page hashes stored along the longest cached prefix of `tokens` (whole pages, any
    /// tier), without touching anything. Empty unless page hashes are kept.
    pub fn prefix_page_hashes(&self, tokens: &[Token]) -> Vec<PageHash> {
        let ps = self.page_size;
        let mut out = Vec::new();
        let mut node = self.root;
        let mut pos = 0;
        while pos + ps <= tokens.len() {
            let Some(child) = self.find_child(node, &tokens[pos..pos + ps]) else {
                break;
            };
            let c = self.node(child);
            let matched = self.common_pages(&c.tokens, &tokens[pos..]);
            out.extend(c.page_hashes.iter().take(matched).copied());
            if matched < c.pages(ps) as usize {
                break;
            }
            pos += matched * ps;
            node = child;
        }
        out
    }

    /// Committing prefix match: splits the node where the match ends inside it and
    /// touches every matched node (re-keying leaves in the LRU order).
    pub fn match_prefix(&mut self, tokens: &[Token]) -> Match {
        self.walk(tokens).0
    }

    /// The committing walk behind `match_prefix` and `insert`. Also returns the deepest
    /// node whose label lies entirely within `tokens`, and its depth in pages.
    fn walk(&mut self, tokens: &[Token]) -> (Match, NodeId, u32) {
        self.drain_releases();
        self.clock += 1;
        let ps = self.page_size;
        let mut m = Match {
            device: self.root,
            device_pages: 0,
            host: self.root,
            host_pages: 0,
        };
        let (mut dev_alive, mut host_alive) = (true, true);
        let mut node = self.root;
        let mut pos = 0;
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

    fn touch(&mut self, id: NodeId) {
        let clock = self.clock;
        self.node_mut(id).last_access = clock;
        for tier in Tier::ALL {
            if self.node(id).tiers[tier.index()].lru.is_some() {
                self.lru_insert(id, tier);
            }
        }
    }

    /// Splits `id` after its first `k` pages; returns the new prefix node, which takes
    /// the first `k` pages of every tier and the same lock counts (every lock covering
    /// the suffix also covers the prefix). The suffix keeps its identity.
    fn split(&mut self, id: NodeId, k: usize) -> NodeId {
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
        x
    }

    // ----- locks -----------------------------------------------------------------

    /// Locks `tier` on `node` and every ancestor.
    pub fn lock(&mut self, node: NodeId, tier: Tier) -> NodeLock {
        self.pin(node, tier);
        NodeLock {
            node,
            tier,
            home: Some(self.lock_releases.releaser()),
        }
    }

    /// Raises the `tier` lock count of `node` and its ancestors (a lock without a handle;
    /// undone by `release_lock`).
    fn pin(&mut self, node: NodeId, tier: Tier) {
        debug_assert!(self.is_live(node));
        let t = tier.index();
        let mut cur = node;
        while cur != self.root {
            let n = self.node_mut(cur);
            n.tiers[t].refs += 1;
            let (first, pages, parent) = (n.tiers[t].refs == 1, n.tiers[t].pages.len(), n.parent);
            if first {
                self.locked_pages[t] += pages as u64;
            }
            cur = parent.expect("non-root node has a parent");
        }
    }

    /// Releases a lock now.
    pub fn unlock(&mut self, mut lock: NodeLock) {
        lock.home = None;
        self.release_lock(lock.node, lock.tier);
    }

    fn release_lock(&mut self, node: NodeId, tier: Tier) {
        if !self.is_live(node) {
            debug_assert!(false, "lock on a removed node {node:?}");
            return;
        }
        let t = tier.index();
        let mut cur = node;
        let mut emptied = Vec::new();
        while cur != self.root {
            let n = self.node_mut(cur);
            debug_assert!(n.tiers[t].refs > 0, "lock count underflow");
            n.tiers[t].refs = n.tiers[t].refs.saturating_sub(1);
            let (now_zero, pages, in_lru, parent) = (
                n.tiers[t].refs == 0,
                n.tiers[t].pages.len(),
                n.tiers[t].lru.is_some(),
                n.parent,
            );
            if now_zero {
                self.locked_pages[t] -= pages as u64;
                if in_lru {
                    self.lru_insert(cur, tier);
                }
                if pages == 0 {
                    emptied.push(cur);
                }
            }
            cur = parent.expect("non-root node has a parent");
        }
        // A copy rolled back while locked leaves a hollow node; prune it once free.
        for id in emptied {
            if self.is_live(id) {
                self.prune_up(id);
            }
        }
    }

    // ----- LRU -------------------------------------------------------------------

    fn lru_insert(&mut self, id: NodeId, tier: Tier) {
        let t = tier.index();
        let key = (self.clock, self.node(id).seq, id);
        if let Some(old) = self.node_mut(id).tiers[t].lru.replace(key) {
            self.lru[t].remove(&old);
        }
        self.lru[t].insert(key);
    }

    fn lru_remove(&mut self, id: NodeId, tier: Tier) {
        let t = tier.index();
        if let Some(old) = self.node_mut(id).tiers[t].lru.take() {
            self.lru[t].remove(&old);
        }
    }

    fn is_leaf(&self, id: NodeId, tier: Tier) -> bool {
        let t = tier.index();
        let n = self.node(id);
        id != self.root
            && n.tiers[t].present()
            && !n
                .children
                .iter()
                .any(|&(_, c)| self.node(c).tiers[t].present())
    }

    fn update_leaf(&mut self, id: NodeId, tier: Tier) {
        if id == self.root {
            return;
        }
        if self.is_leaf(id, tier) {
            self.lru_insert(id, tier);
        } else {
            self.lru_remove(id, tier);
        }
    }

    fn update_leaves(&mut self, id: NodeId, tier: Tier) {
        self.update_leaf(id, tier);
        if let Some(parent) = self.node(id).parent {
            self.update_leaf(parent, tier);
        }
    }

    // ----- attach / detach -----------------------------------------------------------

    fn attach(&mut self, id: NodeId, tier: Tier, pages: Vec<PageId>, valid: bool) {
        let t = tier.index();
        let ps = self.page_size;
        let n = self.node_mut(id);
        debug_assert!(!n.tiers[t].present());
        debug_assert_eq!(pages.len() * ps, n.tokens.len());
        let (count, locked) = (pages.len() as u64, n.tiers[t].refs > 0);
        n.tiers[t].pages = pages;
        n.tiers[t].valid = valid;
        self.cached_pages[t] += count;
        if locked {
            self.locked_pages[t] += count;
        }
        self.update_leaves(id, tier);
    }

    /// Takes a node's pages on `tier` back into the pool.
    fn detach(&mut self, id: NodeId, tier: Tier) {
        let t = tier.index();
        self.lru_remove(id, tier);
        let n = self.node_mut(id);
        let pages = std::mem::take(&mut n.tiers[t].pages);
        n.tiers[t].valid = false;
        let locked = n.tiers[t].refs > 0;
        if tier == Tier::Device {
            let hashes = std::mem::take(&mut n.block_hashes);
            if let Some(sink) = self.events.as_mut() {
                sink.removed(&hashes);
            }
        }
        self.cached_pages[t] -= pages.len() as u64;
        if locked {
            self.locked_pages[t] -= pages.len() as u64;
        }
        self.pools[t].free_ids(&pages);
        if let Some(parent) = self.node(id).parent {
            self.update_leaf(parent, tier);
        }
    }

    /// Removes resource-less, unlocked, childless nodes from `id` upwards; returns the
    /// first survivor.
    fn prune_up(&mut self, mut id: NodeId) -> NodeId {
        while id != self.root {
            let n = self.node(id);
            let removable = n.children.is_empty()
                && n.tiers
                    .iter()
                    .all(|r| !r.present() && r.refs == 0 && r.pending == 0);
            if !removable {
                break;
            }
            let parent = n.parent.expect("non-root node has a parent");
            self.remove_child(parent, id);
            self.nodes.remove(id.idx as usize);
            self.gens[id.idx as usize] = self.gens[id.idx as usize].wrapping_add(1);
            id = parent;
        }
        for tier in Tier::ALL {
            self.update_leaf(id, tier);
        }
        id
    }

    // ----- hashes ----------------------------------------------------------------

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
    fn ensure_block_hashes(&mut self, id: NodeId) {
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
    fn ensure_page_hashes(&mut self, id: NodeId) {
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

    fn emit_stored(&mut self, id: NodeId) {
        if self.events.is_none() {
            return;
        }
        self.ensure_block_hashes(id);
        let ps = self.page_size;
        let n = &self.nodes[id.idx as usize];
        let mut parent = self.last_block_hash(n.parent.expect("non-root"));
        if let Some(sink) = self.events.as_mut() {
            for (page, &h) in n.tokens.chunks_exact(ps).zip(&n.block_hashes) {
                sink.stored(h, parent, page, ps as u32);
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

    // ----- insert ----------------------------------------------------------------

    /// Inserts whole pages of `tokens` on `tier`. The first `prefix_pages` pages must
    /// already be resident on `tier` along this path (the caller holds a lock there);
    /// `pages` holds exactly the pages for the rest, in order. The first copy wins:
    /// pages duplicating a resident copy go back to the pool.
    pub fn insert(
        &mut self,
        tier: Tier,
        tokens: &[Token],
        prefix_pages: u32,
        pages: OwnedPages,
    ) -> Result<InsertResult, RadixError> {
        self.drain_releases();
        self.check_aligned(tokens)?;
        let t = tier.index();
        let ps = self.page_size;
        let total = (tokens.len() / ps) as u32;
        let expected = total.saturating_sub(prefix_pages);
        if prefix_pages > total || pages.len() != expected as usize {
            return Err(RadixError::PageCountMismatch {
                total,
                prefix: prefix_pages,
                expected,
                got: pages.len(),
            });
        }
        let mut ids = self.pools[t].adopt(pages)?;
        if total == 0 {
            return Ok(InsertResult {
                last_node: self.root,
                inserted_pages: 0,
            });
        }
        // Walk (splitting and touching), then one new node for whatever remains.
        let (m, mut last, matched) = self.walk(tokens);
        // The claimed prefix must really be resident on this tier along this path.
        let resident = match tier {
            Tier::Device => m.device_pages,
            Tier::Host => m.host_pages,
        };
        if resident < prefix_pages {
            self.pools[t].free_ids(&ids);
            return Err(RadixError::PrefixNotResident {
                prefix: prefix_pages,
            });
        }
        if matched < total {
            let node = self.new_node(last, tokens[matched as usize * ps..].to_vec(), matched);
            self.add_child(last, node);
            last = node;
        }
        // Plan leaf→root before touching anything, so a contract violation changes nothing.
        let mut plan = Vec::new();
        let mut remaining = total;
        let mut cur = last;
        while cur != self.root && remaining > prefix_pages {
            let n = self.node(cur);
            let lo = remaining - n.pages(ps);
            if n.tiers[t].present() {
                plan.push((cur, false, remaining - lo.max(prefix_pages)));
            } else if lo < prefix_pages {
                self.pools[t].free_ids(&ids);
                self.prune_up(last);
                return Err(RadixError::PrefixNotResident {
                    prefix: prefix_pages,
                });
            } else {
                plan.push((cur, true, n.pages(ps)));
            }
            remaining = lo;
            cur = n.parent.expect("non-root");
        }
        let mut inserted = 0;
        let mut attached = Vec::new();
        for (node, attach, n) in plan {
            let tail = ids.split_off(ids.len() - n as usize);
            if attach {
                self.attach(node, tier, tail, true);
                inserted += n;
                attached.push(node);
            } else {
                self.pools[t].free_ids(&tail);
            }
        }
        debug_assert!(ids.is_empty());
        self.pools[t].free_ids(&ids);
        if self.keep_page_hashes {
            self.ensure_page_hashes(last);
        }
        if tier == Tier::Device {
            for &node in attached.iter().rev() {
                self.emit_stored(node);
            }
        }
        Ok(InsertResult {
            last_node: last,
            inserted_pages: inserted,
        })
    }

    // ----- paths across tiers --------------------------------------------------------

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
            self.emit_stored(node);
        }
        Some(pairs)
    }

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
        let Some(Ticket { nodes, pinned }) = self.tickets.remove(&ticket.0) else {
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
                self.detach(node, Tier::Host);
            }
        }
        let mut written = WrittenBack::default();
        if success {
            for &node in nodes.iter().rev().filter(|&&n| self.is_live(n)) {
                let n = self.node(node);
                if n.tiers[1].usable() {
                    written.host_pages.extend_from_slice(&n.tiers[1].pages);
                    if n.page_hashes.len() == n.tiers[1].pages.len() {
                        written.page_hashes.extend_from_slice(&n.page_hashes);
                    }
                }
            }
            written.deepest = nodes.first().copied().filter(|&n| self.is_live(n));
        }
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
            if n.children
                .iter()
                .any(|&(_, c)| self.node(c).tiers[0].present())
            {
                break;
            }
            self.detach(cur, Tier::Device);
            cur = parent;
        }
    }

    // ----- capacity and eviction -------------------------------------------------

    /// Free pages of a tier.
    pub fn available(&mut self, tier: Tier) -> u32 {
        self.pools[tier.index()].available()
    }

    /// Pages of a tier held by the tree and locked by nobody: all of them can be
    /// evicted (a lock on a node also locks its ancestors, so an unlocked node has only
    /// unlocked descendants and falls in a cascade).
    pub fn evictable(&self, tier: Tier) -> u64 {
        let t = tier.index();
        self.cached_pages[t] - self.locked_pages[t]
    }

    /// Makes `need` pages free on `tier`, evicting least recently used leaves, but only
    /// when that can succeed: a failed attempt evicts nothing.
    pub fn ensure_free(&mut self, tier: Tier, need: u32) -> bool {
        self.drain_releases();
        let free = self.pools[tier.index()].available();
        if free >= need {
            return true;
        }
        if u64::from(free) + self.evictable(tier) < u64::from(need) {
            return false;
        }
        self.evict(tier, need - free);
        self.pools[tier.index()].available() >= need
    }

    /// Whether `ensure_free` would succeed, with `extra_locked` more pages about to be
    /// locked.
    pub fn can_free(&mut self, tier: Tier, need: u32, extra_locked: u32) -> bool {
        self.drain_releases();
        let free = u64::from(self.pools[tier.index()].available());
        free >= u64::from(need)
            || free + self.evictable(tier).saturating_sub(u64::from(extra_locked))
                >= u64::from(need)
    }

    /// Evicts at least `pages` pages from `tier` if possible; returns pages freed.
    fn evict(&mut self, tier: Tier, pages: u32) -> u32 {
        self.clock += 1;
        let t = tier.index();
        let mut freed = 0;
        let mut parked = Vec::new();
        let mut evicted = Vec::new();
        while freed < pages {
            let Some(key) = self.lru[t].pop_first() else {
                break;
            };
            let id = key.2;
            self.node_mut(id).tiers[t].lru = None;
            if self.node(id).tiers[t].refs > 0 {
                parked.push(id);
                continue;
            }
            freed += self.node(id).tiers[t].pages.len() as u32;
            self.detach(id, tier);
            evicted.push(id);
        }
        for id in parked {
            self.update_leaf(id, tier);
        }
        // Children were evicted before their parents: prune in that order, skipping
        // nodes an earlier prune already removed, so no resource-less node is left.
        for id in evicted {
            if self.is_live(id) {
                self.prune_up(id);
            }
        }
        freed
    }

    /// Evicts every unlocked page of both tiers (host first, so nodes fall whole).
    pub fn clear(&mut self) {
        self.drain_releases();
        for tier in [Tier::Host, Tier::Device] {
            let n = self.evictable(tier);
            self.evict(tier, u32::try_from(n).unwrap_or(u32::MAX));
        }
    }

    // ----- pools --------------------------------------------------------------------

    /// Allocates `n` pages of `tier` outside the tree (request-local pages).
    pub fn allocate(&mut self, tier: Tier, n: usize) -> Option<OwnedPages> {
        self.drain_releases();
        self.pools[tier.index()].allocate(n)
    }

    /// Returns pages held outside the tree to their pool now.
    pub fn free(&mut self, tier: Tier, pages: OwnedPages) -> Result<(), RadixError> {
        Ok(self.pools[tier.index()].free(pages)?)
    }

    /// Usable pages of a tier's pool.
    pub fn usable(&self, tier: Tier) -> u32 {
        self.pools[tier.index()].usable()
    }

    /// Tree counters.
    pub fn stats(&mut self) -> TreeStats {
        self.drain_releases();
        TreeStats {
            nodes: self.nodes.len() - 1,
            cached_pages: self.cached_pages,
            locked_pages: self.locked_pages,
            free_pages: [self.pools[0].available(), self.pools[1].available()],
        }
    }

    // ----- invariants -------------------------------------------------------------

    /// Checks the structural invariants. `outside` gives, per tier, the page ids held
    /// outside the tree (request-local pages); with it, page conservation is checked
    /// exactly: every usable page is free, in one node, or held outside, once.
    pub fn check_invariants(&mut self, outside: [&[PageId]; 2]) -> Result<(), String> {
        self.drain_releases();
        let ps = self.page_size;
        for (t, tier) in Tier::ALL.into_iter().enumerate() {
            let total = self.pools[t].total() as usize;
            let mut owner = vec![0u8; total.max(1)];
            let mut mark = |p: PageId, what: &str| -> Result<(), String> {
                let p = p as usize;
                if p == 0 || p >= total {
                    return Err(format!("{tier:?} page {p} out of range ({what})"));
                }
                owner[p] += 1;
                if owner[p] > 1 {
                    return Err(format!("{tier:?} page {p} owned twice (last by {what})"));
                }
                Ok(())
            };
            for &p in self.pools[t].free_list() {
                mark(p, "free list")?;
            }
            for (_, n) in self.nodes.iter() {
                for &p in &n.tiers[t].pages {
                    mark(p, "tree")?;
                }
            }
            for &p in outside[t] {
                mark(p, "outside")?;
            }
            if let Some(p) = (1..total).find(|&p| owner[p] == 0) {
                return Err(format!("{tier:?} page {p} leaked: neither free nor owned"));
            }
        }
        let mut cached = [0u64; 2];
        let mut locked = [0u64; 2];
        let mut leaves = [0usize; 2];
        for (idx, n) in self.nodes.iter() {
            let id = NodeId {
                idx: idx as u32,
                gen_: self.gens[idx],
            };
            if id == self.root {
                if n.tiers.iter().any(|r| r.present()) {
                    return Err("root holds pages".into());
                }
                continue;
            }
            let parent = n.parent.ok_or("non-root without parent")?;
            if !self.is_live(parent) {
                return Err(format!("{id:?} has a removed parent"));
            }
            let p = self.node(parent);
            if n.tokens.is_empty() || !n.tokens.len().is_multiple_of(ps) {
                return Err(format!("{id:?} label of {} tokens", n.tokens.len()));
            }
            let parent_end = if parent == self.root {
                0
            } else {
                p.end_page(ps)
            };
            if n.start_page != parent_end {
                return Err(format!(
                    "{id:?} starts at page {} under a parent ending at {parent_end}",
                    n.start_page
                ));
            }
            if !p
                .children
                .iter()
                .any(|&(k, c)| c == id && k == page_key(&n.tokens[..ps]))
            {
                return Err(format!("{id:?} not keyed under its parent"));
            }
            for (t, res) in n.tiers.iter().enumerate() {
                if res.present() && res.pages.len() != n.pages(ps) as usize {
                    return Err(format!(
                        "{id:?} tier {t} holds {} pages for {}",
                        res.pages.len(),
                        n.pages(ps)
                    ));
                }
                if res.present() && parent != self.root && !p.tiers[t].present() {
                    return Err(format!("{id:?} tier {t} present under a parent without it"));
                }
                if res.refs > 0 && parent != self.root && p.tiers[t].refs < res.refs {
                    return Err(format!("{id:?} tier {t} locked more than its parent"));
                }
                cached[t] += res.pages.len() as u64;
                if res.refs > 0 {
                    locked[t] += res.pages.len() as u64;
                }
                let tier = Tier::ALL[t];
                if self.is_leaf(id, tier) != res.lru.is_some() {
                    return Err(format!(
                        "{id:?} tier {t} leaf status and LRU entry disagree"
                    ));
                }
                if let Some(key) = res.lru {
                    if !self.lru[t].contains(&key) {
                        return Err(format!("{id:?} tier {t} LRU key missing from the set"));
                    }
                    leaves[t] += 1;
                }
            }
            if n.children.is_empty()
                && n.tiers
                    .iter()
                    .all(|r| !r.present() && r.refs == 0 && r.pending == 0)
            {
                return Err(format!("{id:?} is a resource-less leaf (zombie)"));
            }
            if !n.page_hashes.is_empty() && n.page_hashes.len() != n.pages(ps) as usize {
                return Err(format!(
                    "{id:?} has {} page hashes for {} pages",
                    n.page_hashes.len(),
                    n.pages(ps)
                ));
            }
        }
        for t in 0..2 {
            if cached[t] != self.cached_pages[t] || locked[t] != self.locked_pages[t] {
                return Err(format!(
                    "tier {t} counters drifted: cached {} vs {}, locked {} vs {}",
                    cached[t], self.cached_pages[t], locked[t], self.locked_pages[t]
                ));
            }
            if leaves[t] != self.lru[t].len() {
                return Err(format!(
                    "tier {t} LRU set has {} entries for {} leaves",
                    self.lru[t].len(),
                    leaves[t]
                ));
            }
        }
        Ok(())
    }
}
