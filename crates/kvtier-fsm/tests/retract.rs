//! Port of `tests/cpp/test_retract.cpp` (scheduler and cache parts), plus our fixes:
//! a retraction that cannot get host pages recomputes the request (by default) or, under
//! the reference's policy, aborts it *and reports it* in `plan.aborted` (P4), and a
//! failed retract write-back keeps the device copy authoritative (P8).

mod common;

use common::*;
use kvtier_fsm::{Scheduler, StateKind};
use kvtier_types::{
    AbortNotice, AbortReason, ExecutionPlan, Policy, RowKind, SchedulerConfig, Tier,
};

#[test]
fn retract_triggered_when_device_full() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    assert!(plan.forward.is_empty());
    assert_eq!(plan.write_backs.len(), 1);
    let op = &plan.write_backs[0];
    assert!(op.is_retract);
    assert!(op.op_id > 0);
    // The 2 published pages (tokens 1..4) are copied to host, leaf→root within the node.
    let src: Vec<u32> = op.pairs.iter().map(|p| p.src).collect();
    let dst: Vec<u32> = op.pairs.iter().map(|p| p.dst).collect();
    assert_eq!(src, [2, 1]);
    assert_eq!(dst, [31, 30]);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    let st = s.stats();
    assert_eq!((st.retracted, st.decoding, st.retractions), (1, 0, 1));
    check(&mut s);
}

#[test]
fn retract_request_not_in_forward_while_retracting() {
    let mut s = sched(d0_device3());
    retract_r1(&mut s);
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert!(plan.write_backs.is_empty(), "one write-back per retraction");
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    // The request holds no slot and no running page table while retracting.
    assert_eq!(s.occupied_pages(&rid("r1")), None);
    check(&mut s);
}

#[test]
fn retract_write_back_done_transitions_to_retracted() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    let st = s.stats();
    assert_eq!((st.retracted, st.decoding), (1, 0));
    // The device copy was demoted: the prefix lives on host only.
    assert_eq!(st.cached_device_pages, 0);
    assert_eq!(st.cached_host_pages, 2);
    assert_eq!(st.available_device_pages, 2);
    // Retracted pins its host prefix.
    assert_eq!(locked_pages(&mut s, Tier::Host), 2);
    check(&mut s);
}

#[test]
fn retract_retracted_request_recovers_to_decoding() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    ack_write_backs(&mut s, &plan, true);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Recovery);
    assert_eq!(plan.forward.num_prefill_rows, 0);
    // Recovery row: whole page table new, explicit input token, history length.
    assert_eq!(r.begin, 0);
    assert_eq!(r.size, r.pages_len);
    assert_eq!(r.decode_input_id, 6);
    assert_eq!(r.hist_token_len, 5);
    assert_eq!(r.prefill_length, 0);
    assert_eq!(r.input_length, 0); // decode_input_tokens
    // The prefix is loaded back into the row's pages, in page order.
    assert_eq!(plan.load_backs.len(), 1);
    let lb = &plan.load_backs[0];
    assert_eq!(lb.pairs.iter().map(|p| p.src).collect::<Vec<_>>(), [31, 30]);
    let dst: Vec<u32> = lb.pairs.iter().map(|p| p.dst).collect();
    assert_eq!(plan.forward.page_table_of(r), dst.as_slice());
    let st = s.stats();
    assert_eq!((st.decoding, st.retracted), (1, 0));
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    check(&mut s);
}

/// d 2, device 4: the PrefillDone request's first decode needs a page, none is free,
/// and it is retracted from PrefillDone.
#[test]
fn retract_from_prefill_done_triggered_when_device_full() {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 2,
        device_pages: 4,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 4)); // 4 + d 2 slots = all 3 pages
    s.next_plan();
    assert_eq!(free_device(&mut s), 0);
    advance(&mut s, vec![extend("r1", &[5])]);
    assert_eq!(state(&s, "r1"), StateKind::PrefillDone);
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert_eq!(plan.write_backs.len(), 1);
    assert!(plan.write_backs[0].is_retract);
    // 5 tokens: the 2 full pages before the last token are written back.
    assert_eq!(plan.write_backs[0].pairs.len(), 2);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    check(&mut s);
}

/// d 2, device 6 (5 usable): r1 (3 pages) and r2 (2 pages) fill the pool, neither can
/// take its first decode page, the longer r1 is retracted. After the ack the next
/// forward is not empty (r2 decodes); r1 resumes once r2 finishes.
fn two_requests_d2_device6() -> (Scheduler, ExecutionPlan) {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 2,
        device_pages: 6,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(100, 2));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    assert_eq!(free_device(&mut s), 0);
    advance(&mut s, vec![extend("r1", &[5]), extend("r2", &[102])]);
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert_eq!(plan.write_backs.len(), 1);
    assert!(plan.write_backs[0].is_retract);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    assert_eq!(state(&s, "r2"), StateKind::PrefillDone);
    (s, plan)
}

#[test]
fn retract_from_prefill_done_full_cycle() {
    let (mut s, plan) = two_requests_d2_device6();
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    let plan = s.next_plan();
    assert!(!plan.forward.is_empty());
    assert_eq!(row_ids(&plan), ["r2"]);
    assert_eq!(row_of(&plan, "r2").kind, RowKind::Decode);
    // r2 finishes; r1 recovers and runs to completion.
    advance(&mut s, vec![extend("r2", &[103]), finish("r2")]);
    let mut engine = Engine::with_max_new(3);
    engine.produced.insert("r1".into(), 1);
    let plans = drain(&mut s, &mut engine, 50);
    assert!(
        plans
            .iter()
            .any(|p| row(p, "r1").is_some_and(|r| r.kind == RowKind::Recovery)),
        "r1 never recovered"
    );
    assert_eq!(engine.finished, ["r1"]);
    assert_eq!(free_device(&mut s), 5);
    check(&mut s);
}

/// Retracted at a page boundary (tail_free 0): the kept request-local page (holding the
/// newest token's slot) stays in the recovered page table after the loaded-back prefix,
/// followed by the new decode page — at least 3 pages (§7.4 verified example).
#[test]
fn retract_tail_page_zero_preserves_boundary_page() {
    let (mut s, plan) = two_requests_d2_device6();
    ack_write_backs(&mut s, &plan, true);
    s.next_plan(); // r2 decodes
    advance(&mut s, vec![extend("r2", &[103]), finish("r2")]);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Recovery);
    let table = plan.forward.page_table_of(r);
    assert!(table.len() >= 3, "{table:?}");
    // Loaded-back prefix (2 pages), the kept page, one new page for d = 2 slots.
    assert_eq!(table.len(), 4);
    let lb: Vec<u32> = plan
        .load_backs
        .iter()
        .flat_map(|op| op.pairs.iter().map(|p| p.dst))
        .collect();
    assert_eq!(&table[..2], lb.as_slice());
    // r1's third page at admission was page 3 (pages 5, 4, 3 popped LIFO).
    assert_eq!(table[2], 3);
    assert_eq!(r.decode_input_id, 5);
    assert_eq!(r.hist_token_len, 4);
    check(&mut s);
}

/// The victim is the running request with the most tokens; ties go to the first in
/// scheduling order (smallest id). Exactly one victim per plan.
#[test]
fn victim_is_longest_request_ties_by_id() {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 5,
        ..fixture()
    });
    submit(&mut s, "b", tokens(1, 4));
    submit(&mut s, "a", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[104]), extend("b", &[5])]);
    s.next_plan();
    // Both ask for a page none has; equal length: "a" (first in id order) is the victim.
    advance(
        &mut s,
        vec![
            extend("a", &[105]),
            reserve("a", 2),
            extend("b", &[6]),
            reserve("b", 2),
        ],
    );
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    assert_eq!(state(&s, "a"), StateKind::Retracting);
    assert_eq!(state(&s, "b"), StateKind::Decoding);
    ack_write_backs(&mut s, &plan, true);
    // a's demoted pages let b decode.
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["b"]);

    // Longer request wins over id order.
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 5,
        ..fixture()
    });
    submit(&mut s, "a", tokens(100, 4));
    submit(&mut s, "b", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[104]), extend("b", &[5])]);
    s.next_plan();
    advance(
        &mut s,
        vec![
            extend("a", &[105]),
            reserve("a", 2),
            extend("b", &[6, 7]),
            reserve("b", 2),
        ],
    );
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    assert_eq!(state(&s, "b"), StateKind::Retracting);
    assert_eq!(state(&s, "a"), StateKind::Decoding);
}

/// No retraction while at least one op was scheduled, even if another decode failed.
#[test]
fn no_retraction_when_something_was_scheduled() {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 5,
        ..fixture()
    });
    submit(&mut s, "a", tokens(100, 4));
    submit(&mut s, "b", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[104]), extend("b", &[5])]);
    s.next_plan();
    // "a" needs 2 pages (none free), "b" needs none.
    advance(
        &mut s,
        vec![extend("a", &[105]), reserve("a", 4), extend("b", &[6])],
    );
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["b"]);
    assert!(plan.write_backs.is_empty());
    assert_eq!(state(&s, "a"), StateKind::Decoding);
    assert_eq!(s.stats().retractions, 0);
}

/// P4 fixed: when the host pool cannot take the victim's prefix, the reference's policy
/// aborts the victim and the plan says so.
#[test]
fn retract_without_host_pages_aborts_and_reports() {
    let mut s = sched(SchedulerConfig {
        host_pages: 2, // 1 usable host page, the prefix needs 2
        policy: Policy::Reference,
        ..d0_device3()
    });
    let plan = retract_r1(&mut s);
    assert!(plan.forward.is_empty());
    assert!(plan.write_backs.is_empty());
    assert_eq!(
        plan.aborted,
        [AbortNotice {
            request_id: rid("r1"),
            reason: AbortReason::HostPoolExhausted,
        }]
    );
    assert!(!plan.is_empty());
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    let st = s.stats();
    assert_eq!(st.scheduler_aborts, 1);
    assert_eq!(st.available_host_pages, 1);
    // The published prefix stays as unlocked device cache.
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
    // The engine's late result for it is stale, not an error.
    advance(&mut s, vec![extend("r1", &[7])]);
    s.next_plan();
    assert_eq!(s.request_state(&rid("r1")), None);
    advance(&mut s, vec![extend("r1", &[8])]);
    check(&mut s);
}

/// By default the victim whose prefix the host pool cannot take is queued again to
/// compute its whole history — unless, as here, that history (6 tokens, 3 pages) can
/// no longer fit the device pool (2 usable pages): then it is given up for that reason,
/// and the plan says so.
#[test]
fn retract_without_host_pages_recomputes_or_reports_what_cannot_fit() {
    let mut s = sched(SchedulerConfig {
        host_pages: 2, // 1 usable host page, the prefix needs 2
        ..d0_device3()
    });
    let plan = retract_r1(&mut s);
    assert_eq!(
        plan.aborted,
        [AbortNotice {
            request_id: rid("r1"),
            reason: AbortReason::ExceedsDevicePool,
        }]
    );
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
}

/// P8 fixed for retraction: a failed retract write-back rolls the host pages back and
/// keeps the device copy locked; the request resumes from its device copy without a
/// load-back.
#[test]
fn failed_retract_write_back_keeps_device_copy() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    ack_write_backs(&mut s, &plan, false);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    let st = s.stats();
    assert_eq!(st.failed_write_backs, 1);
    assert_eq!(st.available_host_pages, 31);
    assert_eq!(st.cached_host_pages, 0);
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(locked_pages(&mut s, Tier::Device), 2);
    check(&mut s);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Recovery);
    assert!(plan.load_backs.is_empty());
    assert_eq!(plan.forward.page_table_of(r), [2, 1]);
    check(&mut s);
}

/// A retracted request that has outgrown the whole device pool can never run again: it
/// is aborted with an `ExceedsDevicePool` notice instead of waiting forever (the C++
/// stalls). ps 2, d 1, device 3 (2 usable): with [1,2] + 2 generated tokens the request
/// needs its loaded-back page, its kept (full) tail page and a new page for the next
/// slot: 3 > 2.
#[test]
fn retracted_request_that_can_never_fit_is_aborted() {
    let mut s = sched(SchedulerConfig {
        device_pages: 3,
        ..fixture()
    });
    submit(&mut s, "r0", vec![1, 2]); // 2 + d = 3 slots: both pages
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[3])]);
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[4]), reserve("r0", 4)]);
    let plan = s.next_plan();
    assert_eq!(state(&s, "r0"), StateKind::Retracting);
    ack_write_backs(&mut s, &plan, true);
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert_eq!(
        plan.aborted,
        [AbortNotice {
            request_id: rid("r0"),
            reason: AbortReason::ExceedsDevicePool,
        }]
    );
    assert_eq!(state(&s, "r0"), StateKind::Finished);
    check(&mut s);
}

/// The pool-capacity abort must count the free slots left in the kept tail page.
/// ps 2, d 1, device 4 (3 usable): prompt [1,2,3] takes 2 pages, its first decode a
/// third (slots 0..4 acquired, 1 free slot left in page 3). The engine then asks for a
/// reserve of 2 (e.g. accepted draft tokens): no page is free, so it is retracted with
/// 2 pages written back and page 3 kept. Resuming needs the 2 loaded-back pages plus the
/// kept page, whose free slot takes the d = 1 reserved slot: 3 pages, exactly the pool.
/// It must resume, not be aborted as exceeding the pool.
#[test]
fn retracted_request_with_tail_room_is_not_aborted() {
    let mut s = sched(SchedulerConfig {
        device_pages: 4,
        ..fixture()
    });
    submit(&mut s, "r0", vec![1, 2, 3]);
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[4])]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r0").size, 1);
    assert_eq!(free_device(&mut s), 0);
    advance(&mut s, vec![extend("r0", &[5]), reserve("r0", 2)]);
    let plan = s.next_plan();
    assert_eq!(state(&s, "r0"), StateKind::Retracting);
    assert_eq!(plan.write_back_pages(), 2);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(free_device(&mut s), 2);
    let plan = s.next_plan();
    assert!(plan.aborted.is_empty(), "aborted: {:?}", plan.aborted);
    let r = row_of(&plan, "r0");
    assert_eq!(r.kind, RowKind::Recovery);
    assert_eq!(plan.forward.page_table_of(r).len(), 3);
    assert_eq!(plan.forward.page_table_of(r)[2], 1); // the kept tail page
    assert_eq!(free_device(&mut s), 0);
    check(&mut s);
}

/// Finish while Retracting: the copy in flight completes (WritingBack), the tail pages
/// are freed now; the acknowledgement finishes the request.
#[test]
fn finish_from_retracting_waits_for_the_copy() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    advance(&mut s, vec![finish("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    assert_eq!(s.stats().retracted, 0);
    check(&mut s);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    s.next_plan();
    assert!(s.is_idle());
    let st = s.stats();
    assert_eq!((st.available_device_pages, st.cached_host_pages), (2, 2));
    check(&mut s);
}

/// Finish while Retracted: host lock and tail pages dropped, the host copy stays cached.
#[test]
fn finish_from_retracted_releases_everything() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    ack_write_backs(&mut s, &plan, true);
    advance(&mut s, vec![finish("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    let plan = s.next_plan();
    assert!(plan.is_empty());
    assert_eq!(s.stats().cached_host_pages, 2);
    assert_eq!(free_device(&mut s), 2);
    check(&mut s);
}
