//! The reference scheduler's admission paths for hybrid models, where
//! [`Policy`](kvtier_types::Policy) names a difference: the view of a hybrid match it
//! makes room for, the room of its recoveries, and how its states settle.

use crate::{Match, NodeId, RadixCore};

impl RadixCore {
    /// The KV match `kv` as the reference's match caps it at its states, those cached
    /// off their depth too (`MambaFamily::reference_capped`): the prefix it makes room
    /// for.
    pub(crate) fn reference_view(&self, kv: Match) -> Match {
        let (device, host) = self
            .states()
            .map(|states| states.reference_capped(self, kv.device, kv.host))
            .expect("hybrid admission needs the state family");
        Match {
            device,
            device_pages: self.depth_pages(device),
            host,
            host_pages: self.depth_pages(host),
        }
    }

    /// Makes the room the reference's recovery makes before it resumes a request from
    /// `source`: device pages for the host part of its prefix (as the reference's
    /// match caps it: `MambaFamily::reference_capped`) and the decode input, then a
    /// fresh pair of state slots, and one more for a host state it loads back. It
    /// evicts as the reference does, which keeps what it evicted even where it then
    /// finds too little, and keeps the view's device terminal locked throughout (the
    /// states on its path are not evicted for the slots). Whether it had both.
    pub(crate) fn reference_recovery_room(&mut self, kv: Match, source: NodeId, d: u32) -> bool {
        let ps = self.page_size();
        let view = self.reference_view(kv);
        let load_back = view.host_pages.saturating_sub(view.device_pages);
        let pages = (load_back * ps + d).div_ceil(ps);
        let Some(guard) = self.make_room(view.device, pages) else {
            return false;
        };
        let state_load = self
            .states()
            .is_some_and(|s| s.device_slot(source).is_none());
        let need = 2 + u32::from(state_load);
        let states =
            self.with_states(|states, tree| states.ensure_device(tree, need, Some(source)));
        self.unlock(guard);
        states == Some(true)
    }

    /// [`Self::settle_states`] as the reference does it: its checkpoint if it has one,
    /// else its working slot, is cached on `node` whatever depth it holds (C.3), unless
    /// `node` holds a state already; the other slot is freed. One off `node`'s depth is
    /// cached as such: no match reuses it, only the request's own recovery. At the root
    /// it is held for good, as the reference holds it there (C.9).
    pub(crate) fn settle_states_as_the_reference(
        &mut self,
        node: NodeId,
        mut pair: kvtier_mamba::RequestStates,
        working_at: u32,
        publish: bool,
    ) {
        let occupied = self.states().is_some_and(|s| s.device_slot(node).is_some());
        let (slot, at) = match pair.take_checkpoint() {
            Some(checkpoint) => {
                self.with_states(|s, _| s.discard(pair.working));
                checkpoint
            }
            None => (pair.working, Some(working_at)),
        };
        if !publish || occupied {
            self.with_states(|s, _| s.discard(slot));
        } else if node == self.root() {
            // A retraction without a full page: the reference attaches the slot to the
            // root, where it stays for good (C.9).
            self.with_states(|s, _| s.hold_at_root(slot));
        } else if at == Some(self.depth_pages(node) * self.page_size()) {
            self.cache_state(Some(node), slot, at);
        } else {
            self.with_states(|s, tree| s.publish_off_depth(tree, node, slot, at));
        }
    }
}
