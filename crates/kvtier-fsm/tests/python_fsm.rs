//! Port of `python/tests/test_fsm_and_scheduling.py` (ps 16, device 1024, host 0 →
//! `disable_l2_cache`, budget 64, batch 8, d 1, unless noted). Python's `RuntimeError`
//! on an invalid transition is our `SchedError::InvalidTransition`; a token size of -1
//! is `None`. Binding-only checks (field read/write of event objects) are not ported.

mod common;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::{ExecutionPlan, RowKind, SchedulerConfig};

fn py() -> Scheduler {
    sched(python_fixture())
}

fn py_with(f: impl FnOnce(&mut SchedulerConfig)) -> Scheduler {
    let mut c = python_fixture();
    f(&mut c);
    sched(c)
}

/// r0 (prompt 1..4) decoding: prefill, ExtendResult, first decode, ExtendResult.
fn decoding(s: &mut Scheduler, id: &str, start: i32) {
    submit(s, id, tokens(start, 4));
    let plan = s.next_plan();
    assert!(row(&plan, id).is_some());
    advance(s, vec![extend(id, &[start + 50])]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, id).kind, RowKind::Decode);
    advance(s, vec![extend(id, &[start + 51])]);
}

// ----- TestFSMTransitions ---------------------------------------------------------------

#[test]
fn fsm_invalid_transition_message() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    let err = single_error(s.advance(vec![finish("r0")]));
    assert!(matches!(
        err,
        SchedError::InvalidTransition {
            event: "Finish",
            state: StateKind::Submitted,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(msg.contains("FSM transition invalid"), "{msg}");
    assert!(msg.contains("Finish") && msg.contains("Submitted"), "{msg}");
    assert_eq!(state(&s, "r0"), StateKind::Submitted);
}

#[test]
fn fsm_submit_waiting() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    assert_eq!(s.stats().waiting, 1);
}

#[test]
fn fsm_first_plan_prefilling_with_extends() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(plan.forward.num_prefill_rows, 1);
    assert_eq!(s.stats().prefilling, 1);
}

#[test]
fn fsm_prefill_done_to_decoding_on_plan_two_without_extends() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5])]);
    assert_eq!(state(&s, "r0"), StateKind::PrefillDone);
    let plan = s.next_plan();
    assert_eq!(plan.forward.num_prefill_rows, 0);
    assert_eq!(plan.forward.rows.len(), 1);
    assert_eq!(state(&s, "r0"), StateKind::Decoding);
}

#[test]
fn fsm_finish_then_plan_forgets_request() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    advance(&mut s, vec![finish("r0")]);
    assert_eq!(state(&s, "r0"), StateKind::Finished);
    s.next_plan();
    assert_eq!(s.request_tokens(&rid("r0")), None);
    check(&mut s);
}

#[test]
fn fsm_extend_result_appends() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    assert_eq!(s.request_tokens(&rid("r0")), Some(4));
    advance(&mut s, vec![extend("r0", &[5])]);
    assert_eq!(s.request_tokens(&rid("r0")), Some(5));
}

// ----- TestChunkedPrefill ------------------------------------------------------------

#[test]
fn chunked_thirty_tokens_budget_ten() {
    let mut s = py_with(|c| c.max_scheduled_tokens = 10);
    submit(&mut s, "r0", tokens(1, 30));
    for chunk in 0..3u32 {
        let plan = s.next_plan();
        let r = row_of(&plan, "r0");
        assert_eq!(r.kind, RowKind::Prefill);
        assert_eq!((r.input_length, r.extend_prefix_len), (10, 10 * chunk));
        // The token count does not change while chunks run.
        assert_eq!(s.request_tokens(&rid("r0")), Some(30));
    }
    assert_eq!(state(&s, "r0"), StateKind::PrefillDone);
    advance(&mut s, vec![extend("r0", &[31])]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r0").kind, RowKind::Decode);
}

// ----- TestPrefillFirst --------------------------------------------------------------

#[test]
fn prefill_first_prefilling_before_new_submitted() {
    let mut s = py_with(|c| c.max_scheduled_tokens = 10);
    submit(&mut s, "r1", tokens(1, 30));
    s.next_plan();
    submit(&mut s, "r0", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
}

#[test]
fn prefill_first_decode_withheld_while_prefill_exists() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    submit(&mut s, "r1", tokens(100, 20));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
    assert_eq!(plan.forward.decode_rows().len(), 0);
}

fn mixed_plan() -> (Scheduler, ExecutionPlan) {
    let mut s = py_with(|c| {
        c.enable_mixed_prefill_decode = true;
        c.max_scheduled_tokens = 16;
    });
    decoding(&mut s, "r0", 1);
    submit(&mut s, "r1", tokens(100, 32));
    let plan = s.next_plan();
    (s, plan)
}

/// fsm-scheduler.md §7.1 verified: mixed (ps 16, budget 16), decode r0 + 32-token
/// prompt r1 → rows [r1, r0], input lengths [15, 1].
#[test]
fn prefill_first_mixed_rows_and_sizes() {
    let (_, plan) = mixed_plan();
    assert_eq!(row_ids(&plan), ["r1", "r0"]);
    assert_eq!(plan.forward.num_prefill_rows, 1);
    let sizes: Vec<u32> = plan.forward.rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [1, 0]);
    let lens: Vec<u32> = plan.forward.rows.iter().map(|r| r.input_length).collect();
    assert_eq!(lens, [15, 1]);
    let r1 = row_of(&plan, "r1");
    assert_eq!(plan.forward.input_ids_of(r1), tokens(100, 15).as_slice());
    assert_eq!(
        plan.forward.shifted_input_ids_of(r1),
        tokens(101, 15).as_slice()
    );
    assert_eq!(plan.forward.input_ids.len(), 15);
}

#[test]
fn prefill_first_mixed_decode_not_starved() {
    let (mut s, _) = mixed_plan();
    advance(&mut s, vec![extend("r0", &[60])]);
    let plan = s.next_plan();
    // The decode keeps running next to the remaining chunks.
    assert_eq!(row_ids(&plan), ["r1", "r0"]);
    let lens: Vec<u32> = plan.forward.rows.iter().map(|r| r.input_length).collect();
    assert_eq!(lens, [15, 1]);
    assert_eq!(row_of(&plan, "r1").extend_prefix_len, 15);
}

#[test]
fn prefill_first_batch_two_caps_rows() {
    let mut s = py_with(|c| c.max_batch_size = 2);
    for i in 0..3 {
        submit(&mut s, &format!("r{i}"), tokens(10 * i + 1, 4));
    }
    let plan = s.next_plan();
    assert_eq!(plan.forward.rows.len(), 2);
}

// ----- TestDecodeBatch ---------------------------------------------------------------

#[test]
fn decode_batch_two_decodes_in_one_batch() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), extend("r1", &[104])]);
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r0", "r1"]);
    assert_eq!(plan.forward.decode_rows().len(), 2);
}

#[test]
fn decode_batch_finishing_one_leaves_other() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), extend("r1", &[104])]);
    s.next_plan();
    advance(
        &mut s,
        vec![extend("r0", &[6]), finish("r0"), extend("r1", &[105])],
    );
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
    assert_eq!(s.request_state(&rid("r0")), None);
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    check(&mut s);
}

#[test]
fn decode_batch_each_decode_appends_one_token() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    assert_eq!(s.request_tokens(&rid("r0")), Some(6));
    for n in 7..10 {
        s.next_plan();
        advance(&mut s, vec![extend("r0", &[n])]);
        assert_eq!(s.request_tokens(&rid("r0")), Some(n as usize));
    }
}

// ----- TestPrefillInputIds -----------------------------------------------------------

#[test]
fn input_ids_full_prefill() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 8));
    let plan = s.next_plan();
    let r = row_of(&plan, "r0");
    assert_eq!(plan.forward.input_ids_of(r), tokens(1, 8).as_slice());
    let mut shifted = tokens(2, 7);
    shifted.push(-1);
    assert_eq!(plan.forward.shifted_input_ids_of(r), shifted.as_slice());
    assert_eq!(r.extend_prefix_len, 0);
}

#[test]
fn input_ids_fifteen_tokens_budget_five() {
    let mut s = py_with(|c| c.max_scheduled_tokens = 5);
    submit(&mut s, "r0", tokens(1, 15));
    for (i, begin) in [0, 5, 10].into_iter().enumerate() {
        let plan = s.next_plan();
        let r = row_of(&plan, "r0");
        assert_eq!(r.extend_prefix_len, begin, "chunk {i}");
        let first = begin as i32 + 1;
        assert_eq!(plan.forward.input_ids_of(r), tokens(first, 5).as_slice());
        let mut shifted = tokens(first + 1, if i == 2 { 4 } else { 5 });
        if i == 2 {
            shifted.push(-1);
        }
        assert_eq!(plan.forward.shifted_input_ids_of(r), shifted.as_slice());
    }
}

#[test]
fn input_ids_two_requests_concatenated() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 3));
    submit(&mut s, "r1", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(plan.forward.input_ids, [1, 2, 3, 100, 101, 102, 103]);
    assert_eq!(
        plan.forward.shifted_input_ids,
        [2, 3, -1, 101, 102, 103, -1]
    );
    let starts: Vec<u32> = plan
        .forward
        .rows
        .iter()
        .map(|r| r.input_ids_start)
        .collect();
    assert_eq!(starts, [0, 3]);
}

#[test]
fn input_ids_twenty_tokens_budget_eight() {
    let mut s = py_with(|c| c.max_scheduled_tokens = 8);
    submit(&mut s, "r0", tokens(1, 20));
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let plan = s.next_plan();
        let r = row_of(&plan, "r0");
        chunks.push((r.input_length, r.extend_prefix_len));
    }
    assert_eq!(chunks, [(8, 0), (8, 8), (4, 16)]);
    assert_eq!(state(&s, "r0"), StateKind::PrefillDone);
}

// ----- TestUpdateReserveNumTokens (ps 16 unless noted) --------------------------------

fn decode_size(s: &mut Scheduler, id: &str) -> u32 {
    let plan = s.next_plan();
    row_of(&plan, id).size
}

#[test]
fn reserve_on_submitted_is_refused() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    let err = single_error(s.advance(vec![reserve("r0", 16)]));
    assert!(matches!(err, SchedError::InvalidTransition { .. }));
}

/// Prompt 4 + d: 5 slots of a 16-slot page; first decode takes 1 more (size 0). A
/// reserve of 16 then needs a page.
#[test]
fn reserve_sixteen_gives_one_page() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    advance(&mut s, vec![reserve("r0", 16)]);
    assert_eq!(decode_size(&mut s, "r0"), 1);
}

#[test]
fn reserve_last_update_wins() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    advance(&mut s, vec![reserve("r0", 16), reserve("r0", 1)]);
    assert_eq!(decode_size(&mut s, "r0"), 0);
}

#[test]
fn reserve_twenty_at_page_size_eight() {
    let mut s = py_with(|c| c.page_size = 8);
    decoding(&mut s, "r0", 1);
    advance(&mut s, vec![reserve("r0", 20)]);
    // 6 slots used of the first page (4 prompt + 2 decode): 20 more need 3 pages.
    let size = decode_size(&mut s, "r0");
    assert!(size > 1);
    assert_eq!(size, 3);
}

#[test]
fn reserve_zero_after_big_reserve() {
    let mut s = py_with(|c| c.page_size = 8);
    decoding(&mut s, "r0", 1);
    advance(&mut s, vec![reserve("r0", 20)]);
    assert_eq!(decode_size(&mut s, "r0"), 3);
    advance(&mut s, vec![reserve("r0", 0)]);
    assert_eq!(decode_size(&mut s, "r0"), 0);
}

#[test]
fn reserve_update_while_decoding() {
    let mut s = py();
    decoding(&mut s, "r0", 1);
    assert_eq!(decode_size(&mut s, "r0"), 0);
    advance(&mut s, vec![extend("r0", &[60]), reserve("r0", 16)]);
    assert_eq!(decode_size(&mut s, "r0"), 1);
}

#[test]
fn reserve_prefill_done_first_decode_then_sixteen() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5])]);
    assert_eq!(decode_size(&mut s, "r0"), 0);
    advance(&mut s, vec![extend("r0", &[6]), reserve("r0", 16)]);
    assert_eq!(decode_size(&mut s, "r0"), 1);
}

#[test]
fn reserve_per_request_independence() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    submit(&mut s, "r1", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), extend("r1", &[104])]);
    s.next_plan();
    advance(
        &mut s,
        vec![extend("r0", &[6]), reserve("r0", 16), extend("r1", &[105])],
    );
    let plan = s.next_plan();
    assert_eq!((row_of(&plan, "r0").size, row_of(&plan, "r1").size), (1, 0));
}

// ----- TestWriteBackPriority (ps 2, host 16) -------------------------------------------

#[test]
fn write_back_priority_finish_is_not_retract() {
    let mut s = sched(
        SchedulerConfig {
            page_size: 2,
            device_pages: 16,
            host_pages: 16,
            ..python_fixture()
        }
        .with_l2(),
    );
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), finish("r0")]);
    let plan = s.next_plan();
    let kinds: Vec<bool> = plan.write_backs.iter().map(|op| op.is_retract).collect();
    assert_eq!(kinds, [false]);
}

#[test]
fn write_back_priority_retract_is_retract() {
    let mut s = sched(
        SchedulerConfig {
            page_size: 2,
            device_pages: 3,
            host_pages: 16,
            ..python_fixture()
        }
        .with_l2(),
    );
    submit(&mut s, "r0", vec![1, 2]); // 2 + d = 3 slots: both pages
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[3])]);
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[4]), reserve("r0", 4)]);
    let plan = s.next_plan();
    let kinds: Vec<bool> = plan.write_backs.iter().map(|op| op.is_retract).collect();
    assert_eq!(kinds, [true]);
    check(&mut s);
}

trait WithL2 {
    fn with_l2(self) -> Self;
}

impl WithL2 for SchedulerConfig {
    fn with_l2(mut self) -> Self {
        self.disable_l2_cache = false;
        self
    }
}

// ----- TestDecodeInputIds --------------------------------------------------------------

#[test]
fn decode_input_ids_normal_decode_is_placeholder() {
    let mut s = py();
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5])]);
    let plan = s.next_plan();
    let ids: Vec<i32> = plan
        .forward
        .rows
        .iter()
        .map(|r| r.decode_input_id)
        .collect();
    assert_eq!(ids, [-1]);
    assert_eq!(row_of(&plan, "r0").hist_token_len, -1);
}

#[test]
fn decode_input_ids_recovered_decode_uses_last_token() {
    // Device 4 (3 usable): after the retraction there is room to resume.
    let mut s = sched(
        SchedulerConfig {
            page_size: 2,
            device_pages: 4,
            host_pages: 16,
            ..python_fixture()
        }
        .with_l2(),
    );
    submit(&mut s, "r0", vec![1, 2]);
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[3])]);
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[77]), reserve("r0", 4)]);
    let plan = s.next_plan();
    assert_eq!(state(&s, "r0"), StateKind::Retracting);
    ack_write_backs(&mut s, &plan, true);
    let plan = s.next_plan();
    let r = row_of(&plan, "r0");
    assert_eq!(r.kind, RowKind::Recovery);
    assert_eq!(r.decode_input_id, 77);
    check(&mut s);
}

#[test]
fn decode_input_ids_mixed_one_placeholder_per_decode_row() {
    let mut s = py_with(|c| c.enable_mixed_prefill_decode = true);
    decoding(&mut s, "r0", 1);
    decoding(&mut s, "r2", 200);
    submit(&mut s, "r1", tokens(100, 8));
    let plan = s.next_plan();
    assert_eq!(plan.forward.num_prefill_rows, 1);
    let ids: Vec<i32> = plan
        .forward
        .decode_rows()
        .iter()
        .map(|r| r.decode_input_id)
        .collect();
    assert_eq!(ids, [-1, -1]);
}
