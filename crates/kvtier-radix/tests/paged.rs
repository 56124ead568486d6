//! The paged-cache family hosted by the radix cache: snapshots on real tree nodes, the
//! splits its commits ask for, and snapshots leaving with their node's device KV.

mod common;

use common::{insert_fresh, make_aligned_tokens};
use kvtier_paged::{Adjunct, GroupRole, GroupSpec, PagedFamily, SnapshotTree};
use kvtier_radix::{CacheConfig, NodeId, RadixCore};
use kvtier_types::{Policy, Tier, Token, TreeView};

fn cache(page_size: u32, device_pages: u32, adjunct: Adjunct) -> RadixCore {
    RadixCore::new(&CacheConfig {
        page_size,
        device_pages,
        host_pages: 0,
        kv_events: false,
        page_hashes: false,
        policy: Policy::Default,
        mamba: None,
        paged: Some(adjunct),
        lost_hits: false,
    })
}

fn family<R>(
    c: &mut RadixCore,
    f: impl FnOnce(&mut PagedFamily<NodeId>, &mut RadixCore) -> R,
) -> R {
    c.with_snapshots(f).expect("a paged cache")
}

/// The reference's `Small` fixture: P 2, 8 device pages, `fh` 4×1 and `swa` 2×1
/// (W 8, state), both required: A = 4.
fn small() -> RadixCore {
    let adjunct = Adjunct::new(
        vec![
            GroupSpec::full_history("fh", 4, 1, 16),
            GroupSpec::sliding("swa", 2, 1, 16, 8, GroupRole::State),
        ],
        &["fh", "swa"],
    )
    .expect("the small fixture");
    cache(2, 8, adjunct)
}

/// A request computes `tokens` (on device at `node`) and commits them.
fn commit(c: &mut RadixCore, node: NodeId, tokens: u32) {
    family(c, |f, tree| {
        let mut r = f.new_tables();
        f.acquire(&mut r, 0, tokens, None).expect("pages");
        f.commit_chunk(tree, &mut r, node);
        f.release(&mut r);
    });
}

/// `test_paged_cache_eviction.cpp` PassiveEvictionReleasesPagedCachePages on the real
/// tree: evicting a node's KV frees its snapshot's group pages.
#[test]
fn passive_eviction_releases_paged_cache_pages() {
    let mut c = small();
    let a = insert_fresh(&mut c, Tier::Device, &make_aligned_tokens(2, 2, 1)).last_node;
    let b = insert_fresh(&mut c, Tier::Device, &make_aligned_tokens(2, 2, 100)).last_node;
    assert_eq!(c.available(Tier::Device), 3);
    let before = family(&mut c, |f, _| f.available());
    assert_eq!(before, [15, 15]);
    commit(&mut c, a, 4);
    assert!(c.snapshots().expect("family").has_snapshot(a));
    assert_eq!(family(&mut c, |f, _| f.available()), [14, 13]);
    c.check_invariants([&[], &[]]).expect("consistent");

    let lock = c.lock(b, Tier::Device);
    assert!(c.ensure_free(Tier::Device, 4));
    assert_eq!(family(&mut c, |f, _| f.available()), before);
    assert_eq!(family(&mut c, |f, _| f.stats().dropped_kv_evict), 1);
    c.unlock(lock);
    c.check_invariants([&[], &[]]).expect("consistent");
}

/// `test_paged_cache_replay.cpp` ExactTerminalHitUsesContinuationStateWithoutReplay on
/// the real tree: the commit splits the cached node at every multiple of A, and the
/// second request's terminal hit reads the window across two snapshots.
#[test]
fn exact_terminal_hit_on_the_radix_tree() {
    let adjunct = Adjunct::new(
        vec![
            GroupSpec::full_history("history", 64, 1, 64),
            GroupSpec::sliding("required_state", 4, 1, 128, 8, GroupRole::State),
            GroupSpec::sliding("window_state", 64, 1, 6, 128, GroupRole::State),
        ],
        &["history", "required_state"],
    )
    .expect("the terminal fixture");
    let mut c = cache(64, 64, adjunct);
    let prompt: Vec<Token> = make_aligned_tokens(5, 64, 1);
    let n256 = insert_fresh(&mut c, Tier::Device, &prompt[..256]).last_node;
    commit(&mut c, n256, 256);
    let nodes: Vec<NodeId> = c.snapshots().expect("family").snapshot_nodes().collect();
    let depths: Vec<u32> = nodes.iter().map(|&n| c.depth(n)).collect();
    let mut sorted = depths.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [64, 128, 192, 256], "one node per multiple of A");
    c.check_invariants([&[], &[]]).expect("consistent");

    let (hit, node) = family(&mut c, |f, tree| f.cap_match(tree, n256));
    assert_eq!((hit.prefix_len, node), (256, n256));
    assert!(hit.terminal);
    assert_eq!((hit.groups[2].base, hit.groups[2].ids.len()), (2, 2));
    assert_eq!((hit.groups[1].base, hit.groups[1].ids.len()), (62, 2));

    let n320 = common::insert_after_prefix(&mut c, Tier::Device, &prompt, 4).last_node;
    assert_eq!(c.parent(n320), Some(n256));
    family(&mut c, |f, tree| {
        let mut r2 = f.new_tables();
        f.acquire(&mut r2, 256, 320, Some(&hit)).expect("pages");
        f.commit_chunk(tree, &mut r2, n320);
        let (hit, node) = f.cap_match(tree, n320);
        assert_eq!((hit.prefix_len, node), (320, n320));
        assert_eq!((hit.groups[2].base, hit.groups[2].ids.len()), (3, 2));
        assert_eq!((hit.groups[1].base, hit.groups[1].ids.len()), (78, 2));
        f.check_invariants([&r2]).expect("pages in one place");
        f.release(&mut r2);
    });
    c.check_invariants([&[], &[]]).expect("consistent");
}

/// A match that diverges inside a snapshot node splits it like any node: the node, and
/// its snapshot, stay on the suffix at the snapshot's depth, and the cap still finds it.
#[test]
fn a_kv_split_keeps_a_snapshot_on_its_depth() {
    let mut c = small();
    let prompt = make_aligned_tokens(4, 2, 1);
    let leaf = insert_fresh(&mut c, Tier::Device, &prompt).last_node;
    commit(&mut c, leaf, 8);
    let n4 = c.parent(leaf).expect("the split at 4");
    assert_eq!((c.depth(n4), c.depth(leaf)), (4, 8));
    // Tokens that share 6 of the 8 tokens split the node ending at 8 after its first
    // page.
    let mut other = prompt[..6].to_vec();
    other.extend([900, 901]);
    c.match_prefix(&other);
    let n6 = c.parent(leaf).expect("the new prefix node");
    assert_eq!((c.depth(n6), c.depth(leaf)), (6, 8));
    assert!(c.snapshots().expect("family").has_snapshot(leaf));
    assert!(!c.snapshots().expect("family").has_snapshot(n6));
    c.check_invariants([&[], &[]]).expect("consistent");
    let (hit, node) = family(&mut c, |f, tree| f.cap_match(tree, leaf));
    assert_eq!((hit.prefix_len, node), (8, leaf));
}

/// Commits split where they must and nowhere else: a request whose KV node already
/// ends at a multiple of A splits nothing.
#[test]
fn commits_split_only_at_multiples_of_the_alignment() {
    let mut c = small();
    let prompt = make_aligned_tokens(3, 2, 1);
    let leaf = insert_fresh(&mut c, Tier::Device, &prompt).last_node;
    assert_eq!(c.stats().nodes, 1);
    commit(&mut c, leaf, 6);
    // 6 tokens: one snapshot, at 4; the leaf (ending at 6) holds none.
    assert_eq!(c.stats().nodes, 2);
    let n4 = c.parent(leaf).expect("split at 4");
    let f = c.snapshots().expect("family");
    assert!(f.has_snapshot(n4) && !f.has_snapshot(leaf));
    assert_eq!(
        c.split_at(leaf, 4),
        Some(n4),
        "an existing boundary is reused"
    );
    assert_eq!(c.split_at(leaf, 5), None, "never off a page boundary");
    assert_eq!(c.split_at(leaf, 8), None, "never below the node");
}
