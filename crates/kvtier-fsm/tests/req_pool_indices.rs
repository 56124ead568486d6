//! Port of `python/tests/test_req_pool_indices.py` and
//! `tests/cpp/test_req_pool_allocator.cpp`, observed through the plan's `slot` field:
//! slot 0 is reserved, slots are FIFO-reused, released whenever a request leaves the
//! running states (finish, abort, retraction), and a recovered request gets a new one.

mod common;

use std::collections::BTreeSet;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{RowKind, SchedulerConfig};

fn batch(n: u32) -> SchedulerConfig {
    SchedulerConfig {
        max_batch_size: n,
        disable_l2_cache: true,
        host_pages: 0,
        ..fixture()
    }
}

#[test]
fn first_slot_is_one() {
    let mut s = sched(batch(4));
    submit(&mut s, "r0", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r0").slot, 1);
}

#[test]
fn slot_stable_from_prefill_to_decode() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 4,
        ..batch(4)
    });
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 8));
    let mut slots = Vec::new();
    let mut engine = Engine::with_max_new(3);
    for _ in 0..8 {
        let plan = step(&mut s, &mut engine);
        if let Some(r) = row(&plan, "r1") {
            slots.push((r.kind, r.slot));
        }
    }
    assert!(slots.len() >= 4, "{slots:?}");
    assert!(slots.iter().any(|&(k, _)| k == RowKind::Prefill));
    assert!(slots.iter().any(|&(k, _)| k == RowKind::Decode));
    assert!(
        slots.iter().all(|&(_, slot)| slot == slots[0].1),
        "{slots:?}"
    );
}

#[test]
fn distinct_slots_in_range() {
    let mut s = sched(batch(4));
    for i in 0..4 {
        submit(&mut s, &format!("r{i}"), tokens(10 * i + 1, 4));
    }
    let plan = s.next_plan();
    let slots: BTreeSet<u32> = plan.forward.rows.iter().map(|r| r.slot).collect();
    assert_eq!(slots, BTreeSet::from([1, 2, 3, 4]));
}

/// Freed slots go to the back of the queue: batch 2 gives r0 = 1, r1 = 2, and after r0
/// finishes r2 = 1.
#[test]
fn freed_slot_reused_fifo() {
    let mut s = sched(batch(2));
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!((row_of(&plan, "r0").slot, row_of(&plan, "r1").slot), (1, 2));
    advance(&mut s, vec![extend("r0", &[5]), finish("r0")]);
    submit(&mut s, "r2", tokens(200, 4));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r2").slot, 1);

    // With a never-used slot still queued, it comes before the released one.
    let mut s = sched(batch(3));
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![abort("r0")]);
    submit(&mut s, "r2", tokens(200, 4));
    submit(&mut s, "r3", tokens(300, 4));
    let plan = s.next_plan();
    assert_eq!((row_of(&plan, "r2").slot, row_of(&plan, "r3").slot), (3, 1));
}

/// RAII: leaving a running state by any path returns the slot.
#[test]
fn slot_released_by_every_exit() {
    let mut s = sched(batch(1));
    submit(&mut s, "a", tokens(1, 4));
    assert_eq!(row_of(&s.next_plan(), "a").slot, 1);
    advance(&mut s, vec![abort("a")]); // from PrefillDone
    submit(&mut s, "b", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "b").slot, 1);
    advance(&mut s, vec![extend("b", &[5])]);
    s.next_plan();
    advance(&mut s, vec![extend("b", &[6]), finish("b")]); // from Decoding
    submit(&mut s, "c", tokens(1, 4));
    assert_eq!(row_of(&s.next_plan(), "c").slot, 1);
}

/// Retraction releases the slot (another request can take it) and recovery allocates a
/// new one — no slot is leaked across the cycle (the C++ move-assignment leak, 476ea6d2).
#[test]
fn retraction_releases_slot_and_recovery_takes_a_new_one() {
    let mut s = sched(SchedulerConfig {
        max_batch_size: 1,
        decode_input_tokens: 0,
        device_pages: 3,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[6]), reserve("r1", 3)]);
    let plan = s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    submit(&mut s, "r2", vec![50]);
    ack_write_backs(&mut s, &plan, true);
    // r2 (Submitted) outranks the Retracted r1 and takes the only slot.
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r2"]);
    assert_eq!(row_of(&plan, "r2").slot, 1);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    advance(&mut s, vec![extend("r2", &[51]), finish("r2")]);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Recovery);
    assert_eq!(r.slot, 1);
    check(&mut s);
}
