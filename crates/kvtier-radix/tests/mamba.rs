//! The Mamba family on a real radix tree: state slots on nodes, leaf eviction by
//! `(time, seq)`, the match capped at the deepest state, host copies valid only after
//! their acknowledgement, load-backs. Ports of the reference's
//! `test_mamba_slot.cpp` (tree part), `test_mamba_eviction.cpp` and
//! `test_mamba_cache.cpp`, plus the bugs of spec/hybrid-l3.md §1.7 (mapped in
//! docs/test-inventory/mamba.md). The reference's geometry: pages of 2 tokens, 32 device
//! pages, 8 state slots, kernel chunk 4.

mod common;

use common::{insert_fresh, make_aligned_tokens};
use kvtier_mamba::{CappedMatch, MambaConfig, MambaFamily, Slot, SlotId};
use kvtier_radix::{CacheConfig, NodeId, RadixCore};
use kvtier_types::{Policy, Tier, Token, TransferKind, TransferPair};

const P: u32 = 2;

/// The reference's `MambaCacheTest` cache settings (`host`: its `MambaL2CacheTest`,
/// with 32 host pages and 8 host state slots).
fn settings(host: bool, policy: Policy) -> CacheConfig {
    CacheConfig {
        page_size: P,
        device_pages: 32,
        host_pages: if host { 32 } else { 0 },
        kv_events: false,
        page_hashes: false,
        policy,
        mamba: Some(MambaConfig {
            page_size: P,
            device_slots: 8,
            host_slots: if host { 8 } else { 0 },
            chunk: 4,
            policy,
        }),
        paged: None,
        lost_hits: false,
    }
}

fn cache(host: bool, policy: Policy) -> RadixCore {
    RadixCore::new(&settings(host, policy))
}

fn hybrid() -> RadixCore {
    cache(false, Policy::Default)
}

fn hybrid_l2() -> RadixCore {
    cache(true, Policy::Default)
}

/// `pages` pages of tokens `start, start + 1, …`.
fn tokens(pages: usize, start: Token) -> Vec<Token> {
    make_aligned_tokens(pages, P, start)
}

/// Inserts `tokens` on `tier` from the root; the node ending there.
fn kv(c: &mut RadixCore, tier: Tier, tokens: &[Token]) -> NodeId {
    insert_fresh(c, tier, tokens).last_node
}

fn family<R>(c: &mut RadixCore, f: impl FnOnce(&mut MambaFamily<NodeId>, &RadixCore) -> R) -> R {
    c.with_states(f).expect("a hybrid cache")
}

/// Publishes a fresh device state on `node`; its slot.
fn publish(c: &mut RadixCore, node: NodeId) -> SlotId {
    family(c, |f, tree| {
        let slot = f.allocate().expect("a free device slot");
        let id = slot.id();
        assert!(f.publish(tree, node, slot), "published");
        id
    })
}

/// Attaches a fresh host state to `node`; its slot.
fn attach_host(c: &mut RadixCore, node: NodeId) -> SlotId {
    family(c, |f, tree| {
        let slot = f.allocate_host(tree).expect("a free host slot");
        let id = slot.id();
        assert!(f.attach_host(tree, node, slot), "attached");
        id
    })
}

/// The committed match of `tokens` capped at its states: (device pages, host pages, the
/// capped match).
fn capped(c: &mut RadixCore, tokens: &[Token]) -> (u32, u32, CappedMatch<NodeId>) {
    let m = c.match_prefix(tokens);
    let capped = family(c, |f, tree| f.cap_match(tree, m.device, m.host, true, true));
    (
        c.depth_pages(capped.device),
        c.depth_pages(capped.host),
        capped,
    )
}

fn device_state(c: &RadixCore, node: NodeId) -> Option<SlotId> {
    c.states().and_then(|f| f.device_slot(node))
}

fn host_state(c: &RadixCore, node: NodeId) -> Option<SlotId> {
    c.states().and_then(|f| f.host_slot(node))
}

/// Free (device, host) state slots.
fn free_slots(c: &mut RadixCore) -> (u32, u32) {
    let s = c.stats().states.expect("a hybrid cache");
    (s.free_device_slots, s.free_host_slots)
}

fn check(c: &mut RadixCore) {
    c.check_invariants([&[], &[]]).expect("invariants hold");
}

// ----- test_mamba_slot.cpp: states on tree nodes -------------------------------------

#[test]
fn a_fresh_node_holds_no_state() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    assert_eq!((device_state(&c, node), host_state(&c, node)), (None, None));
    check(&mut c);
}

/// A published state sits on its node (attach); it leaves with the node's KV, its slot
/// back in the pool (detach, destructor).
#[test]
fn a_published_state_sits_on_its_node_until_its_kv_goes() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    let slot = publish(&mut c, node);
    assert_eq!(device_state(&c, node), Some(slot));
    assert_eq!(free_slots(&mut c).0, 7);
    check(&mut c);
    assert!(c.ensure_free(Tier::Device, 31), "the KV is evicted");
    assert!(!c.is_live(node), "and its node removed");
    assert_eq!(free_slots(&mut c).0, 8);
    check(&mut c);
}

/// The same on the host tier: a host state on a host-only node leaves with its host KV.
#[test]
fn a_host_state_sits_on_its_node_until_its_host_kv_goes() {
    let mut c = hybrid_l2();
    let node = kv(&mut c, Tier::Host, &tokens(2, 1));
    let slot = attach_host(&mut c, node);
    assert_eq!(
        (device_state(&c, node), host_state(&c, node)),
        (None, Some(slot))
    );
    assert_eq!(free_slots(&mut c), (8, 7));
    check(&mut c);
    assert!(c.ensure_free(Tier::Host, 31));
    assert!(!c.is_live(node));
    assert_eq!(free_slots(&mut c), (8, 8));
    check(&mut c);
}

/// A split keeps the node (and its states) on the suffix: the new prefix node has none,
/// so the state stays the state after the whole prefix.
#[test]
fn a_split_leaves_the_state_on_the_suffix() {
    let mut c = hybrid_l2();
    let four = tokens(4, 1);
    let node = kv(&mut c, Tier::Device, &four);
    let device = publish(&mut c, node);
    let host = attach_host(&mut c, node);
    let mut diverging = four[..4].to_vec();
    diverging.extend([1001, 1002]);
    let m = c.match_prefix(&diverging);
    assert_eq!(m.device_pages, 2, "the match splits the node after 2 pages");
    assert_ne!(m.device, node);
    assert_eq!(
        c.depth_pages(node),
        4,
        "the suffix keeps the node's identity"
    );
    assert_eq!(
        (device_state(&c, node), host_state(&c, node)),
        (Some(device), Some(host))
    );
    assert_eq!(
        (device_state(&c, m.device), host_state(&c, m.device)),
        (None, None)
    );
    check(&mut c);
}

// ----- test_mamba_eviction.cpp ----------------------------------------------------------

#[test]
fn eviction_frees_the_state_and_keeps_the_kv() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, node);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert_eq!(device_state(&c, node), None);
    assert_eq!(c.probe(&tokens(2, 1)).device_pages, 2, "the KV stays");
    assert_eq!(free_slots(&mut c).0, 8);
    check(&mut c);
}

#[test]
fn eviction_takes_the_least_recently_used_state_first() {
    let mut c = hybrid();
    let old = kv(&mut c, Tier::Device, &tokens(1, 1));
    publish(&mut c, old);
    // A match advances the clock: the next node is younger.
    let _ = c.match_prefix(&tokens(1, 1));
    let young = kv(&mut c, Tier::Device, &tokens(1, 3));
    publish(&mut c, young);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert!(device_state(&c, old).is_none() && device_state(&c, young).is_some());
}

/// A state being read is not evicted. The reference keeps every state whose KV a
/// running request has locked; kvtier keeps the states a row of this plan copies from
/// (`protect`) and lets the others go — a running request never reads its path's
/// cached states again.
#[test]
fn a_state_being_read_is_not_evicted() {
    let mut c = cache(false, Policy::Reference);
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, node);
    let lock = c.lock(node, Tier::Device);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 0);
    assert!(device_state(&c, node).is_some());
    c.unlock(lock);

    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, node);
    family(&mut c, |f, _| f.protect(node));
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 0);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, Some(node))), 0);
    // The next plan: the copy has been made.
    family(&mut c, |f, _| f.begin_plan());
    let lock = c.lock(node, Tier::Device);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    c.unlock(lock);
    check(&mut c);
}

#[test]
fn ensure_capacity_evicts_enough() {
    let mut c = hybrid();
    for start in [1, 3] {
        let node = kv(&mut c, Tier::Device, &tokens(1, start));
        publish(&mut c, node);
    }
    assert_eq!(free_slots(&mut c).0, 6);
    assert!(family(&mut c, |f, tree| f.ensure_device(tree, 8, None)));
    assert_eq!(free_slots(&mut c).0, 8);
    // Nine cannot be had: nothing is evicted trying.
    assert!(!family(&mut c, |f, tree| f.ensure_device(tree, 9, None)));
}

/// Only a state with no state below it is evicted; its parent becomes a candidate when
/// it goes, however young.
#[test]
fn a_state_becomes_a_leaf_when_the_state_below_it_goes() {
    let mut c = hybrid();
    let a = kv(&mut c, Tier::Device, &tokens(1, 1));
    publish(&mut c, a);
    let _ = c.match_prefix(&tokens(1, 1));
    let b = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, b);
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert!(device_state(&c, b).is_none() && device_state(&c, a).is_some());
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert!(device_state(&c, a).is_none());
}

/// Nodes made within one clock tick tie on time: the one made first goes first, on every
/// rank alike (never by address).
#[test]
fn time_ties_go_to_the_node_made_first() {
    let mut c = hybrid();
    let nodes: Vec<NodeId> = [1, 3, 5]
        .into_iter()
        .map(|start| kv(&mut c, Tier::Device, &tokens(1, start)))
        .collect();
    for &node in nodes.iter().rev() {
        publish(&mut c, node);
    }
    for (i, &node) in nodes.iter().enumerate() {
        assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
        assert!(device_state(&c, node).is_none(), "node {i} goes {i}th");
        assert!(
            nodes[i + 1..]
                .iter()
                .all(|&n| device_state(&c, n).is_some())
        );
    }
}

/// #357 and the reference's disabled test: a node removed from the tree leaves every
/// set of the family first, so a later eviction never meets it — under both policies.
#[test]
fn a_removed_node_is_never_an_eviction_candidate() {
    for policy in [Policy::Default, Policy::Reference] {
        let mut c = cache(false, policy);
        let gone = kv(&mut c, Tier::Device, &tokens(2, 1));
        publish(&mut c, gone);
        let kept = kv(&mut c, Tier::Device, &tokens(2, 11));
        publish(&mut c, kept);
        let lock = c.lock(kept, Tier::Device);
        assert!(
            c.ensure_free(Tier::Device, 29),
            "{policy:?}: the unlocked KV goes"
        );
        assert!(!c.is_live(gone));
        check(&mut c);
        c.unlock(lock);
        // An eviction takes the live state; an unsatisfiable one then fails cleanly.
        assert_eq!(
            family(&mut c, |f, tree| f.evict(tree, 1, None)),
            1,
            "{policy:?}"
        );
        assert!(device_state(&c, kept).is_none());
        assert!(!family(&mut c, |f, tree| f.ensure_device(tree, 9, None)));
        check(&mut c);
    }
}

/// notes C.8: a split between two states leaves the upper one with a stateless child;
/// once the lower state goes, the upper one is a leaf again and can be evicted (the
/// reference only re-derives direct parents and would keep it forever).
#[test]
fn a_state_two_levels_above_another_is_evictable_once_it_goes() {
    let mut c = hybrid();
    let upper = kv(&mut c, Tier::Device, &tokens(1, 1));
    publish(&mut c, upper);
    let lower = kv(&mut c, Tier::Device, &tokens(3, 1));
    publish(&mut c, lower);
    let mut split = tokens(2, 1);
    split.extend([1001, 1002]);
    let m = c.match_prefix(&split);
    assert_eq!(m.device_pages, 2, "a stateless node between the two states");
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert!(device_state(&c, lower).is_none());
    assert_eq!(family(&mut c, |f, tree| f.evict(tree, 1, None)), 1);
    assert!(device_state(&c, upper).is_none());
    check(&mut c);
}

// ----- test_mamba_cache.cpp: the capped match (§1.4) ------------------------------------

#[test]
fn a_match_without_states_reuses_nothing() {
    let mut c = hybrid();
    kv(&mut c, Tier::Device, &tokens(3, 1));
    let (device, host, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, host, m.cow_src), (0, 0, None));
    assert_eq!(m.branching, Some(4), "align4(3 pages × 2)");
}

#[test]
fn a_state_at_the_kv_depth_keeps_it() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(3, 1));
    let slot = publish(&mut c, node);
    let (device, _, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, m.cow_src, m.branching), (3, Some(slot), None));
}

/// The deepest state within the KV caps the match (the walk goes up from the KV's
/// terminal); the KV beyond asks for a branching checkpoint at align4(8).
#[test]
fn a_match_caps_at_the_deepest_state_within_the_kv() {
    let mut c = hybrid();
    let two = kv(&mut c, Tier::Device, &tokens(2, 1));
    let slot = publish(&mut c, two);
    let four = kv(&mut c, Tier::Device, &tokens(4, 1));
    let found = family(&mut c, |f, tree| f.last_device_state(tree, four));
    assert_eq!(found, Some(two));
    let (device, _, m) = capped(&mut c, &tokens(4, 1));
    assert_eq!((device, m.cow_src, m.branching), (2, Some(slot), Some(8)));
}

/// A query diverging above the state splits its node: the prefix it shares has no
/// state, so nothing is reused, and the first chunk checkpoints at align4(4).
#[test]
fn a_query_diverging_above_the_state_finds_none() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(4, 1));
    publish(&mut c, node);
    let mut query = tokens(2, 1);
    query.extend([1001, 1002]);
    let (device, _, m) = capped(&mut c, &query);
    assert_eq!((device, m.cow_src, m.branching), (0, None, Some(4)));
}

#[test]
fn no_branching_when_the_aligned_kv_is_not_past_the_state() {
    let mut c = hybrid();
    let two = kv(&mut c, Tier::Device, &tokens(2, 1));
    let slot = publish(&mut c, two);
    kv(&mut c, Tier::Device, &tokens(3, 1));
    let (device, _, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, m.cow_src, m.branching), (2, Some(slot), None));
}

/// KV eviction takes the node's state with it (`OnKVEvict`), and the node is then pruned
/// safely.
#[test]
fn kv_eviction_takes_the_state_with_it() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, node);
    let before = c.stats().states.expect("states");
    assert!(c.ensure_free(Tier::Device, 31));
    let after = c.stats().states.expect("states");
    assert_eq!(after.free_device_slots, before.free_device_slots + 1);
    assert_eq!((after.device_states, after.dropped_with_kv), (0, 1));
    check(&mut c);
}

// ----- #612: KV without its state is never reused --------------------------------------

/// Without host states, a host-only KV hit has no state to resume from: it is capped to
/// the device state (here none), where the reference reused it stateless.
#[test]
fn a_host_only_kv_hit_without_its_state_is_not_reused() {
    // A host tier without host states.
    let mut c = RadixCore::new(&CacheConfig {
        host_pages: 32,
        ..settings(false, Policy::Default)
    });
    kv(&mut c, Tier::Host, &tokens(3, 1));
    let (device, host, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, host, m.cow_src, m.host_src), (0, 0, None, None));
    // With a device state shallower than the host KV, both tiers cap there.
    let one = kv(&mut c, Tier::Device, &tokens(1, 1));
    let slot = publish(&mut c, one);
    let (device, host, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, host, m.cow_src), (1, 1, Some(slot)));
}

// ----- test_mamba_cache.cpp, L2: host copies ---------------------------------------------

/// With host states on, a device state on a host-only node is out of reach (the host
/// walk reads host states only); a host state makes the host KV a hit that must be
/// loaded back (no copy source on device).
#[test]
fn host_kv_needs_a_host_state() {
    let mut c = hybrid_l2();
    let node = kv(&mut c, Tier::Host, &tokens(3, 1));
    publish(&mut c, node);
    let (device, host, _) = capped(&mut c, &tokens(3, 1));
    assert_eq!((device, host), (0, 0));
    family(&mut c, |f, tree| f.retire(tree, node));
    let slot = attach_host(&mut c, node);
    let (device, host, m) = capped(&mut c, &tokens(3, 1));
    assert_eq!(
        (device, host, m.host_src, m.cow_src),
        (0, 3, Some(slot), None)
    );
}

#[test]
fn a_deeper_host_state_beats_a_shallower_device_state() {
    let mut c = hybrid_l2();
    let two = kv(&mut c, Tier::Device, &tokens(2, 1));
    publish(&mut c, two);
    let four = kv(&mut c, Tier::Host, &tokens(4, 1));
    let host_slot = attach_host(&mut c, four);
    let (device, host, m) = capped(&mut c, &tokens(4, 1));
    assert_eq!((device, host), (2, 4));
    assert_eq!(
        (m.host_src, m.cow_src),
        (Some(host_slot), None),
        "the deeper host state wins: loaded back, no device copy source"
    );
}

#[test]
fn a_host_state_loads_back_into_a_fresh_device_slot() {
    let mut c = hybrid_l2();
    let node = kv(&mut c, Tier::Host, &tokens(2, 1));
    let host = attach_host(&mut c, node);
    let pair = family(&mut c, |f, tree| f.load_back(tree, node)).expect("a load-back");
    let device = device_state(&c, node).expect("attached at once");
    assert_eq!(
        pair,
        TransferPair {
            kind: TransferKind::Mamba,
            src: host,
            dst: device
        }
    );
    // A second load-back of the same state is nothing to do.
    assert_eq!(family(&mut c, |f, tree| f.load_back(tree, node)), None);
    check(&mut c);
}

/// Device and host KV on `pages` pages with a device state; the node.
fn written_back_candidate(c: &mut RadixCore, pages: usize) -> NodeId {
    let t = tokens(pages, 1);
    let node = kv(c, Tier::Device, &t);
    kv(c, Tier::Host, &t);
    publish(c, node);
    node
}

/// An acknowledgement gives host copies to exactly the states its write-back copied,
/// never an ancestor's (PR243's exact-node acks).
#[test]
fn an_ack_gives_host_copies_to_exactly_its_states() {
    let mut c = hybrid_l2();
    let ancestor = written_back_candidate(&mut c, 2);
    let descendant = written_back_candidate(&mut c, 4);
    let (pairs, a) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[ancestor]));
    assert_eq!((pairs.len(), a.as_slice()), (1, [ancestor].as_slice()));
    let (pairs, d) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[descendant]));
    assert_eq!((pairs.len(), d.as_slice()), (1, [descendant].as_slice()));
    family(&mut c, |f, tree| f.write_back_done(tree, &d, true));
    assert!(host_state(&c, ancestor).is_none() && host_state(&c, descendant).is_some());
    family(&mut c, |f, tree| f.write_back_done(tree, &a, true));
    assert!(host_state(&c, ancestor).is_some());
    check(&mut c);
}

/// A host copy is reserved, not attached, until its write-back is acknowledged: no host
/// hit before; after, the host state is the hit and the idle device copy is demoted.
#[test]
fn a_host_copy_is_a_hit_only_after_its_ack() {
    let mut c = hybrid_l2();
    let node = written_back_candidate(&mut c, 2);
    let device = device_state(&c, node).expect("device state");
    let (pairs, nodes) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[node]));
    let [pair] = pairs.as_slice() else {
        panic!("one state copy: {pairs:?}")
    };
    assert_eq!((pair.kind, pair.src), (TransferKind::Mamba, device));
    assert_eq!(host_state(&c, node), None, "reserved, not attached");
    let (_, host, _) = capped(&mut c, &tokens(2, 1));
    assert_eq!(host, 0, "no host state yet: the host KV is no hit");
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, true));
    assert_eq!(host_state(&c, node), Some(pair.dst));
    assert_eq!(
        device_state(&c, node),
        None,
        "the idle device copy is demoted"
    );
    let (_, host, m) = capped(&mut c, &tokens(2, 1));
    assert_eq!((host, m.host_src, m.cow_src), (2, Some(pair.dst), None));
    check(&mut c);
}

/// A device copy someone reads when the ack lands keeps both copies; it is demoted at
/// the next try after the reader lets go (kvtier tries at every plan).
#[test]
fn a_state_read_at_the_ack_is_demoted_once_let_go() {
    let mut c = hybrid_l2();
    let node = written_back_candidate(&mut c, 2);
    let (_, nodes) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[node]));
    let lock = c.lock(node, Tier::Device);
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, true));
    assert!(device_state(&c, node).is_some() && host_state(&c, node).is_some());
    c.unlock(lock);
    assert!(device_state(&c, node).is_some(), "no demotion by itself");
    family(&mut c, |f, tree| f.demote_idle(tree));
    assert!(device_state(&c, node).is_none() && host_state(&c, node).is_some());
    check(&mut c);
}

/// Demoting a written-back prefix drops its device state even when a device child keeps
/// the node's KV on device.
#[test]
fn a_demoted_prefix_drops_its_device_state_whatever_lies_below() {
    let mut c = hybrid_l2();
    let node = written_back_candidate(&mut c, 4);
    attach_host(&mut c, node);
    kv(&mut c, Tier::Device, &tokens(5, 1));
    c.demote(node);
    assert_eq!(
        c.probe(&tokens(4, 1)).device_pages,
        4,
        "the child keeps the KV"
    );
    assert_eq!(
        (
            device_state(&c, node).is_some(),
            host_state(&c, node).is_some()
        ),
        (false, true)
    );
    check(&mut c);
}

/// #620: a failed write-back frees the host slot it reserved and demotes nothing.
#[test]
fn a_failed_state_write_back_frees_its_host_slot_and_demotes_nothing() {
    let mut c = hybrid_l2();
    let node = written_back_candidate(&mut c, 2);
    let (_, nodes) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[node]));
    assert_eq!(free_slots(&mut c).1, 7);
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, false));
    assert_eq!(free_slots(&mut c).1, 8);
    assert!(device_state(&c, node).is_some() && host_state(&c, node).is_none());
    check(&mut c);
}

/// notes C.10: publishing a second state at a depth that has one keeps the first (the
/// states are equal by the position rule) and frees the new slot — replacing would free
/// an index an op of the same plan may still name.
#[test]
fn publishing_a_depth_twice_keeps_the_first_state() {
    let mut c = hybrid();
    let node = kv(&mut c, Tier::Device, &tokens(2, 1));
    let first = publish(&mut c, node);
    let kept = family(&mut c, |f, tree| {
        let second: Slot = f.allocate().expect("free");
        f.publish(tree, node, second)
    });
    assert!(!kept);
    assert_eq!(device_state(&c, node), Some(first));
    assert_eq!(free_slots(&mut c).0, 7);
    check(&mut c);
}

/// A reference-policy cache with host states whose 2-page node's state is being
/// written back: the cache, the node, the copy's pairs and the nodes it is for.
fn a_state_being_copied() -> (RadixCore, NodeId, Vec<TransferPair>, Vec<NodeId>) {
    let mut c = cache(true, Policy::Reference);
    let node = written_back_candidate(&mut c, 2);
    let (pairs, nodes) = family(&mut c, |f, tree| f.prepare_write_back(tree, &[node]));
    (c, node, pairs, nodes)
}

/// Hybrid seeds 303 and 904 (C.10). Under the reference policy a state published again
/// replaces the cached one, as the reference does; but where a write-back in flight is
/// still copying the old slot, kvtier frees that slot only at the write-back's
/// acknowledgement. The reference frees it at once, and may hand it out to a row that
/// writes it while the copy reads it (seed 904). The old code kept the old slot and
/// freed the new one.
#[test]
fn a_state_replaced_under_a_write_back_is_freed_at_its_ack() {
    let (mut c, node, pairs, nodes) = a_state_being_copied();
    let old = device_state(&c, node).expect("device state");
    assert_eq!(pairs[0].src, old);
    let lock = c.lock(node, Tier::Device);
    let new = publish(&mut c, node);
    assert_eq!(
        device_state(&c, node),
        Some(new),
        "the new state replaces it"
    );
    let allocated = family(&mut c, |f, _| f.allocate().map(|s| s.id()));
    assert!(
        allocated.is_some_and(|id| id != old),
        "the slot being copied is not handed out: {allocated:?}"
    );
    assert_eq!(
        free_slots(&mut c).0,
        6,
        "old (retiring), new; the one dropped is back"
    );
    check(&mut c);
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, true));
    assert_eq!(
        free_slots(&mut c).0,
        7,
        "the copy is done: the old slot is free"
    );
    assert_eq!(
        family(&mut c, |f, _| f.allocate().map(|s| s.id())),
        Some(old),
        "and the next to go out (lowest id first)"
    );
    assert_eq!(
        (device_state(&c, node), host_state(&c, node).is_some()),
        (Some(new), true),
        "the locked device copy stays beside the host copy"
    );
    c.unlock(lock);
    check(&mut c);
}

/// Hybrid seed 5506, shrunk (C.10). The state that replaced the one a write-back is
/// copying is replaced in turn: nothing reads it, so it is freed at once, as the
/// reference frees it; only the slot the copy reads waits for the acknowledgement. The
/// old code kept every replaced slot until then, and the next row took another slot.
#[test]
fn a_state_replaced_twice_under_a_write_back_frees_the_middle_one_at_once() {
    let (mut c, node, _, nodes) = a_state_being_copied();
    let lock = c.lock(node, Tier::Device);
    let middle = publish(&mut c, node);
    assert_eq!(
        free_slots(&mut c).0,
        6,
        "the copied slot and the middle one"
    );
    let last = publish(&mut c, node);
    assert_eq!(device_state(&c, node), Some(last));
    assert_eq!(
        free_slots(&mut c).0,
        6,
        "the middle one is back at once: {middle}"
    );
    check(&mut c);
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, true));
    assert_eq!(free_slots(&mut c).0, 7, "the copied slot, at the ack");
    c.unlock(lock);
    check(&mut c);
}

/// Hybrid seed 5506 (C.3). A node whose only state is a host copy at its own depth
/// still takes a stopped request's slot off its depth: the reference looks for a
/// device state only. Each tier keeps the depth its state holds, so no match reuses
/// the device slot, and the host copy is still found at the node's depth. The old code
/// counted the host copy as a state there and freed the slot.
#[test]
fn a_host_copy_alone_leaves_room_for_a_slot_off_its_depth() {
    let (mut c, node, _, nodes) = a_state_being_copied();
    family(&mut c, |f, tree| f.write_back_done(tree, &nodes, true));
    let host = host_state(&c, node).expect("a host copy");
    assert_eq!(device_state(&c, node), None, "demoted at the ack");
    let own = 2 * P;
    let off = family(&mut c, |f, tree| {
        let slot = f.allocate().expect("a free device slot");
        let id = slot.id();
        assert!(f.publish_off_depth(tree, node, slot, Some(own + 1)));
        id
    });
    let holding =
        |c: &mut RadixCore, depth| family(c, |f, tree| f.states_holding(tree, node, depth));
    assert_eq!(holding(&mut c, own + 1), (Some(off), None));
    assert_eq!(holding(&mut c, own), (None, Some(host)));
    let found = family(&mut c, |f, tree| {
        (
            f.last_device_state(tree, node),
            f.last_host_state(tree, node),
        )
    });
    assert_eq!(
        found,
        (None, Some(node)),
        "a match reuses the host copy only"
    );
    check(&mut c);
}

/// The root never holds a state (notes C.9: the reference attached one there, never to
/// be found or freed).
#[test]
fn the_root_takes_no_state() {
    let mut c = hybrid_l2();
    let root = c.root();
    let published = family(&mut c, |f, tree| {
        let slot = f.allocate().expect("free");
        f.publish(tree, root, slot)
    });
    assert!(!published);
    let attached = family(&mut c, |f, tree| {
        let slot = f.allocate_host(tree).expect("free");
        f.attach_host(tree, root, slot)
    });
    assert!(!attached);
    assert_eq!(free_slots(&mut c), (8, 8));
    check(&mut c);
}

/// The reference's view of a match (hybrid seeds 661, 669, 830, 818): its `augmentMatch`
/// counts every cached state, a stopped request's slot cached off its depth too, and
/// with no device match leaves the host tier uncapped where a device state lies on its
/// path (#612, C.7). kvtier's own cap reuses neither; a retracted request's recovery
/// makes its room, and searches for its state, from the reference's view.
#[test]
fn the_reference_cap_counts_states_off_their_depth_and_a_state_on_a_host_only_path() {
    // Host KV pages, but no host copies of states.
    let mut c = RadixCore::new(&CacheConfig {
        host_pages: 32,
        ..settings(false, Policy::Reference)
    });
    let prompt = tokens(4, 1);
    let on_host = kv(&mut c, Tier::Host, &prompt);
    let root = c.root();
    // A stopped request's slot: 9 tokens deep, cached on the 8-token node.
    family(&mut c, |f, tree| {
        let slot = f.allocate().expect("a free device slot");
        assert!(f.publish_off_depth(tree, on_host, slot, Some(9)));
    });
    let (device, host) = family(&mut c, |f, tree| f.reference_capped(tree, root, on_host));
    assert_eq!((device, host), (root, on_host), "the host tier uncapped");
    let source = family(&mut c, |f, tree| {
        f.reference_recovery_node(tree, root, on_host)
    });
    assert_eq!(source, Some(on_host), "the slot it left");
    let (device_pages, host_pages, cap) = capped(&mut c, &prompt);
    assert_eq!(
        (device_pages, host_pages, cap.cow_src),
        (0, 0, None),
        "no match reuses a state off its depth"
    );
    // A state at the node's own depth replaces it, and a match reuses it from host.
    let slot = publish(&mut c, on_host);
    let (device_pages, host_pages, cap) = capped(&mut c, &prompt);
    assert_eq!(
        (device_pages, host_pages, cap.cow_src, cap.source),
        (0, 4, Some(slot), Some(on_host))
    );
    family(&mut c, |f, tree| f.check_invariants(tree, |_| true)).expect("invariants");
}

/// Under the reference policies a state published again at its node replaces the
/// device slot (C.10); a host copy of the node's own state stays. (Only a host copy of a
/// state off the node's depth goes with it.)
#[test]
fn a_state_published_again_keeps_the_nodes_host_copy() {
    let mut c = cache(true, Policy::Reference);
    let prompt = tokens(4, 1);
    let node = kv(&mut c, Tier::Device, &prompt);
    insert_fresh(&mut c, Tier::Host, &prompt);
    publish(&mut c, node);
    let host = attach_host(&mut c, node);
    let free = free_slots(&mut c);
    let again = publish(&mut c, node);
    assert_eq!(device_state(&c, node), Some(again));
    assert_eq!(host_state(&c, node), Some(host), "the host copy stays");
    assert_eq!(
        free_slots(&mut c),
        free,
        "the old device slot freed, nothing leaked"
    );
    family(&mut c, |f, tree| f.check_invariants(tree, |_| true)).expect("invariants");
}
