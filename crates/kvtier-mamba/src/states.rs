//! The cached states, by the prefix they follow.
//!
//! A state is the recurrent state after `tokens[0, d)`, `d` a multiple of the page size,
//! and is known by the rolling hash of that prefix ([`PageHash`] of its last page): two
//! requests with the same prefix find the same state, whatever shape the radix tree's
//! nodes have (a split leaves the state where it was: at its depth). An entry holds at
//! most one device and one host slot, and a host slot being written (pending until the
//! write-back that fills it is acknowledged).
//!
//! Entries form a forest: each links to the nearest entry above it on its path, found
//! when it is inserted. **Device leaves** — entries with a device slot and no entry below
//! them with one — are the eviction candidates, oldest first by `(time, seq)`: the step
//! a state was last used or published in, then its insertion sequence; never an
//! address, so every rank evicts alike.
//! Evicting a state keeps the KV: a prefix then caps at a shallower state.

use std::collections::{BTreeMap, BTreeSet};

use kvtier_types::OpId;
use kvtier_types::hash::PageHash;

use crate::slots::SlotId;

/// A state's identity: the rolling hash of the prefix it follows.
pub type StateKey = PageHash;

/// One cached state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Its depth in tokens (a multiple of the page size).
    pub depth: u32,
    /// The nearest entry above it on its path.
    pub parent: Option<StateKey>,
    /// Entries linking to it.
    pub children: u32,
    /// Children holding a device slot.
    pub device_children: u32,
    pub device: Option<SlotId>,
    pub host: Option<SlotId>,
    /// A host slot a write-back is filling, and that write-back.
    pub pending_host: Option<(OpId, SlotId)>,
    /// Requests reading the device copy (a copy-on-write source not yet copied).
    pub device_refs: u32,
    pub time: u64,
    pub seq: u64,
}

impl Entry {
    fn is_device_leaf(&self) -> bool {
        self.device.is_some() && self.device_children == 0
    }

    fn is_empty(&self) -> bool {
        self.device.is_none() && self.host.is_none() && self.pending_host.is_none()
    }
}

/// The index of cached states.
#[derive(Debug, Default)]
pub(crate) struct States {
    pub entries: BTreeMap<StateKey, Entry>,
    /// Device leaves by `(time, seq)`.
    pub device_leaves: BTreeSet<(u64, u64, StateKey)>,
    /// Host copies (valid) by `(time, seq)`: host eviction takes the oldest unread one.
    pub host_lru: BTreeSet<(u64, u64, StateKey)>,
    pub clock: u64,
    next_seq: u64,
}

impl States {
    /// The deepest entry on `path` (the hashes of a prefix's pages, root first) at most
    /// `max_pages` deep whose copy on the asked tier satisfies `has`.
    pub fn deepest(
        &self,
        path: &[StateKey],
        max_pages: usize,
        has: impl Fn(&Entry) -> bool,
    ) -> Option<(usize, StateKey)> {
        let max = max_pages.min(path.len());
        (1..=max).rev().find_map(|pages| {
            let key = path[pages - 1];
            self.entries
                .get(&key)
                .filter(|e| has(e))
                .map(|_| (pages, key))
        })
    }

    /// The entry for the prefix `path` (its last page's hash is the key), made if absent
    /// and linked under the nearest entry above it.
    pub fn entry(&mut self, path: &[StateKey], page_size: u32) -> StateKey {
        let key = *path.last().expect("a state follows at least one page");
        if self.entries.contains_key(&key) {
            return key;
        }
        let parent = path[..path.len() - 1]
            .iter()
            .rev()
            .find(|k| self.entries.contains_key(k))
            .copied();
        if let Some(p) = parent
            && let Some(pe) = self.entries.get_mut(&p)
        {
            pe.children += 1;
        }
        self.next_seq += 1;
        self.entries.insert(
            key,
            Entry {
                depth: path.len() as u32 * page_size,
                parent,
                children: 0,
                device_children: 0,
                device: None,
                host: None,
                pending_host: None,
                device_refs: 0,
                time: self.clock,
                seq: self.next_seq,
            },
        );
        key
    }

    /// A new step: states used from now on are newer than all used before.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// Marks an entry used in this step (it moves behind every state used earlier).
    pub fn touch(&mut self, key: &StateKey) {
        let clock = self.clock;
        let Some(e) = self.entries.get(key) else {
            return;
        };
        let (old, seq) = ((e.time, e.seq, *key), e.seq);
        let leaf = self.device_leaves.remove(&old);
        let host = self.host_lru.remove(&old);
        if let Some(e) = self.entries.get_mut(key) {
            e.time = clock;
        }
        if leaf {
            self.device_leaves.insert((clock, seq, *key));
        }
        if host {
            self.host_lru.insert((clock, seq, *key));
        }
    }

    /// Gives an entry a device slot (it had none).
    pub fn attach_device(&mut self, key: &StateKey, slot: SlotId) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        debug_assert!(e.device.is_none(), "a second device slot");
        e.device = Some(slot);
        let (parent, time, seq) = (e.parent, e.time, e.seq);
        if e.is_device_leaf() {
            self.device_leaves.insert((time, seq, *key));
        }
        if let Some(p) = parent {
            self.device_child_changed(&p, 1);
        }
    }

    /// Takes an entry's device slot away (the caller frees it); removes the entry when
    /// nothing is left in it.
    pub fn detach_device(&mut self, key: &StateKey) -> Option<SlotId> {
        let e = self.entries.get_mut(key)?;
        let slot = e.device.take()?;
        let (parent, time, seq) = (e.parent, e.time, e.seq);
        self.device_leaves.remove(&(time, seq, *key));
        if let Some(p) = parent {
            self.device_child_changed(&p, -1);
        }
        self.prune(key);
        Some(slot)
    }

    /// Gives an entry a valid host slot.
    pub fn attach_host(&mut self, key: &StateKey, slot: SlotId) {
        if let Some(e) = self.entries.get_mut(key) {
            debug_assert!(e.host.is_none(), "a second host slot");
            e.host = Some(slot);
            self.host_lru.insert((e.time, e.seq, *key));
        }
    }

    /// Takes an entry's host slot away (the caller frees it).
    pub fn detach_host(&mut self, key: &StateKey) -> Option<SlotId> {
        let e = self.entries.get_mut(key)?;
        let slot = e.host.take()?;
        self.host_lru.remove(&(e.time, e.seq, *key));
        self.prune(key);
        Some(slot)
    }

    fn device_child_changed(&mut self, parent: &StateKey, delta: i32) {
        let Some(p) = self.entries.get_mut(parent) else {
            return;
        };
        let was_leaf = p.is_device_leaf();
        p.device_children = p.device_children.saturating_add_signed(delta);
        let (is_leaf, time, seq) = (p.is_device_leaf(), p.time, p.seq);
        match (was_leaf, is_leaf) {
            (true, false) => {
                self.device_leaves.remove(&(time, seq, *parent));
            }
            (false, true) => {
                self.device_leaves.insert((time, seq, *parent));
            }
            _ => {}
        }
    }

    /// Removes an entry left without slots, relinking its children to its parent.
    pub fn prune(&mut self, key: &StateKey) {
        let Some(e) = self.entries.get(key) else {
            return;
        };
        if !e.is_empty() || e.device_refs > 0 {
            return;
        }
        let parent = e.parent;
        let children: Vec<StateKey> = if e.children == 0 {
            Vec::new()
        } else {
            self.entries
                .iter()
                .filter(|(_, c)| c.parent == Some(*key))
                .map(|(k, _)| *k)
                .collect()
        };
        let moved_device = children
            .iter()
            .filter(|k| self.entries[*k].device.is_some())
            .count() as i32;
        for child in &children {
            if let Some(c) = self.entries.get_mut(child) {
                c.parent = parent;
            }
        }
        self.entries.remove(key);
        if let Some(p) = parent {
            if let Some(pe) = self.entries.get_mut(&p) {
                pe.children = pe.children - 1 + children.len() as u32;
            }
            self.device_child_changed(&p, moved_device);
        }
    }
}
