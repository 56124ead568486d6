//! Port of the reference scheduler's `test_kv_cache_events.cpp`, cache-level tests
//! (page size 2; the fixture's pools hold 3 pages = 2 usable per tier).
//!
//! The event sink is `CacheConfig::kv_events` + `drain_events()`; events are
//! device-tier only, one `BlockStored` per newly resident page (de-duplicated by a
//! published set) and one `BlockRemoved` per node leaving the device.
//! The scheduler-level `DrainKvEventsReturnsAndClearsSchedulerEvents` is ported here only
//! at cache level (`drain_events_returns_and_clears`); see
//! docs/test-inventory/cache-core.md.

mod common;

use common::{
    assert_invariants, concat, insert_fresh, make_aligned_tokens, new_cache, new_cache_with_events,
};
use kvtier_radix::RadixCore;
use kvtier_types::{KvEvent, Medium, Tier, Token, hash::block_hash};

const PS: u32 = 2;

fn fixture() -> RadixCore {
    new_cache_with_events(PS, 3, 3)
}

/// The fields of a `BlockStored` event: (hash, parent, tokens, block size).
fn stored(event: &KvEvent) -> (u64, Option<u64>, Vec<Token>, u32) {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
        } => {
            assert_eq!(*medium, Medium::Device, "`stored` reads device events");
            assert_eq!(block_hashes.len(), 1, "one hash per BlockStored");
            (
                block_hashes[0],
                *parent_block_hash,
                token_ids.clone(),
                *block_size,
            )
        }
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

/// The hashes of a `BlockRemoved` event.
/// The media of `events`, in order.
fn media(events: &[KvEvent]) -> Vec<(&'static str, Medium)> {
    events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { medium, .. } => ("stored", *medium),
            KvEvent::BlockRemoved { medium, .. } => ("removed", *medium),
            other => panic!("unexpected {other:?}"),
        })
        .collect()
}

fn removed(event: &KvEvent) -> Vec<u64> {
    match event {
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => {
            assert_eq!(*medium, Medium::Device);
            block_hashes.clone()
        }
        other => panic!("expected BlockRemoved, got {other:?}"),
    }
}

#[test]
fn insert_one_page_emits_block_stored() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(1, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);

    let events = cache.drain_events();
    assert_eq!(events.len(), 1);
    let (hash, parent, token_ids, block_size) = stored(&events[0]);
    assert_eq!(hash, block_hash(None, &tokens));
    assert_eq!(hash, 15_057_981_579_580_773_918, "§6.2 vector for [1,2]");
    assert_eq!(parent, None);
    assert_eq!(token_ids, tokens);
    assert_eq!(block_size, PS);
    assert_invariants(&mut cache);
}

#[test]
fn insert_same_tokens_does_not_duplicate_block_stored() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(1, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    assert_eq!(cache.drain_events().len(), 1);

    let res = insert_fresh(&mut cache, Tier::Device, &tokens);
    assert_eq!(res.inserted_pages, 0);
    assert!(cache.drain_events().is_empty());
    assert_invariants(&mut cache);
}

#[test]
fn insert_two_pages_emits_rolling_parent_hash() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(2, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);

    let events = cache.drain_events();
    assert_eq!(events.len(), 2);
    let first_hash = block_hash(None, &tokens[..2]);
    let second_hash = block_hash(Some(first_hash), &tokens[2..]);
    assert_eq!(
        second_hash, 1_701_542_150_546_744_594,
        "§6.2 vector for [3,4]"
    );

    let (h0, p0, _, _) = stored(&events[0]);
    assert_eq!((h0, p0), (first_hash, None));
    let (h1, p1, t1, _) = stored(&events[1]);
    assert_eq!((h1, p1), (second_hash, Some(first_hash)));
    assert_eq!(t1, tokens[2..].to_vec());
    assert_invariants(&mut cache);
}

#[test]
fn split_node_uses_prefix_block_hash_for_new_child_parent() {
    let mut cache = new_cache_with_events(PS, 8, 8);
    let original = make_aligned_tokens(3, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &original);
    assert_eq!(cache.drain_events().len(), 3);

    // Shares two pages with `original`, then branches: the node is split after page 2.
    let branched = concat(&original[..4], &[99, 100]);
    let res = insert_fresh(&mut cache, Tier::Device, &branched);
    assert_eq!(res.inserted_pages, 1);

    let first_hash = block_hash(None, &original[..2]);
    let second_hash = block_hash(Some(first_hash), &original[2..4]);
    let branch_hash = block_hash(Some(second_hash), &branched[4..]);

    let events = cache.drain_events();
    assert_eq!(events.len(), 1, "only the new branch page is stored");
    let (hash, parent, token_ids, _) = stored(&events[0]);
    assert_eq!(hash, branch_hash);
    assert_eq!(parent, Some(second_hash));
    assert_eq!(token_ids, vec![99, 100]);
    assert_eq!(cache.stats().nodes, 3);
    assert_invariants(&mut cache);
}

#[test]
fn device_eviction_emits_block_removed() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(2, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    let events = cache.drain_events();
    let first_hash = stored(&events[0]).0;
    let second_hash = stored(&events[1]).0;

    assert!(cache.ensure_free(Tier::Device, 1));
    let events = cache.drain_events();
    assert_eq!(events.len(), 1, "one event per evicted node");
    assert_eq!(removed(&events[0]), vec![first_hash, second_hash]);
    assert_invariants(&mut cache);
}

#[test]
fn already_removed_blocks_are_not_removed_twice() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(2, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    cache.drain_events();

    assert!(cache.ensure_free(Tier::Device, 1));
    assert_eq!(cache.drain_events().len(), 1);
    assert!(cache.ensure_free(Tier::Device, 1));
    assert!(cache.drain_events().is_empty());

    // Stronger: a node that left the device and later leaves the host (its last tier)
    // does not announce its blocks again.
    insert_fresh(&mut cache, Tier::Device, &tokens);
    insert_fresh(&mut cache, Tier::Host, &tokens);
    let (gpu, cpu) = (("stored", Medium::Device), ("stored", Medium::Host));
    assert_eq!(media(&cache.drain_events()), [gpu, gpu, cpu, cpu]);
    let usable = cache.usable(Tier::Device);
    assert!(cache.ensure_free(Tier::Device, usable));
    assert_eq!(media(&cache.drain_events()), [("removed", Medium::Device)]);
    cache.clear();
    assert_eq!(cache.stats().nodes, 0);
    assert_eq!(
        media(&cache.drain_events()),
        [("removed", Medium::Host)],
        "each tier announces its removal once"
    );
    assert_invariants(&mut cache);
}

#[test]
fn host_recovery_publishes_device_stored_events() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(2, PS, 1);
    insert_fresh(&mut cache, Tier::Host, &tokens);
    let cpu = ("stored", Medium::Host);
    assert_eq!(
        media(&cache.drain_events()),
        [cpu, cpu],
        "host pages are published"
    );

    let m = cache.match_prefix(&tokens);
    assert_eq!((m.device_pages, m.host_pages), (0, 2));
    let nodes = cache.nodes_without(Tier::Device, m.host);
    let pairs = cache.attach_for_load_back(&nodes).expect("device room");
    assert_eq!(pairs.len(), 2);

    let first_hash = block_hash(None, &tokens[..2]);
    let second_hash = block_hash(Some(first_hash), &tokens[2..]);
    let events = cache.drain_events();
    assert_eq!(events.len(), 2);
    assert_eq!(stored(&events[0]).0, first_hash);
    assert_eq!(stored(&events[0]).1, None);
    assert_eq!(stored(&events[1]).0, second_hash);
    assert_eq!(stored(&events[1]).1, Some(first_hash));

    assert!(cache.ensure_free(Tier::Device, 1));
    let events = cache.drain_events();
    assert_eq!(events.len(), 1);
    assert_eq!(removed(&events[0]), vec![first_hash, second_hash]);
    assert_invariants(&mut cache);
}

/// `KVPrefixCacheEventBenchTest.OptimizedInsertIsFasterThanLegacyAncestorRehashing`:
/// 512 pages of 16 tokens published over an existing 512-node host chain give 512
/// correctly chained events. Like the reference, no timing is asserted.
#[test]
fn optimized_insert_emits_one_event_per_page_over_a_deep_chain() {
    const BENCH_PS: u32 = 16;
    const PAGES: usize = 512;
    let mut cache = new_cache_with_events(BENCH_PS, PAGES as u32 + 1, 2 * PAGES as u32 + 1);
    // A host chain of 512 one-page nodes.
    for pages in 1..=PAGES {
        insert_fresh(
            &mut cache,
            Tier::Host,
            &make_aligned_tokens(pages, BENCH_PS, 1),
        );
    }
    assert_eq!(cache.stats().nodes, PAGES);
    let host = media(&cache.drain_events());
    assert_eq!(host, vec![("stored", Medium::Host); PAGES]);

    let tokens = make_aligned_tokens(PAGES, BENCH_PS, 1);
    let res = insert_fresh(&mut cache, Tier::Device, &tokens);
    assert_eq!(res.inserted_pages, PAGES as u32);

    let events = cache.drain_events();
    assert_eq!(events.len(), PAGES);
    let mut parent = None;
    let mut sink = 0u64;
    for (event, page) in events.iter().zip(tokens.chunks_exact(BENCH_PS as usize)) {
        let (hash, p, token_ids, _) = stored(event);
        assert_eq!(p, parent);
        assert_eq!(hash, block_hash(parent, page));
        assert_eq!(token_ids, page.to_vec());
        sink ^= hash;
        parent = Some(hash);
    }
    assert_ne!(sink, 0);
    assert_invariants(&mut cache);
}

/// Cache-level half of `DrainKvEventsReturnsAndClearsSchedulerEvents`: draining returns
/// the buffered events and clears the buffer.
#[test]
fn drain_events_returns_and_clears() {
    let mut cache = fixture();
    let tokens = make_aligned_tokens(1, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    let events = cache.drain_events();
    assert_eq!(events.len(), 1);
    assert_eq!(stored(&events[0]).2, tokens);
    assert!(cache.drain_events().is_empty());
    assert_invariants(&mut cache);
}

#[test]
fn no_events_when_disabled() {
    let mut cache = new_cache(PS, 3, 3);
    let tokens = make_aligned_tokens(2, PS, 1);
    insert_fresh(&mut cache, Tier::Device, &tokens);
    assert!(cache.ensure_free(Tier::Device, 2));
    assert!(cache.drain_events().is_empty());
    assert_invariants(&mut cache);
}

/// §7: demoting a device copy (write-back acknowledged) announces its removal once.
#[test]
fn demote_emits_block_removed() {
    let mut cache = new_cache_with_events(PS, 8, 8);
    let tokens = make_aligned_tokens(2, PS, 1);
    let res = insert_fresh(&mut cache, Tier::Device, &tokens);
    let hashes: Vec<u64> = cache.drain_events().iter().map(|e| stored(e).0).collect();

    let nodes = cache.nodes_without(Tier::Host, res.last_node);
    let (ticket, _) = cache.attach_for_write_back(&nodes).expect("host room");
    cache.write_back_done(ticket, true);
    let cpu = ("stored", Medium::Host);
    assert_eq!(
        media(&cache.drain_events()),
        [cpu, cpu],
        "readable on host once the write-back is acknowledged"
    );

    cache.demote(res.last_node);
    let events = cache.drain_events();
    assert_eq!(events.len(), 1);
    assert_eq!(removed(&events[0]), hashes);
    assert_eq!(cache.probe(&tokens).device_pages, 0);
    assert_eq!(cache.probe(&tokens).host_pages, 2);
    assert_invariants(&mut cache);
}
