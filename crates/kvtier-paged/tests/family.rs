//! The reference's paged-cache C++ tests (`tests/cpp/test_paged_cache_*.cpp` at
//! 350cf505), ported over a small tree, with the page ids the reference's pools give
//! (read off its build). Names keep the reference's, in snake case.

mod support;

use kvtier_paged::{Adjunct, GroupRole, GroupSpec, PagedError, PagedFamily, SnapshotTree, Starved};
use kvtier_types::TreeView;
use support::{LARGE, SMALL, TestTree, WIDE, complete_snapshot, downgrade_to_history_only};

// ---- test_paged_cache_prefix_match.cpp ----

#[test]
fn cap_vs_no_cap_320() {
    let mut family = LARGE.family();
    let mut tree = TestTree::default();
    let terminal = tree.insert(0, 320);
    let (hit, node) = family.cap_match(&tree, terminal);
    assert_eq!(
        (hit.prefix_len, node),
        (0, 0),
        "no snapshot: capped to the root"
    );

    let n256 = tree.split_at(terminal, 256).unwrap();
    assert_eq!(tree.depth(n256), 256);
    let snapshot = complete_snapshot(&mut family, 256, 0);
    let c = family.adjunct().completeness(&snapshot);
    assert!(c.history && c.state);
    family.attach(n256, snapshot);
    let (hit, node) = family.cap_match(&tree, terminal);
    assert_eq!((hit.prefix_len, node), (256, n256));
    // The fixture's fake swa base (0) fails terminal assembly: the k-path serves it.
    assert!(!hit.terminal);
    assert_eq!(hit.groups[0].ids, [31]);
    assert_eq!(
        (hit.groups[1].ids.as_slice(), hit.groups[1].base),
        ([29, 28].as_slice(), 0)
    );
}

/// Snapshots at 256, 512 and 768 on one path.
fn chain_768(fixture: support::Fixture) -> (PagedFamily<usize>, TestTree, [usize; 3]) {
    let mut family = fixture.family();
    let mut tree = TestTree::default();
    let leaf = tree.insert(0, 768);
    let n256 = tree.split_at(leaf, 256).expect("split at 256");
    let n512 = tree.split_at(leaf, 512).expect("split at 512");
    let n768 = tree.split_at(leaf, 768).expect("split at 768");
    assert_eq!(n768, leaf);
    for n in [n256, n512, n768] {
        let s = complete_snapshot(&mut family, tree.depth(n), 0);
        family.attach(n, s);
    }
    (family, tree, [n256, n512, n768])
}

#[test]
fn contiguous_chain_break_mid() {
    let (mut family, tree, [n256, n512, n768]) = chain_768(LARGE);
    let taken = family.take_snapshot(n512).unwrap();
    for (i, seg) in taken.segments.iter().enumerate() {
        family.pool(i).free_ids(&seg.as_ref().unwrap().pages);
    }
    assert!(!family.has_snapshot(n512));
    assert!(
        family
            .adjunct()
            .completeness(family.snapshot(n768).unwrap())
            .history
    );
    let (hit, node) = family.cap_match(&tree, n768);
    assert_eq!((hit.prefix_len, node), (256, n256));
}

// ---- test_paged_cache_family_split.cpp ----

#[test]
fn history_complete_state_missing_fallback() {
    let (mut family, tree, [_, n512, n768]) = chain_768(LARGE);
    downgrade_to_history_only(&mut family, n768);
    let (hit, node) = family.cap_match(&tree, n768);
    assert_eq!((hit.prefix_len, node), (512, n512));
    assert_eq!(hit.history_tokens, 768);
    assert_eq!(hit.groups[0].ids, [31, 30]);
    assert_eq!(
        (hit.groups[1].ids.as_slice(), hit.groups[1].base),
        ([27, 26].as_slice(), 0)
    );
}

#[test]
fn state_window_discontinuity_fallback() {
    // W = 512 spans two snapshots (k = 2): a missing state at 512 breaks 768 too.
    let (mut family, tree, [n256, n512, n768]) = chain_768(WIDE);
    downgrade_to_history_only(&mut family, n512);
    let (hit, node) = family.cap_match(&tree, n768);
    assert_eq!((hit.prefix_len, node), (256, n256));
}

#[test]
fn state_detach_does_not_break_history_chain() {
    let (mut family, tree, [_, n512, n768]) = chain_768(LARGE);
    downgrade_to_history_only(&mut family, n512);
    let c = family
        .adjunct()
        .completeness(family.snapshot(n512).unwrap());
    assert!(c.history && !c.state);
    assert!(
        family
            .adjunct()
            .completeness(family.snapshot(n768).unwrap())
            .state
    );
    let (hit, node) = family.cap_match(&tree, n768);
    assert_eq!((hit.prefix_len, node), (768, n768));
    assert_eq!(hit.groups[0].ids, [31, 30, 29]);
    assert_eq!(hit.groups[1].ids, [25, 24]);
}

// ---- test_paged_cache_prefix_hit_commit.cpp ----

#[test]
fn prefix_hit_followed_by_checkpoint_does_not_overflow_window() {
    let mut family = WIDE.family();
    let mut tree = TestTree::default();
    let terminal = tree.insert(0, 512);
    let n256 = tree.split_at(terminal, 256).unwrap();
    let s = complete_snapshot(&mut family, 256, 0);
    assert_eq!(s.segments[1].as_ref().unwrap().pages, [63, 62, 61, 60]);
    family.attach(n256, s);

    let (hit, node) = family.cap_match(&tree, terminal);
    assert_eq!((hit.prefix_len, node), (256, n256));
    assert!(hit.terminal);
    assert_eq!(hit.groups[1].ids.len(), 4);

    let mut r = family.new_tables();
    family.acquire(&mut r, 256, 512, Some(&hit)).unwrap();
    assert_eq!(r.get(0).ids(), [63, 62]);
    assert_eq!(r.get(1).ids(), [63, 62, 61, 60, 59, 58, 57, 56]);
    family.commit_chunk(&mut tree, &mut r, terminal);
    let at = family.snapshot(terminal).unwrap();
    let c = family.adjunct().completeness(at);
    assert!(c.history && c.state);
    let (fh, swa) = (
        at.segments[0].as_ref().unwrap(),
        at.segments[1].as_ref().unwrap(),
    );
    assert_eq!((fh.pages.as_slice(), fh.base), ([62].as_slice(), 1));
    assert_eq!(
        (swa.pages.as_slice(), swa.base),
        ([59, 58, 57, 56].as_slice(), 4)
    );

    let (hit, _) = family.cap_match(&tree, terminal);
    assert_eq!(hit.prefix_len, 512);
    // min(W / tpp, 512 / tpp) = 8 state pages, never more than the window.
    assert_eq!(hit.groups[1].ids, [63, 62, 61, 60, 59, 58, 57, 56]);
    assert_eq!(hit.groups[1].base, 0);
    family.release(&mut r);
    family.check_invariants([&r]).unwrap();
}

// ---- test_paged_cache_eviction.cpp ----

#[test]
fn passive_eviction_releases_paged_cache_pages() {
    let mut family = SMALL.family();
    let mut tree = TestTree::default();
    let a = tree.insert(0, 4);
    let before = family.available();
    assert_eq!(before, [15, 15]);
    let s = complete_snapshot(&mut family, 4, 0);
    family.attach(a, s);
    assert_eq!(family.available(), [14, 13]);
    family.on_kv_evicted(a);
    assert_eq!(family.available(), before);
    assert_eq!(family.stats().dropped_kv_evict, 1);
    family.check_invariants([]).unwrap();
}

// ---- test_paged_cache_replay.cpp ----

/// The terminal fixture: `history` 64×1, `required_state` 4×1 (W 8, required),
/// `window_state` 64×1 (W 128, continuation-only); A = 64.
fn terminal_family() -> PagedFamily<usize> {
    let adjunct = Adjunct::new(
        vec![
            GroupSpec::full_history("history", 64, 1, 64),
            GroupSpec::sliding("required_state", 4, 1, 128, 8, GroupRole::State),
            GroupSpec::sliding("window_state", 64, 1, 6, 128, GroupRole::State),
        ],
        &["history", "required_state"],
    )
    .expect("the terminal fixture");
    assert_eq!(adjunct.alignment(), 64);
    PagedFamily::new(adjunct, false)
}

const HISTORY: usize = 0;
const REQUIRED: usize = 1;
const WINDOW: usize = 2;

/// r1 computes 256 tokens and commits them: snapshots at 64, 128, 192 and 256, the
/// last completed with the window state.
fn commit_r1(family: &mut PagedFamily<usize>, tree: &mut TestTree) -> usize {
    let n256 = tree.insert(0, 256);
    let mut r1 = family.new_tables();
    family.acquire(&mut r1, 0, 256, None).expect("r1 pages");
    assert_eq!(
        (
            r1.get(HISTORY).len(),
            r1.get(REQUIRED).len(),
            r1.get(WINDOW).len()
        ),
        (4, 64, 4)
    );
    family.commit_chunk(tree, &mut r1, n256);
    family.release(&mut r1);
    n256
}

#[test]
fn exact_terminal_hit_uses_continuation_state_without_replay() {
    let mut family = terminal_family();
    let mut tree = TestTree::default();
    let n256 = commit_r1(&mut family, &mut tree);
    let stats = family.stats();
    assert_eq!(
        (stats.snapshots_created, stats.terminal_continuations),
        (4, 1)
    );
    assert_eq!(stats.checkpoint_stale_owned, 56 + 2);
    let s = family.snapshot(n256).unwrap();
    assert!(family.adjunct().completeness(s).continuation);
    let required_bases: Vec<u32> = family
        .snapshot_nodes()
        .filter_map(|n| {
            family.snapshot(n)?.segments[REQUIRED]
                .as_ref()
                .map(|s| s.base)
        })
        .collect();
    assert_eq!(required_bases.len(), 4);

    let (hit, node) = family.cap_match(&tree, n256);
    assert_eq!((hit.history_tokens, hit.prefix_len, node), (256, 256, n256));
    assert!(hit.terminal);
    let window = &hit.groups[WINDOW];
    assert_eq!((window.base, window.ids.len()), (2, 2));
    let required = &hit.groups[REQUIRED];
    assert_eq!((required.base, required.ids.len()), (62, 2));

    // r2 extends the prefix to 320 from the hit.
    let n320 = tree.insert(n256, 320);
    let mut r2 = family.new_tables();
    family.acquire(&mut r2, 256, 320, Some(&hit)).unwrap();
    assert_eq!(r2.get(HISTORY).len(), 5);
    assert_eq!((r2.get(REQUIRED).base(), r2.get(REQUIRED).len()), (62, 18));
    assert_eq!((r2.get(WINDOW).base(), r2.get(WINDOW).len()), (2, 3));
    family.commit_chunk(&mut tree, &mut r2, n320);
    let at = family.snapshot(n320).unwrap();
    assert!(family.adjunct().completeness(at).continuation);
    let w = at.segments[WINDOW].as_ref().unwrap();
    assert_eq!((w.base, w.pages.len()), (4, 1));
    assert_eq!(at.segments[REQUIRED].as_ref().unwrap().base, 78);

    let (hit, node) = family.cap_match(&tree, n320);
    assert_eq!((hit.history_tokens, hit.prefix_len, node), (320, 320, n320));
    assert_eq!(
        (hit.groups[WINDOW].base, hit.groups[WINDOW].ids.len()),
        (3, 2)
    );
    assert_eq!(
        (hit.groups[REQUIRED].base, hit.groups[REQUIRED].ids.len()),
        (78, 2)
    );
    family.release(&mut r2);
    family.check_invariants([&r2]).unwrap();
}

#[test]
fn state_prune_drops_continuation_and_falls_back_to_cold_prefill() {
    let mut family = terminal_family();
    let mut tree = TestTree::default();
    let n256 = commit_r1(&mut family, &mut tree);
    let mut free = family.available();
    assert_eq!(free, [59, 119, 3]);
    free[WINDOW] = 0;
    let pressure = family.new_tables();
    assert!(family.admit(&tree, &pressure, 0, 64, None, &mut free));
    assert_eq!(family.stats().prune_state_only, 1);
    // The deepest of four tied snapshots lost its state groups, not its history.
    let s = family.snapshot(n256).unwrap();
    assert!(!family.adjunct().completeness(s).continuation);
    assert!(s.segments[WINDOW].is_none() && s.segments[HISTORY].is_some());
    // A continuation-only group and no terminal window: no hit at all.
    let (hit, node) = family.cap_match(&tree, n256);
    assert_eq!((hit.history_tokens, hit.prefix_len, node), (0, 0, 0));
    assert!(hit.groups.is_empty());
}

#[test]
fn history_only_prefix_hit_remains_usable() {
    let adjunct = Adjunct::new(vec![GroupSpec::full_history("fh", 64, 1, 16)], &["fh"]).unwrap();
    let mut family = PagedFamily::new(adjunct, false);
    let mut tree = TestTree::default();
    let leaf = tree.insert(0, 256);
    let mut r1 = family.new_tables();
    family.acquire(&mut r1, 0, 256, None).unwrap();
    assert_eq!(r1.get(0).len(), 4);
    family.commit_chunk(&mut tree, &mut r1, leaf);
    assert_eq!(family.stats().snapshots_created, 4);
    family.release(&mut r1);
    let (hit, node) = family.cap_match(&tree, leaf);
    assert_eq!((hit.history_tokens, hit.prefix_len, node), (256, 256, leaf));
    assert_eq!(hit.groups[0].ids.len(), 4);
}

#[test]
fn existing_transport_state_group_uses_sliding_window_credit() {
    let adjunct = Adjunct::new(
        vec![
            GroupSpec::full_history("fh", 8, 4, 32),
            GroupSpec::sliding("swa", 4, 1, 10, 16, GroupRole::State),
        ],
        &["fh"],
    )
    .unwrap();
    assert_eq!(adjunct.alignment(), 32);
    let mut family: PagedFamily<usize> = PagedFamily::new(adjunct, false);
    let tree = TestTree::default();
    let mut r = family.new_tables();
    family.acquire(&mut r, 0, 32, None).unwrap();
    assert_eq!((r.get(0).len(), r.get(1).len()), (1, 8));
    let mut free = family.available();
    assert_eq!(free[1], 1);
    // swa needs 8 new pages; the release below 17 frees 4: 1 + 4 < 8.
    assert!(!family.admit(&tree, &r, 32, 64, None, &mut free));
    assert_eq!(family.stats().admission_denied, 1);
    // The acquisition is refused as a whole: the reference's had already taken fh's
    // second page and released swa's front when it threw.
    let err = family.acquire(&mut r, 32, 64, None).unwrap_err();
    assert!(
        matches!(err, PagedError::OutOfPages { ref group, .. } if group == "swa"),
        "{err}"
    );
    assert_eq!((r.get(0).len(), r.get(1).len(), r.get(1).base()), (1, 8, 0));
    family.check_invariants([&r]).unwrap();
}

#[test]
fn rewind_request_releases_rejected_tail_and_keeps_committed_prefix() {
    let adjunct = Adjunct::new(vec![GroupSpec::full_history("fh", 2, 1, 8)], &["fh"]).unwrap();
    let mut family = PagedFamily::new(adjunct, false);
    let mut tree = TestTree::default();
    assert_eq!(family.available(), [7]);
    let mut r = family.new_tables();
    family.acquire(&mut r, 0, 8, None).unwrap();
    assert_eq!(r.get(0).ids(), [7, 6, 5, 4]);
    assert_eq!(family.available(), [3]);
    let leaf = tree.insert(0, 4);
    family.commit_chunk(&mut tree, &mut r, leaf);
    assert!(family.has_snapshot(leaf));
    family.rewind(&mut r, 5);
    assert_eq!(r.get(0).ids(), [7, 6, 5]);
    assert_eq!(family.available(), [4]);
    assert_eq!(family.stats().rewind_owned, 1);
    let (hit, _) = family.cap_match(&tree, leaf);
    assert_eq!(hit.history_tokens, 4);
    family.check_invariants([&r]).unwrap();
}

// ---- kvtier's own: the bugs of spec §2.8 and the family's edges ----

/// A history group and a 128-token window state group that is not required.
fn history_and_window() -> Adjunct {
    Adjunct::new(
        vec![
            GroupSpec::full_history("history", 64, 1, 64),
            GroupSpec::sliding("window_state", 64, 1, 16, 128, GroupRole::State),
        ],
        &["history"],
    )
    .expect("a valid adjunct")
}

/// A first turn of 256 tokens, committed and released: the tree, its terminal and the
/// terminal hit a second turn reads.
fn first_turn(family: &mut PagedFamily<usize>) -> (TestTree, usize, kvtier_paged::PagedHit) {
    let mut tree = TestTree::default();
    let n256 = tree.insert(0, 256);
    let mut r1 = family.new_tables();
    family
        .acquire(&mut r1, 0, 256, None)
        .expect("the first turn fits");
    family.commit_chunk(&mut tree, &mut r1, n256);
    family.release(&mut r1);
    let (hit, _) = family.cap_match(&tree, n256);
    assert!(hit.terminal);
    (tree, n256, hit)
}

/// The window-state pages of the snapshot on `node`.
fn first_window(family: &PagedFamily<usize>, node: usize) -> Vec<kvtier_types::PageId> {
    let snapshot = family.snapshot(node).expect("a snapshot");
    snapshot.segments[1]
        .as_ref()
        .expect("a window")
        .pages
        .clone()
}

/// #460: a second turn's terminal commit detaches the superseded state windows of the
/// first turn's snapshots that only it pins; without the fix they stay, one window a
/// turn, in the small state pools.
#[test]
fn terminal_commit_detaches_superseded_state_windows() {
    for detach in [false, true] {
        let mut family = PagedFamily::new(history_and_window(), detach);
        let (mut tree, n256, hit) = first_turn(&mut family);
        // Turn 2 extends to 512 and holds its path.
        let n512 = tree.insert(n256, 512);
        tree.lock_path(n512, 1);
        let mut r2 = family.new_tables();
        family.acquire(&mut r2, 256, 512, Some(&hit)).unwrap();
        family.commit_chunk(&mut tree, &mut r2, n512);
        assert!(
            family
                .adjunct()
                .completeness(family.snapshot(n512).unwrap())
                .continuation
        );
        let old = family.snapshot(n256).unwrap();
        assert_eq!(old.segments[1].is_none(), detach, "detach {detach}");
        assert_eq!(family.stats().stale_state_detached, u64::from(detach));
        // The history chain is intact either way, and the new terminal serves.
        let (hit, _) = family.cap_match(&tree, n512);
        assert_eq!(hit.prefix_len, 512);
        family.release(&mut r2);
        family.check_invariants([&r2]).unwrap();
    }
}

/// A commit never splits a snapshot node: the walk stops before it.
#[test]
fn commits_never_split_a_snapshot_node() {
    let adjunct = Adjunct::new(vec![GroupSpec::full_history("fh", 4, 1, 32)], &["fh"]).unwrap();
    let mut family = PagedFamily::new(adjunct, true);
    let mut tree = TestTree::default();
    // A snapshot node spanning 4..12 (depth 12), as a request that published it left it.
    let n12 = tree.insert(0, 12);
    let mut r1 = family.new_tables();
    family.acquire(&mut r1, 0, 12, None).unwrap();
    let n4 = tree.split_at(n12, 4).unwrap();
    family.commit_chunk(&mut tree, &mut r1, n4);
    let n8 = tree.split_at(n12, 8).unwrap();
    family.commit_chunk(&mut tree, &mut r1, n8);
    family.commit_chunk(&mut tree, &mut r1, n12);
    family.release(&mut r1);
    assert_eq!(family.snapshot_nodes().count(), 3);
    // Another request whose path ends inside... a node that would cut n8's span:
    // committing past 8 to a terminal below n12 needs no split of a snapshot node.
    let deeper = tree.insert(n12, 20);
    let mut r2 = family.new_tables();
    let (hit, _) = family.cap_match(&tree, n12);
    assert_eq!(hit.prefix_len, 12);
    family.acquire(&mut r2, 12, 20, Some(&hit)).unwrap();
    family.commit_chunk(&mut tree, &mut r2, deeper);
    assert_eq!(
        tree.depth(tree.parent(deeper).unwrap()),
        16,
        "the split is below the snapshots"
    );
    family.release(&mut r2);
    family.check_invariants([&r2]).unwrap();
}

/// A history-starved admission drops the oldest unpinned snapshot and every unpinned
/// one below it; pinned ones stay.
#[test]
fn history_prune_cascades_to_unpinned_descendants() {
    let adjunct = Adjunct::new(vec![GroupSpec::full_history("fh", 4, 1, 8)], &["fh"]).unwrap();
    let mut family = PagedFamily::new(adjunct, false);
    let mut tree = TestTree::default();
    let leaf = tree.insert(0, 12);
    let other = tree.insert(0, 40);
    let mut r1 = family.new_tables();
    family.acquire(&mut r1, 0, 12, None).unwrap();
    family.commit_chunk(&mut tree, &mut r1, leaf);
    family.release(&mut r1);
    assert_eq!(family.snapshot_nodes().count(), 3);
    assert_eq!(family.available(), [4]);
    // A request elsewhere needs 6 pages. While a running request pins the path,
    // nothing can go.
    let mut free = family.available();
    let r2 = family.new_tables();
    tree.lock_path(leaf, 1);
    assert!(
        !family.admit(&tree, &r2, 0, 24, None, &mut free),
        "every snapshot is pinned"
    );
    tree.lock_path(leaf, -1);
    // Unpinned, the oldest snapshot (at 4; the deeper ones were touched later) goes
    // with the two below it.
    let n8 = tree.parent(leaf).unwrap();
    tree.touch(n8, 5);
    tree.touch(leaf, 5);
    assert!(family.admit(&tree, &r2, 0, 24, None, &mut free));
    let stats = family.stats();
    assert_eq!((stats.prune_full, stats.prune_cascade), (1, 2));
    assert_eq!(family.snapshot_nodes().count(), 0);
    let _ = other;
    family.check_invariants([&r2]).unwrap();
    // A prune of nothing fails.
    assert!(!family.prune(&tree, Starved::History));
}

/// Found by the property test: a history-starved admission pruned the very snapshot
/// its own hit borrows from, then imported the freed pages. The hit's path is spared.
#[test]
fn admission_never_prunes_its_own_hit() {
    let adjunct = Adjunct::new(vec![GroupSpec::full_history("fh", 4, 1, 5)], &["fh"]).unwrap();
    let mut family = PagedFamily::new(adjunct, false);
    let mut tree = TestTree::default();
    let leaf = tree.insert(0, 12);
    let mut r0 = family.new_tables();
    family.acquire(&mut r0, 0, 8, None).unwrap();
    let n8 = tree.split_at(leaf, 8).unwrap();
    family.commit_chunk(&mut tree, &mut r0, n8);
    family.release(&mut r0);
    // Two snapshots hold 2 of 4 pages; a request holds the other 2.
    let mut other = family.new_tables();
    family.acquire(&mut other, 0, 8, None).unwrap();
    assert_eq!(family.available(), [0]);
    // A hit of 8 tokens needs one page more: the only prunable snapshots are its own.
    let (hit, node) = family.cap_match(&tree, leaf);
    assert_eq!((hit.prefix_len, node), (8, n8));
    let r1 = family.new_tables();
    let mut free = family.available();
    assert!(!family.admit(&tree, &r1, 8, 12, Some((&hit, node)), &mut free));
    assert!(family.has_snapshot(n8), "the hit's snapshots stay");
    family.release(&mut other);
    family.check_invariants([&r1]).unwrap();
}

/// #460 as the 0.1.0 wheel has it: a terminal commit detaches every superseded state
/// window of an ancestor only the committing request holds, but not one whose pages a
/// request's table still borrows (a stopped request's tables, kept until the request
/// is forgotten, hold no lock).
#[test]
fn the_wheels_detach_spares_a_window_a_table_still_borrows() {
    for borrowed in [false, true] {
        let mut family = PagedFamily::new(history_and_window(), false).detaching_as_the_wheel();
        assert!(family.reads_borrowed_state());
        let (mut tree, n256, hit) = first_turn(&mut family);
        // A request that read the first turn's terminal keeps its tables, unlocked.
        let mut reader = family.new_tables();
        if borrowed {
            family.acquire(&mut reader, 256, 257, Some(&hit)).unwrap();
        }
        let n512 = tree.insert(n256, 512);
        tree.lock_path(n512, 1);
        // The cache keeps it; the committing request's tables are taken out.
        tree.tables.push(reader);
        let mut r2 = family.new_tables();
        family.acquire(&mut r2, 256, 512, Some(&hit)).unwrap();
        let window = first_window(&family, n256);
        family.commit_chunk_holding(&mut tree, &mut r2, n512, None);
        // The terminal checkpoint dropped r2's entries below its window.
        let census = family.borrowed_state(&tree, &r2);
        let reads_window = window.iter().any(|&p| census.contains(&(1, p)));
        assert_eq!(reads_window, borrowed, "borrowed {borrowed}");
        let old = family.snapshot(n256).unwrap();
        assert_eq!(old.segments[1].is_some(), borrowed, "borrowed {borrowed}");
        assert_eq!(family.stats().stale_state_detached, u64::from(!borrowed));
        for mut reader in tree.tables.drain(..) {
            family.release(&mut reader);
        }
        family.release(&mut r2);
        family.check_invariants([&r2]).unwrap();
    }
}

/// Hybrid seed 7597: two requests read the same hit and run to the same terminal. The
/// first commits it, window state included; the second only adopts the history there
/// (the window is not required), so no checkpoint drops its entries below the window,
/// and those still borrow the first turn's window. The wheel spares that window when
/// the second commits alone; kvtier counted the second's entries inside the window at
/// the terminal only, detached it, and gave its pages out while the wheel kept them.
#[test]
fn the_wheels_detach_spares_a_window_an_adopting_committer_still_borrows() {
    let mut family = PagedFamily::new(history_and_window(), false).detaching_as_the_wheel();
    let (mut tree, n256, hit) = first_turn(&mut family);
    let n512 = tree.insert(n256, 512);
    let (mut first, mut second) = (family.new_tables(), family.new_tables());
    for tables in [&mut first, &mut second] {
        family.acquire(tables, 256, 512, Some(&hit)).unwrap();
    }
    tree.lock_path(n512, 2);
    family.commit_chunk_holding(&mut tree, &mut first, n512, None);
    assert!(family.snapshot(n512).unwrap().segments[1].is_some());
    family.release(&mut first);
    tree.lock_path(n512, -1);
    let window = first_window(&family, n256);
    family.commit_chunk_holding(&mut tree, &mut second, n512, None);
    let census = family.borrowed_state(&tree, &second);
    assert!(
        window.iter().all(|&p| census.contains(&(1, p))),
        "the adopting commit keeps its entries below the window"
    );
    assert!(family.snapshot(n256).unwrap().segments[1].is_some());
    assert_eq!(family.stats().stale_state_detached, 0);
    family.release(&mut second);
    family.check_invariants([&second]).unwrap();
}

/// A running request's next op is admitted before its previous chunk is committed.
/// The commit's terminal checkpoint turns owned pages of a continuation-only window
/// into snapshot pages, so the op's slide frees fewer than it would have: the
/// admission must not count them (the wheel's admission does not; kvtier's once did,
/// and the acquisition then came up short).
#[test]
fn an_admission_before_a_terminal_checkpoint_credits_only_what_the_slide_frees() {
    let adjunct = Adjunct::new(
        vec![
            GroupSpec::full_history("fh", 8, 4, 32),
            GroupSpec::sliding("swa", 4, 1, 14, 16, GroupRole::State),
        ],
        &["fh"],
    )
    .unwrap();
    let mut family: PagedFamily<usize> = PagedFamily::new(adjunct, false);
    let mut tree = TestTree::default();
    let n40 = tree.insert(0, 40);
    let n32 = tree.split_at(n40, 32).unwrap();
    let mut r = family.new_tables();
    family.acquire(&mut r, 0, 40, None).unwrap();
    assert_eq!((r.get(1).len(), family.available()[1]), (10, 3));
    // [40, 72) needs 8 new swa pages; the slide from 40 frees pages 0..6.
    let pending = kvtier_paged::PendingCommit {
        depth: 32,
        terminal: Some(n32),
    };
    let mut free = family.available();
    assert!(family.admit(&tree, &r, 40, 72, None, &mut free));
    // The checkpoint at 32 keeps the window 16..32 (pages 4..8): only 4 are freed.
    let mut free = family.available();
    assert!(!family.admit_before_commit(&tree, &r, (40, 72), Some(pending), &mut free));
    family.commit_chunk(&mut tree, &mut r, n32);
    assert!(family.snapshot(n32).unwrap().segments[1].is_some());
    let err = family.acquire(&mut r, 40, 72, None).unwrap_err();
    assert!(matches!(err, PagedError::OutOfPages { ref group, .. } if group == "swa"));
    family.release(&mut r);
    family.check_invariants([&r]).unwrap();
}
