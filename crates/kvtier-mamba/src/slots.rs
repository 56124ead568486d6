//! State slot pools and the RAII slot handle.
//!
//! A pool hands out its **smallest free index** (ranks that free slots in different
//! orders still allocate alike, which tensor-parallel determinism needs). Unlike the KV
//! page pools, a state pool has no dummy slot: a pool of `total` has slots
//! `0..total`, as the reference's Mamba pools do (their tests count on it: 24 slots
//! hold 12 request pairs). A [`Slot`] held outside the pool is move-only; dropping it
//! sends its index home, and the pool takes returns back, sorted, before its next
//! allocation.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use kvtier_host::{Lease, ReleaseQueue};
use kvtier_types::Tier;

/// The index of a state slot in its pool.
pub type SlotId = u32;

/// A pool of recurrent-state slots on one tier.
#[derive(Debug)]
pub struct SlotPool {
    tier: Tier,
    total: u32,
    free: BinaryHeap<Reverse<SlotId>>,
    returns: ReleaseQueue<SlotId>,
    /// Slots handed out as handles and not yet back (dropped, freed or adopted).
    held: u32,
    /// Debug builds track which slots are free to catch double frees.
    #[cfg(debug_assertions)]
    is_free: Vec<bool>,
}

/// A state slot held outside its pool: dropping it returns the index.
#[derive(Debug)]
#[must_use = "dropping a slot frees it"]
pub struct Slot {
    lease: Lease<SlotId>,
    tier: Tier,
}

impl Slot {
    /// Its index.
    pub fn id(&self) -> SlotId {
        self.lease.get()
    }

    /// Its tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }
}

impl SlotPool {
    /// A pool of `total` slots on `tier`: `0..total`.
    pub fn new(tier: Tier, total: u32) -> Self {
        Self {
            tier,
            total,
            free: (0..total).map(Reverse).collect(),
            returns: ReleaseQueue::new(),
            held: 0,
            #[cfg(debug_assertions)]
            is_free: vec![true; total as usize],
        }
    }

    /// Slots out as live handles (after taking back dropped ones).
    pub fn held(&mut self) -> u32 {
        self.drain_returns();
        self.held
    }

    /// Its tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Slots in the pool.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Free slots without taking back dropped handles (a lower bound of
    /// [`Self::available`]).
    pub fn available_hint(&self) -> u32 {
        self.free.len() as u32
    }

    /// Free slots right now (after taking back dropped handles).
    pub fn available(&mut self) -> u32 {
        self.drain_returns();
        self.free.len() as u32
    }

    /// Takes back every slot dropped since the last call, and returns them in ascending
    /// order (the order the reference drains its host pool in).
    pub fn drain_returns(&mut self) -> Vec<SlotId> {
        let mut back = Vec::new();
        self.returns.drain(|id| back.push(id));
        back.sort_unstable();
        for &id in &back {
            self.held -= 1;
            self.put_back(id);
        }
        back
    }

    /// The smallest free slot, held by the caller; `None` when the pool is empty.
    pub fn allocate(&mut self) -> Option<Slot> {
        self.drain_returns();
        let Reverse(id) = self.free.pop()?;
        #[cfg(debug_assertions)]
        {
            self.is_free[id as usize] = false;
        }
        self.held += 1;
        Some(Slot {
            lease: Lease::new(id, self.returns.releaser()),
            tier: self.tier,
        })
    }

    /// Takes a slot handle back at once (no channel round trip).
    pub fn free(&mut self, slot: Slot) {
        let id = self.adopt(slot);
        self.release(id);
    }

    /// Turns a handle into an index the pool's owner keeps (a slot attached to a cached
    /// state): it no longer returns itself when dropped; [`Self::release`] frees it.
    pub fn adopt(&mut self, slot: Slot) -> SlotId {
        debug_assert_eq!(slot.tier, self.tier, "a slot of another tier");
        self.held -= 1;
        slot.lease.into_inner()
    }

    /// Frees an index the owner kept (see [`Self::adopt`]).
    pub fn release(&mut self, id: SlotId) {
        self.put_back(id);
    }

    /// Allocates an index the owner keeps (never a handle).
    pub fn take(&mut self) -> Option<SlotId> {
        self.allocate().map(|slot| self.adopt(slot))
    }

    fn put_back(&mut self, id: SlotId) {
        if id >= self.total {
            // Out of range: ignored, as the reference does.
            return;
        }
        #[cfg(debug_assertions)]
        {
            debug_assert!(!self.is_free[id as usize], "slot {id} freed twice");
            self.is_free[id as usize] = true;
        }
        self.free.push(Reverse(id));
    }
}
