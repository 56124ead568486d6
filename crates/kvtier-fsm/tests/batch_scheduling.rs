//! Port of `tests/cpp/test_batch_scheduling.cpp` (fixture with batch 3).

mod common;

use std::collections::BTreeSet;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{RowKind, SchedulerConfig};

fn batch3() -> SchedulerConfig {
    SchedulerConfig {
        max_batch_size: 3,
        ..fixture()
    }
}

#[test]
fn max_batch_size_limits_scheduled_requests() {
    let mut s = sched(batch3());
    for i in 0..5 {
        submit(&mut s, &format!("r{i}"), tokens(10 * i + 1, 4));
    }
    let plan = s.next_plan();
    assert!(plan.forward.rows.len() <= 3);
    // Ties are broken by id: the three smallest ids run, the others wait.
    assert_eq!(row_ids(&plan), ["r0", "r1", "r2"]);
    let st = s.stats();
    assert_eq!((st.prefilling, st.waiting), (3, 2));
    check(&mut s);
}

#[test]
fn multiple_decoding_all_in_same_batch() {
    let mut s = sched(batch3());
    for i in 0..3 {
        submit(&mut s, &format!("r{i}"), tokens(10 * i + 1, 4));
    }
    let plan = s.next_plan();
    assert_eq!(plan.forward.num_prefill_rows, 3);
    advance(
        &mut s,
        vec![
            extend("r0", &[90]),
            extend("r1", &[91]),
            extend("r2", &[92]),
        ],
    );
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r0", "r1", "r2"]);
    assert_eq!(row_kinds(&plan), [RowKind::Decode; 3]);
    assert_eq!(plan.forward.num_prefill_rows, 0);
    assert_eq!(s.stats().decoding, 3);
    check(&mut s);
}

/// Prefill-first: a round that admits a prefill schedules no decode.
#[test]
fn prefill_blocks_decode() {
    let mut s = sched(batch3());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    advance(&mut s, vec![extend("r1", &[6])]);

    submit(&mut s, "r2", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r2"]);
    assert!(row(&plan, "r1").is_none());
    assert_eq!(row_of(&plan, "r2").kind, RowKind::Prefill);
    // r1 is untouched and decodes in the next (decode-only) round.
    advance(&mut s, vec![extend("r2", &[104])]);
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    check(&mut s);
}

#[test]
fn distinct_pool_indices() {
    let mut s = sched(batch3());
    for i in 0..3 {
        submit(&mut s, &format!("r{i}"), tokens(10 * i + 1, 4));
    }
    let plan = s.next_plan();
    let slots: BTreeSet<u32> = plan.forward.rows.iter().map(|r| r.slot).collect();
    assert_eq!(slots.len(), 3);
    assert!(
        slots.iter().all(|&slot| (1..=3).contains(&slot)),
        "{slots:?}"
    );
}

#[test]
fn token_budget_limits_scheduled_tokens() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 4,
        ..batch3()
    });
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
    let total: u32 = plan.forward.rows.iter().map(|r| r.input_length).sum();
    assert!(total <= 4);
    assert_eq!(state(&s, "r2"), StateKind::Submitted);
    check(&mut s);
}

/// A candidate that cannot be admitted does not block smaller requests behind it
/// (no head-of-line blocking, fsm-scheduler.md §5.2 step 5).
#[test]
fn failed_admission_does_not_block_later_candidates() {
    // 7 usable pages: "a" needs 8 + d = 9 slots = 5 pages, "b" 3 pages, "c" 2 pages.
    let mut s = sched(SchedulerConfig {
        device_pages: 8,
        ..batch3()
    });
    submit(&mut s, "a", tokens(1, 8));
    submit(&mut s, "b", tokens(100, 5));
    submit(&mut s, "c", tokens(200, 2));
    let plan = s.next_plan();
    // "a" takes 5 pages; "b" needs 3 of the 2 left and is skipped; "c" fits.
    assert_eq!(row_ids(&plan), ["a", "c"]);
    assert_eq!(state(&s, "b"), StateKind::Submitted);
    assert_eq!(free_device(&mut s), 0);
    check(&mut s);
}
