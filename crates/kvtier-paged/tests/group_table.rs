//! The reference's `python/tests/test_paged_cache_group.py`, ported, with the page ids
//! its pools hand out (LIFO, the largest id first on a fresh pool).

use kvtier_paged::{GroupPool, GroupRole, GroupSpec, PageTable, PagedError};

fn full(total: u32) -> GroupSpec {
    GroupSpec::full_history("full", 64, 4, total)
}

fn sliding(id: &str, total: u32) -> GroupSpec {
    GroupSpec::sliding(id, 2, 1, total, 4, GroupRole::History)
}

#[test]
fn full_history_release_skipped_is_noop() {
    let g = full(8);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 1024).unwrap();
    assert_eq!(t.ids(), [7, 6, 5, 4]);
    let released = t.release_skipped(&g, &mut pool, 1_000_000);
    assert_eq!((released.owned, released.borrowed), (0, 0));
    assert_eq!(t.ids(), [7, 6, 5, 4]);
    assert_eq!(t.base(), 0);
}

#[test]
fn sliding_release_skipped_releases_below_threshold() {
    let g = sliding("swa", 8);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 8).unwrap();
    assert_eq!(t.ids(), [7, 6, 5, 4]);
    // Bound 4 (a first position of 7 with W = 4): pages 0 and 1 go.
    assert_eq!(t.release_below(&mut pool, 4 / 2).owned, 2);
    assert_eq!(t.ids(), [5, 4]);
    assert_eq!((t.base(), t.len()), (2, 2));
    assert_eq!(pool.available(), 5);
    // Idempotent.
    assert_eq!(t.release_below(&mut pool, 2).owned, 0);
    assert_eq!(t.base(), 2);
}

#[test]
fn acquire_throws_on_exhaustion_without_leaking_cursor() {
    let g = sliding("swa", 2);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    let err = t.acquire(&g, &mut pool, 4).unwrap_err();
    assert_eq!(
        err,
        PagedError::OutOfPages {
            group: "swa".into(),
            needed: 2,
            free: 1
        }
    );
    assert_eq!(pool.failed_alloc(), 1);
    assert_eq!((t.len(), t.cursor(), t.base()), (0, 0, 0));
    assert_eq!(pool.available(), 1);
}

#[test]
fn stride_group_allocates_partial_entry_and_boundary_page() {
    let g = full(4);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 1).unwrap();
    assert_eq!((t.len(), t.cursor()), (1, 1));
    t.acquire(&g, &mut pool, 256).unwrap();
    assert_eq!(t.len(), 1);
    t.acquire(&g, &mut pool, 257).unwrap();
    assert_eq!(t.len(), 2);
}

/// Spec §2.7: the release bound of a chunk is its first position; the target-based
/// bound releases pages the chunk's first tokens still attend.
#[test]
fn chunked_prefill_release_lower_bound_uses_first_pos_not_target() {
    let g = GroupSpec::sliding("swa", 2, 1, 16, 4, GroupRole::History);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 10).unwrap();
    assert_eq!(t.ids(), [15, 14, 13, 12, 11]);
    // The next chunk starts at 10: it attends 7..=10, so pages below 7 / 2 = 3 go.
    let released = t.release_skipped(&g, &mut pool, 10);
    assert_eq!(released.owned, 3);
    assert_eq!(t.base(), 3);
    assert_eq!(t.ids(), [12, 11]);

    // The buggy bound (the chunk's target 14 − W = 10) empties the table.
    let mut buggy_pool = GroupPool::new(&g);
    let mut buggy = PageTable::new();
    buggy.acquire(&g, &mut buggy_pool, 10).unwrap();
    assert_eq!(buggy.release_below(&mut buggy_pool, 10 / 2).owned, 5);
    assert!(buggy.is_empty());
    assert_eq!(buggy.base(), 5);
}

/// An empty table only moves its base; acquisition then starts there.
#[test]
fn empty_sliding_table_advances_base() {
    let g = sliding("swa", 8);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    assert_eq!(t.release_skipped(&g, &mut pool, 9).owned, 0);
    assert_eq!(t.base(), 3);
    t.acquire(&g, &mut pool, 10).unwrap();
    assert_eq!((t.base(), t.len(), t.pages_have()), (3, 2, 5));
}

/// `test_paged_cache_replay.cpp` RewindRequestReleasesRejectedTailAndKeepsCommittedPrefix,
/// table level: a rewind keeps what the committed prefix and accepted tokens need.
#[test]
fn rewind_keeps_committed_prefix() {
    let g = GroupSpec::full_history("fh", 2, 1, 8);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 8).unwrap();
    assert_eq!(t.ids(), [7, 6, 5, 4]);
    assert_eq!(pool.available(), 3);
    let seg = t.commit_history(&g, &mut pool, 2).unwrap().unwrap();
    assert_eq!((seg.pages.as_slice(), seg.base), ([7].as_slice(), 0));
    let seg = t.commit_history(&g, &mut pool, 4).unwrap().unwrap();
    assert_eq!((seg.pages.as_slice(), seg.base), ([6].as_slice(), 1));
    // Accepted 5 tokens: pages(5) = 3 are kept.
    assert_eq!(t.rewind_tail(&g, &mut pool, 5), 1);
    assert_eq!(t.ids(), [7, 6, 5]);
    assert_eq!(pool.available(), 4);
    // Never below the committed prefix.
    assert_eq!(t.rewind_tail(&g, &mut pool, 1), 1);
    assert_eq!(t.ids(), [7, 6]);
    assert_eq!(t.cursor(), 4);
    // The snapshots' pages are the snapshots' now: released tables do not free them.
    t.release_all(&mut pool);
    assert_eq!(pool.available(), 5);
    pool.free_ids(&[7, 6]);
    assert_eq!(pool.available(), 7);
}

#[test]
fn commits_refuse_what_the_table_cannot_back() {
    let g = GroupSpec::full_history("fh", 2, 1, 8);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 4).unwrap();
    for target in [3, 6] {
        let err = t.commit_history(&g, &mut pool, target).unwrap_err();
        assert!(matches!(err, PagedError::Table { .. }), "{target}: {err}");
    }
    assert_eq!(t.commit_history(&g, &mut pool, 0).unwrap(), None);
    assert_eq!(t.ids(), [7, 6], "a refused commit changes nothing");
    let err = t.import_borrowed(&g, &[1], 0, 2).unwrap_err().to_string();
    assert!(err.contains("fresh table"), "{err}");
}

/// A state checkpoint drops what is outside the window at its target and moves only
/// its own pages; a second request adopts the canonical segment.
#[test]
fn state_checkpoint_moves_only_the_owned_delta() {
    let g = GroupSpec::sliding("st", 4, 1, 128, 8, GroupRole::State);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 64).unwrap();
    assert_eq!(t.len(), 16);
    let (seg, stale) = t.checkpoint_state(&g, &mut pool, 64).unwrap().unwrap();
    // The window at 64 is [56, 64): pages 14 and 15; 14 stale pages freed.
    assert_eq!((seg.base, seg.pages.len(), stale), (14, 2, 14));
    assert_eq!(seg.pages, [113, 112]);
    assert_eq!((t.base(), t.borrowed().len(), t.owned().len()), (14, 2, 0));

    // Another request computed the same 64 tokens: it adopts the canonical segment.
    let mut other = PageTable::new();
    other.acquire(&g, &mut pool, 64).unwrap();
    let before = pool.available();
    other
        .adopt_state(&g, &mut pool, &seg.pages, seg.base, 64)
        .unwrap();
    assert_eq!(
        (other.base(), other.borrowed(), other.owned().len()),
        (14, seg.pages.as_slice(), 0)
    );
    assert_eq!(pool.available(), before + 16);
    assert_eq!(other.committed(), 64);
}

/// A request's tables are RAII: dropping them anywhere (an abort, a lost request)
/// returns its own pages, never the snapshots' borrowed ones.
#[test]
fn dropped_tables_return_their_own_pages() {
    let g = GroupSpec::sliding("swa", 2, 1, 16, 4, GroupRole::History);
    let mut pool = GroupPool::new(&g);
    let mut t = PageTable::new();
    t.acquire(&g, &mut pool, 10).unwrap();
    assert_eq!(pool.available(), 10);
    drop(t);
    assert_eq!(pool.available(), 15);
}

/// Hybrid seed 84: a first chunk whose KV cannot be had gives its fresh tables back.
/// Released in table order, the pool's top pages came back swapped after each refused
/// try, so later tables differed from the reference's (which takes the pages only once
/// the KV is there); undone, the pool hands the same pages out in the same order again.
#[test]
fn an_undone_acquisition_leaves_the_pool_as_it_was() {
    let g = full(8);
    let mut pool = GroupPool::new(&g);
    let mut first = PageTable::new();
    first.acquire(&g, &mut pool, 512).unwrap();
    assert_eq!(first.ids(), [7, 6]);
    let mut refused = PageTable::new();
    refused.acquire(&g, &mut pool, 512).unwrap();
    refused.undo_acquisition(&mut pool);
    let mut again = PageTable::new();
    again.acquire(&g, &mut pool, 512).unwrap();
    assert_eq!(again.ids(), [5, 4], "as if the refused try never took them");
    // A plain release hands them out the other way round.
    again.release_all(&mut pool);
    let mut after = PageTable::new();
    after.acquire(&g, &mut pool, 512).unwrap();
    assert_eq!(after.ids(), [4, 5]);
}
