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

mod eviction;
mod host;
mod matching;
mod publication;
mod tree_events;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use kvtier_types::{Policy, Tier, TreeView};

use crate::checkpoint::align_down;
use crate::{MambaError, SlotId, SlotPool};

/// What the family reads of the tree that hosts it, beyond what every family reads
/// ([`TreeView`]).
pub trait StateTree: TreeView {
    /// A node's children, in a fixed order.
    fn children(&self, node: Self::Node) -> impl Iterator<Item = Self::Node> + '_;
    /// Whether the node's KV is on device.
    fn on_device(&self, node: Self::Node) -> bool;
    /// Whether the node's KV is on host and someone holds a host lock on it.
    fn host_locked(&self, node: Self::Node) -> bool;
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
    /// Whose decisions the family makes where kvtier and the reference differ (its
    /// incremental leaf tracking, eviction that runs even when it cannot free enough,
    /// ...: the Mamba rules of [`Policy`]).
    pub policy: Policy,
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
            if (a.device_off.is_some() || a.host_off.is_some())
                && !self.config.policy.is_reference()
            {
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
            && (!self.config.policy.is_reference() || !seen[0].insert(s))
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
