//! Admission and publication for hybrid models: the KV tree and the recurrent states on
//! its nodes decided together (spec/hybrid-l3.md §1.3–§1.6).
//!
//! Every step follows the reference's order — the KV match, capped at the deepest states
//! (§1.4), room for the KV, then for the states (`2` slots for a request's pair, one more
//! for a host state loaded back), the loads, the allocations — so a refusal leaves what
//! the reference leaves, and `Policy::Reference` reproduces its decisions. Where the
//! reference caches a state at the wrong depth or loses one, kvtier does not: a slot is
//! cached only at the depth whose state it holds.

use kvtier_mamba::{CappedMatch, RequestStates, SlotId};
use kvtier_types::{PageId, Tier, Token};

use crate::batch::{
    ChunkCommit, ChunkFamily, ChunkShape, FamilyGrant, FinalStates, FirstChunkAsk, Halt, Outcome,
    Pinned, Publication, StateGrant, grow,
};
use crate::{Match, NodeId, NodeLock, RadixCore};

impl RadixCore {
    /// The KV match of `tokens` capped at the states reachable on each tier (host states
    /// only with `host_states`; `host_kv`: whether the host prefix may be loaded back).
    fn capped(
        &mut self,
        m: Match,
        host_states: bool,
        host_kv: bool,
    ) -> (Match, CappedMatch<NodeId>) {
        let capped = self
            .with_states(|states, tree| {
                states.cap_match(tree, m.device, m.host, host_states, host_kv)
            })
            .expect("hybrid admission needs the state family");
        let m = Match {
            device: capped.device,
            device_pages: self.depth_pages(capped.device),
            host: capped.host,
            host_pages: self.depth_pages(capped.host),
        };
        (m, capped)
    }

    /// A hybrid request's first chunk (the skeleton's steps in [`Hybrid`]).
    pub(crate) fn first_chunk_hybrid(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        self.first_chunk_with(ask, Hybrid::new())
    }

    /// A fresh working and checkpoint pair (admission made room for it).
    fn request_pair(&mut self) -> Option<RequestStates> {
        let pair = self
            .with_states(|states, _| {
                Some(RequestStates::new(states.allocate()?, states.allocate()?))
            })
            .flatten();
        debug_assert!(pair.is_some(), "room was made for the pair");
        pair
    }

    /// A read-only test that a first chunk has a chance (default policy): without it a
    /// waiting request would commit a match (split, touch) every step only to be refused.
    /// Whatever the states cap the match to, the chunk needs at least the pages of the
    /// deepest KV match's chunk, and two state slots.
    fn could_admit(&mut self, ask: FirstChunkAsk<'_>) -> bool {
        // Any chunk needs a page (before walking the prompt for a better bound).
        if !self.can_free(Tier::Device, 1, 0) {
            return false;
        }
        let probe = if ask.reuse {
            self.probe(ask.tokens)
        } else {
            crate::Probe::default()
        };
        let deepest = probe.device_pages.max(probe.host_pages);
        let least = ask.shape(deepest, 0, self.page_size());
        self.can_free(Tier::Device, least.own_pages, 0)
            && self.with_states(|states, tree| states.could_free(tree, 2)) == Some(true)
    }

    /// Resumes a retracted hybrid request. Its KV prefix comes back whole (as for any
    /// request); its state only from a cached state holding exactly its `computed`
    /// tokens (one at the published depth when the history ends there, or, under the
    /// reference policies, the slot it left at its retraction), else it is recomputed
    /// from the deepest state there is. Under the reference policies the request is
    /// lost where the reference's search finds no state, makes the reference's room
    /// first (`reference_recovery_room`), and is resumed only where that search finds
    /// its own state, else recomputed.
    pub(crate) fn recovery_hybrid(
        &mut self,
        tokens: &[Token],
        tail_pages: u32,
        tail_free: u32,
        held: Vec<NodeLock>,
        d: u32,
        computed: u32,
    ) -> Outcome {
        let ps = self.page_size();
        let kv = self.match_prefix(tokens);
        // The node at the published depth holds the state the next decode starts from.
        let depth = (tokens.len() / ps as usize) as u32;
        let terminal = if kv.device_pages == depth {
            kv.device
        } else if kv.host_pages == depth {
            kv.host
        } else {
            self.root()
        };
        let (device_state, host_state) = self
            .states()
            .map(|s| s.states_holding(&*self, terminal, computed))
            .unwrap_or((None, None));
        // The reference gives the request up when its search finds no state at all, and
        // resumes from the state its search finds: exactly only when that is the one at
        // the terminal.
        let source = if self.policy().recovers_from_the_state_it_finds() {
            let found = self
                .states()
                .and_then(|s| s.reference_recovery_node(&*self, kv.device, kv.host));
            if found.is_none() {
                drop(held);
                return Outcome::StateLost;
            }
            found
        } else {
            None
        };
        let exact = (device_state.is_some() || host_state.is_some())
            && source.is_none_or(|n| n == terminal);
        // The reference makes its room first, over its own view of the match, even
        // where that evicts the request's own device KV (the next match finds it on
        // host only then).
        if let Some(source) = source
            && !self.reference_recovery_room(kv, source, d)
        {
            return Outcome::Waits { held, commit: None };
        }
        if depth == 0 || !exact {
            // The reference resumes from whatever state it finds (a shallower one
            // computes on a wrong state: C.6); kvtier recomputes the request instead,
            // at that same point rather than at once.
            drop(held);
            return Outcome::Recompute;
        }
        let kv = if source.is_some() {
            self.match_prefix(tokens)
        } else {
            kv
        };
        let (reserve_pages, new_tail_free) = grow(tail_free, d, ps);
        let load_back = kv.host_pages.saturating_sub(kv.device_pages);
        let footprint = kv.device_pages.max(kv.host_pages) + tail_pages + reserve_pages;
        if footprint > self.usable(Tier::Device) {
            drop(held);
            return Outcome::TooBig;
        }
        let Some(guard) = self.make_room(kv.device, load_back + reserve_pages) else {
            return Outcome::Waits { held, commit: None };
        };
        let need = 2 + u32::from(device_state.is_none());
        if self.with_states(|states, tree| states.ensure_device(tree, need, Some(terminal)))
            != Some(true)
        {
            self.unlock(guard);
            return Outcome::Waits { held, commit: None };
        }
        let mut cow_src = device_state;
        self.with_states(|states, _| states.protect(terminal));
        let state_load = if device_state.is_none() {
            self.with_states(|states, tree| {
                let pair = states.load_back(tree, terminal);
                cow_src = states.device_slot(terminal);
                pair
            })
            .flatten()
        } else {
            None
        };
        let Some(mut pinned) = self.pin_path(kv, guard, true) else {
            debug_assert!(false, "room was made for the load-back");
            return Outcome::Waits { held, commit: None };
        };
        pinned.2.extend(state_load);
        for lock in held {
            self.unlock(lock);
        }
        let Some(states) = self.request_pair() else {
            return Outcome::waits();
        };
        let grant = StateGrant {
            states,
            cow_src,
            branching: None,
        };
        let shape = ChunkShape::recovery(depth, reserve_pages, new_tail_free);
        self.admitted(pinned, &shape, FamilyGrant::States(Box::new(grant)))
    }

    /// Commits a hybrid request's last chunk: its new full pages go into the tree and
    /// its checkpoint is cached at their end if it holds that state (else freed). Returns
    /// the lock on the published node and its path's device pages; `None` when nothing
    /// was published. `old`: the request's previous lock, given up once the new one is
    /// taken (`None`: the request keeps it until the reply is in).
    pub(crate) fn commit_chunk(
        &mut self,
        commit: ChunkCommit,
        old: Option<NodeLock>,
    ) -> Option<(NodeLock, Vec<PageId>)> {
        let ChunkCommit {
            publication,
            checkpoint,
            recommit,
        } = commit;
        let published = publication.and_then(|p| self.publish_pages(p, old));
        if let (None, Some((key, node))) = (&published, recommit) {
            self.commit_tables(key, node, None);
        }
        let node = published.as_ref().map(|(lock, _)| lock.node());
        if let Some((slot, at)) = checkpoint {
            self.cache_state(node, slot, at);
        }
        published
    }

    /// Publishes a request's pages; the lock on the published node and its path's device
    /// pages.
    fn publish_pages(
        &mut self,
        publication: Publication,
        old: Option<NodeLock>,
    ) -> Option<(NodeLock, Vec<PageId>)> {
        let (lock, _) = self.publish(publication, old);
        let lock = lock?;
        let mut path = Vec::new();
        self.device_path_pages(lock.node(), &mut path);
        Some((lock, path))
    }

    /// Caches `slot` on `node` if it holds the state after exactly the node's prefix;
    /// frees it otherwise.
    pub(crate) fn cache_state(
        &mut self,
        node: Option<NodeId>,
        slot: kvtier_mamba::Slot,
        at: Option<u32>,
    ) {
        let depth = node.map(|n| self.depth_pages(n) * self.page_size());
        self.with_states(|states, tree| match node {
            Some(node) if at.is_some() && at == depth => {
                states.publish(tree, node, slot);
            }
            _ => states.discard(slot),
        });
    }

    /// A decoding hybrid request's new full pages, and its checkpoint (cached where it
    /// holds the state at their end); a fresh checkpoint when asked for and one can be
    /// had. `old`: as for [`Self::commit_chunk`].
    pub(crate) fn publish_decode(
        &mut self,
        publication: Publication,
        checkpoint: Option<(kvtier_mamba::Slot, Option<u32>)>,
        renew: bool,
        retire: Option<NodeId>,
        old: Option<NodeLock>,
    ) -> (Option<(NodeLock, Vec<PageId>)>, Option<kvtier_mamba::Slot>) {
        let published = self.commit_chunk(
            ChunkCommit {
                publication: Some(publication),
                checkpoint,
                recommit: None,
            },
            old,
        );
        let deeper = published.as_ref().is_some_and(|(lock, _)| {
            self.states()
                .is_some_and(|s| s.device_slot(lock.node()).is_some())
        });
        if let Some(old) = retire.filter(|&n| deeper && self.is_live(n)) {
            self.with_states(|states, tree| states.retire(tree, old));
        }
        // Only from a free slot: evicting a cached state for a state this request may
        // never need would trade a likely hit for an unlikely one.
        let fresh = if renew {
            self.with_states(|states, _| states.allocate()).flatten()
        } else {
            None
        };
        (published, fresh)
    }

    /// A finishing or retracted hybrid request's slots: the one holding the state at
    /// `terminal`'s depth is cached there (the checkpoint first), the rest freed.
    /// `publish` false frees them all (the reference caches only when the request
    /// published pages at the end). The reference policies cache as the reference does
    /// ([`Self::settle_states_as_the_reference`]).
    pub(crate) fn settle_states(&mut self, terminal: NodeId, states: FinalStates, publish: bool) {
        let FinalStates {
            states: mut pair,
            working_at,
        } = states;
        if self.policy().settles_states_as_the_reference() {
            return self.settle_states_as_the_reference(terminal, pair, working_at, publish);
        }
        let depth = self.depth_pages(terminal) * self.page_size();
        let has_state = self
            .states()
            .is_some_and(|s| s.device_slot(terminal).is_some());
        let mut cached = !publish || has_state || terminal == self.root();
        if let Some((slot, at)) = pair.take_checkpoint() {
            if !cached && at == Some(depth) {
                self.cache_state(Some(terminal), slot, at);
                cached = true;
            } else {
                self.with_states(|s, _| s.discard(slot));
            }
        }
        if !cached && working_at == depth {
            self.cache_state(Some(terminal), pair.working, Some(working_at));
        } else {
            self.with_states(|s, _| s.discard(pair.working));
        }
    }
}

/// A hybrid model's first chunk: its prefix capped at the deepest cached state, a host
/// state loaded back when it is deeper than any device state, and a working and a
/// checkpoint slot.
#[derive(Debug)]
pub(crate) struct Hybrid {
    /// Host states may be loaded back (false on the retry when the device pool cannot
    /// take one beside the request's pair).
    host_states: bool,
    /// The reference's view of the match, which it makes room for.
    view: Option<Match>,
    /// The pages of the room made.
    room: u32,
}

/// A hybrid first chunk's reservation: the slot it copies its state from, the load-back
/// of a host state, and where its next checkpoint branches off.
pub(crate) struct HybridHeld {
    cow_src: Option<SlotId>,
    state_load: Option<kvtier_types::TransferPair>,
    branching: Option<u32>,
}

impl Hybrid {
    pub(crate) fn new() -> Self {
        Self {
            host_states: true,
            view: None,
            room: 0,
        }
    }
}

impl ChunkFamily for Hybrid {
    /// What the states learned of the match: where the request's state comes from.
    type Cap = CappedMatch<NodeId>;
    type Held = HybridHeld;

    /// kvtier's: a read-only test that the chunk has a chance, so a waiting request does
    /// not commit a match every step only to be refused.
    fn precheck(&mut self, core: &mut RadixCore, ask: FirstChunkAsk<'_>) -> Option<Outcome> {
        (!core.policy().commits_before_it_fits() && !core.could_admit(ask)).then(Outcome::waits)
    }

    fn cap(
        &mut self,
        core: &mut RadixCore,
        kv: Match,
        ask: FirstChunkAsk<'_>,
    ) -> Result<(Match, CappedMatch<NodeId>), Outcome> {
        Ok(core.capped(kv, self.host_states, ask.use_host))
    }

    /// The reference makes room for its own view of the match, which counts the states
    /// cached off their depth (C.3) and, where the state was found from the host
    /// terminal (#612), reuses the whole host prefix, deeper than the state (C.7); it
    /// locks that view's device terminal meanwhile. kvtier makes the same room, then
    /// admits its own match, which may need more.
    fn room(
        &mut self,
        core: &mut RadixCore,
        kv: Match,
        m: &Match,
        shape: &ChunkShape,
        ask: FirstChunkAsk<'_>,
    ) -> (NodeId, u32) {
        if !core.policy().makes_room_for_its_own_view() {
            self.room = shape.need;
            return (m.device, shape.need);
        }
        let view = core.reference_view(kv);
        let host_pages = if ask.use_host { view.host_pages } else { 0 };
        self.view = Some(view);
        self.room = ask
            .shape(view.device_pages, host_pages, core.page_size())
            .need;
        (view.device, self.room)
    }

    fn reserve(
        &mut self,
        core: &mut RadixCore,
        m: &Match,
        capped: CappedMatch<NodeId>,
        shape: &ChunkShape,
        _: Option<HybridHeld>,
        guard: NodeLock,
    ) -> Result<(NodeLock, HybridHeld), Halt> {
        // The deepest host prefix the request reads.
        let host = m.host;
        if self.room < shape.need && core.available(Tier::Device) < shape.need {
            core.unlock(guard);
            return Err(Halt::Stop(Outcome::waits()));
        }
        let branching = capped.branching.or_else(|| {
            let aligned = core.states().map_or(0, |s| s.align(shape.tokens));
            (aligned > 0).then_some(aligned)
        });
        // A host state deeper than every device state is loaded back.
        let load_node = (capped.host_src.is_some() && capped.cow_src.is_none())
            .then(|| {
                core.states().and_then(|s| {
                    s.last_host_state(&*core, host)
                        .filter(|&n| s.device_slot(n).is_none())
                })
            })
            .flatten();
        // The reference's view loads its host state back where it lies deeper than its
        // device state: a third slot, which it makes room for even where kvtier's own
        // match starts from a device state.
        let view_loads = self.view.is_some_and(|v| {
            v.host_pages > v.device_pages
                && core
                    .states()
                    .is_some_and(|s| s.config().host_copies() && s.device_slot(v.host).is_none())
        });
        let need = 2 + u32::from(load_node.is_some() || view_loads);
        // The state the request starts from must survive the room made for its own slots
        // (else the slot it copies from could come back as one of them). The reference
        // does not keep it: the slot may come back as the row's own, which the engine
        // copies from before it writes it.
        let spare_none = core.policy().spares_no_state_source();
        let source = capped.source.filter(|_| !spare_none);
        if core.with_states(|states, tree| states.ensure_device(tree, need, source)) != Some(true) {
            core.unlock(guard);
            if spare_none {
                return Err(Halt::Stop(Outcome::waits()));
            }
            // A pool too small for a host state beside a fresh pair: start from the
            // deepest device state instead. Too small to keep the device source: give
            // it up and start from whatever state is left. (The reference would wait
            // forever in both cases.)
            if load_node.is_some() {
                return Err(Halt::Retry);
            }
            let room = source.is_some()
                && core.with_states(|states, tree| states.ensure_device(tree, need, None))
                    == Some(true);
            return Err(if room {
                Halt::Retry
            } else {
                Halt::Stop(Outcome::waits())
            });
        }
        let mut cow_src = capped.cow_src;
        if let Some(source) = capped.source {
            core.with_states(|states, _| states.protect(source));
        }
        let state_load = load_node.and_then(|node| {
            core.with_states(|states, tree| {
                let pair = states.load_back(tree, node);
                let source = states.last_device_state(tree, host);
                cow_src = source.and_then(|n| states.device_slot(n));
                if let Some(n) = source {
                    states.protect(n);
                }
                pair
            })
            .flatten()
        });
        let held = HybridHeld {
            cow_src,
            state_load,
            branching,
        };
        Ok((guard, held))
    }

    fn unreserve(&mut self, _: &mut RadixCore, _: HybridHeld) {
        debug_assert!(false, "room was made for the load-back");
    }

    fn retry(self) -> Option<Self> {
        Some(Self {
            host_states: false,
            ..Self::new()
        })
    }

    fn grant(
        self,
        core: &mut RadixCore,
        mut pinned: Pinned,
        shape: &ChunkShape,
        held: HybridHeld,
    ) -> Outcome {
        pinned.2.extend(held.state_load);
        let Some(states) = core.request_pair() else {
            return Outcome::waits();
        };
        let grant = StateGrant {
            states,
            cow_src: held.cow_src,
            branching: held.branching,
        };
        core.admitted(pinned, shape, FamilyGrant::States(Box::new(grant)))
    }
}
