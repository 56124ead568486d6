//! Port of `tests/cpp/test_chunked_prefill.cpp` (fixture with budget 4), plus the
//! page-table and mid-flight publication behaviour of chunked prefill.

mod common;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{RowKind, SchedulerConfig};

fn budget4() -> SchedulerConfig {
    SchedulerConfig {
        max_scheduled_tokens: 4,
        ..fixture()
    }
}

#[test]
fn chunked_prefill_splits_across_plans() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 8));
    let p1 = s.next_plan();
    assert_eq!(row_of(&p1, "r1").input_length, 4);
    assert_eq!(state(&s, "r1"), StateKind::Prefilling);
    let p2 = s.next_plan();
    assert_eq!(row_of(&p2, "r1").input_length, 4);
    assert_eq!(row_of(&p2, "r1").kind, RowKind::Prefill);
    assert_eq!(state(&s, "r1"), StateKind::PrefillDone);
    advance(&mut s, vec![extend("r1", &[9])]);
    let p3 = s.next_plan();
    assert_eq!(row_of(&p3, "r1").kind, RowKind::Decode);
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    check(&mut s);
}

#[test]
fn extend_prefix_len_grows_per_chunk() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 8));
    let p1 = s.next_plan();
    let p2 = s.next_plan();
    assert_eq!(row_of(&p1, "r1").extend_prefix_len, 0);
    assert_eq!(row_of(&p2, "r1").extend_prefix_len, 4);
    assert_eq!(row_of(&p1, "r1").prefill_length, 8);
    assert_eq!(row_of(&p2, "r1").prefill_length, 8);
}

#[test]
fn prefill_first_continues_prefill_before_new_submitted() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 8));
    s.next_plan();
    submit(&mut s, "r0", tokens(100, 4)); // smaller id, but Prefilling outranks Submitted
    let p2 = s.next_plan();
    assert_eq!(row_ids(&p2), ["r1"]);
    assert_eq!(state(&s, "r0"), StateKind::Submitted);
}

#[test]
fn input_ids_correct_per_chunk() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 6));
    let p1 = s.next_plan();
    let r = row_of(&p1, "r1");
    assert_eq!(p1.forward.input_ids_of(r), [1, 2, 3, 4]);
    assert_eq!(p1.forward.shifted_input_ids_of(r), [2, 3, 4, 5]);
    let p2 = s.next_plan();
    let r = row_of(&p2, "r1");
    assert_eq!(p2.forward.input_ids_of(r), [5, 6]);
    // The last chunk's targets end at the prompt and are padded with -1.
    assert_eq!(p2.forward.shifted_input_ids_of(r), [6, -1]);
}

/// The second chunk's page table continues the first one: the chunk-1 pages keep their
/// ids (mid-flight publication moves them into the tree without copying), the new chunk
/// appends after them, and the first chunk's reserved decode slot is absorbed.
#[test]
fn page_table_continues_across_chunks() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 8));
    let p1 = s.next_plan();
    let r = row_of(&p1, "r1");
    // 4 tokens + d 1 = 5 slots = 3 pages.
    assert_eq!(p1.forward.page_table_of(r), [31, 30, 29]);
    assert_eq!((r.begin, r.size), (0, 3));
    let p2 = s.next_plan();
    let r = row_of(&p2, "r1");
    // 4 more tokens after the 5 slots acquired so far: new pages follow page 29.
    // Slots 0..9 (8 prompt tokens + d) need 5 pages: tokens 5..8 fill page 29 and 28,
    // the decode slot lands in 27.
    assert_eq!(p2.forward.page_table_of(r), [31, 30, 29, 28, 27]);
    assert_eq!((r.begin, r.size), (3, 2));
    assert_eq!(p2.forward.new_pages_of(r), [28, 27]);
    assert_eq!(s.occupied_pages(&rid("r1")), Some(vec![31, 30, 29, 28, 27]));
    check(&mut s);
}

/// Mid-flight publication (our default, reference PR #381): at the start of every plan,
/// requests in prefill publish the pages their computed chunks cover, so a concurrent
/// request with the same prefix reuses them.
#[test]
fn mid_flight_publication_shares_computed_chunks() {
    let mut s = sched(budget4());
    submit(&mut s, "r1", tokens(1, 8));
    s.next_plan();
    assert_eq!(s.stats().cached_device_pages, 0);
    s.next_plan(); // plan 2 publishes the 2 pages chunk 1 computed
    assert_eq!(s.stats().cached_device_pages, 2);
    submit(&mut s, "r2", tokens(1, 8));
    advance(&mut s, vec![extend("r1", &[9])]);
    // Plan 3 first publishes r1's whole prompt (chunk 2 is computed), then admits r2,
    // which reuses all 3 full pages before its last token.
    let p3 = s.next_plan();
    assert_eq!(s.stats().cached_device_pages, 4);
    let r = row_of(&p3, "r2");
    assert_eq!(r.kind, RowKind::Prefill);
    assert_eq!(r.extend_prefix_len, 6);
    assert_eq!(r.input_length, 2);
    // r2's page table starts with r1's published pages.
    assert_eq!(&p3.forward.page_table_of(r)[..3], [31, 30, 29]);
    // A first chunk gets a new slot, so its whole page-table row is new (begin 0).
    assert_eq!((r.begin, r.size), (0, 5));
    check(&mut s);
}

/// With `publish_prefix_mid_flight: false` (the reference's behaviour of record for
/// non-hybrid models) nothing reaches the tree before Finish.
#[test]
fn without_mid_flight_publication_nothing_is_cached_before_finish() {
    let mut s = sched(SchedulerConfig {
        publish_prefix_mid_flight: false,
        ..budget4()
    });
    submit(&mut s, "r1", tokens(1, 8));
    s.next_plan();
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[9])]);
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    assert_eq!(s.stats().cached_device_pages, 0);
    submit(&mut s, "r2", tokens(1, 8));
    let p = s.next_plan();
    assert_eq!(row_of(&p, "r2").extend_prefix_len, 0);
    check(&mut s);
}
