//! Port of `tests/cpp/test_basic_lifecycle.cpp` (fixture: ps 2, device 32, host 32,
//! budget 64, batch 8, d 1, L3 off), plus the verified §7.1 page example and our
//! deliberate submit-time refusals (duplicate ids, empty prompts, negative tokens,
//! prompts that can never fit).

mod common;

use common::*;
use kvtier_fsm::{SchedError, StateKind};
use kvtier_types::{RequestSpec, RowKind};

#[test]
fn submit_creates_waiting_request() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let st = s.stats();
    assert_eq!(st.waiting, 1);
    assert_eq!(st.decoding, 0);
    assert_eq!(st.prefilling, 0);
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
    // A waiting request holds nothing.
    assert_eq!(st.available_device_pages, 31);
    check(&mut s);
}

#[test]
fn plan_once_schedules_prefill() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
    let r = &plan.forward.rows[0];
    assert_eq!(r.kind, RowKind::Prefill);
    assert!(r.input_length > 0);
    assert_eq!(plan.forward.num_prefill_rows, 1);
    check(&mut s);
}

/// Verified example of fsm-scheduler.md §7.1 (ps 2, device 32, budget 64, d 1).
#[test]
fn four_token_prompt_page_example() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));

    // Prefill row: 4 prompt tokens + d = 5 slots = 3 pages, popped LIFO from the top.
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(plan.forward.page_table_of(r), [31, 30, 29]);
    assert_eq!((r.begin, r.size), (0, 3));
    assert_eq!(plan.forward.new_pages_of(r), [31, 30, 29]);
    assert_eq!(
        (r.input_length, r.prefill_length, r.extend_prefix_len),
        (4, 4, 0)
    );
    assert_eq!(plan.forward.input_ids_of(r), [1, 2, 3, 4]);

    // Next plan: decode row with input_length 1, begin 3, size 0 (the reserved slot).
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Decode);
    assert_eq!((r.input_length, r.begin, r.size), (1, 3, 0));
    assert_eq!(plan.forward.page_table_of(r), [31, 30, 29]);

    // Another plan without ExtendResult: one new page (28).
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!((r.begin, r.size), (3, 1));
    assert_eq!(plan.forward.new_pages_of(r), [28]);

    // After ExtendResult + UpdateReserve(1): the reserved slot is in the tail page.
    advance(&mut s, vec![extend("r1", &[5]), reserve("r1", 1)]);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!((r.begin, r.size), (4, 0));
    check(&mut s);
}

#[test]
fn forward_done_transitions_to_prefill_done() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    assert_eq!(s.stats().prefilling, 1);
    assert_eq!(state(&s, "r1"), StateKind::PrefillDone);
    check(&mut s);
}

#[test]
fn second_plan_transitions_to_decoding() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").kind, RowKind::Decode);
    let st = s.stats();
    assert_eq!((st.decoding, st.prefilling), (1, 0));
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    check(&mut s);
}

#[test]
fn full_lifecycle_submit_through_finish() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[6]), finish("r1")]);
    assert_eq!(s.stats().decoding, 0);
    // L2 is on: the finished prefix is written back first.
    assert_eq!(state(&s, "r1"), StateKind::Draining);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    let plan = s.next_plan();
    assert!(plan.is_empty());
    assert_eq!(s.request_state(&rid("r1")), None);
    let st = s.stats();
    assert_eq!((st.decoding, st.waiting, st.prefilling), (0, 0, 0));
    // Every device page is free again: the written-back prefix was demoted to host.
    assert_eq!(st.available_device_pages, 31);
    assert!(s.is_idle());
    check(&mut s);
}

#[test]
fn empty_plan_no_requests() {
    let mut s = sched(fixture());
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    assert_eq!(plan.forward.num_prefill_rows, 0);
    assert!(plan.is_empty());
    check(&mut s);
}

#[test]
fn multiple_submits_all_get_scheduled() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    assert_eq!(s.stats().prefilling, 2);
    check(&mut s);
}

#[test]
fn token_size_grows_with_decode_output() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    assert_eq!(s.request_tokens(&rid("r1")), Some(4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    assert_eq!(s.request_tokens(&rid("r1")), Some(5));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[6])]);
    assert_eq!(s.request_tokens(&rid("r1")), Some(6));
    check(&mut s);
}

#[test]
fn get_request_token_size_unknown_request() {
    let s = sched(fixture());
    assert_eq!(s.request_tokens(&rid("nope")), None);
    assert_eq!(s.request_state(&rid("nope")), None);
    assert_eq!(s.occupied_pages(&rid("nope")), None);
}

#[test]
fn available_kv_pages_decreases_after_prefill() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let before = free_device(&mut s);
    assert_eq!(before, 31);
    s.next_plan();
    assert_eq!(free_device(&mut s), before - 3);
    assert_eq!(s.occupied_pages(&rid("r1")), Some(vec![31, 30, 29]));
    check(&mut s);
}

/// Scheduler-level half of `test_kv_cache_events.cpp`
/// `DrainKvEventsReturnsAndClearsSchedulerEvents`: a finish publishing one page yields
/// one device `BlockStored` with the page's tokens; a second drain is empty.
#[test]
fn drain_kv_events_returns_and_clears_scheduler_events() {
    use kvtier_types::{KvEvent, Medium, SchedulerConfig};
    let mut s = sched(SchedulerConfig {
        enable_kv_cache_events: true,
        disable_l2_cache: true,
        host_pages: 0,
        ..fixture()
    });
    submit(&mut s, "r1", vec![1, 2, 3]);
    s.next_plan();
    assert!(s.drain_kv_events().is_empty());
    advance(&mut s, vec![extend("r1", &[4]), finish("r1")]);
    let events = s.drain_kv_events();
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
        } => {
            assert_eq!(block_hashes.len(), 1);
            assert_eq!(*parent_block_hash, None);
            assert_eq!(token_ids, &[1, 2]);
            assert_eq!(*block_size, 2);
            assert_eq!(*medium, Medium::Device);
        }
        other => panic!("{other:?}"),
    }
    assert!(s.drain_kv_events().is_empty());
}

// ----- our deliberate submit-time differences (C++ P11 and missing validation) -----

/// C++ silently drops a spec whose id already exists (P11); we refuse it and keep the
/// first request untouched.
#[test]
fn duplicate_request_id_is_refused() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let err = single_error(s.submit(vec![RequestSpec::new("r1", tokens(50, 6))]));
    assert_eq!(err, SchedError::DuplicateRequest(rid("r1")));
    assert_eq!(s.request_tokens(&rid("r1")), Some(4));
    assert_eq!(s.stats().waiting, 1);
}

/// The C++ keeps even a Finished-but-not-erased request in the map; so do we, and a
/// resubmission before the next plan is refused. After the plan erases it the id is
/// free again.
#[test]
fn duplicate_of_finished_request_refused_until_erased() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    let err = single_error(s.submit(vec![RequestSpec::new("r1", tokens(1, 4))]));
    assert_eq!(err, SchedError::DuplicateRequest(rid("r1")));
    s.next_plan();
    assert_eq!(s.request_state(&rid("r1")), None);
    submit(&mut s, "r1", tokens(1, 4));
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
}

/// A batch is applied item by item: valid specs are queued, invalid ones reported with
/// their index.
#[test]
fn invalid_specs_are_refused_individually() {
    let mut s = sched(fixture());
    let err = s
        .submit(vec![
            RequestSpec::new("ok1", tokens(1, 4)),
            RequestSpec::new("empty", vec![]),
            RequestSpec::new("neg", vec![1, -3, 2]),
            // 31 usable pages of 2 tokens: 62 prompt tokens + d = 63 slots = 32 pages.
            RequestSpec::new("long", tokens(1, 62)),
            RequestSpec::new("ok2", tokens(1, 61)),
            RequestSpec::new("ok1", tokens(9, 3)),
        ])
        .expect_err("some specs are refused");
    let refused: Vec<(usize, SchedError)> = err
        .rejected
        .iter()
        .map(|r| (r.index, r.error.clone()))
        .collect();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert_eq!(refused[0], (1, SchedError::EmptyPrompt(rid("empty"))));
    assert_eq!(
        refused[1],
        (
            2,
            SchedError::InvalidToken {
                id: rid("neg"),
                token: -3
            }
        )
    );
    assert_eq!(refused[2].0, 3);
    assert!(
        matches!(&refused[2].1, SchedError::PromptTooLong { id, pages: 32, usable: 31, .. } if id.as_str() == "long"),
        "{:?}",
        refused[2].1
    );
    assert_eq!(refused[3], (5, SchedError::DuplicateRequest(rid("ok1"))));
    assert_eq!(s.request_ids(), [rid("ok1"), rid("ok2")]);
    assert_eq!(s.request_tokens(&rid("ok1")), Some(4));
}

/// Page size, pools, budget and batch size must be positive; with L2 on the host pool
/// needs at least 2 pages.
#[test]
fn invalid_config_is_refused() {
    use kvtier_types::SchedulerConfig;
    let bad = [
        SchedulerConfig {
            page_size: 0,
            ..fixture()
        },
        SchedulerConfig {
            device_pages: 1,
            ..fixture()
        },
        SchedulerConfig {
            max_scheduled_tokens: 0,
            ..fixture()
        },
        SchedulerConfig {
            max_batch_size: 0,
            ..fixture()
        },
        SchedulerConfig {
            host_pages: 0,
            ..fixture()
        },
    ];
    for config in bad {
        let err = kvtier_fsm::Scheduler::new(config.clone()).expect_err("refused");
        assert!(matches!(err, SchedError::Config(_)), "{config:?}: {err:?}");
    }
    // The C++ "host 0" fixtures map to disable_l2_cache.
    let ok = SchedulerConfig {
        host_pages: 0,
        disable_l2_cache: true,
        ..fixture()
    };
    assert!(kvtier_fsm::Scheduler::new(ok).is_ok());
}
