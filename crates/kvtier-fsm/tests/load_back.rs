//! Port of `tests/cpp/test_load_back.cpp` (ps 2, d 0, device 5, host 32). Setup: a
//! request with prompt [1..4] finishes and is written back; on the acknowledgement its
//! device copy is demoted, so the prefix lives on host only. (The C++ setup also runs
//! a 3-page filler to push the copy off device; our demote already does, and with the
//! filler holding 3 of the 4 usable pages the probe request would not fit.)

mod common;

use common::*;
use kvtier_fsm::{Scheduler, StateKind};
use kvtier_types::{RowKind, SchedulerConfig, TransferKind};

fn setup() -> Scheduler {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 5,
        host_pages: 32,
        ..fixture()
    });
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), finish("r0")]);
    let plan = s.next_plan();
    assert_eq!(plan.write_back_pages(), 2);
    ack_write_backs(&mut s, &plan, true);
    let st = s.stats();
    assert_eq!((st.cached_device_pages, st.cached_host_pages), (0, 2));
    assert_eq!(st.available_device_pages, 4);
    s
}

#[test]
fn load_back_generated_on_host_cache_hit() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(plan.load_backs.len(), 1);
    assert!(plan.load_backs[0].op_id > 0);
    assert_eq!(row_of(&plan, "r1").kind, RowKind::Prefill);
    check(&mut s);
}

#[test]
fn load_back_pages_are_non_empty() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let pairs = &plan.load_backs[0].pairs;
    assert!(!pairs.is_empty());
    for p in pairs {
        assert_eq!(p.kind, TransferKind::Kv);
        assert!((1..32).contains(&p.src), "host page {}", p.src);
        assert!((1..5).contains(&p.dst), "device page {}", p.dst);
    }
    // The loaded page is the first entry of the row's page table.
    let r = row_of(&plan, "r1");
    assert_eq!(plan.forward.page_table_of(r)[0], pairs[0].dst);
    check(&mut s);
}

/// Only the page before the last prompt token is matchable: 1 page (2 tokens) comes
/// from host, 2 tokens are computed.
#[test]
fn load_back_prefill_input_length_reduced() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.input_length, 2);
    assert_eq!(r.extend_prefix_len, 2);
    assert_eq!(plan.forward.input_ids_of(r), [3, 4]);
    assert_eq!(plan.load_back_pages(), 1);
    check(&mut s);
}

/// Two identical prompts admitted in one plan: the first admission attaches device
/// pages to the host-only node, the second sees a device hit. One pair in total.
#[test]
fn load_back_duplicate_pages_deduped() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    assert_eq!(plan.load_back_pages(), 1);
    let dst = plan.load_backs[0].pairs[0].dst;
    for id in ["r1", "r2"] {
        let r = row_of(&plan, id);
        assert_eq!(r.extend_prefix_len, 2);
        assert_eq!(plan.forward.page_table_of(r)[0], dst);
    }
    check(&mut s);
}

/// A longer prompt hits both written-back pages.
#[test]
fn load_back_whole_written_back_prefix() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 6));
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!((r.extend_prefix_len, r.input_length), (4, 2));
    assert_eq!(plan.load_back_pages(), 2);
    let dst: Vec<u32> = plan.load_backs[0].pairs.iter().map(|p| p.dst).collect();
    assert_eq!(&plan.forward.page_table_of(r)[..2], dst.as_slice());
    check(&mut s);
}

/// Admission counts the load-back pages: a host hit that cannot get device pages for
/// the load-back and the chunk is not admitted, and nothing is attached.
#[test]
fn load_back_needs_device_pages_for_the_copy() {
    let mut s = setup();
    submit(&mut s, "big", tokens(100, 6)); // 3 of the 4 usable pages
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["big"]);
    submit(&mut s, "r1", tokens(1, 6)); // needs 2 load-back pages + 1 page
    let plan = s.next_plan();
    assert!(row(&plan, "r1").is_none());
    assert!(plan.load_backs.is_empty());
    // Only "big" runs (its first decode publishes its 3 prompt pages); no device page
    // was attached to the host-only prefix.
    assert_eq!(row_ids(&plan), ["big"]);
    let st = s.stats();
    assert_eq!((st.cached_device_pages, st.cached_host_pages), (3, 2));
    assert_eq!(free_device(&mut s), 1);
    check(&mut s);
}

// ----- failed load-backs (issue 17) ---------------------------------------------------

fn load_back_failed(op_id: kvtier_types::OpId) -> kvtier_types::EngineEvent {
    kvtier_types::EngineEvent::LoadBackFailed { op_id }
}

/// A failed load-back makes every row that read its pages void: both requests that
/// share the loaded page (one loaded it, the other matched it in the same plan) are
/// waiting again with their prompts, their results of that plan are ignored, and the
/// cache took the failed device copy back (host copy only). The next plan loads it
/// back again, onto pages that are then really copied.
#[test]
fn a_failed_load_back_requeues_every_reader_and_leaves_the_host_copy() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(1, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    let op = plan.load_backs[0].op_id;
    // The engine reports the failure after the rows' results: it is applied first.
    advance(
        &mut s,
        vec![extend("r1", &[9]), extend("r2", &[9]), load_back_failed(op)],
    );
    for id in ["r1", "r2"] {
        assert_eq!(state(&s, id), StateKind::Submitted, "{id}");
        assert_eq!(s.request_tokens(&rid(id)), Some(4), "{id}: void result");
    }
    let st = s.stats();
    assert_eq!((st.failed_load_backs, st.load_back_requeues), (1, 2));
    assert_eq!(st.stale_events, 2, "the two void results");
    check(&mut s);
    let plan = s.next_plan();
    let st = s.stats();
    assert_eq!(st.cached_host_pages, 2, "the host copy stays");
    assert_eq!(plan.load_back_pages(), 1, "loaded back again");
    assert_eq!(row_ids(&plan), ["r1", "r2"]);
    assert_eq!(row_of(&plan, "r1").extend_prefix_len, 2);
    check(&mut s);
}

/// A failure reported twice counts once; one for an op of an earlier plan is refused
/// (that plan's successor may have read the pages), one for an op never issued too.
#[test]
fn load_back_failures_must_name_an_op_of_the_last_plan() {
    let mut s = setup();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let op = plan.load_backs[0].op_id;
    advance(&mut s, vec![load_back_failed(op), load_back_failed(op)]);
    assert_eq!(s.stats().failed_load_backs, 1);
    let _ = s.next_plan();
    let error = single_error(s.advance(vec![load_back_failed(op)]));
    assert_eq!(error, kvtier_fsm::SchedError::LateLoadBackFailure(op));
    let error = single_error(s.advance(vec![load_back_failed(10_000)]));
    assert_eq!(error, kvtier_fsm::SchedError::UnknownOp(10_000));
    check(&mut s);
}

/// A retracted request resuming from host whose load-back fails must compute its whole
/// history again; where that history cannot fit the device pool (d 0, device 3: the
/// sequence of `retract.rs::retract_retracted_request_recovers_to_decoding`), the
/// scheduler gives up on it and says so with the next plan, instead of queueing a
/// request that can never run.
#[test]
fn a_recovery_whose_load_back_fails_and_cannot_recompute_is_aborted() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    ack_write_backs(&mut s, &plan, true);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").kind, RowKind::Recovery);
    let op = plan.load_backs[0].op_id;
    advance(&mut s, vec![load_back_failed(op), extend("r1", &[7])]);
    let plan = s.next_plan();
    assert_eq!(
        plan.aborted,
        [kvtier_types::AbortNotice {
            request_id: rid("r1"),
            reason: kvtier_types::AbortReason::ExceedsDevicePool,
        }]
    );
    assert!(plan.forward.is_empty());
    let st = s.stats();
    assert_eq!((st.scheduler_aborts, st.cached_host_pages), (1, 2));
    assert_eq!(free_device(&mut s), 2, "nothing held on device");
    check(&mut s);
}
