//! The Mamba family attached to a prefix tree: which node holds which state, the match
//! cap, eviction, host copies and load-backs (spec/hybrid-l3.md §1).
//!
//! A state slot attached to a node of depth `d` holds the recurrent state after
//! `tokens[0, d)`, `d` a multiple of the page size. A node holds at most one device and
//! one host slot; a split leaves them on the suffix (the node that keeps its identity),
//! and a removed node frees them. The tree itself is the host's (the radix cache): this
//! family reads it through [`StateTree`] and is told of every change that concerns its
//! states (KV evicted or demoted, a node removed).
//!
//! Everything is ordered: nodes by their ids, eviction by `(time, seq)` of the tree's
//! nodes, never by an address, so every rank decides alike.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use kvtier_types::{Tier, TransferKind, TransferPair};

use crate::checkpoint::align_down;
use crate::{MambaError, Slot, SlotId, SlotPool};

/// What the family reads of the tree that hosts it.
pub trait StateTree {
    /// A node's identity (stable while the node lives; a split keeps it on the suffix).
    type Node: Copy + Ord + Debug;

    /// The root (depth 0; never holds a state).
    fn root(&self) -> Self::Node;
    /// A node's parent (`None` for the root).
    fn parent(&self, node: Self::Node) -> Option<Self::Node>;
    /// A node's children, in a fixed order.
    fn children(&self, node: Self::Node) -> impl Iterator<Item = Self::Node> + '_;
    /// A node's depth in tokens (its label's end).
    fn depth(&self, node: Self::Node) -> u32;
    /// Whether the node's KV is on device.
    fn on_device(&self, node: Self::Node) -> bool;
    /// Whether someone holds a device lock on the node.
    fn device_locked(&self, node: Self::Node) -> bool;
    /// Whether the node's KV is on host and someone holds a host lock on it.
    fn host_locked(&self, node: Self::Node) -> bool;
    /// The node's LRU order: last access time, then creation order.
    fn age(&self, node: Self::Node) -> (u64, u64);
    /// A dense index of the node, below [`Self::index_bound`] (for marking nodes in a
    /// bit set rather than an ordered set).
    fn index(&self, node: Self::Node) -> usize;
    /// One more than the largest index a live node has.
    fn index_bound(&self) -> usize;
}

/// Settings of the Mamba family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaConfig {
    /// KV page size in tokens: states sit at multiples of it.
    pub page_size: u32,
    /// Device state slots (the reference's `mamba_pool_total_chunks`).
    pub device_slots: u32,
    /// Host state slots; 0 means no host copies.
    pub host_slots: u32,
    /// The scan kernel's chunk length (`mamba_cache_chunk_size`): the branching length
    /// and intermediate checkpoints are aligned to it.
    pub chunk: u32,
    /// The reference scheduler's choices where kvtier's differ (see
    /// `kvtier_types::Policy`): its incremental leaf tracking (direct children only,
    /// nothing re-derived on a split) and eviction that runs even when it cannot free
    /// enough.
    pub reference: bool,
}

impl MambaConfig {
    fn validate(&self) -> Result<(), MambaError> {
        if self.page_size == 0 {
            return Err(MambaError::Config("page_size must be positive"));
        }
        if self.chunk == 0 {
            return Err(MambaError::Config("the Mamba chunk must be positive"));
        }
        if self.device_slots < 2 {
            return Err(MambaError::Config(
                "a request needs two device state slots: the pool needs at least 2",
            ));
        }
        Ok(())
    }

    /// Whether states get host copies.
    pub fn host_copies(&self) -> bool {
        self.host_slots > 0
    }
}

/// A node with its LRU key `(time, seq)`.
type Aged<N> = ((u64, u64), N);

/// The slots attached to one node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Attached {
    device: Option<SlotId>,
    host: Option<SlotId>,
    /// Under the reference policies, the depth the device state holds when it is not
    /// the node's own: a stopped request's slot cached where it stopped, as the
    /// reference caches it (C.3; `UNWRITTEN`: a checkpoint never written). It takes
    /// slots, is copied to host and evicted like any state, but no match reuses it:
    /// only the request that left it resumes from it, and only when it holds exactly
    /// that request's history. A state published there at the node's own depth
    /// replaces it.
    device_off: Option<u32>,
    /// The same for the host state (a copy of such a device state, or loaded back as
    /// one). The two differ where the reference caches a stopped request's slot on a
    /// node whose only state is a host copy at the node's depth.
    host_off: Option<u32>,
}

/// [`Attached::device_off`] of a checkpoint slot the worker never wrote.
const UNWRITTEN: u32 = u32::MAX;

/// Device slots a running request holds: its working and its checkpoint slot.
const REQUEST_SLOTS: u32 = 2;

/// A state's write-back in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PendingCopy {
    /// The host slot it fills, attached at its acknowledgement.
    host: SlotId,
    /// The device slot it reads: freed only after the acknowledgement, even if a state
    /// published again replaces it.
    reads: SlotId,
    /// [`Attached::device_off`] of the state it copies.
    off: Option<u32>,
}

/// The Mamba-capped view of a KV prefix match (§1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CappedMatch<N> {
    /// The deepest node with a device state within the device KV match (root: none).
    pub device: N,
    /// The deepest node with a host state within the host KV match (root: none).
    pub host: N,
    /// The device state to copy into the request's working slot, when it starts from
    /// a device state.
    pub cow_src: Option<SlotId>,
    /// The node holding `cow_src`: `device`, or, under the reference policies without
    /// host copies, a node on the host match whose KV left the device (#612).
    pub source: Option<N>,
    /// The host state at `host`, if any (loaded back when it is deeper than `device`).
    pub host_src: Option<SlotId>,
    /// Tokens the first chunk should also checkpoint at (the KV match aligned to the
    /// kernel chunk, where that is deeper than the state).
    pub branching: Option<u32>,
}

/// Counters of the family (the reference's probe counters where it has them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MambaStats {
    /// Free device slots.
    pub free_device_slots: u32,
    /// Free host slots.
    pub free_host_slots: u32,
    /// Nodes holding a device state.
    pub device_states: u32,
    /// Nodes holding a host state.
    pub host_states: u32,
    /// A device slot held at the root, as the reference holds a retracted request's
    /// there (reference policies only, C.9): neither free nor a node's state.
    pub held_at_root: u32,
    /// Device states evicted (LRU leaves).
    pub device_evicted: u64,
    /// Host states evicted for room.
    pub host_evicted: u64,
    /// Device states dropped with their evicted KV.
    pub dropped_with_kv: u64,
    /// Host states dropped with their evicted host KV.
    pub host_dropped_with_kv: u64,
    /// Device copies dropped because a host copy exists.
    pub device_demoted: u64,
    /// Host states attached on a write-back's acknowledgement.
    pub host_attached: u64,
    /// States published into the tree.
    pub published: u64,
    /// Checkpoints freed instead (nothing to publish, or the node already had a state).
    pub discarded: u64,
    /// Cached states replaced by a newer slot holding the same state (reference policy,
    /// C.10): the old slot was freed.
    pub replaced: u64,
    /// Decode states dropped because the same request cached a deeper one.
    pub retired: u64,
}

/// The Mamba family of a prefix tree: its slot pools and the states attached to nodes.
#[derive(Debug)]
pub struct MambaFamily<N: Copy + Ord + Debug> {
    config: MambaConfig,
    device: SlotPool,
    host: SlotPool,
    attached: BTreeMap<N, Attached>,
    /// Reference policy: the eviction candidates as the reference tracks them.
    leaves: BTreeSet<N>,
    /// Write-backs in flight: the host slot each reserved (not yet attached) and the
    /// device slot it reads.
    pending: BTreeMap<N, PendingCopy>,
    /// Device slots a state published again replaced while a write-back in flight
    /// still reads them (reference policies): freed at its acknowledgement. A slot
    /// replaced that no copy reads is freed at once, as the reference frees it.
    retiring: BTreeMap<N, SlotId>,
    /// A retracted request's slot the reference attached to the root (C.9; reference
    /// policies only): no match finds it, nothing evicts or frees it.
    at_root: Option<SlotId>,
    /// Nodes whose host copy landed and whose device copy waits to be demoted.
    to_demote: BTreeSet<N>,
    /// States this plan's rows copy from (default policy: kept until the next plan).
    protected: BTreeSet<N>,
    stats: MambaStats,
}

impl<N: Copy + Ord + Debug> MambaFamily<N> {
    /// A family with empty pools. Fails on an unusable config.
    pub fn new(config: MambaConfig) -> Result<Self, MambaError> {
        config.validate()?;
        Ok(Self {
            device: SlotPool::new(Tier::Device, config.device_slots),
            host: SlotPool::new(Tier::Host, config.host_slots),
            config,
            attached: BTreeMap::new(),
            leaves: BTreeSet::new(),
            pending: BTreeMap::new(),
            retiring: BTreeMap::new(),
            at_root: None,
            to_demote: BTreeSet::new(),
            protected: BTreeSet::new(),
            stats: MambaStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MambaConfig {
        &self.config
    }

    /// The node's device state slot, if any.
    pub fn device_slot(&self, node: N) -> Option<SlotId> {
        self.attached.get(&node).and_then(|a| a.device)
    }

    /// The node's host state slot, if any.
    pub fn host_slot(&self, node: N) -> Option<SlotId> {
        self.attached.get(&node).and_then(|a| a.host)
    }

    /// Free device slots (after taking back dropped handles).
    pub fn free_device_slots(&mut self) -> u32 {
        self.device.available()
    }

    /// `floor(x / chunk) · chunk`.
    pub fn align(&self, x: u32) -> u32 {
        align_down(x, self.config.chunk)
    }

    // ----- match --------------------------------------------------------------------

    /// The deepest node from `node` up (root excluded) holding a device state a match
    /// may reuse (one at its node's depth).
    pub fn last_device_state<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> Option<N> {
        self.last_with(tree, node, |a| a.device.is_some() && a.device_off.is_none())
    }

    /// The device and host slots on `node` that hold exactly the state after `depth`
    /// tokens: its own states when `depth` is the node's depth, or states cached there
    /// off its depth that hold `depth`.
    pub fn states_holding<T: StateTree<Node = N>>(
        &self,
        tree: &T,
        node: N,
        depth: u32,
    ) -> (Option<SlotId>, Option<SlotId>) {
        let Some(a) = self.attached.get(&node) else {
            return (None, None);
        };
        let own = tree.depth(node);
        let on = |off: Option<u32>| off.unwrap_or(own) == depth;
        (
            a.device.filter(|_| on(a.device_off)),
            a.host.filter(|_| on(a.host_off)),
        )
    }

    /// The deepest node from `node` up (root excluded) holding a host state a match may
    /// reuse (one at its node's depth).
    pub fn last_host_state<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> Option<N> {
        self.last_with(tree, node, |a| a.host.is_some() && a.host_off.is_none())
    }

    fn last_with<T: StateTree<Node = N>>(
        &self,
        tree: &T,
        mut node: N,
        has: impl Fn(&Attached) -> bool,
    ) -> Option<N> {
        let root = tree.root();
        while node != root {
            if self.attached.get(&node).is_some_and(&has) {
                return Some(node);
            }
            node = tree.parent(node)?;
        }
        None
    }

    /// The KV match terminals `device` and `host` as the reference's match caps them
    /// at its states (`augmentMatch`), counting every cached state, those off their
    /// depth too. With host copies, each tier at its deepest state; without, both at
    /// the device state, or, with no device match at all, the host tier uncapped where
    /// a device state lies on its path (#612, C.7).
    pub fn reference_capped<T: StateTree<Node = N>>(&self, tree: &T, device: N, host: N) -> (N, N) {
        let root = tree.root();
        let on_device = |a: &Attached| a.device.is_some();
        if self.config.host_copies() {
            let on_host = |a: &Attached| a.host.is_some();
            return (
                self.last_with(tree, device, on_device).unwrap_or(root),
                self.last_with(tree, host, on_host).unwrap_or(root),
            );
        }
        if device == root {
            let found = self.last_with(tree, host, on_device).is_some();
            return (root, if found { host } else { root });
        }
        match self.last_with(tree, device, on_device) {
            None => (root, root),
            Some(state) => (
                state,
                if tree.depth(host) >= tree.depth(state) {
                    state
                } else {
                    root
                },
            ),
        }
    }

    /// The node whose state the reference resumes a retracted request from, given the
    /// request's KV match terminals; `None`: it finds none and gives the request up. It
    /// searches from the host terminal as the reference's match caps it
    /// ([`Self::reference_capped`]): a device state there or above, else the host state
    /// the cap stopped at.
    pub fn reference_recovery_node<T: StateTree<Node = N>>(
        &self,
        tree: &T,
        device: N,
        host: N,
    ) -> Option<N> {
        let (_, from) = self.reference_capped(tree, device, host);
        let host_state = (self.config.host_copies() && from != tree.root()).then_some(from);
        self.last_with(tree, from, |a| a.device.is_some())
            .or(host_state)
    }

    /// Caps a KV match at the deepest states reachable on each tier (§1.4): KV depth
    /// without its state is never reusable. `device` and `host` are the KV match's
    /// terminals; with host copies off, or `host_states` false (no room to load one
    /// back), the host tier caps to the device state (a host-only KV hit has no state:
    /// #612), except under the reference policies where `host_kv` (the host prefix can
    /// be loaded back) and there is no device match at all: then the host match caps to
    /// a device state on its path, as the reference's #612 fix looks for one there.
    pub fn cap_match<T: StateTree<Node = N>>(
        &self,
        tree: &T,
        device: N,
        host: N,
        host_states: bool,
        host_kv: bool,
    ) -> CappedMatch<N> {
        let root = tree.root();
        let ps = self.config.page_size;
        let host_states = host_states && self.config.host_copies();
        // Without host copies a device state stays on a node whose KV went to host.
        // With no device match at all, the reference (#612) looks for one from the host
        // terminal, and reuses the host prefix down to it.
        let from_host = self.config.reference
            && host_kv
            && !self.config.host_copies()
            && device == root
            && host != root;
        let dm = self.last_device_state(tree, if from_host { host } else { device });
        // The branching point counts the host tier's KV too, except under the
        // reference policy without host states, where the reference counts the device
        // tier's only (its prefix is capped to the device state there anyway), or the
        // host tier's where it found the state from there.
        let kv_depth = if host_states || !self.config.reference {
            tree.depth(device).max(tree.depth(host))
        } else if from_host && dm.is_some() {
            tree.depth(host)
        } else {
            tree.depth(device)
        };
        let kv_pages = kv_depth / ps;
        let hm = if host_states {
            self.last_host_state(tree, host)
        } else {
            None
        };
        let depth = |n: Option<N>| n.map_or(0, |n| tree.depth(n));
        let (dm_depth, hm_depth) = (depth(dm), depth(hm));
        let prefer_host = hm_depth > dm_depth;
        let mut capped = CappedMatch {
            device: if from_host { root } else { dm.unwrap_or(root) },
            host: hm.unwrap_or(root),
            cow_src: None,
            source: None,
            host_src: hm.and_then(|n| self.host_slot(n)),
            branching: None,
        };
        let mut state_depth = 0;
        if let Some(dm) = dm
            && !prefer_host
        {
            capped.cow_src = self.device_slot(dm);
            capped.source = Some(dm);
            state_depth = dm_depth;
        }
        if prefer_host {
            state_depth = hm_depth;
        }
        if !host_states {
            // The host tier's KV is reusable only as deep as the device state.
            capped.host = if from_host {
                dm.unwrap_or(root)
            } else {
                capped.device
            };
        }
        let aligned = self.align(kv_pages * ps);
        if aligned > state_depth {
            capped.branching = Some(aligned);
        }
        capped
    }

    // ----- leaves and eviction ----------------------------------------------------------

    /// Whether `node` holds a device state and no direct child does (the reference's
    /// leaf rule; the default policy asks about every descendant instead).
    fn is_direct_leaf<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        node != tree.root()
            && self.device_slot(node).is_some()
            && tree.children(node).all(|c| self.device_slot(c).is_none())
    }

    /// Reference tracking: a node that became a leaf is tracked, and its parent, no
    /// longer a leaf, is not (the parent is never added here).
    fn track<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if node == tree.root() {
            return;
        }
        if self.is_direct_leaf(tree, node) {
            self.leaves.insert(node);
        }
        if let Some(p) = tree.parent(node)
            && p != tree.root()
            && !self.is_direct_leaf(tree, p)
        {
            self.leaves.remove(&p);
        }
    }

    fn update_leaf<T: StateTree<Node = N>>(&mut self, tree: &T, node: Option<N>) {
        let Some(node) = node.filter(|&n| n != tree.root()) else {
            return;
        };
        if self.is_direct_leaf(tree, node) {
            self.leaves.insert(node);
        } else {
            self.leaves.remove(&node);
        }
    }

    /// Nodes whose device state may be evicted now, with their LRU keys, in no order:
    /// leaves (reference: as tracked; default: no device state anywhere below), neither
    /// `protected` nor locked on device.
    fn candidates<T: StateTree<Node = N>>(&self, tree: &T, protected: Option<N>) -> Vec<Aged<N>> {
        let leaves: Vec<N> = if self.config.reference {
            self.leaves.iter().copied().collect()
        } else {
            // Mark every node above a device state (a chain stops where an earlier one
            // marked); the unmarked device states are the leaves.
            let mut above = vec![false; tree.index_bound()];
            let devices = self.attached.iter().filter(|(_, a)| a.device.is_some());
            for (&node, _) in devices.clone() {
                let mut cur = tree.parent(node);
                while let Some(p) = cur {
                    let seen = &mut above[tree.index(p)];
                    if *seen {
                        break;
                    }
                    *seen = true;
                    cur = tree.parent(p);
                }
            }
            devices
                .filter(|(n, _)| !above[tree.index(**n)])
                .map(|(&n, _)| n)
                .collect()
        };
        leaves
            .into_iter()
            .filter(|&n| Some(n) != protected && !self.pinned_on_device(tree, n))
            .map(|n| (tree.age(n), n))
            .collect()
    }

    /// Whether a state cannot be evicted now. The reference keeps every state whose KV is
    /// locked on device (a running request's whole path: its states fill the pool and
    /// starve admissions); kvtier keeps only those a row of this plan copies from and
    /// those a write-back is reading.
    fn pinned_on_device<T: StateTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        if self.config.reference {
            return tree.on_device(node) && tree.device_locked(node);
        }
        self.protected.contains(&node) || self.pending.contains_key(&node)
    }

    /// A new plan: the last plan's copies have been made.
    pub fn begin_plan(&mut self) {
        self.protected.clear();
    }

    /// A row of this plan copies `node`'s state: it stays until the next plan.
    pub fn protect(&mut self, node: N) {
        self.protected.insert(node);
    }

    /// Evicts up to `n` device states, least recently used leaves first (the KV stays: a
    /// prefix then caps at a shallower state). Returns how many went.
    pub fn evict<T: StateTree<Node = N>>(&mut self, tree: &T, n: u32, protected: Option<N>) -> u32 {
        let cands = self.candidates(tree, protected);
        self.evict_from(tree, n, protected, cands)
    }

    /// [`Self::evict`] from these candidates (`Self::candidates`, oldest first).
    fn evict_from<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        n: u32,
        protected: Option<N>,
        mut cands: Vec<Aged<N>>,
    ) -> u32 {
        let mut evicted = 0;
        while evicted < n {
            // The oldest by `(time, seq)`, then node id: a total order, never an address.
            let Some(oldest) = (0..cands.len()).min_by_key(|&i| cands[i]) else {
                break;
            };
            let (_, leaf) = cands.swap_remove(oldest);
            if let Some(slot) = self.take_device(leaf) {
                self.device.release(slot);
                evicted += 1;
                self.stats.device_evicted += 1;
            }
            self.leaves.remove(&leaf);
            let Some(parent) = tree.parent(leaf).filter(|&p| p != tree.root()) else {
                continue;
            };
            if evicted == n && !self.config.reference {
                // Enough: whether the parent is a leaf now is for the next eviction to find.
                break;
            }
            let parent_is_leaf = if self.config.reference {
                self.is_direct_leaf(tree, parent)
            } else {
                self.device_slot(parent).is_some()
                    && self
                        .candidates(tree, protected)
                        .iter()
                        .any(|&(_, c)| c == parent)
            };
            if parent_is_leaf {
                self.leaves.insert(parent);
                if Some(parent) != protected && !self.pinned_on_device(tree, parent) {
                    cands.push((tree.age(parent), parent));
                }
            }
        }
        evicted
    }

    /// Makes `need` device slots free, evicting states if it must (never `protected`).
    /// The default policy evicts nothing when that cannot succeed; the reference evicts
    /// what it can either way.
    pub fn ensure_device<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        need: u32,
        protected: Option<N>,
    ) -> bool {
        let free = self.device.available();
        if free >= need {
            return true;
        }
        let cands = self.candidates(tree, protected);
        // Transactional (default policy): evict only what can succeed. The leaves alone
        // often suffice; else count what a cascade of evictions could reach.
        let leaves = cands.len() as u32;
        if !self.config.reference
            && free + leaves < need
            && free + self.evictable(tree, protected) < need
        {
            return false;
        }
        self.evict_from(tree, need - free, protected, cands);
        self.device.available() >= need
    }

    /// Whether `need` device slots could be made free (nothing changes).
    pub fn could_free<T: StateTree<Node = N>>(&mut self, tree: &T, need: u32) -> bool {
        let free = self.device.available();
        free >= need || free + self.evictable(tree, None) >= need
    }

    /// Device states a cascade of leaf evictions could reach (default policy).
    fn evictable<T: StateTree<Node = N>>(&self, tree: &T, protected: Option<N>) -> u32 {
        // A pinned state keeps every state above it from becoming a leaf.
        let mut blocked = BTreeSet::new();
        for (&node, a) in &self.attached {
            if a.device.is_some() && (Some(node) == protected || self.pinned_on_device(tree, node))
            {
                let mut cur = Some(node);
                while let Some(n) = cur {
                    if !blocked.insert(n) {
                        break;
                    }
                    cur = tree.parent(n);
                }
            }
        }
        self.attached
            .iter()
            .filter(|(n, a)| a.device.is_some() && !blocked.contains(*n))
            .count() as u32
    }

    fn take_device(&mut self, node: N) -> Option<SlotId> {
        let a = self.attached.get_mut(&node)?;
        let slot = a.device.take();
        a.device_off = None;
        if a.device.is_none() && a.host.is_none() {
            self.attached.remove(&node);
        }
        slot
    }

    fn take_host(&mut self, node: N) -> Option<SlotId> {
        let a = self.attached.get_mut(&node)?;
        let slot = a.host.take();
        a.host_off = None;
        if a.device.is_none() && a.host.is_none() {
            self.attached.remove(&node);
        }
        slot
    }

    // ----- publication -------------------------------------------------------------------

    /// Attaches `slot` to `node` as the state after its prefix. A node that already
    /// has a device state keeps it and the new slot is freed: both hold the same state,
    /// and the old one may be what a row of this plan copies or a write-back reads.
    /// The reference replaces it and frees the old slot at once (C.10 in
    /// docs/notes/mamba-reference.md); under its policy kvtier replaces it too where no
    /// row of this plan copies the old slot, so later slot ids stay the reference's,
    /// but one a write-back in flight reads is freed only at its acknowledgement.
    /// Returns whether it was attached.
    pub fn publish<T: StateTree<Node = N>>(&mut self, tree: &T, node: N, slot: Slot) -> bool {
        let held = self.device_slot(node).is_some();
        if held && self.config.reference && !self.protected.contains(&node) {
            let id = self.device.adopt(slot);
            let a = self.attached.entry(node).or_default();
            a.device_off = None;
            // A host copy of a state off the node's depth goes with it.
            let stale_host = a.host_off.take().and_then(|_| a.host.take());
            if let Some(old) = a.device.replace(id) {
                if self.pending.get(&node).is_some_and(|p| p.reads == old) {
                    let earlier = self.retiring.insert(node, old);
                    debug_assert!(earlier.is_none(), "a copy reads one slot");
                } else {
                    self.device.release(old);
                }
            }
            if let Some(host) = stale_host {
                self.host.release(host);
            }
            self.track(tree, node);
            self.stats.replaced += 1;
            return true;
        }
        if node == tree.root() || held {
            self.device.free(slot);
            self.stats.discarded += 1;
            return false;
        }
        debug_assert!(
            tree.depth(node).is_multiple_of(self.config.page_size),
            "a state off a page boundary"
        );
        let id = self.device.adopt(slot);
        self.attached.entry(node).or_default().device = Some(id);
        self.track(tree, node);
        self.stats.published += 1;
        true
    }

    /// Caches a stopped request's `slot` on `node` although it holds the state after
    /// `at` tokens (`None`: never written), not after the node's own (the reference
    /// policies only: the reference caches it there, C.3). A node that holds a device
    /// state already, or a write-back in flight, keeps it and the slot is freed; a host
    /// state alone does not stop it, as the reference looks at the device state only.
    /// Returns whether it was attached.
    pub fn publish_off_depth<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        node: N,
        slot: Slot,
        at: Option<u32>,
    ) -> bool {
        debug_assert!(
            self.config.reference,
            "states off their depth are the reference's"
        );
        let occupied = self.device_slot(node).is_some();
        if node == tree.root() || occupied || self.pending.contains_key(&node) {
            self.device.free(slot);
            self.stats.discarded += 1;
            return false;
        }
        let id = self.device.adopt(slot);
        let a = self.attached.entry(node).or_default();
        a.device = Some(id);
        a.device_off = Some(at.unwrap_or(UNWRITTEN));
        self.track(tree, node);
        self.stats.published += 1;
        true
    }

    /// Drops `node`'s device state because a deeper one on the same request's path
    /// supersedes it — unless a row of this plan or a write-back still reads it. A host
    /// copy stays.
    pub fn retire<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if self.pinned_on_device(tree, node) {
            return;
        }
        if let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.retired += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// A load-back into these device slots failed: the nodes they are attached to lose
    /// those device states (their host copies stay).
    pub fn discard_slots<T: StateTree<Node = N>>(&mut self, tree: &T, slots: &[SlotId]) {
        let nodes: Vec<N> = self
            .attached
            .iter()
            .filter(|(_, a)| a.device.is_some_and(|s| slots.contains(&s)))
            .map(|(&n, _)| n)
            .collect();
        for node in nodes {
            if let Some(slot) = self.take_device(node) {
                self.leaves.remove(&node);
                self.device.release(slot);
                self.update_leaf(tree, tree.parent(node));
            }
        }
    }

    /// Frees a request's slot that holds nothing worth caching.
    pub fn discard(&mut self, slot: Slot) {
        self.device.free(slot);
        self.stats.discarded += 1;
    }

    /// A retracted request's slot that the reference caches at the root (C.9 in
    /// docs/notes/mamba-reference.md; reference policies only): the first is held for
    /// good, as the reference holds it (nothing finds, evicts or frees a state at the
    /// root, so its pool is one slot smaller from then on); later ones are freed, as the
    /// reference frees a slot it finds the node holding a state for. A pool that would
    /// be left without room for a request's pair frees it too: there the reference
    /// stalls for good, and kvtier does not follow it. Returns whether it was held.
    pub fn hold_at_root(&mut self, slot: Slot) -> bool {
        debug_assert!(
            self.config.reference,
            "a state at the root is the reference's"
        );
        if self.at_root.is_some() || self.config.device_slots <= REQUEST_SLOTS {
            self.discard(slot);
            return false;
        }
        self.at_root = Some(self.device.adopt(slot));
        true
    }

    /// A fresh device slot for a request (its working or checkpoint slot), if one is
    /// free. Admission made room beforehand.
    pub fn allocate(&mut self) -> Option<Slot> {
        self.device.allocate()
    }

    // ----- what the tree tells the family -------------------------------------------------

    /// The node's device KV was evicted: its device state goes with it.
    pub fn on_device_evicted<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        if let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.dropped_with_kv += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// The node's device KV is being demoted (its host copy stays): a device state that
    /// also has a host copy goes; one without stays (it is the only copy).
    pub fn on_device_demoted<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        let both = self
            .attached
            .get(&node)
            .is_some_and(|a| a.device.is_some() && a.host.is_some());
        if both && let Some(slot) = self.take_device(node) {
            self.leaves.remove(&node);
            self.device.release(slot);
            self.stats.device_demoted += 1;
            self.update_leaf(tree, tree.parent(node));
        }
    }

    /// The node's host KV was evicted: its host state, and a host slot a write-back
    /// reserved for it, go.
    pub fn on_host_evicted(&mut self, node: N) {
        if let Some(copy) = self.pending.remove(&node) {
            self.host.release(copy.host);
        }
        if let Some(slot) = self.take_host(node) {
            self.host.release(slot);
            self.stats.host_dropped_with_kv += 1;
        }
        self.to_demote.remove(&node);
    }

    /// The node is about to be removed from the tree: everything attached to it goes
    /// first, so no set names a node that no longer exists (#357).
    pub fn on_node_removed<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) {
        self.leaves.remove(&node);
        if let Some(old) = self.retiring.remove(&node) {
            self.device.release(old);
        }
        if let Some(slot) = self.take_device(node) {
            self.device.release(slot);
            self.update_leaf(tree, tree.parent(node));
        }
        self.on_host_evicted(node);
    }

    // ----- host copies ------------------------------------------------------------------------

    /// Evicts host states, oldest first by `(time, seq)`, until `need` host slots are
    /// free; none is evicted when that cannot succeed. States whose host KV is locked,
    /// and `protected`, stay.
    fn ensure_host<T: StateTree<Node = N>>(&mut self, tree: &T, need: u32) -> bool {
        if self.host.available() >= need {
            return true;
        }
        let mut victims: Vec<N> = self
            .attached
            .iter()
            .filter(|(n, a)| a.host.is_some() && !tree.host_locked(**n))
            .map(|(&n, _)| n)
            .collect();
        if self.host.available() + (victims.len() as u32) < need && !self.config.reference {
            return false;
        }
        victims.sort_by_key(|&n| (tree.age(n), n));
        for node in victims {
            if self.host.available() >= need {
                break;
            }
            if let Some(slot) = self.take_host(node) {
                self.host.release(slot);
                self.to_demote.remove(&node);
                self.stats.host_evicted += 1;
            }
        }
        self.host.available() >= need
    }

    /// The state half of a write-back of `nodes` (their KV is being copied to host):
    /// each node with a device state, no host state and none reserved gets a host slot,
    /// reserved — not attached — until the write-back is acknowledged. Returns the device
    /// → host copies and the nodes they are for: all of them, or none when the host pool
    /// cannot make room for all.
    pub fn prepare_write_back<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        nodes: &[N],
    ) -> (Vec<TransferPair>, Vec<N>) {
        if !self.config.host_copies() {
            return (Vec::new(), Vec::new());
        }
        let wanted: Vec<(N, SlotId, Option<u32>)> = nodes
            .iter()
            .filter_map(|&n| {
                let a = self.attached.get(&n)?;
                let device = a.device?;
                (a.host.is_none() && !self.pending.contains_key(&n)).then_some((
                    n,
                    device,
                    a.device_off,
                ))
            })
            .collect();
        if wanted.is_empty() || !self.ensure_host(tree, wanted.len() as u32) {
            return (Vec::new(), Vec::new());
        }
        let mut pairs = Vec::with_capacity(wanted.len());
        let mut filled = Vec::with_capacity(wanted.len());
        for (node, device, off) in wanted {
            let Some(host) = self.host.take() else {
                debug_assert!(false, "ensure_host made room");
                break;
            };
            self.pending.insert(
                node,
                PendingCopy {
                    host,
                    reads: device,
                    off,
                },
            );
            filled.push(node);
            pairs.push(TransferPair {
                kind: TransferKind::Mamba,
                src: device,
                dst: host,
            });
        }
        (pairs, filled)
    }

    /// A host slot for a state an L3 prefetch brings (evicting older host states if it
    /// must); `None` without host copies or room.
    pub fn allocate_host<T: StateTree<Node = N>>(&mut self, tree: &T) -> Option<Slot> {
        if !self.config.host_copies() || !self.ensure_host(tree, 1) {
            return None;
        }
        self.host.allocate()
    }

    /// Attaches a host state `slot` (filled by an L3 prefetch) to `node`; a node that
    /// already has a host state keeps it and the slot is freed. Returns whether it was
    /// attached.
    pub fn attach_host<T: StateTree<Node = N>>(&mut self, tree: &T, node: N, slot: Slot) -> bool {
        let occupied = self.host_slot(node).is_some() || self.pending.contains_key(&node);
        if node == tree.root() || occupied {
            self.host.free(slot);
            return false;
        }
        let id = self.host.adopt(slot);
        self.attached.entry(node).or_default().host = Some(id);
        true
    }

    /// A write-back of exactly `nodes`' states finished. On success each gets its host
    /// copy (never an ancestor: #620), and device copies that now have a host copy are
    /// demoted once nothing holds them; on failure the reserved host slots go back and
    /// nothing is demoted.
    pub fn write_back_done<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        nodes: &[N],
        success: bool,
    ) {
        for &node in nodes {
            if let Some(old) = self.retiring.remove(&node) {
                self.device.release(old);
            }
            let Some(PendingCopy {
                host: slot, off, ..
            }) = self.pending.remove(&node)
            else {
                continue;
            };
            if success {
                let a = self.attached.entry(node).or_default();
                a.host = Some(slot);
                a.host_off = off;
                self.stats.host_attached += 1;
                self.to_demote.insert(node);
            } else {
                self.host.release(slot);
            }
        }
        if success {
            self.demote_idle(tree);
        }
    }

    /// Demotes every device copy that has a host copy and no device lock; the others wait
    /// for the next try (each release of a request, each acknowledgement).
    pub fn demote_idle<T: StateTree<Node = N>>(&mut self, tree: &T) {
        let waiting: Vec<N> = self.to_demote.iter().copied().collect();
        for node in waiting {
            let Some(a) = self.attached.get(&node).copied() else {
                self.to_demote.remove(&node);
                continue;
            };
            if a.host.is_none() || a.device.is_none() {
                self.to_demote.remove(&node);
                continue;
            }
            if tree.device_locked(node) {
                continue;
            }
            self.to_demote.remove(&node);
            self.on_device_demoted(tree, node);
        }
    }

    /// Loads `node`'s host state back: a device slot attached at once, and the host →
    /// device copy. `None` (nothing changed) without a host state, with a device state
    /// already, or without a free device slot.
    pub fn load_back<T: StateTree<Node = N>>(&mut self, tree: &T, node: N) -> Option<TransferPair> {
        let a = self.attached.get(&node)?;
        let host = a.host?;
        if a.device.is_some() {
            return None;
        }
        let dst = self.device.take()?;
        let a = self.attached.entry(node).or_default();
        a.device = Some(dst);
        a.device_off = a.host_off;
        self.track(tree, node);
        Some(TransferPair {
            kind: TransferKind::Mamba,
            src: host,
            dst,
        })
    }

    // ----- queries ----------------------------------------------------------------------------

    /// Counters and gauges.
    pub fn stats(&mut self) -> MambaStats {
        let mut s = self.stats;
        s.free_device_slots = self.device.available();
        s.free_host_slots = self.host.available();
        s.device_states = self
            .attached
            .values()
            .filter(|a| a.device.is_some())
            .count() as u32;
        s.host_states = self.attached.values().filter(|a| a.host.is_some()).count() as u32;
        s.held_at_root = u32::from(self.at_root.is_some());
        s
    }

    /// Slots out as live handles, device then host: those requests hold (working and
    /// checkpoint slots, host slots an L3 prefetch fills).
    pub fn held_slots(&mut self) -> [u32; 2] {
        [self.device.held(), self.host.held()]
    }

    /// Checks that every slot of each pool is free, held by a request, attached to
    /// exactly one node or reserved by one write-back; that states sit at page
    /// boundaries on live nodes; and (reference) that tracked leaves hold states.
    pub fn check_invariants<T: StateTree<Node = N>>(
        &mut self,
        tree: &T,
        live: impl Fn(N) -> bool,
    ) -> Result<(), MambaError> {
        let bad = |what: String| Err(MambaError::Invariant(what));
        let mut seen = [BTreeSet::new(), BTreeSet::new()];
        for (&node, a) in &self.attached {
            if !live(node) {
                return bad(format!("a state on a removed node {node:?}"));
            }
            if node == tree.root() || !tree.depth(node).is_multiple_of(self.config.page_size) {
                return bad(format!("a state at depth {}", tree.depth(node)));
            }
            if a.device.is_none() && a.host.is_none() {
                return bad(format!("an empty attachment on {node:?}"));
            }
            if (a.device.is_none() && a.device_off.is_some())
                || (a.host.is_none() && a.host_off.is_some())
            {
                return bad(format!("a depth recorded for a missing state on {node:?}"));
            }
            if (a.device_off.is_some() || a.host_off.is_some()) && !self.config.reference {
                return bad(format!(
                    "a state off its depth on {node:?} outside the reference policy"
                ));
            }
            for (t, slot) in [(0, a.device), (1, a.host)] {
                if let Some(s) = slot
                    && !seen[t].insert(s)
                {
                    return bad(format!("slot {s} attached twice"));
                }
            }
        }
        for (&node, &PendingCopy { host: s, .. }) in &self.pending {
            if !live(node) {
                return bad(format!("a reserved host slot on a removed node {node:?}"));
            }
            if !seen[1].insert(s) {
                return bad(format!("host slot {s} reserved twice"));
            }
        }
        if let Some(s) = self.at_root
            && (!self.config.reference || !seen[0].insert(s))
        {
            return bad(format!("device slot {s} held at the root"));
        }
        for (&node, &s) in &self.retiring {
            if !live(node) {
                return bad(format!("a retiring slot on a removed node {node:?}"));
            }
            if !seen[0].insert(s) {
                return bad(format!("device slot {s} retiring and attached"));
            }
        }
        if let Some(stale) = self.leaves.iter().find(|n| !live(**n)) {
            return bad(format!("a removed node {stale:?} is an eviction candidate"));
        }
        let device = self.device.available() + self.device.held() + seen[0].len() as u32;
        if device != self.device.total() {
            return bad(format!(
                "device slots: {device} free, held or attached of {}",
                self.device.total()
            ));
        }
        if self.config.host_copies() {
            let host = self.host.available() + self.host.held() + seen[1].len() as u32;
            if host != self.host.total() {
                return bad(format!(
                    "host slots: {host} free, held, attached or reserved of {}",
                    self.host.total()
                ));
            }
        }
        Ok(())
    }
}
