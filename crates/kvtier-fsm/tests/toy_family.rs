//! The recipe for a new cache family (`docs/architecture.md`), followed by a toy: one
//! implementation of `CacheFamily` (this file) and one registration
//! (`Scheduler::hosting`). Nothing else in the workspace knows it, yet the cache caps its
//! requests' matches by it, makes room for it, grants, grows, settles and takes back each
//! request's part, tells it of every eviction, removal and split, reports its counters
//! and checks its invariants.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Engine, abort, check, drain, fixture, step, submit, tokens};
use kvtier_fsm::{SchedError, Scheduler};
use kvtier_radix::{
    CacheFamily, Match, NodeId, RadixCore, RadixError, TreeEvent, TreeStats, Violation,
};
use kvtier_types::{MambaSettings, RowKind, SchedulerConfig, Tier, TreeView};

// ----- step 1: the family ------------------------------------------------------------

/// A toy recurrent "summary" of a prefix, as a Mamba state is: a running request holds
/// one summary slot; when it stops, the slot is cached on the node its published prefix
/// ends at (where none sits yet), and a later prompt resumes only as deep as the deepest
/// summary on its path (the root holds the empty one). A summary is worthless without
/// its prefix's device KV, so it goes with it.
#[derive(Debug)]
struct Summaries {
    slots: u32,
    /// Free slots (the lowest taken first).
    free: BTreeSet<u32>,
    /// Running requests' slots, by the family's number for them.
    held: BTreeMap<u32, u32>,
    /// Cached summaries, by node.
    cached: BTreeMap<NodeId, u32>,
    next_request: u32,
    counts: BTreeMap<&'static str, u64>,
    /// A broken family, to show that its invariants are checked.
    leak_on_release: bool,
}

impl Summaries {
    fn new(slots: u32) -> Self {
        Self {
            slots,
            free: (0..slots).collect(),
            held: BTreeMap::new(),
            cached: BTreeMap::new(),
            next_request: 0,
            counts: BTreeMap::new(),
            leak_on_release: false,
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    /// The deepest node at or above `node` that holds a summary (the root always does).
    fn deepest_summary(&self, tree: &RadixCore, mut node: NodeId) -> NodeId {
        while node != tree.root() && !self.cached.contains_key(&node) {
            node = tree.parent(node).unwrap_or(tree.root());
        }
        node
    }

    fn drop_cached(&mut self, node: NodeId, why: &'static str) {
        if let Some(slot) = self.cached.remove(&node) {
            self.free.insert(slot);
            self.count(why);
        }
    }
}

impl CacheFamily for Summaries {
    fn name(&self) -> &'static str {
        "summaries"
    }

    fn cap_match(&mut self, tree: &RadixCore, m: Match) -> Match {
        let node = self.deepest_summary(tree, m.device);
        if node == m.device && m.host_pages <= m.device_pages {
            return m;
        }
        self.count("capped");
        Match {
            device: node,
            device_pages: tree.depth_pages(node),
            host: node,
            host_pages: 0,
        }
    }

    fn reserve(&mut self, tree: &RadixCore, m: &Match) -> bool {
        if !self.free.is_empty() {
            return true;
        }
        // Any cached summary off the request's own path, the shallowest first.
        let source = self.deepest_summary(tree, m.device);
        let victim = self
            .cached
            .keys()
            .copied()
            .filter(|&n| n != source)
            .min_by_key(|&n| (tree.depth_pages(n), n));
        match victim {
            Some(node) => {
                self.drop_cached(node, "evicted_for_room");
                true
            }
            None => false,
        }
    }

    fn grant(&mut self, _tree: &RadixCore) -> u32 {
        let slot = self
            .free
            .pop_first()
            .expect("reserve made room for one slot");
        let request = self.next_request;
        self.next_request += 1;
        self.held.insert(request, slot);
        self.count("granted");
        request
    }

    fn grow(&mut self, _tree: &RadixCore, request: u32, tokens: u32) -> bool {
        assert!(
            self.held.contains_key(&request),
            "grow of an unknown request"
        );
        *self.counts.entry("grown_tokens").or_default() += u64::from(tokens);
        true
    }

    fn settle(&mut self, tree: &RadixCore, request: u32, terminal: NodeId, publish: bool) {
        let Some(slot) = self.held.remove(&request) else {
            panic!("settle of an unknown request {request}");
        };
        let keep = publish
            && terminal != tree.root()
            && tree.resident(terminal, Tier::Device)
            && !self.cached.contains_key(&terminal);
        if keep {
            self.cached.insert(terminal, slot);
            self.count("settled_cached");
        } else {
            self.free.insert(slot);
            self.count("settled_freed");
        }
    }

    fn release(&mut self, request: u32) {
        let Some(slot) = self.held.remove(&request) else {
            panic!("release of an unknown request {request}");
        };
        if !self.leak_on_release {
            self.free.insert(slot);
        }
        self.count("released");
    }

    fn on_tree_event(&mut self, _tree: &RadixCore, event: TreeEvent) {
        match event {
            TreeEvent::KvLeft {
                node,
                tier: Tier::Device,
                ..
            } => self.drop_cached(node, "dropped_with_kv"),
            TreeEvent::Removing(node) => self.drop_cached(node, "dropped_with_node"),
            // The suffix keeps its id, and so its summary at its depth.
            TreeEvent::Split { .. } => self.count("splits"),
            TreeEvent::KvLeft { .. } | TreeEvent::Demoting(_) => {}
        }
    }

    fn report(&mut self, _tree: &RadixCore, stats: &mut TreeStats) {
        stats.registered = self.counts.iter().map(|(&k, &v)| (k, v)).collect();
        stats.registered.push(("free", self.free.len() as u64));
        stats.registered.push(("held", self.held.len() as u64));
        stats.registered.push(("cached", self.cached.len() as u64));
    }

    fn check_invariants(&mut self, tree: &RadixCore) -> Result<(), Violation> {
        let mut seen = BTreeSet::new();
        let all = self
            .free
            .iter()
            .chain(self.held.values())
            .chain(self.cached.values());
        for &slot in all {
            if !seen.insert(slot) {
                return Err(Violation::Family {
                    family: self.name(),
                    detail: format!("slot {slot} in two places"),
                });
            }
        }
        if seen.len() != self.slots as usize {
            return Err(Violation::Family {
                family: self.name(),
                detail: format!("{} of {} slots accounted for", seen.len(), self.slots),
            });
        }
        if let Some(node) = self
            .cached
            .keys()
            .find(|&&n| !tree.resident(n, Tier::Device))
        {
            return Err(Violation::Family {
                family: self.name(),
                detail: format!("a summary on {node:?}, which has no device KV"),
            });
        }
        Ok(())
    }
}

// ----- step 2: its registration ------------------------------------------------------

const SLOTS: u32 = 3;

/// A dense model without a host tier (a summary has no host copy, so it would go with
/// every demotion).
fn config() -> SchedulerConfig {
    SchedulerConfig {
        device_pages: 24,
        host_pages: 0,
        disable_l2_cache: true,
        ..fixture()
    }
}

fn scheduler(family: Summaries) -> Scheduler {
    Scheduler::hosting(config(), Box::new(family)).expect("a dense config hosts it")
}

// ----- what the cache does with it -----------------------------------------------------

/// A counter the family reported, through the scheduler's stats.
fn counter(s: &mut Scheduler, name: &str) -> u64 {
    let stats = s.stats();
    let found = stats.registered.iter().find(|(k, _)| *k == name);
    found.map_or(0, |&(_, v)| v)
}

/// Ten requests sharing prefixes, served to the end with the invariants checked at
/// every step: a pool of `device_pages`, `slots` summary slots, `max_new` tokens each.
fn serve(device_pages: u32, slots: u32, max_new: usize) -> Scheduler {
    let config = SchedulerConfig {
        device_pages,
        ..config()
    };
    let mut s = Scheduler::hosting(config, Box::new(Summaries::new(slots))).expect("hosted");
    let mut engine = Engine::with_max_new(max_new);
    let shared = tokens(1, 8);
    for i in 0..10i32 {
        let mut prompt = shared[..(4 + 2 * (i as usize % 3))].to_vec();
        prompt.extend(tokens(100 + 20 * i, 6));
        submit(&mut s, &format!("r{i}"), prompt);
        step(&mut s, &mut engine);
        check(&mut s);
    }
    for _ in 0..400 {
        if s.is_idle() {
            break;
        }
        step(&mut s, &mut engine);
        check(&mut s);
    }
    assert!(s.is_idle(), "the workload drains");
    // Every part given was given back, and every slot is free or cached.
    let stopped = counter(&mut s, "settled_cached") + counter(&mut s, "settled_freed");
    assert_eq!(
        counter(&mut s, "granted"),
        stopped + counter(&mut s, "released")
    );
    assert_eq!(counter(&mut s, "held"), 0);
    assert_eq!(
        counter(&mut s, "free") + counter(&mut s, "cached"),
        u64::from(slots)
    );
    s
}

/// Requests sharing prefixes: every request gets its part at admission and gives it
/// back when it stops, summaries are cached, cap later matches, are evicted for room,
/// survive the splits of their nodes, and go with their KV.
#[test]
fn a_registered_family_serves_a_workload_through_every_hook() {
    let mut s = serve(24, SLOTS, 3);
    assert!(counter(&mut s, "granted") >= 10, "every request got a part");
    for hook in [
        "settled_cached",
        "capped",
        "evicted_for_room",
        "splits",
        "grown_tokens",
    ] {
        assert!(counter(&mut s, hook) > 0, "{hook} never happened");
    }
    // Clearing the cache takes every summary with its KV.
    s.clear_cache();
    assert_eq!(counter(&mut s, "cached"), 0);
    assert_eq!(counter(&mut s, "free"), u64::from(SLOTS));
    assert!(counter(&mut s, "dropped_with_kv") > 0);
    check(&mut s);
}

/// Under page pressure requests are retracted: each settles its part at the retraction
/// and its recovery (or recompute) is granted a fresh one.
#[test]
fn retracted_requests_settle_their_part_and_are_granted_another() {
    let mut s = serve(14, 2, 8);
    let stats = s.stats();
    assert!(stats.retractions > 0, "the pool is small enough to retract");
    let granted = counter(&mut s, "granted");
    assert!(
        granted > 10,
        "a retracted request's return is granted again: {granted}"
    );
    assert!(counter(&mut s, "dropped_with_kv") > 0);
}

/// A prompt resumes only as deep as the deepest summary on its path: the KV of a shared
/// prefix without a summary at its end is computed again.
#[test]
fn a_match_is_capped_at_the_deepest_summary() {
    let mut s = scheduler(Summaries::new(SLOTS));
    let mut engine = Engine::with_max_new(1);
    submit(&mut s, "a", tokens(1, 9));
    drain(&mut s, &mut engine, 50);
    // "a" published 4 pages (8 tokens) and its summary sits at their end.
    assert_eq!(counter(&mut s, "cached"), 1);

    // A prompt through it resumes there.
    submit(&mut s, "whole", [tokens(1, 8), tokens(50, 3)].concat());
    let plan = step(&mut s, &mut engine);
    assert_eq!(common::row_of(&plan, "whole").extend_prefix_len, 8);
    drain(&mut s, &mut engine, 50);

    // Half of "a"'s prefix: the KV matches 2 pages, no summary sits there.
    submit(&mut s, "half", [tokens(1, 4), tokens(70, 5)].concat());
    let plan = step(&mut s, &mut engine);
    let row = common::row_of(&plan, "half");
    assert_eq!((row.kind, row.extend_prefix_len), (RowKind::Prefill, 0));
    assert!(counter(&mut s, "capped") >= 1);
    drain(&mut s, &mut engine, 50);
    check(&mut s);
}

/// An aborted request's lease goes back to the family before the cache's next operation.
#[test]
fn an_aborted_request_gives_its_part_back() {
    let mut s = scheduler(Summaries::new(SLOTS));
    submit(&mut s, "a", tokens(1, 9));
    s.next_plan();
    assert_eq!(counter(&mut s, "held"), 1);
    s.advance(vec![abort("a")]).expect("abort accepted");
    assert_eq!(counter(&mut s, "held"), 0);
    assert_eq!(counter(&mut s, "released"), 1);
    assert_eq!(counter(&mut s, "free"), u64::from(SLOTS));
    check(&mut s);
}

/// A family that loses slots breaks its invariants, and the cache's check says whose.
#[test]
fn a_broken_family_fails_the_invariant_check() {
    let mut family = Summaries::new(SLOTS);
    family.leak_on_release = true;
    let mut s = scheduler(family);
    submit(&mut s, "a", tokens(1, 9));
    s.next_plan();
    s.advance(vec![abort("a")]).expect("abort accepted");
    let err = s.check_invariants().expect_err("a slot leaked");
    let text = err.to_string();
    assert!(
        text.contains("summaries") && text.contains("2 of 3"),
        "{text}"
    );
}

/// A model has one family: registering one beside a built-in is a typed error.
#[test]
fn a_family_beside_a_built_in_one_is_refused() {
    let mamba = SchedulerConfig {
        mamba: Some(MambaSettings {
            device_slots: 8,
            host_slots: 0,
            chunk: 64,
        }),
        ..config()
    };
    let err = Scheduler::hosting(mamba, Box::new(Summaries::new(SLOTS))).map(|_| ());
    assert!(
        matches!(
            err,
            Err(SchedError::Cache(RadixError::TwoFamilies {
                registered: "summaries",
                hosted: "mamba",
            }))
        ),
        "{err:?}"
    );
}

/// A second registration is refused too, naming the family hosted already.
#[test]
fn a_second_registered_family_is_refused() {
    let cache = RadixCore::new(&kvtier_fsm::cache_config(&config()))
        .hosting(Box::new(Summaries::new(SLOTS)))
        .expect("the first is hosted");
    let err = cache.hosting(Box::new(Summaries::new(1))).map(|_| ());
    assert!(
        matches!(
            err,
            Err(RadixError::TwoFamilies {
                registered: "summaries",
                hosted: "summaries",
            })
        ),
        "{err:?}"
    );
}
