//! Port of `tests/cpp/test_write_back.cpp` (fixture, pools 32), plus our fixes: a failed
//! write-back rolls the host pages back instead of publishing garbage (P8), and an
//! acknowledgement for an op of a request that is gone is fine.

mod common;

use std::collections::BTreeSet;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::{RowKind, SchedulerConfig, Tier, TransferKind};

/// Runs `id` (prompt `prompt`) through prefill and one decode, then finishes it with
/// one more token: its except-last full pages are published and written back.
fn run_and_finish(s: &mut Scheduler, ids: &[(&str, Vec<i32>)]) {
    for (id, prompt) in ids {
        submit(s, id, prompt.clone());
    }
    s.next_plan();
    let events = ids.iter().map(|(id, _)| extend(id, &[900])).collect();
    advance(s, events);
    s.next_plan();
    let mut events = Vec::new();
    for (id, _) in ids {
        events.push(extend(id, &[901]));
        events.push(finish(id));
    }
    advance(s, events);
}

#[test]
fn write_back_generated_after_finish() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    assert_eq!(state(&s, "r1"), StateKind::Draining);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    let op = &plan.write_backs[0];
    assert!(!op.is_retract);
    assert!(op.op_id > 0);
    // 6 tokens: 2 full pages before the last token; device pages 31, 30 → host 31, 30.
    let pairs: Vec<(u32, u32)> = op.pairs.iter().map(|p| (p.src, p.dst)).collect();
    assert_eq!(pairs, [(31, 31), (30, 30)]);
    assert!(op.pairs.iter().all(|p| p.kind == TransferKind::Kv));
    check(&mut s);
}

#[test]
fn write_back_request_not_in_forward_while_writing_back() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    let plan = s.next_plan();
    assert!(row(&plan, "r1").is_none());
    assert!(plan.write_backs.is_empty(), "issued once");
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    check(&mut s);
}

#[test]
fn write_back_finished_after_write_back_done() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    s.next_plan();
    assert_eq!(s.request_state(&rid("r1")), None);
    // Demoted: every device page is free, the prefix is on host.
    let st = s.stats();
    assert_eq!(st.available_device_pages, 31);
    assert_eq!(st.cached_host_pages, 2);
    assert!(s.is_idle());
    check(&mut s);
}

#[test]
fn write_back_multiple_requests_get_separate_ops() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4)), ("r2", tokens(100, 4))]);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 2);
    let ids: BTreeSet<u32> = plan.write_backs.iter().map(|op| op.op_id).collect();
    assert_eq!(ids.len(), 2);
    assert!(plan.write_backs.iter().all(|op| !op.pairs.is_empty()));
    check(&mut s);
}

/// Prompts [1,2,3,4] and [1,2,5,6] share the page [1,2]. Their write-backs together
/// copy 3 distinct pages: a pair already emitted by an earlier op of the plan is
/// omitted from later ops.
#[test]
fn write_back_shared_device_path_both_get_separate_ops() {
    let mut s = sched(fixture());
    run_and_finish(
        &mut s,
        &[("r1", vec![1, 2, 3, 4]), ("r2", vec![1, 2, 5, 6])],
    );
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 2);
    let ids: BTreeSet<u32> = plan.write_backs.iter().map(|op| op.op_id).collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|&id| id > 0));
    let pairs: Vec<_> = plan.write_backs.iter().flat_map(|op| &op.pairs).collect();
    assert_eq!(pairs.len(), 3);
    let src: BTreeSet<u32> = pairs.iter().map(|p| p.src).collect();
    let dst: BTreeSet<u32> = pairs.iter().map(|p| p.dst).collect();
    assert_eq!((src.len(), dst.len()), (3, 3));
    check(&mut s);
    ack_write_backs(&mut s, &plan, true);
    let st = s.stats();
    assert_eq!(st.cached_host_pages, 3);
    assert_eq!(st.available_device_pages, 31);
    check(&mut s);
}

/// Found by the seeded campaign: a plan emits each pair once, so the second of two
/// write-backs sharing a prefix relies on the first to copy it. When the first fails and
/// the second succeeds, the shared host pages were never written: nothing of either may
/// read as written back. Both acknowledgement orders; a write-back acknowledged before
/// the one it relies on waits for it (its request stays `WritingBack`).
#[test]
fn a_write_back_relying_on_a_failed_one_rolls_back_too() {
    for first_acked in ["r1", "r2"] {
        let mut s = sched(fixture());
        run_and_finish(
            &mut s,
            &[("r1", vec![1, 2, 3, 4]), ("r2", vec![1, 2, 5, 6])],
        );
        let plan = s.next_plan();
        let [op1, op2] = [&plan.write_backs[0], &plan.write_backs[1]];
        assert_eq!(
            (op1.pairs.len(), op2.pairs.len()),
            (2, 1),
            "op 2 relies on op 1"
        );
        let (failed, succeeded) = (wb_done(op1.op_id, false), wb_done(op2.op_id, true));
        if first_acked == "r2" {
            advance(&mut s, vec![succeeded]);
            assert_eq!(state(&s, "r2"), StateKind::WritingBack, "waits for op 1");
            advance(&mut s, vec![failed]);
        } else {
            advance(&mut s, vec![failed, succeeded]);
        }
        assert_eq!(state(&s, "r1"), StateKind::Finished);
        assert_eq!(state(&s, "r2"), StateKind::Finished);
        let st = s.stats();
        assert_eq!(
            st.cached_host_pages, 0,
            "{first_acked} first: nothing reads as written"
        );
        assert_eq!(st.failed_write_backs, 1);
        check(&mut s);
        // Their prefix is still served, from the device copies.
        submit(&mut s, "r3", vec![1, 2, 5, 6, 7]);
        let plan = s.next_plan();
        assert!(plan.load_backs.is_empty(), "{first_acked} first");
        assert_eq!(row_of(&plan, "r3").extend_prefix_len, 4);
        check(&mut s);
    }
}

/// P8 fixed: a failed write-back rolls the host pages back; the device copy stays
/// cached (unlocked) and the request finishes.
#[test]
fn failed_write_back_rolls_host_pages_back() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    let plan = s.next_plan();
    assert_eq!(free_host(&mut s), 29);
    ack_write_backs(&mut s, &plan, false);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    let st = s.stats();
    assert_eq!(st.failed_write_backs, 1);
    assert_eq!(st.available_host_pages, 31);
    assert_eq!(st.cached_host_pages, 0);
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
    // The same prompt hits the device copy: no load-back.
    submit(&mut s, "r2", tokens(1, 5));
    let plan = s.next_plan();
    assert!(plan.load_backs.is_empty());
    assert_eq!(row_of(&plan, "r2").extend_prefix_len, 4);
    check(&mut s);
}

#[test]
fn write_back_done_for_unknown_op_is_refused_and_repeat_is_stale() {
    let mut s = sched(fixture());
    let err = single_error(s.advance(vec![wb_done(7, true)]));
    assert_eq!(err, SchedError::UnknownOp(7));
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    // A duplicate acknowledgement of a completed op is stale, not an error.
    let stale = s.stats().stale_events;
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(s.stats().stale_events, stale + 1);
    check(&mut s);
}

/// When the host pool cannot take the prefix the request finishes without a
/// write-back; its prefix stays cached on device.
#[test]
fn finish_without_host_room_skips_write_back() {
    let mut s = sched(SchedulerConfig {
        host_pages: 2, // 1 usable host page; the prefix has 2
        ..fixture()
    });
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    let plan = s.next_plan();
    assert!(plan.write_backs.is_empty());
    let st = s.stats();
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(st.available_host_pages, 1);
    check(&mut s);
}

/// Behaviour of record: after the write-back the device copy is demoted, so the same
/// prompt pays a load-back.
#[test]
fn repeat_prompt_after_write_back_loads_back() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    submit(&mut s, "r2", tokens(1, 5));
    let plan = s.next_plan();
    let r = row_of(&plan, "r2");
    assert_eq!(r.kind, RowKind::Prefill);
    assert_eq!(r.extend_prefix_len, 4);
    assert_eq!(plan.load_back_pages(), 2);
    let lb: Vec<(u32, u32)> = plan.load_backs[0]
        .pairs
        .iter()
        .map(|p| (p.src, p.dst))
        .collect();
    // Host pages 31, 30 into the first two entries of the row's page table.
    assert_eq!(lb[0].0, 31);
    assert_eq!(lb[1].0, 30);
    assert_eq!(
        &plan.forward.page_table_of(r)[..2],
        [lb[0].1, lb[1].1].as_slice()
    );
    check(&mut s);
}

/// A write-back in flight copies a whole path. If a later match splits one of its nodes
/// before the acknowledgement, the acknowledgement must still make the *whole* copied
/// path readable on host: the finished request's device pages are all demoted and a
/// repeat of its prompt hits host for the whole prefix.
#[test]
fn write_back_ack_covers_nodes_split_while_in_flight() {
    let mut s = sched(fixture());
    run_and_finish(&mut s, &[("r1", tokens(1, 4))]);
    let plan = s.next_plan(); // r1's write-back of [1,2,3,4] is in flight
    assert_eq!(plan.write_backs.len(), 1);
    // r2 shares only the first page: its admission splits r1's node at page 1.
    submit(&mut s, "r2", vec![1, 2, 50, 51]);
    let p = s.next_plan();
    assert_eq!(row_of(&p, "r2").extend_prefix_len, 2);
    advance(&mut s, vec![abort("r2")]);
    ack_write_backs(&mut s, &plan, true);
    let st = s.stats();
    // r1's two pages were copied and acknowledged: both are readable on host and
    // demoted from device.
    assert_eq!(st.cached_host_pages, 2);
    assert_eq!(
        st.cached_device_pages, 0,
        "page [1,2] kept its device copy: its host copy is still pending"
    );
    // A repeat of r1's prompt should hit host for both pages.
    submit(&mut s, "r3", tokens(1, 5));
    let p = s.next_plan();
    let r = row_of(&p, "r3");
    assert_eq!(r.extend_prefix_len, 4);
    check(&mut s);
}
