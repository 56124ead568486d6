//! Port of `tests/cpp/test_retract_abort_pages.cpp` (ps 2, d 0, device 4, host 4: 3
//! usable pages per tier). Every test ends with the exact page-conservation check.
//! Differences: a `WriteBackDone` for a request aborted while Retracting is accepted
//! (P6: the C++ throws), and Finish clamps its publication to the pages held (P16).

mod common;

use common::*;
use kvtier_fsm::{Scheduler, StateKind};
use kvtier_types::{ExecutionPlan, RowKind, SchedulerConfig, Tier};

fn config() -> SchedulerConfig {
    SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 4,
        host_pages: 4,
        ..fixture()
    }
}

/// r1 (prompt 1,2) and r2 (prompt 11,12) decode with one page each (published), then
/// both ask for 3 reserved slots (2 pages each) with one page free.
fn both_decoding() -> Scheduler {
    let mut s = sched(config());
    submit(&mut s, "r1", vec![1, 2]);
    submit(&mut s, "r2", vec![11, 12]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[3]), extend("r2", &[13])]);
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    assert_eq!(free_device(&mut s), 1);
    s
}

/// From `both_decoding`: the next plan retracts r1 (equal lengths: first by id).
fn retract_r1() -> (Scheduler, ExecutionPlan) {
    let mut s = both_decoding();
    advance(
        &mut s,
        vec![
            extend("r1", &[4]),
            reserve("r1", 3),
            extend("r2", &[14]),
            reserve("r2", 3),
        ],
    );
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert_eq!(plan.write_backs.len(), 1);
    assert!(plan.write_backs[0].is_retract);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    check(&mut s);
    (s, plan)
}

#[test]
fn retract_then_abort_no_double_free() {
    let (mut s, plan) = retract_r1();
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    check(&mut s);
    // The copy was in flight: its acknowledgement is fine (P6: the C++ throws here).
    ack_write_backs(&mut s, &plan, true);
    check(&mut s);
    // The survivor decodes with the freed pages.
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r2"]);
    assert_eq!(row_of(&plan, "r2").kind, RowKind::Decode);
    assert_eq!(row_of(&plan, "r2").size, 2);
    assert_eq!(s.request_state(&rid("r1")), None);
    check(&mut s);
}

#[test]
fn retract_then_abort_after_ack_releases_host_lock() {
    let (mut s, plan) = retract_r1();
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    assert_eq!(locked_pages(&mut s, Tier::Host), 1);
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    // The host copy stays as cache.
    assert_eq!(s.stats().cached_host_pages, 1);
    check(&mut s);
}

#[test]
fn retract_write_back_done_pages_accounted() {
    let (mut s, plan) = retract_r1();
    // In flight: r1's published page is pinned on both tiers.
    assert_eq!(free_device(&mut s), 1);
    assert_eq!(free_host(&mut s), 2);
    ack_write_backs(&mut s, &plan, true);
    let st = s.stats();
    // r1's device copy is demoted; r2 still holds its page.
    assert_eq!(st.available_device_pages, 2);
    assert_eq!(st.cached_device_pages, 1);
    assert_eq!(st.cached_host_pages, 1);
    assert_eq!(st.available_host_pages, 2);
    check(&mut s);
}

#[test]
fn abort_one_other_continues_pages_intact() {
    let mut s = both_decoding();
    let r2_pages = s.occupied_pages(&rid("r2")).expect("running");
    advance(
        &mut s,
        vec![extend("r1", &[4]), abort("r1"), extend("r2", &[14])],
    );
    assert_eq!(s.occupied_pages(&rid("r2")), Some(r2_pages.clone()));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r2"]);
    assert_eq!(
        &plan.forward.page_table_of(row_of(&plan, "r2"))[..r2_pages.len()],
        r2_pages.as_slice()
    );
    check(&mut s);
}

#[test]
fn abort_from_decoding_pages_freed() {
    let mut s = both_decoding();
    advance(&mut s, vec![reserve("r1", 2)]);
    s.next_plan(); // r1 takes the free page
    let before = free_device(&mut s);
    assert_eq!(before, 0);
    advance(&mut s, vec![abort("r1")]);
    let after = free_device(&mut s);
    assert!(after >= before);
    // Its request-local page is free; its published page stays as unlocked cache.
    assert_eq!(after, 1);
    assert_eq!(s.stats().cached_device_pages, 2);
    assert_eq!(locked_pages(&mut s, Tier::Device), 1);
    check(&mut s);
}

#[test]
fn finish_write_back_all_pages_freed() {
    let mut s = sched(config());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[6]), finish("r1")]);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    assert!(!plan.write_backs[0].is_retract);
    ack_write_backs(&mut s, &plan, true);
    let st = s.stats();
    assert_eq!(st.available_device_pages, 3);
    assert_eq!(st.cached_device_pages, 0);
    assert_eq!(st.cached_host_pages, 2);
    check(&mut s);
}

#[test]
fn retract_abort_new_request_reuses_pages() {
    let (mut s, plan) = retract_r1();
    ack_write_backs(&mut s, &plan, true);
    advance(&mut s, vec![abort("r1"), abort("r2")]);
    s.next_plan();
    // 5 tokens need all 3 device pages: r2's cached page is evicted for it.
    submit(&mut s, "r3", tokens(21, 5));
    let plan = s.next_plan();
    let r = row_of(&plan, "r3");
    assert_eq!(r.kind, RowKind::Prefill);
    assert_eq!(plan.forward.page_table_of(r).len(), 3);
    assert_eq!(free_device(&mut s), 0);
    check(&mut s);
}

/// Overlap: 4 extra tokens arrive before the request acquired slots for them; the
/// retraction publishes only the pages actually held.
#[test]
fn retract_after_extend_result_no_page_mismatch_crash() {
    let mut s = both_decoding();
    advance(
        &mut s,
        vec![
            extend("r1", &[4, 5, 6, 7]),
            reserve("r1", 3),
            extend("r2", &[14]),
            reserve("r2", 3),
        ],
    );
    let plan = s.next_plan();
    assert!(s.stats().retractions >= 1);
    assert_eq!(plan.write_backs.len(), 1);
    // r1 holds one page; only that page can be written back.
    assert_eq!(plan.write_backs[0].pairs.len(), 1);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    check(&mut s);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    check(&mut s);
}

/// P16: Finish clamps the publication to the pages held when ExtendResult outgrew the
/// allocated slots.
#[test]
fn finish_after_extend_result_outgrows_slots_is_clamped() {
    let mut s = both_decoding();
    advance(&mut s, vec![extend("r1", &[4, 5, 6, 7, 8]), finish("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Draining);
    let plan = s.next_plan();
    assert_eq!(plan.write_back_pages(), 1);
    check(&mut s);
    ack_write_backs(&mut s, &plan, true);
    check(&mut s);
}
