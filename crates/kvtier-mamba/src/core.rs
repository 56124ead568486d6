//! The Mamba family's core: the two slot pools, the cached states and the state
//! write-backs in flight.
//!
//! Requests hold their working and checkpoint slots as [`Slot`] handles (a
//! [`RequestStates`] pair owned by the request's state in the scheduler), so every exit
//! — finish, abort, retraction — returns them by dropping the pair. Cached states hold
//! their slots as plain indices; the core frees those itself.

use std::collections::{BTreeMap, BTreeSet};

use kvtier_types::hash::PageHash;
use kvtier_types::{OpId, Tier, TransferKind, TransferPair};

use crate::checkpoint::align_down;
use crate::states::{StateKey, States};
use crate::{MambaError, Slot, SlotId, SlotPool};

/// Settings of the Mamba family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MambaConfig {
    /// KV page size in tokens: states sit at multiples of it.
    pub page_size: u32,
    /// Device state slots.
    pub device_slots: u32,
    /// Host state slots; 0 means no host copies.
    pub host_slots: u32,
    /// The scan kernel's chunk length (the branching length is aligned to it).
    pub kernel_chunk: u32,
}

impl MambaConfig {
    fn validate(&self) -> Result<(), MambaError> {
        if self.page_size == 0 {
            return Err(MambaError::Config("page_size must be positive"));
        }
        if self.kernel_chunk == 0 {
            return Err(MambaError::Config("kernel_chunk must be positive"));
        }
        if self.device_slots < 2 {
            return Err(MambaError::Config(
                "a request needs two device slots: device_slots must be at least 2",
            ));
        }
        Ok(())
    }

    /// Whether states get host copies.
    pub fn host_copies(&self) -> bool {
        self.host_slots > 0
    }
}

/// A request's own slots: the *working* state (live) and the *checkpoint* the next
/// forward may fill. Dropping the pair returns both.
#[derive(Debug)]
pub struct RequestStates {
    /// The live state.
    pub working: Slot,
    /// The snapshot destination, if the request has one now.
    pub checkpoint: Option<Slot>,
}

/// Where an admitted request's starting state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSource {
    /// A cached device state, copied into the working slot before the forward.
    Device(StateKey),
    /// A cached host state, loaded back onto device first.
    Host(StateKey),
}

/// How far a prompt's cached KV is reusable with its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateMatch {
    /// Pages reusable: the depth of the deepest state within the KV match (0: none).
    pub pages: u32,
    /// That state, if any.
    pub source: Option<StateSource>,
    /// The branching length (tokens): the KV match aligned to the kernel chunk, when it
    /// goes deeper than the state (the prefill then checkpoints there, to cache a
    /// deeper state for the next request).
    pub branching: Option<u32>,
}

/// What an admission took.
#[derive(Debug)]
pub struct Admitted {
    /// The request's pair.
    pub states: RequestStates,
    /// The device slot copied into the working slot before the forward (copy on
    /// write), if the request starts from a cached state.
    pub cow_src: Option<SlotId>,
    /// The host → device copy of a host state, if it starts from one.
    pub load_back: Option<TransferPair>,
}

/// Counters and gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MambaStats {
    /// Free device slots.
    pub free_device_slots: u32,
    /// Free host slots.
    pub free_host_slots: u32,
    /// Cached states with a device slot.
    pub device_states: u32,
    /// Cached states with a valid host slot.
    pub host_states: u32,
    /// Device states evicted.
    pub device_evictions: u64,
    /// Host states evicted.
    pub host_evictions: u64,
    /// Admissions refused for want of device slots.
    pub refused_admissions: u64,
    /// Checkpoints published into the cache.
    pub published: u64,
    /// Checkpoints dropped because their depth already had a state.
    pub duplicates: u64,
}

/// The Mamba family's core.
#[derive(Debug)]
pub struct MambaCore {
    config: MambaConfig,
    device: SlotPool,
    host: SlotPool,
    states: States,
    /// State write-backs in flight: the exact states each one fills.
    write_backs: BTreeMap<OpId, Vec<StateKey>>,
    /// States this step's admissions start from: not evicted until the next step.
    protected: BTreeSet<StateKey>,
    /// States whose host copy landed and whose device copy is to go once nothing
    /// reads it (retried every step).
    to_demote: BTreeSet<StateKey>,
    stats: MambaStats,
}

impl MambaCore {
    /// A core with empty pools. Fails on an unusable config.
    pub fn new(config: MambaConfig) -> Result<Self, MambaError> {
        config.validate()?;
        Ok(Self {
            device: SlotPool::new(Tier::Device, config.device_slots),
            host: SlotPool::new(Tier::Host, config.host_slots),
            config,
            states: States::default(),
            write_backs: BTreeMap::new(),
            protected: BTreeSet::new(),
            to_demote: BTreeSet::new(),
            stats: MambaStats::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MambaConfig {
        &self.config
    }

    /// A new scheduling step: the last step's copy sources have been copied, so they
    /// may be evicted, and device copies waiting for their readers may be demoted.
    pub fn begin_step(&mut self) {
        self.protected.clear();
        self.states.tick();
        self.demote_idle();
    }

    // ----- match --------------------------------------------------------------------

    /// How much of a prompt whose page hashes are `path` is reusable, given that its
    /// KV is cached `kv_device_pages` deep on device and `kv_host_pages` deep on host:
    /// the deepest state within the KV match, preferring a deeper host state (loaded
    /// back) to a shallower device one. KV depth without its state is never reusable.
    /// Read-only.
    pub fn match_prefix(
        &self,
        path: &[PageHash],
        kv_device_pages: u32,
        kv_host_pages: u32,
    ) -> StateMatch {
        let device = self
            .states
            .deepest(path, kv_device_pages as usize, |e| e.device.is_some());
        let host = if self.config.host_copies() {
            self.states
                .deepest(path, kv_host_pages.max(kv_device_pages) as usize, |e| {
                    e.host.is_some()
                })
        } else {
            None
        };
        let dm = device.map_or(0, |(pages, _)| pages);
        let (pages, source) = match host {
            Some((hm, key)) if hm > dm => (hm, Some(StateSource::Host(key))),
            _ => (dm, device.map(|(_, key)| StateSource::Device(key))),
        };
        let ps = self.config.page_size;
        let kv_tokens = kv_device_pages.max(kv_host_pages) * ps;
        let aligned = align_down(kv_tokens, self.config.kernel_chunk);
        StateMatch {
            pages: pages as u32,
            source,
            branching: (aligned > pages as u32 * ps).then_some(aligned),
        }
    }

    /// The state a retracted request resumes from: the deepest device state within
    /// `kv_pages` of KV on either tier (a device state survives its KV's demotion to
    /// host when it has no host copy), else the deepest host state. `None`: nothing to
    /// resume from. The caller checks that the depth is the state it needs. Read-only.
    pub fn match_for_recovery(
        &self,
        path: &[PageHash],
        kv_pages: u32,
    ) -> Option<(u32, StateSource)> {
        let max = kv_pages as usize;
        if let Some((pages, key)) = self.states.deepest(path, max, |e| e.device.is_some()) {
            return Some((pages as u32, StateSource::Device(key)));
        }
        self.states
            .deepest(path, max, |e| e.host.is_some())
            .map(|(pages, key)| (pages as u32, StateSource::Host(key)))
    }

    // ----- admission ------------------------------------------------------------------

    /// Device slots an admission from `source` needs: the pair, and one more for a
    /// host state's load-back.
    pub fn slots_needed(source: Option<StateSource>) -> u32 {
        2 + u32::from(matches!(source, Some(StateSource::Host(_))))
    }

    /// Whether an admission needing `need` device slots could get them, evicting
    /// unprotected states. Read-only.
    pub fn can_admit(&mut self, need: u32) -> bool {
        let free = self.device.available();
        free >= need || free + self.evictable_device() >= need
    }

    /// Admits a request starting from `source` (or from nothing): evicts what it must
    /// (never `source`), loads a host state back (its device slot attached at once),
    /// and hands out a working and a checkpoint slot. `None` with nothing changed when
    /// the slots cannot be had.
    pub fn admit(&mut self, source: Option<StateSource>) -> Option<Admitted> {
        let need = Self::slots_needed(source);
        let key = source.map(|s| match s {
            StateSource::Device(k) | StateSource::Host(k) => k,
        });
        if let Some(key) = key {
            self.protected.insert(key);
        }
        if !self.ensure_device(need) {
            self.stats.refused_admissions += 1;
            return None;
        }
        let (cow_src, load_back) = match source {
            None => (None, None),
            Some(StateSource::Device(key)) => {
                self.states.touch(&key);
                (self.states.entries.get(&key).and_then(|e| e.device), None)
            }
            Some(StateSource::Host(key))
                if self
                    .states
                    .entries
                    .get(&key)
                    .is_some_and(|e| e.device.is_some()) =>
            {
                // Its device copy outlived the KV above it: copy from that instead.
                self.states.touch(&key);
                (self.states.entries.get(&key).and_then(|e| e.device), None)
            }
            Some(StateSource::Host(key)) => {
                let host = self.states.entries.get(&key).and_then(|e| e.host);
                let dst = self.device.take();
                match (host, dst) {
                    (Some(host), Some(dst)) => {
                        self.states.attach_device(&key, dst);
                        self.states.touch(&key);
                        let pair = TransferPair {
                            kind: TransferKind::Mamba,
                            src: host,
                            dst,
                        };
                        (Some(dst), Some(pair))
                    }
                    (_, dst) => {
                        debug_assert!(false, "a matched host state without its slot");
                        if let Some(dst) = dst {
                            self.device.release(dst);
                        }
                        (None, None)
                    }
                }
            }
        };
        let (Some(working), Some(checkpoint)) = (self.device.allocate(), self.device.allocate())
        else {
            debug_assert!(false, "ensure_device made room for the pair");
            return None;
        };
        Some(Admitted {
            states: RequestStates {
                working,
                checkpoint: Some(checkpoint),
            },
            cow_src,
            load_back,
        })
    }

    /// A fresh checkpoint slot for a request that published its last one (a later
    /// chunk, or the first decode), evicting if it must. `None` when none can be had.
    pub fn renew_checkpoint(&mut self) -> Option<Slot> {
        if !self.ensure_device(1) {
            return None;
        }
        self.device.allocate()
    }

    // ----- publication ------------------------------------------------------------------

    /// Caches `slot` as the state after the prefix whose page hashes are `path`. If that
    /// depth already has a device state, the slot is freed instead. Returns whether it
    /// was attached.
    pub fn publish(&mut self, path: &[PageHash], slot: Slot) -> Result<bool, MambaError> {
        if path.is_empty() {
            self.device.free(slot);
            return Err(MambaError::EmptyPath);
        }
        let key = self.states.entry(path, self.config.page_size);
        let has = self
            .states
            .entries
            .get(&key)
            .is_some_and(|e| e.device.is_some());
        if has {
            self.stats.duplicates += 1;
            self.device.free(slot);
            self.states.touch(&key);
            return Ok(false);
        }
        let id = self.device.adopt(slot);
        self.states.attach_device(&key, id);
        self.states.touch(&key);
        self.stats.published += 1;
        Ok(true)
    }

    // ----- eviction -----------------------------------------------------------------------

    fn pinned(&self, key: &StateKey) -> bool {
        self.protected.contains(key)
            || self
                .states
                .entries
                .get(key)
                .is_some_and(|e| e.device_refs > 0)
    }

    /// Device states leaf-first eviction could reach: every one neither pinned nor
    /// above a pinned one (a pinned state keeps the states above it from becoming
    /// leaves).
    fn evictable_device(&self) -> u32 {
        let mut blocked = BTreeSet::new();
        for (key, e) in &self.states.entries {
            if e.device.is_some() && self.pinned(key) {
                let mut cur = Some(*key);
                while let Some(k) = cur {
                    if !blocked.insert(k) {
                        break;
                    }
                    cur = self.states.entries.get(&k).and_then(|e| e.parent);
                }
            }
        }
        self.states
            .entries
            .iter()
            .filter(|(k, e)| e.device.is_some() && !blocked.contains(*k))
            .count() as u32
    }

    /// Evicts device states, oldest unpinned leaf first, until `need` slots are free;
    /// `false`, with nothing evicted, when that is not possible.
    pub fn ensure_device(&mut self, need: u32) -> bool {
        let free = self.device.available();
        if free >= need {
            return true;
        }
        if free + self.evictable_device() < need {
            return false;
        }
        while self.device.available_hint() < need {
            let victim = self
                .states
                .device_leaves
                .iter()
                .map(|&(_, _, key)| key)
                .find(|key| !self.pinned(key));
            let Some(key) = victim else {
                debug_assert!(false, "the evictable count promised a leaf");
                break;
            };
            if let Some(slot) = self.states.detach_device(&key) {
                self.device.release(slot);
                self.stats.device_evictions += 1;
            }
        }
        self.device.available_hint() >= need
    }

    /// Evicts host states, oldest first, until `need` host slots are free; `false`,
    /// with nothing evicted, when that is not possible. (A host state being loaded back
    /// this step is protected.)
    fn ensure_host(&mut self, need: u32) -> bool {
        if self.host.available() >= need {
            return true;
        }
        let victims: Vec<StateKey> = self
            .states
            .host_lru
            .iter()
            .map(|&(_, _, k)| k)
            .filter(|k| !self.protected.contains(k))
            .collect();
        if self.host.available_hint() + (victims.len() as u32) < need {
            return false;
        }
        for key in victims {
            if self.host.available_hint() >= need {
                break;
            }
            if let Some(slot) = self.states.detach_host(&key) {
                self.host.release(slot);
                self.stats.host_evictions += 1;
            }
        }
        self.host.available_hint() >= need
    }

    /// The KV under these states left `tier` (evicted): their slots on that tier go
    /// (the state alone cannot be reused, and would only hold a slot). A copy in flight
    /// keeps its slots until acknowledged (the KV it copies is pinned too, so the radix
    /// cannot have evicted it).
    pub fn drop_states(&mut self, keys: &[PageHash], tier: Tier) {
        for key in keys {
            let busy = tier == Tier::Device
                && self
                    .states
                    .entries
                    .get(key)
                    .is_some_and(|e| e.device_refs > 0);
            if busy {
                continue;
            }
            let slot = match tier {
                Tier::Device => self.states.detach_device(key).map(|s| (s, Tier::Device)),
                Tier::Host => self.states.detach_host(key).map(|s| (s, Tier::Host)),
            };
            match slot {
                Some((s, Tier::Device)) => self.device.release(s),
                Some((s, Tier::Host)) => self.host.release(s),
                None => {}
            }
        }
    }

    // ----- host copies ----------------------------------------------------------------------

    /// Prepares the state half of write-back `op`: every state among `keys` with a
    /// device slot and no host copy (valid or pending) gets a host slot, pending until
    /// `op` is acknowledged (evicting older host states if it must). Returns the device
    /// → host copies: for all of them or, when the host pool cannot make room for all,
    /// for none.
    pub fn prepare_write_back(
        &mut self,
        op: OpId,
        keys: &[PageHash],
    ) -> Result<Vec<TransferPair>, MambaError> {
        if self.write_backs.contains_key(&op) {
            return Err(MambaError::DuplicateWriteBack(op));
        }
        if !self.config.host_copies() {
            return Ok(Vec::new());
        }
        let wanted: Vec<(StateKey, SlotId)> = keys
            .iter()
            .filter_map(|key| {
                let e = self.states.entries.get(key)?;
                let device = e.device?;
                (e.host.is_none() && e.pending_host.is_none()).then_some((*key, device))
            })
            .collect();
        // All or nothing: host states are evicted only if every copy then has a slot.
        if wanted.is_empty() || !self.ensure_host(wanted.len() as u32) {
            return Ok(Vec::new());
        }
        let mut pairs = Vec::with_capacity(wanted.len());
        let mut filled = Vec::with_capacity(wanted.len());
        for (key, device) in wanted {
            let Some(host) = self.host.take() else {
                debug_assert!(false, "ensure_host made room");
                break;
            };
            if let Some(e) = self.states.entries.get_mut(&key) {
                e.pending_host = Some((op, host));
                e.device_refs += 1;
            }
            filled.push(key);
            pairs.push(TransferPair {
                kind: TransferKind::Mamba,
                src: device,
                dst: host,
            });
        }
        self.write_backs.insert(op, filled);
        Ok(pairs)
    }

    /// Write-back `op` finished. On success exactly its states get their host copies,
    /// and device copies that now have a host copy and no reader are demoted (the
    /// others when their readers are done); on failure its pending host slots are
    /// freed and nothing is demoted (#620).
    pub fn ack_write_back(&mut self, op: OpId, success: bool) -> Result<(), MambaError> {
        let Some(keys) = self.write_backs.remove(&op) else {
            return Err(MambaError::UnknownWriteBack(op));
        };
        for key in &keys {
            let Some(e) = self.states.entries.get_mut(key) else {
                continue;
            };
            e.device_refs = e.device_refs.saturating_sub(1);
            let Some((pending_op, slot)) = e.pending_host.take() else {
                continue;
            };
            debug_assert_eq!(pending_op, op, "a pending slot of another write-back");
            if success {
                self.states.attach_host(key, slot);
                self.to_demote.insert(*key);
            } else {
                self.host.release(slot);
                self.states.prune(key);
            }
        }
        if success {
            self.demote_idle();
        }
        Ok(())
    }

    /// Demotes every waiting device copy that has a host copy and no reader; the
    /// others wait for the next try.
    pub fn demote_idle(&mut self) {
        let waiting: Vec<StateKey> = self.to_demote.iter().copied().collect();
        for key in waiting {
            let Some(e) = self.states.entries.get(&key) else {
                self.to_demote.remove(&key);
                continue;
            };
            if e.host.is_none() || e.device.is_none() {
                self.to_demote.remove(&key);
                continue;
            }
            if e.device_refs > 0 || self.protected.contains(&key) {
                continue;
            }
            self.to_demote.remove(&key);
            if let Some(slot) = self.states.detach_device(&key) {
                self.device.release(slot);
            }
        }
    }

    // ----- queries ------------------------------------------------------------------------

    /// Counters and gauges.
    pub fn stats(&mut self) -> MambaStats {
        let mut s = self.stats;
        s.free_device_slots = self.device.available();
        s.free_host_slots = if self.config.host_copies() {
            self.host.available()
        } else {
            0
        };
        s.device_states = self
            .states
            .entries
            .values()
            .filter(|e| e.device.is_some())
            .count() as u32;
        s.host_states = self
            .states
            .entries
            .values()
            .filter(|e| e.host.is_some())
            .count() as u32;
        s
    }

    /// The device slot of the cached state after `path`, if any.
    pub fn device_slot(&self, path: &[PageHash]) -> Option<SlotId> {
        path.last()
            .and_then(|k| self.states.entries.get(k))
            .and_then(|e| e.device)
    }

    /// The host slot (valid) of the cached state after `path`, if any.
    pub fn host_slot(&self, path: &[PageHash]) -> Option<SlotId> {
        path.last()
            .and_then(|k| self.states.entries.get(k))
            .and_then(|e| e.host)
    }

    /// Slots held by requests (live handles), per tier.
    pub fn request_slots(&mut self) -> u32 {
        self.device.held()
    }

    /// Checks that every slot is free, held by a request, or attached to exactly one
    /// state, that the leaf set is exactly the device leaves, and that links agree.
    pub fn check_invariants(&mut self) -> Result<(), MambaError> {
        let bad = |what: String| Err(MambaError::Invariant(what));
        let mut attached = [BTreeSet::new(), BTreeSet::new()];
        let mut pending = 0u32;
        for (key, e) in &self.states.entries {
            if e.depth == 0 || !e.depth.is_multiple_of(self.config.page_size) {
                return bad(format!("a state at depth {}", e.depth));
            }
            if e.device.is_none() && e.host.is_none() && e.pending_host.is_none() {
                return bad("an entry without slots".into());
            }
            for (t, slot) in [(0, e.device), (1, e.host)] {
                if let Some(s) = slot
                    && !attached[t].insert(s)
                {
                    return bad(format!("slot {s} attached twice"));
                }
            }
            if let Some((_, s)) = e.pending_host {
                pending += 1;
                if !attached[1].insert(s) {
                    return bad(format!("host slot {s} attached twice"));
                }
            }
            if let Some(p) = e.parent {
                match self.states.entries.get(&p) {
                    Some(pe) if pe.depth < e.depth => {}
                    _ => {
                        return bad(format!(
                            "a state at depth {} under a missing or deeper parent",
                            e.depth
                        ));
                    }
                }
            }
            let leaf = e.device.is_some() && e.device_children == 0;
            if leaf != self.states.device_leaves.contains(&(e.time, e.seq, *key)) {
                return bad(format!("leaf tracking wrong at depth {}", e.depth));
            }
            let device_children = self
                .states
                .entries
                .values()
                .filter(|c| c.parent == Some(*key) && c.device.is_some())
                .count() as u32;
            if device_children != e.device_children {
                return bad(format!("device children miscounted at depth {}", e.depth));
            }
        }
        if self.states.device_leaves.len()
            != self
                .states
                .entries
                .values()
                .filter(|e| e.device.is_some() && e.device_children == 0)
                .count()
        {
            return bad("a stale device leaf".into());
        }
        let device = self.device.available() + self.device.held() + attached[0].len() as u32;
        if device != self.device.total() {
            return bad(format!(
                "device slots: {device} free, held or attached of {}",
                self.device.total()
            ));
        }
        if self.config.host_copies() {
            let host = self.host.available() + self.host.held() + attached[1].len() as u32;
            if host != self.host.total() {
                return bad(format!(
                    "host slots: {host} free, held or attached of {} ({pending} pending)",
                    self.host.total()
                ));
            }
        }
        Ok(())
    }
}
