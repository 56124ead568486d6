//! The match cap: how deep a match may go, up to the deepest state it can resume from.

use std::fmt::Debug;

use super::*;
use crate::SlotId;

impl<N: Copy + Ord + Debug> MambaFamily<N> {
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
        let from_host = self.config.policy.caps_hybrid_matches_by_its_search()
            && host_kv
            && !self.config.host_copies()
            && device == root
            && host != root;
        let dm = self.last_device_state(tree, if from_host { host } else { device });
        // The branching point counts the host tier's KV too, except under the
        // reference policy without host states, where the reference counts the device
        // tier's only (its prefix is capped to the device state there anyway), or the
        // host tier's where it found the state from there.
        let kv_depth = if host_states || !self.config.policy.caps_hybrid_matches_by_its_search() {
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
}
