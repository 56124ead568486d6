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

    /// A first chunk's admission, one skeleton for every family: the match (committed:
    /// split and touched), capped by the family; room for the KV, the family's part
    /// reserved (before or after it); the path pinned; the pages and the family's part
    /// given. Each step's family hook is in a [`ChunkFamily`].
    pub(super) fn first_chunk(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        match self.hosted() {
            Hosted::Dense | Hosted::Registered(_) => self.first_chunk_with(ask, Plain::default()),
            Hosted::Mamba(_) => self.first_chunk_hybrid(ask),
            Hosted::Paged(_) => self.first_chunk_paged(ask),
        }
    }

    pub(crate) fn first_chunk_with<F: ChunkFamily>(
        &mut self,
        ask: FirstChunkAsk<'_>,
        mut f: F,
    ) -> Outcome {
        if let Some(stop) = f.precheck(self, ask) {
            return stop;
        }
        let kv = self.committed_match(ask.tokens, ask.reuse);
        let (m, cap) = match f.cap(self, kv, ask) {
            Ok(capped) => capped,
            Err(stop) => return stop,
        };
        let host = if ask.use_host { m.host_pages } else { 0 };
        let shape = ask.shape(m.device_pages, host, self.page_size());
        let early = match f.reserve_before_room(self, &cap, &shape, ask) {
            Ok(early) => early,
            Err(stop) => return stop,
        };
        let (at, room) = f.room(self, kv, &m, &shape, ask);
        let Some(guard) = self.make_room(at, room) else {
            if let Some(early) = early {
                f.unreserve(self, early);
            }
            return Outcome::waits();
        };
        let (guard, held) = match f.reserve(self, &m, cap, &shape, early, guard) {
            Ok(reserved) => reserved,
            Err(Halt::Stop(stop)) => return stop,
            Err(Halt::Retry) => {
                return match f.retry() {
                    Some(f) => self.first_chunk_with(ask, f),
                    None => Outcome::waits(),
                };
            }
        };
        let Some(pinned) = self.pin_path(m, guard, ask.use_host) else {
            f.unreserve(self, held);
            return Outcome::waits();
        };
        f.grant(self, pinned, &shape, held)
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

/// A family's hook at each step of the first-chunk skeleton
/// ([`RadixCore::first_chunk`]). Each family's steps keep the order of the reference
/// scheduler's, so its policy reproduces the reference's decisions.
pub(crate) trait ChunkFamily: Sized {
    /// What capping the match learned, for the later steps.
    type Cap;
    /// The family's part reserved for the request.
    type Held;

    /// Before anything is committed: `Some` stops the admission there.
    fn precheck(&mut self, _core: &mut RadixCore, _ask: FirstChunkAsk<'_>) -> Option<Outcome> {
        None
    }

    /// The committed KV match `kv` capped at what the family can resume from.
    fn cap(
        &mut self,
        core: &mut RadixCore,
        kv: Match,
        ask: FirstChunkAsk<'_>,
    ) -> Result<(Match, Self::Cap), Outcome>;

    /// The family's part taken before the KV room is made (`None`: after it).
    fn reserve_before_room(
        &mut self,
        _core: &mut RadixCore,
        _cap: &Self::Cap,
        _shape: &ChunkShape,
        _ask: FirstChunkAsk<'_>,
    ) -> Result<Option<Self::Held>, Outcome> {
        Ok(None)
    }

    /// Where the KV room is made, and how many pages (`kv`: the uncapped match).
    fn room(
        &mut self,
        _core: &mut RadixCore,
        _kv: Match,
        m: &Match,
        shape: &ChunkShape,
        _ask: FirstChunkAsk<'_>,
    ) -> (NodeId, u32) {
        (m.device, shape.need)
    }

    /// The family's part reserved once the KV room is made (`guard` holds it; on
    /// failure the hook lets it go).
    #[allow(clippy::too_many_arguments)]
    fn reserve(
        &mut self,
        core: &mut RadixCore,
        m: &Match,
        cap: Self::Cap,
        shape: &ChunkShape,
        early: Option<Self::Held>,
        guard: NodeLock,
    ) -> Result<(NodeLock, Self::Held), Halt>;

    /// Gives back a reservation the admission could not go on with.
    fn unreserve(&mut self, _core: &mut RadixCore, _held: Self::Held) {}

    /// The admission again, with a smaller ask, after [`Halt::Retry`].
    fn retry(self) -> Option<Self> {
        None
    }

    /// The end, the path pinned: the request's pages and its part of the family.
    fn grant(
        self,
        core: &mut RadixCore,
        pinned: Pinned,
        shape: &ChunkShape,
        held: Self::Held,
    ) -> Outcome;
}

/// Why a reservation stopped the skeleton.
pub(crate) enum Halt {
    /// With this outcome.
    Stop(Outcome),
    /// To try the admission again with a smaller ask ([`ChunkFamily::retry`]).
    Retry,
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

/// Full attention, and a registered family through its [`CacheFamily`] hooks.
///
/// [`CacheFamily`]: crate::CacheFamily
#[derive(Debug, Default)]
struct Plain {
    /// kvtier's probe before the match (`None` under the reference's order).
    probe: Option<(u32, u32)>,
}

impl ChunkFamily for Plain {
    type Cap = ();
    type Held = ();

    /// kvtier's: a read-only probe first, so a chunk that cannot fit commits nothing
    /// (no split, no touch) and its prompt is marked where the walk got to. The
    /// reference commits the match before it knows whether the request fits.
    fn precheck(&mut self, core: &mut RadixCore, ask: FirstChunkAsk<'_>) -> Option<Outcome> {
        if core.policy().commits_before_it_fits() {
            return None;
        }
        let (probe, reached) = if ask.reuse {
            core.probe_marked(ask.tokens)
        } else {
            (crate::Probe::default(), core.root())
        };
        let host = if ask.use_host { probe.host_pages } else { 0 };
        let shape = ask.shape(probe.device_pages, host, core.page_size());
        if !core.can_free(Tier::Device, shape.need, probe.device_unlocked_pages) {
            core.mark(ask.tokens, reached);
            return Some(Outcome::waits());
        }
        core.unmark(ask.tokens);
        self.probe = Some((probe.device_pages, host));
        None
    }

    fn cap(
        &mut self,
        core: &mut RadixCore,
        kv: Match,
        ask: FirstChunkAsk<'_>,
    ) -> Result<(Match, ()), Outcome> {
        if core.has_registered() {
            return Ok((
                core.with_family(|family, tree| family.cap_match(tree, kv)),
                (),
            ));
        }
        debug_assert!(
            self.probe.is_none_or(|p| p
                == (
                    kv.device_pages,
                    if ask.use_host { kv.host_pages } else { 0 }
                )),
            "the committed match is the probe's"
        );
        Ok((kv, ()))
    }

    fn reserve(
        &mut self,
        core: &mut RadixCore,
        m: &Match,
        _: (),
        _: &ChunkShape,
        _: Option<()>,
        guard: NodeLock,
    ) -> Result<(NodeLock, ()), Halt> {
        if core.reserve_family(m) {
            return Ok((guard, ()));
        }
        core.unlock(guard);
        Err(Halt::Stop(Outcome::waits()))
    }

    fn grant(self, core: &mut RadixCore, pinned: Pinned, shape: &ChunkShape, _: ()) -> Outcome {
        let family = core.grant_family();
        core.admitted(pinned, shape, family)
    }
}
