//! The "Extra Rust tests worth adding" of spec/cache-core.md §12, plus the chosen
//! touch / LRU semantics: ours is exact LRU on a logical clock — a committed touch
//! (`match_prefix`, or the walk of an `insert`) re-keys an unlocked leaf, while `probe`
//! never changes the LRU order and never splits.

mod common;

use common::{
    assert_invariants, assert_invariants_outside, concat, device_path, insert_after_prefix,
    insert_fresh, make_aligned_tokens, new_cache,
};
use kvtier_host::PagePool;
use kvtier_radix::{CacheConfig, RadixCore, RadixError};
use kvtier_types::{Tier, hash::PageHash, hash::rolling_page_hashes};

// ----- allocators -------------------------------------------------------------------

#[test]
fn allocator_is_lifo_9_8_7() {
    let mut pool = PagePool::new(10);
    let pages = pool.allocate(3).expect("3 of 9 pages");
    assert_eq!(pages.ids(), &[9, 8, 7]);

    // Through the cache, on both tiers.
    let mut cache = new_cache(2, 10, 10);
    let dev = cache.allocate(Tier::Device, 3).expect("3 of 9 pages");
    assert_eq!(dev.ids(), &[9, 8, 7]);
    let host = cache.allocate(Tier::Host, 3).expect("3 of 9 pages");
    assert_eq!(host.ids(), &[9, 8, 7]);

    // Returned pages are pushed in order and popped from the top: last freed, first out.
    cache.free(Tier::Device, dev).expect("own pool");
    let again = cache.allocate(Tier::Device, 3).expect("3 of 9 pages");
    assert_eq!(again.ids(), &[7, 8, 9]);
    assert_invariants_outside(&mut cache, again.ids(), host.ids());
}

#[test]
fn allocate_zero_and_over_ask() {
    let mut cache = new_cache(2, 10, 0);
    let zero = cache
        .allocate(Tier::Device, 0)
        .expect("zero pages is a valid ask");
    assert!(zero.is_empty());
    assert_eq!(cache.available(Tier::Device), 9);

    // All-or-nothing: an over-ask gets nothing and takes nothing.
    assert!(cache.allocate(Tier::Device, 10).is_none());
    assert_eq!(cache.available(Tier::Device), 9);
    let all = cache
        .allocate(Tier::Device, 9)
        .expect("exactly the usable pages");
    assert!(!all.ids().contains(&0), "page 0 is never issued");
    assert!(cache.allocate(Tier::Device, 1).is_none());

    // No host pool: nothing to allocate.
    assert!(cache.allocate(Tier::Host, 1).is_none());
    assert!(cache.allocate(Tier::Host, 0).expect("empty").is_empty());
    assert_invariants_outside(&mut cache, all.ids(), &[]);
}

// ----- split ------------------------------------------------------------------------

/// A split gives the new prefix node the suffix's lock counts: every lock covering the
/// suffix also covers the prefix, and releasing it later unlocks both.
#[test]
fn split_copies_ref_counts() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 0);
    let tokens = make_aligned_tokens(2, PS, 1);
    let n = insert_fresh(&mut cache, Tier::Device, &tokens).last_node;
    let lock = cache.lock(n, Tier::Device);
    assert_eq!(cache.stats().locked_pages[0], 2);

    // A committed match ending inside the node splits it.
    let m = cache.match_prefix(&tokens[..2]);
    assert_eq!(cache.stats().nodes, 2);
    assert_ne!(m.device, n, "the prefix is a new node");
    assert_eq!(m.device_pages, 1);
    assert_eq!(cache.stats().locked_pages[0], 2, "both halves stay locked");
    assert_eq!(cache.evictable(Tier::Device), 0);
    let usable = cache.usable(Tier::Device);
    assert!(!cache.ensure_free(Tier::Device, usable));
    assert_invariants(&mut cache); // a child is never locked more than its parent

    // Lock the prefix alone, then release the original lock: only the suffix frees up.
    let prefix_lock = cache.lock(m.device, Tier::Device);
    cache.unlock(lock);
    assert_eq!(cache.stats().locked_pages[0], 1);
    assert_eq!(cache.evictable(Tier::Device), 1);
    assert!(!cache.ensure_free(Tier::Device, usable));
    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 1));
    assert_eq!(cache.probe(&tokens).device_pages, 1);
    assert_invariants(&mut cache);

    cache.unlock(prefix_lock);
    assert!(cache.ensure_free(Tier::Device, usable));
    assert_eq!(cache.stats().nodes, 0);
    assert_invariants(&mut cache);
}

/// A write-back in flight across a split of its node: the acknowledgement covers the
/// split-off prefix too (success publishes the whole copy, failure rolls it all back).
#[test]
fn write_back_ack_covers_a_node_split_while_in_flight() {
    const PS: u32 = 2;
    let tokens = make_aligned_tokens(2, PS, 1);
    for success in [true, false] {
        let mut cache = new_cache(PS, 16, 16);
        let n = insert_fresh(&mut cache, Tier::Device, &tokens).last_node;
        let nodes = cache.nodes_without(Tier::Host, n);
        let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
        assert_eq!(pairs.len(), 2);

        // Another request matches the first page while the copy is in flight.
        cache.match_prefix(&tokens[..2]);
        assert_eq!(cache.stats().nodes, 2);
        cache.write_back_done(ticket, success);
        assert_eq!(cache.pending_write_backs(), 0);

        let m = cache.match_prefix(&tokens);
        if success {
            assert_eq!(m.host_pages, 2, "both halves readable on host");
            cache.demote(m.device);
            assert_eq!(cache.available(Tier::Device), cache.usable(Tier::Device));
        } else {
            assert_eq!(m.host_pages, 0);
            assert_eq!(cache.stats().cached_pages[Tier::Host.index()], 0);
            assert_eq!(cache.available(Tier::Host), cache.usable(Tier::Host));
            assert_eq!(m.device_pages, 2);
        }
        assert_invariants(&mut cache);
        cache.clear();
        assert_eq!(
            cache.stats().nodes,
            0,
            "success={success}: no node left behind"
        );
        assert_invariants(&mut cache);
    }
}

// ----- write-back, demote -----------------------------------------------------------

/// Cache-level flow of a finished request (§8.3): publish, write back the host-missing
/// suffix, acknowledge, release the device lock, demote: every device page of the
/// request is free again and the prompt is readable on host.
#[test]
fn finished_request_device_pages_all_free_after_write_back() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 32);
    // Published in two chunks: nodes P (2 pages) and C (2 pages).
    let tokens = make_aligned_tokens(4, PS, 1);
    let p = insert_fresh(&mut cache, Tier::Device, &tokens[..4]).last_node;
    let p_lock = cache.lock(p, Tier::Device);
    let c = insert_after_prefix(&mut cache, Tier::Device, &tokens, 2).last_node;
    let dev_lock = cache.lock(c, Tier::Device);
    cache.unlock(p_lock);
    let dev_ids = device_path(&cache, c);

    // Finish: write back NodesWithout<Host> (leaf→root).
    let m = cache.match_prefix(&tokens);
    assert_eq!((m.device, m.device_pages, m.host_pages), (c, 4, 0));
    let nodes = cache.nodes_without(Tier::Host, m.device);
    assert_eq!(nodes, vec![c, p]);
    let need = cache.pages_needed(Tier::Host, &nodes);
    assert_eq!(need, 4);
    assert!(cache.ensure_free(Tier::Host, need));
    let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
    let host_lock = cache.lock(m.device, Tier::Host);
    let mut srcs: Vec<_> = pairs.iter().map(|p| p.src).collect();
    srcs.sort_unstable();
    let mut want = dev_ids.clone();
    want.sort_unstable();
    assert_eq!(srcs, want, "every device page is copied once");

    cache.write_back_done(ticket, true);
    cache.unlock(dev_lock);
    cache.demote(m.device);
    assert_eq!(
        cache.available(Tier::Device),
        cache.usable(Tier::Device),
        "all the request's device pages are back in the pool"
    );
    let m = cache.match_prefix(&tokens);
    assert_eq!((m.device_pages, m.host_pages), (0, 4));
    drop(host_lock);
    assert_invariants(&mut cache);
}

/// Demote stops at a locked device copy and at a node with a device child (§4.5).
#[test]
fn demote_stops_at_locked_copies_and_device_children() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    let tokens = make_aligned_tokens(2, PS, 1);
    let p = insert_fresh(&mut cache, Tier::Device, &tokens[..2]).last_node;
    let c = insert_after_prefix(&mut cache, Tier::Device, &tokens, 1).last_node;
    let nodes = cache.nodes_without(Tier::Host, c);
    let (ticket, _) = cache.attach_for_write_back(&nodes).expect("host room");
    cache.write_back_done(ticket, true);

    cache.demote(p); // P has a device child
    assert_eq!(cache.probe(&tokens).device_pages, 2);
    let lock = cache.lock(c, Tier::Device);
    cache.demote(c); // C is locked
    assert_eq!(cache.probe(&tokens).device_pages, 2);
    cache.unlock(lock);
    cache.demote(c);
    assert_eq!(cache.probe(&tokens).device_pages, 0);
    assert_eq!(cache.probe(&tokens).host_pages, 2);
    assert_invariants(&mut cache);
}

// ----- page hashes (§6.1) ------------------------------------------------------------

const H12: &str = "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f";
const H34: &str = "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c";

fn hex(hashes: &[PageHash]) -> Vec<String> {
    hashes.iter().map(PageHash::to_hex).collect()
}

#[test]
fn page_hash_vectors_on_tree_paths() {
    const PS: u32 = 2;
    let mut cache = RadixCore::new(&CacheConfig {
        page_size: PS,
        device_pages: 16,
        host_pages: 16,
        kv_events: false,
        page_hashes: true,
        policy: Default::default(),
        mamba: None,
        paged: None,
        lost_hits: false,
    });
    let a = insert_fresh(&mut cache, Tier::Device, &[1, 2, 3, 4]).last_node;
    assert_eq!(hex(&cache.path_page_hashes(a)), vec![H12, H34]);

    // A branch splits the node; both paths keep position-correct chains.
    let b = insert_fresh(&mut cache, Tier::Device, &[1, 2, 5, 6]).last_node;
    let h12 = PageHash::from_hex(H12).expect("vector");
    let h56 = PageHash::chain(Some(&h12), &[5, 6]);
    assert_eq!(cache.path_page_hashes(b), vec![h12, h56]);
    assert_eq!(hex(&cache.path_page_hashes(a)), vec![H12, H34]);

    // A host-only path recovered onto the device gets the same chain as from tokens.
    let tokens = [7, 8, 9, 10, 11, 12];
    insert_fresh(&mut cache, Tier::Host, &tokens);
    let m = cache.match_prefix(&tokens);
    let nodes = cache.nodes_without(Tier::Device, m.host);
    cache.attach_for_load_back(&nodes).expect("device room");
    assert_eq!(
        cache.path_page_hashes(m.host),
        rolling_page_hashes(None, &tokens, PS as usize)
    );
    assert_invariants(&mut cache);
}

// ----- pruning ----------------------------------------------------------------------

/// After every copy of every tier is evicted, no node is left (fixed zombie behaviour,
/// §10), including nodes created by splits and host-only branches.
#[test]
fn no_resource_less_node_after_full_eviction() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    let a = make_aligned_tokens(3, PS, 1);
    let b = concat(&a[..4], &[40, 41]);
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Device, &b); // splits A's node
    insert_fresh(&mut cache, Tier::Host, &a); // host copy of A's path
    insert_fresh(&mut cache, Tier::Host, &[90, 91]); // host-only branch
    assert_eq!(cache.stats().nodes, 4);

    // Device tier first: nodes holding a host copy stay, the rest are pruned.
    let usable = cache.usable(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, usable));
    assert_eq!(cache.stats().nodes, 3, "B's device-only leaf is pruned");
    assert_invariants(&mut cache);

    let usable = cache.usable(Tier::Host);
    assert!(cache.ensure_free(Tier::Host, usable));
    let stats = cache.stats();
    assert_eq!(stats.nodes, 0);
    assert_eq!(stats.cached_pages, [0, 0]);
    assert_invariants(&mut cache);
}

#[test]
fn clear_leaves_no_node_and_spares_locked_paths() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    let a = make_aligned_tokens(2, PS, 1);
    let locked = insert_fresh(&mut cache, Tier::Device, &[50, 51]).last_node;
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Host, &a);
    let lock = cache.lock(locked, Tier::Device);

    cache.clear();
    assert_eq!(cache.stats().nodes, 1, "only the locked node is left");
    assert_eq!(cache.probe(&[50, 51]).device_pages, 1);
    cache.unlock(lock);
    cache.clear();
    assert_eq!(cache.stats().nodes, 0);
    assert_invariants(&mut cache);
}

// ----- chosen touch / LRU semantics ---------------------------------------------------

/// Exact LRU: a committed match re-keys an unlocked leaf, so a touched older leaf A is
/// evicted after a newer untouched B.
#[test]
fn touched_unlocked_older_leaf_is_evicted_after_newer_untouched() {
    const PS: u32 = 4;
    let mut cache = new_cache(PS, 64, 0);
    let a = make_aligned_tokens(1, PS, 1);
    let b = make_aligned_tokens(1, PS, 5);
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Device, &b);
    cache.match_prefix(&a);

    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 1));
    assert_eq!(cache.probe(&b).device_pages, 0, "B first");
    assert_eq!(cache.probe(&a).device_pages, 1);
    assert!(cache.ensure_free(Tier::Device, free + 2));
    assert_eq!(cache.probe(&a).device_pages, 0, "then A");
    assert_invariants(&mut cache);
}

/// The walk of an insert is a committed touch too: re-inserting A (all duplicates)
/// makes it the most recently used.
#[test]
fn duplicate_insert_touches_like_a_match() {
    const PS: u32 = 4;
    let mut cache = new_cache(PS, 64, 0);
    let a = make_aligned_tokens(1, PS, 1);
    let b = make_aligned_tokens(1, PS, 5);
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Device, &b);
    assert_eq!(insert_fresh(&mut cache, Tier::Device, &a).inserted_pages, 0);

    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 1));
    assert_eq!(cache.probe(&b).device_pages, 0);
    assert_eq!(cache.probe(&a).device_pages, 1);
    assert_invariants(&mut cache);
}

/// `probe` never changes the LRU order: leaves go in insertion order however often the
/// older ones are probed.
#[test]
fn probe_never_changes_lru_order() {
    const PS: u32 = 4;
    let mut cache = new_cache(PS, 64, 0);
    let leaves: Vec<_> = [1, 5, 9]
        .iter()
        .map(|&s| make_aligned_tokens(1, PS, s))
        .collect();
    for leaf in &leaves {
        insert_fresh(&mut cache, Tier::Device, leaf);
    }
    for _ in 0..3 {
        assert_eq!(cache.probe(&leaves[0]).device_pages, 1);
        assert_eq!(cache.probe(&leaves[1]).device_pages, 1);
    }

    for (i, leaf) in leaves.iter().enumerate() {
        let free = cache.available(Tier::Device);
        assert!(cache.ensure_free(Tier::Device, free + 1));
        assert_eq!(
            cache.probe(leaf).device_pages,
            0,
            "leaf {i} is evicted in turn"
        );
        for later in &leaves[i + 1..] {
            assert_eq!(cache.probe(later).device_pages, 1);
        }
    }
    assert_invariants(&mut cache);
}

/// `probe` never splits; the same query as a committed `match_prefix` does.
#[test]
fn probe_never_splits_but_match_does() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    let tokens = make_aligned_tokens(3, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    insert_fresh(&mut cache, Tier::Host, &tokens);
    let query = concat(&tokens[..2], &[77, 78]);

    let p = cache.probe(&query);
    assert_eq!(
        (p.device_pages, p.host_pages, p.device_unlocked_pages),
        (1, 1, 1)
    );
    assert_eq!(cache.probe(&tokens[..4]).device_pages, 2);
    assert_eq!(cache.stats().nodes, 1, "probes do not split");

    let m = cache.match_prefix(&query);
    assert_eq!((m.device_pages, m.host_pages), (1, 1));
    assert_eq!(cache.stats().nodes, 2, "a committed match splits");
    assert_eq!(cache.probe(&query), p, "and answers the same");
    assert_invariants(&mut cache);
}

/// `device_unlocked_pages` counts the matched pages nobody has locked.
#[test]
fn probe_reports_unlocked_device_pages() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 0);
    let tokens = make_aligned_tokens(2, PS, 1);
    let p = insert_fresh(&mut cache, Tier::Device, &tokens[..2]).last_node;
    insert_after_prefix(&mut cache, Tier::Device, &tokens, 1);
    assert_eq!(cache.probe(&tokens).device_unlocked_pages, 2);
    let lock = cache.lock(p, Tier::Device);
    let probe = cache.probe(&tokens);
    assert_eq!((probe.device_pages, probe.device_unlocked_pages), (2, 1));
    cache.unlock(lock);
    assert_eq!(cache.probe(&tokens).device_unlocked_pages, 2);
    assert_invariants(&mut cache);
}

// ----- insert contract ----------------------------------------------------------------

#[test]
fn insert_rejects_unaligned_tokens_and_returns_pages() {
    let mut cache = new_cache(2, 16, 0);
    let pages = cache.allocate(Tier::Device, 2).expect("2 pages");
    assert!(matches!(
        cache.insert(Tier::Device, &[1, 2, 3], 0, pages),
        Err(RadixError::Unaligned {
            tokens: 3,
            page_size: 2
        })
    ));
    assert_eq!(cache.available(Tier::Device), 15, "the pages went back");
    assert_eq!(cache.stats().nodes, 0);
    assert_invariants(&mut cache);
}

// `insert(tier, tokens, prefix_pages, pages)` requires the first `prefix_pages` pages
// to be resident on `tier`, and reports `PrefixNotResident` otherwise, changing
// nothing.
//
// Regression: the check once looked only at a node straddling the prefix boundary, so a
// claimed prefix ending at a node boundary, or absent altogether, broke the tree.

#[test]
fn insert_rejects_a_non_resident_prefix_straddling_a_node() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    insert_fresh(&mut cache, Tier::Host, &[1, 2, 3, 4]);
    let before = cache.stats();
    let pages = cache.allocate(Tier::Device, 1).expect("1 page");
    assert!(matches!(
        cache.insert(Tier::Device, &[1, 2, 3, 4], 1, pages),
        Err(RadixError::PrefixNotResident { prefix: 1 })
    ));
    assert_eq!(cache.stats().cached_pages, before.cached_pages);
    assert_eq!(cache.stats().free_pages, before.free_pages);
    assert_invariants(&mut cache);
}

#[test]
fn insert_rejects_a_non_resident_prefix_ending_at_a_node_boundary() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    // The claimed 1-page device prefix is a whole node, present on host only.
    insert_fresh(&mut cache, Tier::Host, &[1, 2]);
    let before = cache.stats();
    let pages = cache.allocate(Tier::Device, 1).expect("1 page");
    let res = cache.insert(Tier::Device, &[1, 2, 3, 4], 1, pages);
    assert!(
        matches!(res, Err(RadixError::PrefixNotResident { prefix: 1 })),
        "host-only prefix accepted: {res:?}"
    );
    assert_eq!(cache.stats(), before, "a rejected insert changes nothing");
    assert_invariants(&mut cache);
}

#[test]
fn insert_rejects_a_whole_sequence_prefix_absent_from_the_tree() {
    let mut cache = new_cache(2, 16, 16);
    let res = cache.insert(Tier::Device, &[1, 2], 1, kvtier_host::OwnedPages::empty());
    assert!(
        matches!(res, Err(RadixError::PrefixNotResident { prefix: 1 })),
        "absent prefix accepted: {res:?}"
    );
    assert_eq!(cache.stats().nodes, 0);
    assert_invariants(&mut cache);
}

// A write-back ticket pins its path on both tiers until it is acknowledged: eviction
// cannot take the device pages being read or the host pages being written, and after the
// ack (success or failure) no resource-less node remains.

fn evict_while_in_flight_then_ack(success: bool) {
    const PS: u32 = 2;
    let tokens = make_aligned_tokens(2, PS, 1);
    let mut cache = new_cache(PS, 16, 16);
    let n = insert_fresh(&mut cache, Tier::Device, &tokens).last_node;
    let nodes = cache.nodes_without(Tier::Host, n);
    let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
    assert_eq!(pairs.len(), 2);
    // Nothing of the in-flight copy is evictable, on either tier.
    assert_eq!(cache.evictable(Tier::Device), 0);
    assert_eq!(cache.evictable(Tier::Host), 0);
    cache.clear();
    assert!(!cache.ensure_free(Tier::Device, cache.usable(Tier::Device)));
    assert_eq!(
        cache.probe(&tokens).device_pages,
        2,
        "the source stays on device"
    );
    cache.write_back_done(ticket, success);
    let expected_host = if success { 2 } else { 0 };
    assert_eq!(cache.probe(&tokens).host_pages, expected_host);
    assert_invariants(&mut cache);
    // Once acknowledged, everything is evictable again and nothing lingers.
    cache.clear();
    assert_eq!(cache.stats().nodes, 0);
    assert_invariants(&mut cache);
}

#[test]
fn write_back_success_ack_after_in_flight_eviction_leaves_no_zombie() {
    evict_while_in_flight_then_ack(true);
}

#[test]
fn write_back_failure_ack_after_in_flight_eviction_leaves_no_zombie() {
    evict_while_in_flight_then_ack(false);
}
