//! Port of `tests/cpp/test_abort.cpp`, with our deliberate differences:
//! * an unknown id is refused (`SchedError::UnknownRequest`) instead of ignored, except
//!   ids of requests finished within the last 2 plans, whose stale events are ignored
//!   and counted in `stats().stale_events`;
//! * an invalid transition is a `SchedError::InvalidTransition` (message contains
//!   "FSM transition invalid") and leaves the state unchanged;
//! * abort from Draining rolls back the host pages attached for the write-back (P7);
//! * abort from WritingBack is accepted (the C++ throws); the copy keeps its own locks.

mod common;

use common::*;
use kvtier_fsm::{SchedError, StateKind};
use kvtier_types::{RowKind, SchedulerConfig, Tier};

/// r1 decoding with 6 tokens (prompt 1..4, generated 5, 6).
fn decoding_r1(s: &mut kvtier_fsm::Scheduler) {
    submit(s, "r1", tokens(1, 4));
    s.next_plan();
    advance(s, vec![extend("r1", &[5])]);
    s.next_plan();
    advance(s, vec![extend("r1", &[6])]);
    assert_eq!(state(s, "r1"), StateKind::Decoding);
}

#[test]
fn abort_from_submitted() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.abort(&rid("r1")).expect("abort accepted");
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(s.stats().waiting, 0);
    let plan = s.next_plan();
    assert!(plan.is_empty());
    assert_eq!(s.request_state(&rid("r1")), None);
    assert_eq!(free_device(&mut s), 31);
    check(&mut s);
}

#[test]
fn abort_from_decoding() {
    let mut s = sched(fixture());
    decoding_r1(&mut s);
    advance(&mut s, vec![abort("r1")]);
    // Counted out immediately, not at the next plan.
    assert_eq!(s.stats().decoding, 0);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    // Request-local pages are freed; the prompt pages published mid-flight stay as
    // unlocked cache.
    let st = s.stats();
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(st.available_device_pages, 31 - 2);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    // No write-back for an aborted request.
    let plan = s.next_plan();
    assert!(plan.is_empty(), "{plan:?}");
    check(&mut s);
}

#[test]
fn abort_from_prefilling_frees_chunk_pages() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 4,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 12));
    s.next_plan();
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Prefilling);
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(s.stats().prefilling, 0);
    // Chunk 1's two pages were published when chunk 2 was scheduled; they stay cached.
    let st = s.stats();
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(st.available_device_pages, 29);
    check(&mut s);
}

/// The C++ ignores an abort for an unknown id; we refuse it.
#[test]
fn abort_unknown_request_is_refused() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    assert_eq!(
        s.abort(&rid("ghost")),
        Err(SchedError::UnknownRequest(rid("ghost")))
    );
    let err = single_error(s.advance(vec![abort("ghost")]));
    assert_eq!(err, SchedError::UnknownRequest(rid("ghost")));
    // Nothing else changed.
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
    assert_eq!(s.stats().stale_events, 0);
}

#[test]
fn abort_does_not_affect_other_requests() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(100, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5]), extend("r2", &[104])]);
    let pages_r2 = s.occupied_pages(&rid("r2"));
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r2"), StateKind::PrefillDone);
    assert_eq!(s.occupied_pages(&rid("r2")), pages_r2);
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r2"]);
    assert_eq!(row_of(&plan, "r2").kind, RowKind::Decode);
    check(&mut s);
}

/// Overlap scheduling delivers results one step late: results for a request aborted
/// in between are dropped, not errors (before and after the next plan erases it).
#[test]
fn forward_events_after_abort_are_dropped_not_refused() {
    let mut s = sched(fixture());
    decoding_r1(&mut s);
    advance(&mut s, vec![abort("r1")]);
    let late = || {
        vec![
            extend("r1", &[7]),
            reserve("r1", 3),
            finish("r1"),
            abort("r1"),
        ]
    };
    // Still in the table as Finished.
    advance(&mut s, late());
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(s.request_tokens(&rid("r1")), Some(6));
    // Erased by the next plan, still recognised as recently finished: every late
    // event is ignored and counted.
    let plan = s.next_plan();
    assert!(plan.is_empty());
    assert_eq!(s.request_state(&rid("r1")), None);
    let before = s.stats().stale_events;
    advance(&mut s, late());
    assert_eq!(s.stats().stale_events, before + 4);
    assert_eq!(s.request_state(&rid("r1")), None);
    check(&mut s);
}

/// `stats().stale_events` counts "events for recently finished requests ..., ignored".
/// Before the next plan erases an aborted request, all four kinds of late forward
/// event are ignored, so all four should be counted (as they are after erasure).
#[test]
fn stale_events_counted_for_every_event_kind_before_erasure() {
    let mut s = sched(fixture());
    decoding_r1(&mut s);
    advance(&mut s, vec![abort("r1")]);
    advance(
        &mut s,
        vec![
            extend("r1", &[7]),
            reserve("r1", 3),
            finish("r1"),
            abort("r1"),
        ],
    );
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(s.stats().stale_events, 4);
}

/// Stale ids are remembered for 2 plans after the one that erased them; then they are
/// unknown again.
#[test]
fn stale_ids_expire_after_two_plans() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    advance(&mut s, vec![abort("r1")]);
    s.next_plan(); // erases r1
    advance(&mut s, vec![extend("r1", &[1])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[1])]);
    assert_eq!(s.stats().stale_events, 2);
    s.next_plan();
    let err = single_error(s.advance(vec![extend("r1", &[1])]));
    assert_eq!(err, SchedError::UnknownRequest(rid("r1")));
    assert_eq!(s.stats().stale_events, 2);
}

#[test]
fn invalid_forward_event_before_terminal_still_refused() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let err = single_error(s.advance(vec![reserve("r1", 4)]));
    assert!(
        matches!(
            &err,
            SchedError::InvalidTransition { id, event: "UpdateReserve", state: StateKind::Submitted }
                if id.as_str() == "r1"
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("FSM transition invalid"), "{err}");
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
    assert_eq!(s.stats().stale_events, 0);
    // The request is unaffected and still schedules.
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
}

/// A refused event does not stop the rest of the batch.
#[test]
fn refused_event_does_not_block_the_rest_of_the_batch() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    submit(&mut s, "r2", tokens(100, 4));
    s.next_plan();
    let err = s
        .advance(vec![
            extend("ghost", &[1]),
            extend("r1", &[5]),
            reserve("r2", 2), // PrefillDone: invalid
            extend("r2", &[104]),
        ])
        .expect_err("two events refused");
    let indices: Vec<usize> = err.rejected.iter().map(|r| r.index).collect();
    assert_eq!(indices, [0, 2]);
    assert_eq!(s.request_tokens(&rid("r1")), Some(5));
    assert_eq!(s.request_tokens(&rid("r2")), Some(5));
}

/// P7 fixed: abort from Draining rolls back the host pages attached for the write-back
/// that was never issued.
#[test]
fn abort_from_draining_rolls_back_host_pages() {
    let mut s = sched(fixture());
    decoding_r1(&mut s);
    advance(&mut s, vec![finish("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Draining);
    // 6 tokens: 2 full pages except the last token are published and get host pages.
    assert_eq!(free_host(&mut s), 31 - 2);
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(free_host(&mut s), 31);
    let plan = s.next_plan();
    assert!(plan.write_backs.is_empty());
    // The device copy stays cached, unlocked.
    let st = s.stats();
    assert_eq!(st.cached_device_pages, 2);
    assert_eq!(st.cached_host_pages, 0);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
}

/// The C++ throws on Abort in WritingBack; we accept it. The copy in flight keeps its
/// locks until acknowledged, and the late acknowledgement is fine.
#[test]
fn abort_from_writing_back_is_accepted() {
    let mut s = sched(fixture());
    decoding_r1(&mut s);
    advance(&mut s, vec![finish("r1")]);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1);
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    // Source and destination pages stay pinned while the copy is in flight.
    assert_eq!(locked_pages(&mut s, Tier::Device), 2);
    assert_eq!(locked_pages(&mut s, Tier::Host), 2);
    s.next_plan(); // erases r1
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    // Written back and demoted like a normal finish.
    let st = s.stats();
    assert_eq!((st.cached_device_pages, st.cached_host_pages), (0, 2));
    assert_eq!(st.available_device_pages, 31);
    assert!(s.is_idle());
    check(&mut s);
}
