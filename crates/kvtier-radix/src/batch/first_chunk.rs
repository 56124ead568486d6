//! A first chunk's admission: its prefetch check, its match, the room it makes and the
//! path it pins.

use kvtier_types::{Tier, Token, TransferPair};

use super::*;
use crate::{Hosted, Match, NodeId, NodeLock, RadixCore};

impl RadixCore {
    /// Starts an L3 prefetch when the consecutive L3 hits run more than the threshold
    /// past what the host holds. The host prefix is locked before any host eviction.
    pub(super) fn try_prefetch(&mut self, check: &PrefetchCheck) -> Result<Outcome, PrefetchSkip> {
        let ps = self.page_size();
        let hit = (check.tokens.len() / ps as usize) as u32;
        let (probe, reached) = self.probe_marked(&check.tokens);
        let host = probe.host_pages;
        let n = hit.saturating_sub(host);
        if n <= check.threshold {
            self.mark(&check.tokens, reached);
            return Err(if n == 0 {
                PrefetchSkip::NothingMissing
            } else {
                PrefetchSkip::BelowThreshold
            });
        }
        let m = self.match_prefix(&check.tokens);
        debug_assert_eq!(m.host_pages, host);
        let host_lock = self.lock(m.host, Tier::Host);
        if !self.ensure_free(Tier::Host, n) {
            self.unlock(host_lock);
            return Err(PrefetchSkip::NoHostRoom);
        }
        let Some(pages) = self.allocate(Tier::Host, n as usize) else {
            self.unlock(host_lock);
            return Err(PrefetchSkip::NoHostRoom);
        };
        // A hybrid prefix comes with the state at its end, into a host state slot.
        let state = match self.with_states(|states, tree| states.allocate_host(tree)) {
            None => None,
            Some(Some(slot)) => Some(slot),
            Some(None) => {
                self.unlock(host_lock);
                let freed = self.free(Tier::Host, pages);
                debug_assert!(freed.is_ok(), "{freed:?}");
                return Err(PrefetchSkip::NoStateSlot);
            }
        };
        Ok(Outcome::Prefetch(Box::new(PrefetchStart {
            host_lock,
            pages,
            start_page: host,
            state,
        })))
    }

    pub(super) fn first_chunk(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        let FirstChunkAsk {
            tokens,
            use_host,
            reuse,
            ..
        } = ask;
        let ps = self.page_size();
        if self.policy().commits_before_it_fits() {
            // The reference commits the match (split, touch) before it knows whether
            // the request fits.
            let m = self.committed_match(tokens, reuse);
            let host = if use_host { m.host_pages } else { 0 };
            let shape = ask.shape(m.device_pages, host, ps);
            return self.admit_first_chunk(m, shape, ask);
        }
        let (probe, reached) = if reuse {
            self.probe_marked(tokens)
        } else {
            (crate::Probe::default(), self.root())
        };
        let host = if use_host { probe.host_pages } else { 0 };
        let shape = ask.shape(probe.device_pages, host, ps);
        if !self.can_free(Tier::Device, shape.need, probe.device_unlocked_pages) {
            self.mark(tokens, reached);
            return Outcome::waits();
        }
        self.unmark(tokens);
        let m = self.committed_match(tokens, reuse);
        debug_assert_eq!(
            (m.device_pages, if use_host { m.host_pages } else { 0 }),
            (probe.device_pages, host)
        );
        self.admit_first_chunk(m, shape, ask)
    }

    /// The committing match of a first chunk (the root when reuse is off).
    pub(crate) fn committed_match(&mut self, tokens: &[Token], reuse: bool) -> Match {
        if reuse {
            return self.match_prefix(tokens);
        }
        let root = self.root();
        Match {
            device: root,
            device_pages: 0,
            host: root,
            host_pages: 0,
        }
    }

    /// The admission skeleton over a committed match: the family caps it, room is made
    /// for the KV, then for the family's part, the path is pinned, and the pages and
    /// the family's part are given.
    fn admit_first_chunk(
        &mut self,
        m: Match,
        shape: ChunkShape,
        ask: FirstChunkAsk<'_>,
    ) -> Outcome {
        let (m, shape) = if self.has_registered() {
            let capped = self.with_family(|family, tree| family.cap_match(tree, m));
            let host = if ask.use_host { capped.host_pages } else { 0 };
            (
                capped,
                ask.shape(capped.device_pages, host, self.page_size()),
            )
        } else {
            (m, shape)
        };
        let Some(guard) = self.make_room(m.device, shape.need) else {
            return Outcome::waits();
        };
        if !self.reserve_family(&m) {
            self.unlock(guard);
            return Outcome::waits();
        }
        let Some(pinned) = self.pin_path(m, guard, ask.use_host) else {
            return Outcome::waits();
        };
        let family = self.grant_family();
        self.admitted(pinned, &shape, family)
    }

    /// Room for a registered family's part of one more request (`m` locked).
    pub(super) fn reserve_family(&mut self, m: &Match) -> bool {
        !self.has_registered() || self.with_family(|family, tree| family.reserve(tree, m))
    }

    /// An admitted request's part of a registered family, its room made.
    pub(super) fn grant_family(&mut self) -> FamilyGrant {
        if !self.has_registered() {
            return FamilyGrant::Dense;
        }
        let request = self.with_family(|family, tree| family.grant(tree));
        FamilyGrant::Lease(self.lease(request))
    }

    /// The end of every admission, its path pinned and room made: the request's own
    /// pages and its page table (the locked path's device pages).
    pub(crate) fn admitted(
        &mut self,
        (device_lock, host_lock, load_back): Pinned,
        shape: &ChunkShape,
        family: FamilyGrant,
    ) -> Outcome {
        let Some(pages) = self.allocate(Tier::Device, shape.own_pages as usize) else {
            debug_assert!(false, "admission reserved the pages");
            return Outcome::waits();
        };
        let ps = self.page_size();
        let mut prefix_pages =
            Vec::with_capacity((shape.begin_pages + shape.tokens.div_ceil(ps)) as usize);
        self.device_path_pages(device_lock.node(), &mut prefix_pages);
        Outcome::Admitted(Box::new(Admission {
            tokens: shape.tokens,
            begin_pages: shape.begin_pages,
            device_lock,
            host_lock,
            load_back,
            pages,
            tail_free: shape.tail_free,
            prefix_pages,
            family,
            groups: Vec::new(),
            capped_pages: 0,
            dropped_pages: 0,
        }))
    }

    /// Makes `need` device pages free with `device` locked meanwhile; returns that lock
    /// (the guard), or `None` with nothing locked.
    pub(crate) fn make_room(&mut self, device: NodeId, need: u32) -> Option<NodeLock> {
        let guard = self.lock(device, Tier::Device);
        if !self.ensure_free(Tier::Device, need) {
            // Only the reference's admission (and hybrid admission) tries without a
            // probe first.
            debug_assert!(
                self.policy().commits_before_it_fits() || !matches!(self.hosted(), Hosted::Dense),
                "admission probe promised {need} pages"
            );
            self.unlock(guard);
            return None;
        }
        Some(guard)
    }

    /// Locks the path the request will read, the room for it made (`guard` goes): with
    /// a deeper host match, device pages are attached to the host-only nodes (the
    /// load-back) and both tiers are locked. `None` with nothing changed.
    pub(crate) fn pin_path(&mut self, m: Match, guard: NodeLock, use_host: bool) -> Option<Pinned> {
        let pinned = if use_host && m.host_pages > m.device_pages {
            let host_lock = self.lock(m.host, Tier::Host);
            let nodes = self.nodes_without(Tier::Device, m.host);
            match self.attach_for_load_back(&nodes) {
                Some(pairs) => Some((self.lock(m.host, Tier::Device), Some(host_lock), pairs)),
                None => {
                    self.unlock(host_lock);
                    None
                }
            }
        } else {
            Some((self.lock(m.device, Tier::Device), None, Vec::new()))
        };
        self.unlock(guard);
        pinned
    }
}

/// What a first chunk asks of the cache: the prompt's full pages except the last
/// token's, its length, the tokens left in the step's budget, the decode reserve, and
/// whether host pages and prefix reuse may serve it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstChunkAsk<'a> {
    pub tokens: &'a TokenRef,
    pub prefill_len: u32,
    pub remaining: u32,
    pub d: u32,
    pub use_host: bool,
    pub reuse: bool,
}

impl FirstChunkAsk<'_> {
    /// The chunk's page arithmetic over a prefix matched `device` pages deep on device
    /// and `host` pages deep on host.
    pub(crate) fn shape(&self, device: u32, host: u32, ps: u32) -> ChunkShape {
        ChunkShape::new(device, host, self.prefill_len, self.remaining, self.d, ps)
    }
}

/// A pinned path: the device lock, the host lock on a load-back source, and the
/// load-back's copies.
pub(crate) type Pinned = (NodeLock, Option<NodeLock>, Vec<TransferPair>);

/// The page arithmetic of a first chunk over a prefix matched `device` pages deep on
/// device and `host` pages deep on host (or of a recovery: no tokens, the decode
/// reserve's pages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkShape {
    /// Prefix pages reused.
    pub begin_pages: u32,
    /// Tokens of the chunk.
    pub tokens: u32,
    /// Pages of the request's own (chunk and decode reserve).
    pub own_pages: u32,
    /// Free slots left in the last of them.
    pub tail_free: u32,
    /// Device pages to make free: the load-back and the own pages.
    pub need: u32,
}

impl ChunkShape {
    pub(crate) fn new(
        device: u32,
        host: u32,
        prefill_len: u32,
        budget: u32,
        d: u32,
        ps: u32,
    ) -> Self {
        let begin_pages = device.max(host);
        let load_back = host.saturating_sub(device);
        let tokens = budget.min(prefill_len - begin_pages * ps);
        let (chunk_pages, tail) = grow(0, tokens, ps);
        let (reserve_pages, tail_free) = grow(tail, d, ps);
        Self {
            begin_pages,
            tokens,
            own_pages: chunk_pages + reserve_pages,
            tail_free,
            need: load_back + chunk_pages + reserve_pages,
        }
    }

    /// A recovery's: its history `begin_pages` deep, `reserve_pages` new pages for its
    /// next decode leaving `tail_free` slots.
    pub(crate) fn recovery(begin_pages: u32, reserve_pages: u32, tail_free: u32) -> Self {
        Self {
            begin_pages,
            tokens: 0,
            own_pages: reserve_pages,
            tail_free,
            need: reserve_pages,
        }
    }
}
