//! Admission and publication for hybrid models: the KV tree and the recurrent states on
//! its nodes decided together (spec/hybrid-l3.md §1.3–§1.6).
//!
//! Every step follows the reference's order — the KV match, capped at the deepest states
//! (§1.4), room for the KV, then for the states (`2` slots for a request's pair, one more
//! for a host state loaded back), the loads, the allocations — so a refusal leaves what
//! the reference leaves, and `Policy::Reference` reproduces its decisions. Where the
//! reference caches a state at the wrong depth or loses one, kvtier does not: a slot is
//! cached only at the depth whose state it holds.

use kvtier_mamba::{CappedMatch, RequestStates};
use kvtier_types::{PageId, Tier, Token};

use crate::batch::{
    ChunkCommit, ChunkShape, FamilyGrant, FinalStates, FirstChunkAsk, Outcome, Publication,
    StateGrant, grow,
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

    /// A hybrid request's first chunk: its prefix capped at the deepest cached state, a
    /// host state loaded back when it is deeper than any device state, and a working and
    /// a checkpoint slot.
    pub(crate) fn first_chunk_hybrid(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        self.first_chunk_from(ask, true)
    }

    /// [`Self::first_chunk_hybrid`]; `host_states` false when the device pool cannot
    /// take a host state beside the request's pair.
    fn first_chunk_from(&mut self, ask: FirstChunkAsk<'_>, host_states: bool) -> Outcome {
        let FirstChunkAsk {
            tokens,
            use_host,
            reuse,
            ..
        } = ask;
        let ps = self.page_size();
        if !self.policy().commits_before_it_fits() && !self.could_admit(ask) {
            return Outcome::waits();
        }
        let kv = self.committed_match(tokens, reuse);
        let (m, capped) = self.capped(kv, host_states, use_host);
        let host_pages = if use_host { m.host_pages } else { 0 };
        let shape = ask.shape(m.device_pages, host_pages, ps);
        let branching = capped.branching.or_else(|| {
            let aligned = self.states().map_or(0, |s| s.align(shape.tokens));
            (aligned > 0).then_some(aligned)
        });
        // The reference makes room for its own view of the match, which counts the
        // states cached off their depth (C.3) and, where the state was found from the
        // host terminal (#612), reuses the whole host prefix, deeper than the state
        // (C.7); it locks that view's device terminal meanwhile. kvtier makes the same
        // room, then admits its own match, which may need more.
        let view = self
            .policy()
            .makes_room_for_its_own_view()
            .then(|| self.reference_view(kv));
        let (room_at, room) = match view {
            Some(view) => {
                let host_pages = if use_host { view.host_pages } else { 0 };
                (
                    view.device,
                    ask.shape(view.device_pages, host_pages, ps).need,
                )
            }
            None => (m.device, shape.need),
        };
        let Some(guard) = self.make_room(room_at, room) else {
            return Outcome::waits();
        };
        if room < shape.need && self.available(Tier::Device) < shape.need {
            self.unlock(guard);
            return Outcome::waits();
        }
        // A host state deeper than every device state is loaded back.
        let load_node = (capped.host_src.is_some() && capped.cow_src.is_none())
            .then(|| {
                self.states().and_then(|s| {
                    s.last_host_state(&*self, m.host)
                        .filter(|&n| s.device_slot(n).is_none())
                })
            })
            .flatten();
        // The reference's view loads its host state back where it lies deeper than its
        // device state: a third slot, which it makes room for even where kvtier's own
        // match starts from a device state.
        let view_loads = view.is_some_and(|v| {
            v.host_pages > v.device_pages
                && self
                    .states()
                    .is_some_and(|s| s.config().host_copies() && s.device_slot(v.host).is_none())
        });
        let need = 2 + u32::from(load_node.is_some() || view_loads);
        // The state the request starts from must survive the room made for its own slots
        // (else the slot it copies from could come back as one of them). The reference
        // does not keep it: the slot may come back as the row's own, which the engine
        // copies from before it writes it.
        let spare_none = self.policy().spares_no_state_source();
        let source = capped.source.filter(|_| !spare_none);
        if self.with_states(|states, tree| states.ensure_device(tree, need, source)) != Some(true) {
            self.unlock(guard);
            if spare_none {
                return Outcome::waits();
            }
            // A pool too small for a host state beside a fresh pair: start from the
            // deepest device state instead. Too small to keep the device source: give
            // it up and start from whatever state is left. (The reference would wait
            // forever in both cases.)
            if load_node.is_some() {
                return self.first_chunk_from(ask, false);
            }
            let room = source.is_some()
                && self.with_states(|states, tree| states.ensure_device(tree, need, None))
                    == Some(true);
            if room {
                return self.first_chunk_from(ask, false);
            }
            return Outcome::waits();
        }
        let mut cow_src = capped.cow_src;
        if let Some(source) = capped.source {
            self.with_states(|states, _| states.protect(source));
        }
        let state_load = load_node.and_then(|node| {
            self.with_states(|states, tree| {
                let pair = states.load_back(tree, node);
                let source = states.last_device_state(tree, m.host);
                cow_src = source.and_then(|n| states.device_slot(n));
                if let Some(n) = source {
                    states.protect(n);
                }
                pair
            })
            .flatten()
        });
        let Some(mut pinned) = self.pin_path(m, guard, use_host) else {
            debug_assert!(false, "room was made for the load-back");
            return Outcome::waits();
        };
        pinned.2.extend(state_load);
        let Some(states) = self.request_pair() else {
            return Outcome::waits();
        };
        let grant = StateGrant {
            states,
            cow_src,
            branching,
        };
        self.admitted(pinned, &shape, FamilyGrant::States(Box::new(grant)))
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
