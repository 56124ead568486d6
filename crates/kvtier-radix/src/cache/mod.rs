//! The radix cache core: walk, split, insert, lock, evict, demote, write-back tracking.
//!
//! This module holds the `RadixCore` struct, its construction, node access, the release
//! channel and the pools; each concern's methods live in a submodule's own `impl` block.

mod eviction;
mod family;
mod ghost;
mod hashes;
mod insert;
mod invariants;
mod locks;
mod lru;
mod marks;
mod paths;
mod reference;
mod residency;
mod snapshots;
mod states;
mod tables;
mod view;
mod walk;
mod write_back;

use std::collections::{BTreeMap, BTreeSet};

use kvtier_host::{OwnedPages, PagePool, ReleaseQueue};
use kvtier_mamba::{MambaConfig, MambaStats};
use kvtier_paged::{Adjunct, PagedReport};
use kvtier_types::{Policy, Tier, Token};
use slab::Slab;

pub(crate) use family::Hosted;
pub use family::{CacheFamily, Dense, FamilyLease, TreeEvent};
pub use insert::InsertResult;
pub use states::CachedState;
pub use tables::{GroupTables, TablesKey};
pub use walk::{Match, Probe};
use write_back::Ticket;
pub use write_back::{WriteBackTicket, WrittenBack};

use crate::events::EventSink;
use crate::node::{LruKey, Node, page_key};

use crate::{NodeId, RadixError};

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
    /// kvtier's LRU and eviction, or the reference scheduler's (see [`Policy`]).
    pub policy: Policy,
    /// The recurrent-state (Mamba) family of a hybrid model, hosted on the tree.
    pub mamba: Option<MambaConfig>,
    /// The paged-cache family of a window or compressed-state model (its groups and
    /// required groups), hosted on the tree: snapshots on nodes. Its alignment must be
    /// a multiple of the page size (a snapshot sits at a page boundary).
    pub paged: Option<Adjunct>,
    /// Remember the pages dropped from their last tier (four times the pools' pages),
    /// so that admissions can say how much of a prompt was a lost hit.
    pub lost_hits: bool,
}

/// Counters of the tree for stats and tests.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeStats {
    /// Live nodes, root excluded.
    pub nodes: usize,
    /// Pages held by tree nodes, per tier (device, host).
    pub cached_pages: [u64; 2],
    /// Of those, pages locked by someone.
    pub locked_pages: [u64; 2],
    /// Free pages per tier.
    pub free_pages: [u32; 2],
    /// Pages evicted so far, per tier (LRU eviction to make room; demotions of copies
    /// held on the other tier too and discarded load-backs are not counted).
    pub evicted_pages: [u64; 2],
    /// First chunks admitted without the L3 prefetch their lookup asked for, by
    /// `PrefetchSkip` (nothing missing from host, below the threshold, no host room, no
    /// host state slot).
    pub prefetch_skipped: [u64; 4],
    /// The recurrent-state family's counters (hybrid models).
    pub states: Option<MambaStats>,
    /// The paged-cache family's counters and gauges (window and compressed-state
    /// models).
    pub groups: Option<Box<PagedReport>>,
    /// A registered family's counters, by name.
    pub registered: Vec<(&'static str, u64)>,
}

/// The radix prefix cache with device and host tiers.
#[derive(Debug)]
pub struct RadixCore {
    page_size: usize,
    nodes: Slab<Node>,
    /// Generation per slab slot, bumped when a node is removed.
    gens: Vec<u32>,
    root: NodeId,
    pools: [PagePool; 2],
    lru: [BTreeSet<LruKey>; 2],
    cached_pages: [u64; 2],
    /// Pages evicted so far, per tier.
    evicted_pages: [u64; 2],
    locked_pages: [u64; 2],
    clock: u64,
    next_seq: u64,
    keep_page_hashes: bool,
    /// Where its decisions follow the reference scheduler's ([`Policy`]).
    policy: Policy,
    events: Option<EventSink>,
    /// Pages dropped from their last tier (`CacheConfig::lost_hits`).
    ghost: Option<ghost::Ghost>,
    /// First chunks admitted without the L3 prefetch their lookup asked for, by
    /// `PrefetchSkip`.
    pub(crate) prefetch_skipped: [u64; 4],
    lock_releases: ReleaseQueue<(NodeId, Tier)>,
    /// Write-backs in flight → the nodes they fill, leaf→root. A split of a covered node
    /// adds the new prefix node, so every pending copy is acknowledged.
    tickets: BTreeMap<u64, Ticket>,
    next_ticket: u64,
    /// The host allocator's lease behind the host tier, returned when the cache goes.
    host_lease: Option<OwnedPages>,
    /// The cache family the tree hosts.
    family: Hosted,
    /// The return path of a registered family's leases.
    family_releases: ReleaseQueue<u32>,
    /// Paged models: running requests' group tables.
    tables: tables::TableStore,
    /// Nodes whose last device lock went, over the cache's life: a snapshot below them
    /// may have become prunable (part of a refused admission's version).
    device_unpinned: u64,
    /// Where waiting prompts' last probes got to.
    marks: marks::PromptMarks,
}

impl RadixCore {
    /// An empty cache with fresh pools. A hybrid config's state family must be valid
    /// (`SchedulerConfig::validate` checks it); an invalid one hosts no family.
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
            evicted_pages: [0; 2],
            locked_pages: [0; 2],
            clock: 0,
            next_seq: 1,
            keep_page_hashes: config.page_hashes,
            policy: config.policy,
            events: config.kv_events.then(EventSink::default),
            prefetch_skipped: [0; 4],
            ghost: config
                .lost_hits
                .then(|| ghost::Ghost::new(4 * (config.device_pages + config.host_pages) as usize)),
            lock_releases: ReleaseQueue::new(),
            tickets: BTreeMap::new(),
            next_ticket: 1,
            host_lease: None,
            family: Hosted::of(config),
            family_releases: ReleaseQueue::new(),
            tables: tables::TableStore::default(),
            device_unpinned: 0,
            marks: marks::PromptMarks::default(),
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

    /// The cache family the tree hosts.
    pub(crate) fn hosted(&self) -> &Hosted {
        &self.family
    }

    /// Where the cache's decisions follow the reference scheduler's.
    pub fn policy(&self) -> Policy {
        self.policy
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

    /// Whether a live node holds its KV on `tier` (readable or not yet).
    pub fn resident(&self, id: NodeId, tier: Tier) -> bool {
        self.is_live(id) && self.node(id).tiers[tier.index()].present()
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
        match self.family {
            Hosted::Registered(_) => self.drain_family_releases(),
            Hosted::Paged(_) => self.drain_table_releases(),
            Hosted::Dense | Hosted::Mamba(_) => {}
        }
        self.pools[0].drain_returns();
        self.pools[1].drain_returns();
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
        let mut stats = TreeStats {
            nodes: self.nodes.len() - 1,
            cached_pages: self.cached_pages,
            locked_pages: self.locked_pages,
            free_pages: [self.pools[0].available(), self.pools[1].available()],
            evicted_pages: self.evicted_pages,
            prefetch_skipped: self.prefetch_skipped,
            ..TreeStats::default()
        };
        self.with_family(|family, tree| family.report(tree, &mut stats));
        stats
    }
}
