//! Mid-flight prefix publication (reference PR #381, `reference/004_*.txt`): a request's
//! computed prompt pages enter the tree during prefill, so concurrent requests with the
//! same prefix reuse them; the published nodes carry correct page hashes.

mod common;

use common::*;
use kvtier_types::SchedulerConfig;
use kvtier_types::hash::rolling_page_hashes;

/// Chunked prefill (budget 4) of a 12-token prompt, plus a sibling submitted while the
/// first request is still running.
fn sibling_hit(publish: bool) -> u32 {
    let config = SchedulerConfig {
        max_scheduled_tokens: 4,
        publish_prefix_mid_flight: publish,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "a", tokens(1, 12));
    let mut engine = Engine::default();
    for _ in 0..4 {
        step(&mut s, &mut engine); // three chunks, then the first decode
    }
    assert_eq!(state(&s, "a"), kvtier_fsm::StateKind::Decoding);
    submit(&mut s, "b", tokens(1, 12));
    let plan = step(&mut s, &mut engine);
    check(&mut s);
    row_of(&plan, "b").extend_prefix_len
}

#[test]
fn siblings_reuse_a_prefix_published_mid_flight() {
    // 12 prompt tokens → 5 full pages of 2 tokens before the last token.
    assert_eq!(sibling_hit(true), 10);
}

#[test]
fn without_publication_nothing_is_reused_before_finish() {
    assert_eq!(sibling_hit(false), 0);
}

#[test]
fn publication_happens_at_every_later_chunk() {
    let config = SchedulerConfig {
        max_scheduled_tokens: 4,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "a", tokens(1, 12));
    let mut engine = Engine::default();
    step(&mut s, &mut engine); // chunk [0, 4)
    assert_eq!(s.cache().probe(&tokens(1, 10)).device_pages, 0);
    step(&mut s, &mut engine); // chunk [4, 8): pages of [0, 4) published
    assert_eq!(s.cache().probe(&tokens(1, 10)).device_pages, 2);
    step(&mut s, &mut engine); // chunk [8, 12): pages of [0, 8) published
    assert_eq!(s.cache().probe(&tokens(1, 10)).device_pages, 4);
    step(&mut s, &mut engine); // first decode: the whole prompt published
    assert_eq!(s.cache().probe(&tokens(1, 12)).device_pages, 6);
    check(&mut s);
}

/// Review bug of PR #381: with L3 on, nodes published mid-flight had no page hashes, so
/// the request's later Finish (which skips pages already in the tree) left them without
/// hashes and L3 keys were computed from a wrong seed.
#[test]
fn mid_flight_published_nodes_carry_page_hashes() {
    let config = SchedulerConfig {
        max_scheduled_tokens: 4,
        enable_l3_storage: true,
        ..fixture()
    };
    let mut s = sched(config);
    let prompt = tokens(1, 12);
    submit(&mut s, "a", prompt.clone());
    let mut engine = Engine::with_max_new(3);
    for _ in 0..4 {
        step(&mut s, &mut engine);
    }
    let expected = rolling_page_hashes(None, &prompt, 2);
    assert_eq!(
        s.cache().prefix_page_hashes(&prompt),
        expected,
        "while decoding"
    );
    drain(&mut s, &mut engine, 20);
    assert_eq!(
        s.cache().prefix_page_hashes(&prompt),
        expected,
        "after finish"
    );
    check(&mut s);
}

/// Publication replaces the request's own duplicate pages with the tree's first copy:
/// the request's page table then points at the tree pages, and its own go back.
#[test]
fn duplicate_pages_go_back_and_the_page_table_follows_the_tree() {
    let config = SchedulerConfig {
        max_scheduled_tokens: 64,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "a", tokens(1, 8));
    submit(&mut s, "b", tokens(1, 8));
    let mut engine = Engine::default();
    step(&mut s, &mut engine); // both prefill in one round: no reuse between them
    step(&mut s, &mut engine); // both publish at PrefillDone → Decoding
    let a = s.occupied_pages(&rid("a")).expect("a runs");
    let b = s.occupied_pages(&rid("b")).expect("b runs");
    assert_eq!(
        a[..4],
        b[..4],
        "the full prompt pages are shared after publication"
    );
    check(&mut s);
}
