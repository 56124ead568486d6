//! The request table: live requests by slab key, their id order, and the ids of requests
//! finished in the last few plans.
//!
//! Requests are addressed by slab key inside the core (ops and results carry the key
//! and the id, so a key reused by a newer request is recognised with
//! [`Requests::holds`]). Every decision iterates in id order ([`Requests::keys`]), which
//! keeps plans deterministic; the hash map only answers lookups.

use std::collections::{BTreeMap, VecDeque};
use std::ops::{Index, IndexMut};

use kvtier_types::RequestId;
use slab::Slab;

use crate::idmap::IdMap;
use crate::request::{Request, State};

/// How many plans a finished request's id is remembered, so late results for it (overlap
/// scheduling delivers them one step late) are recognised as stale rather than unknown.
const TOMBSTONE_PLANS: u64 = 2;

/// Live requests, and the ids of recently finished ones.
#[derive(Debug, Default)]
pub(crate) struct Requests {
    /// The requests, by key.
    slab: Slab<Request>,
    /// Id → key, in id order: the order that reaches every decision.
    order: BTreeMap<RequestId, usize>,
    /// The same mapping, for lookups by id (never iterated).
    by_id: IdMap,
    /// Ids of requests forgotten recently → the plan that forgot them.
    tombstones: BTreeMap<RequestId, u64>,
    /// The same, oldest first, to expire them; an entry whose plan no longer matches
    /// `tombstones` belongs to an id that was resubmitted in between.
    tombstone_order: VecDeque<(u64, RequestId)>,
}

impl Requests {
    /// The key of the live request named `id`.
    pub fn key_of(&self, id: &RequestId) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// Whether a live request is named `id`.
    pub fn contains(&self, id: &RequestId) -> bool {
        self.by_id.contains_key(id)
    }

    /// Whether the request at `key` is still the one named `id` (its key may have been
    /// reused since a result for it was addressed).
    pub fn holds(&self, key: usize, id: &RequestId) -> bool {
        self.slab.get(key).is_some_and(|r| &r.id == id)
    }

    /// Whether `id` names a request forgotten in the last few plans.
    pub fn recently_finished(&self, id: &RequestId) -> bool {
        self.tombstones.contains_key(id)
    }

    /// Adds a request; its id must not be live. A resubmitted id is no longer stale.
    pub fn insert(&mut self, request: Request) {
        let id = request.id.clone();
        self.tombstones.remove(&id);
        let key = self.slab.insert(request);
        self.by_id.insert(id.clone(), key);
        self.order.insert(id, key);
        debug_assert!(
            self.slab.len() == self.order.len() && self.by_id.len() == self.order.len(),
            "a live id was inserted again"
        );
    }

    /// Forgets finished requests; their ids stay recognisable for a few plans, counted
    /// from `plan`. Returns how many were forgotten.
    pub fn erase_finished(&mut self, plan: u64) -> usize {
        let finished = self.keys_where(|r| matches!(r.state, State::Finished));
        let count = finished.len();
        for key in finished {
            let id = self.slab.remove(key).id;
            self.by_id.remove(&id);
            self.order.remove(&id);
            self.tombstones.insert(id.clone(), plan);
            self.tombstone_order.push_back((plan, id));
        }
        while let Some((at, _)) = self.tombstone_order.front() {
            if at + TOMBSTONE_PLANS > plan {
                break;
            }
            let (at, id) = self.tombstone_order.pop_front().expect("front exists");
            if self.tombstones.get(&id) == Some(&at) {
                self.tombstones.remove(&id);
            }
        }
        self.debug_check();
        count
    }

    /// Keys of the live requests that `pred` picks, in id order. Scans the dense slab,
    /// not the id order, and sorts only what it picked: a plan asks this twice for
    /// states few requests are in.
    pub fn keys_where(&self, pred: impl Fn(&Request) -> bool) -> Vec<usize> {
        let mut picked: Vec<usize> = self
            .slab
            .iter()
            .filter(|(_, r)| pred(r))
            .map(|(key, _)| key)
            .collect();
        picked.sort_unstable_by(|&a, &b| self.slab[a].id.cmp(&self.slab[b].id));
        picked
    }

    /// Keys of the live requests, in id order.
    pub fn keys(&self) -> impl Iterator<Item = usize> + '_ {
        self.order.values().copied()
    }

    /// Ids of the live requests, in order.
    pub fn ids(&self) -> impl Iterator<Item = &RequestId> {
        self.order.keys()
    }

    /// The live requests, in no particular order (for counts and sets only).
    pub fn iter(&self) -> impl Iterator<Item = &Request> {
        self.slab.iter().map(|(_, r)| r)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Debug builds: the slab, the id order and the id map name the same requests, and no
    /// live id is a tombstone. Linear; run once per plan, beside the linear
    /// `erase_finished`.
    fn debug_check(&self) {
        debug_assert!(
            self.slab.len() == self.order.len() && self.by_id.len() == self.order.len(),
            "request table sizes disagree: slab {}, order {}, id map {}",
            self.slab.len(),
            self.order.len(),
            self.by_id.len()
        );
        debug_assert!(
            self.order
                .iter()
                .all(|(id, &key)| self.by_id.get(id) == Some(&key) && self.holds(key, id)),
            "the id order, the id map and the slab disagree"
        );
        debug_assert!(
            self.tombstones
                .keys()
                .all(|id| !self.by_id.contains_key(id)),
            "a live request's id is a tombstone"
        );
    }
}

impl Index<usize> for Requests {
    type Output = Request;

    fn index(&self, key: usize) -> &Request {
        &self.slab[key]
    }
}

impl IndexMut<usize> for Requests {
    fn index_mut(&mut self, key: usize) -> &mut Request {
        &mut self.slab[key]
    }
}
