//! The reference scheduler's known bugs (spec/cache-core.md §10) that we fix rather than
//! copy. Each test is named after the bug it guards against and asserts the fixed
//! behaviour; on the reference implementation each of them fails.

mod common;

use common::{
    assert_invariants, concat, device_path, insert_after_prefix, insert_fresh, make_aligned_tokens,
    new_cache, new_cache_with_events,
};
use kvtier_types::{KvEvent, Tier};

/// Reference: when a child and its parent are evicted in one call, the child is not
/// pruned (its parent was evicted too) and the parent cannot be pruned (the child is
/// still attached), so both stay behind as resource-less nodes.
#[test]
fn zombie_nodes_after_cascade_prune() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 0);
    // A 3-level chain P → C → G plus a sibling S of C.
    let p = make_aligned_tokens(2, PS, 1);
    let c = concat(&p, &[10, 11]);
    let g = concat(&c, &[20, 21]);
    let s = concat(&p, &[30, 31]);
    insert_fresh(&mut cache, Tier::Device, &p);
    insert_after_prefix(&mut cache, Tier::Device, &c, 2);
    insert_after_prefix(&mut cache, Tier::Device, &g, 3);
    insert_after_prefix(&mut cache, Tier::Device, &s, 2);
    assert_eq!(cache.stats().nodes, 4);

    // One call evicts G, C, S and then P (each exposed by its children's eviction).
    let usable = cache.usable(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, usable));
    assert_eq!(cache.available(Tier::Device), usable);
    assert_invariants(&mut cache); // flags any resource-less leaf
    assert_eq!(cache.stats().nodes, 0, "no resource-less node remains");
    assert_eq!(cache.probe(&g).device_pages, 0);
}

/// The same with a survivor: a locked grandparent keeps its node, everything evicted
/// below it in the same call is pruned.
#[test]
fn zombie_nodes_after_cascade_prune_under_a_locked_ancestor() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 0);
    let root_seq = make_aligned_tokens(1, PS, 1);
    let mid = concat(&root_seq, &[5, 6]);
    let leaf = concat(&mid, &[7, 8]);
    let r = insert_fresh(&mut cache, Tier::Device, &root_seq);
    insert_after_prefix(&mut cache, Tier::Device, &mid, 1);
    insert_after_prefix(&mut cache, Tier::Device, &leaf, 2);
    let lock = cache.lock(r.last_node, Tier::Device);

    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 2));
    assert_eq!(cache.stats().nodes, 1, "only the locked node is left");
    assert_eq!(cache.probe(&leaf).device_pages, 1);
    assert_invariants(&mut cache);
    cache.unlock(lock);
    assert_invariants(&mut cache);
}

/// Reference: touching an unlocked leaf (a committed match) does not re-key it, so a
/// just-used leaf is evicted before an older untouched one. Ours is exact LRU.
#[test]
fn unlocked_touch_moves_lru_order() {
    const PS: u32 = 4;
    let mut cache = new_cache(PS, 64, 0);
    let a = make_aligned_tokens(1, PS, 1);
    let b = make_aligned_tokens(1, PS, 5);
    insert_fresh(&mut cache, Tier::Device, &a); // older
    insert_fresh(&mut cache, Tier::Device, &b); // newer

    // Commit a match on A without locking it.
    let m = cache.match_prefix(&a);
    assert_eq!(m.device_pages, 1);

    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 1));
    assert_eq!(
        cache.probe(&b).device_pages,
        0,
        "untouched B is now the LRU leaf"
    );
    assert_eq!(cache.probe(&a).device_pages, 1, "touched A survives");
    assert_invariants(&mut cache);
}

/// Reference: eviction runs before the admission answer and is never rolled back, so a
/// request that cannot fit still empties the cache. Ours evicts nothing when the
/// request cannot be satisfied.
#[test]
fn non_transactional_eviction() {
    const PS: u32 = 4;
    let mut cache = new_cache_with_events(PS, 16, 0);
    let a = make_aligned_tokens(2, PS, 1);
    let b = make_aligned_tokens(2, PS, 100);
    let c = make_aligned_tokens(2, PS, 200);
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Device, &b);
    let c_node = insert_fresh(&mut cache, Tier::Device, &c).last_node;
    let lock = cache.lock(c_node, Tier::Device);
    cache.drain_events();

    let free = cache.available(Tier::Device);
    assert_eq!(free, 15 - 6);
    assert_eq!(cache.evictable(Tier::Device), 4);
    let before = cache.stats();

    // free (9) + evictable (4) = 13 < 14: refuse, evict nothing.
    assert!(!cache.can_free(Tier::Device, 14, 0));
    assert!(!cache.ensure_free(Tier::Device, 14));
    assert_eq!(cache.stats(), before, "cached pages unchanged");
    assert_eq!(cache.probe(&a).device_pages, 2);
    assert_eq!(cache.probe(&b).device_pages, 2);
    assert!(
        !cache
            .drain_events()
            .iter()
            .any(|e| matches!(e, KvEvent::BlockRemoved { .. })),
        "nothing was announced as removed"
    );

    // Exactly enough succeeds and leaves the locked copy alone.
    assert!(cache.can_free(Tier::Device, 13, 0));
    assert!(
        !cache.can_free(Tier::Device, 13, 1),
        "one more locked page would not fit"
    );
    assert!(cache.ensure_free(Tier::Device, 13));
    assert_eq!(cache.probe(&c).device_pages, 2);
    assert_eq!(cache.stats().cached_pages[Tier::Device.index()], 2);
    cache.unlock(lock);
    assert_invariants(&mut cache);
}

/// Reference: `WriteBackDone.success` (and the host attach result) is ignored, so a
/// failed copy leaves garbage host pages in the tree that later matches read. Ours rolls
/// the host copy back: the pages return to the pool, the host match stays where it was,
/// and the device copy is untouched (and not demoted).
#[test]
fn failed_write_back_treated_as_success_rolls_back() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    // Page 1 is already safely on host.
    let one = make_aligned_tokens(1, PS, 1);
    let first = insert_fresh(&mut cache, Tier::Device, &one);
    let nodes = cache.nodes_without(Tier::Host, first.last_node);
    let (ticket, _) = cache.attach_for_write_back(&nodes).expect("host room");
    cache.write_back_done(ticket, true);

    // Page 2 is published on device, then written back.
    let two = make_aligned_tokens(2, PS, 1);
    let res = insert_after_prefix(&mut cache, Tier::Device, &two, 1);
    let m = cache.match_prefix(&two);
    assert_eq!((m.device_pages, m.host_pages), (2, 1));
    let dev_ids = device_path(&cache, m.device);

    let nodes = cache.nodes_without(Tier::Host, m.device);
    assert_eq!(nodes, vec![res.last_node]);
    let host_free = cache.available(Tier::Host);
    let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].src, dev_ids[1]);
    assert_eq!(cache.available(Tier::Host), host_free - 1);
    assert_eq!(
        cache.probe(&two).host_pages,
        1,
        "an in-flight copy is not readable"
    );

    cache.write_back_done(ticket, false);
    assert_eq!(
        cache.available(Tier::Host),
        host_free,
        "host page back in the pool"
    );
    assert_eq!(cache.stats().cached_pages[Tier::Host.index()], 1);
    let m = cache.match_prefix(&two);
    assert_eq!(m.host_pages, 1, "host match stays at the previous depth");
    assert_eq!(m.device_pages, 2);
    assert_eq!(
        device_path(&cache, m.device),
        dev_ids,
        "device copy unchanged"
    );

    // Demote must not free a device copy whose host copy failed.
    cache.demote(m.device);
    assert_eq!(cache.probe(&two).device_pages, 2);
    assert_eq!(cache.nodes_without(Tier::Host, m.device), vec![m.device]);
    assert_invariants(&mut cache);
}

/// The success half of the fix: an acknowledged copy becomes readable on host, and a
/// demote then frees the device copy.
#[test]
fn failed_write_back_treated_as_success_success_publishes_then_demotes() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 16);
    let tokens = make_aligned_tokens(2, PS, 1);
    let res = insert_fresh(&mut cache, Tier::Device, &tokens);
    let nodes = cache.nodes_without(Tier::Host, res.last_node);

    let (ticket, _) = cache.attach_for_write_back(&nodes).expect("host room");
    // A demote while the copy is in flight frees nothing.
    cache.demote(res.last_node);
    assert_eq!(cache.probe(&tokens).device_pages, 2);

    cache.write_back_done(ticket, true);
    let m = cache.match_prefix(&tokens);
    assert_eq!((m.device_pages, m.host_pages), (2, 2));

    cache.demote(m.device);
    let usable = cache.usable(Tier::Device);
    assert_eq!(cache.available(Tier::Device), usable, "device copy freed");
    let m = cache.match_prefix(&tokens);
    assert_eq!((m.device_pages, m.host_pages), (0, 2));
    assert_invariants(&mut cache);
}

/// Reference: `Match` splits nodes and touches timestamps even for a pure query. Our
/// `probe` does neither.
#[test]
fn probe_is_read_only() {
    const PS: u32 = 2;
    let mut cache = new_cache(PS, 16, 0);
    let a = make_aligned_tokens(2, PS, 1); // one 2-page node, older
    let b = make_aligned_tokens(1, PS, 50); // newer
    insert_fresh(&mut cache, Tier::Device, &a);
    insert_fresh(&mut cache, Tier::Device, &b);
    let before = cache.stats();

    // A probe ending inside A's node, and one diverging inside it.
    assert_eq!(cache.probe(&a[..2]).device_pages, 1);
    assert_eq!(cache.probe(&[1, 2, 7, 7]).device_pages, 1);
    assert_eq!(cache.probe(&a).device_pages, 2);
    assert_eq!(cache.stats(), before);
    assert_eq!(cache.stats().nodes, 2, "no split");

    // No touch: A is still the LRU leaf and goes first.
    let free = cache.available(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, free + 1));
    assert_eq!(cache.probe(&a).device_pages, 0, "probed A was not touched");
    assert_eq!(cache.probe(&b).device_pages, 1);
    assert_invariants(&mut cache);
}

/// Found by the seeded campaign (open bug C, seed 9069): a host insert (an L3
/// prefetch's pages) through a node whose host copy a write-back is still filling took
/// that pending copy for a readable one and made the nodes below it readable. When the
/// write-back then failed, its rollback left a readable copy under a parent without one.
/// Nothing becomes readable below a pending copy now: those pages go back to the pool.
#[test]
fn host_insert_below_a_pending_write_back_copy_is_not_orphaned_by_its_rollback() {
    let mut cache = new_cache(2, 16, 16);
    let prefix = make_aligned_tokens(2, 2, 1);
    let leaf = insert_fresh(&mut cache, Tier::Device, &prefix).last_node;
    let nodes = cache.nodes_without(Tier::Host, leaf);
    let (ticket, pairs) = cache.attach_for_write_back(&nodes).expect("host room");
    assert_eq!(pairs.len(), 2, "the prefix's host copy is pending");
    // The prefetch brings the prefix and two more pages, all verified.
    let longer = concat(&prefix, &make_aligned_tokens(2, 2, 100));
    let inserted = insert_fresh(&mut cache, Tier::Host, &longer);
    assert_eq!(
        inserted.inserted_pages, 0,
        "nothing readable below a pending copy"
    );
    assert_eq!(cache.match_prefix(&longer).host_pages, 0);
    assert_invariants(&mut cache);
    cache.write_back_done(ticket, false);
    assert_invariants(&mut cache);
    assert_eq!(
        cache.match_prefix(&longer).device_pages,
        2,
        "the device copy stays"
    );
}
