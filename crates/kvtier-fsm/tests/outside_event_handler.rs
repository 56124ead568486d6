//! Port of `tests/cpp/test_outside_event_handler.cpp` (ps 2, d 0, device 5), plus the
//! event dispatch rules of fsm-scheduler.md §4 with our differences: unknown ids are
//! refused, invalid transitions are errors that change nothing, and the L3 and
//! disaggregation events are `SchedError::Unsupported` for now.

mod common;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::{EngineEvent, RowKind, SchedulerConfig};

/// [1..4] finished, written back and demoted: host-only prefix of 2 pages.
fn with_host_prefix() -> Scheduler {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 5,
        ..fixture()
    });
    submit(&mut s, "r0", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[5]), finish("r0")]);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(s.stats().cached_device_pages, 0);
    s
}

/// The host hit of 1 page shows in the forward row: input 2, prefix 2. (There is no
/// load-back acknowledgement event: the copy is ordered before the forward.)
#[test]
fn load_back_prefix_len_changes_in_forward() {
    let mut s = with_host_prefix();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!((r.input_length, r.extend_prefix_len), (2, 2));
    assert_eq!(plan.load_back_pages(), 1);
    check(&mut s);
}

#[test]
fn load_back_subsequent_plan_proceeds() {
    let mut s = with_host_prefix();
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let table = plan.forward.page_table_of(row_of(&plan, "r1")).to_vec();
    advance(&mut s, vec![extend("r1", &[77])]);
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Decode);
    assert!(plan.load_backs.is_empty());
    assert_eq!(
        &plan.forward.page_table_of(r)[..table.len()],
        table.as_slice()
    );
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    check(&mut s);
}

/// Events apply strictly in order: a Finish followed by an ExtendResult in the same
/// batch refuses the ExtendResult (Draining takes none) and keeps the token count.
#[test]
fn events_apply_in_order() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    let err = s
        .advance(vec![extend("r1", &[5]), finish("r1"), extend("r1", &[6])])
        .expect_err("the late ExtendResult is refused");
    assert_eq!(err.rejected.len(), 1);
    assert_eq!(err.rejected[0].index, 2);
    assert!(matches!(
        err.rejected[0].error,
        SchedError::InvalidTransition {
            event: "ExtendResult",
            state: StateKind::Draining,
            ..
        }
    ));
    assert_eq!(s.request_tokens(&rid("r1")), Some(5));
    // With the L2 cache off, Finish goes straight to Finished and a late result is stale.
    let mut s = sched(SchedulerConfig {
        disable_l2_cache: true,
        host_pages: 0,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(
        &mut s,
        vec![extend("r1", &[5]), finish("r1"), extend("r1", &[6])],
    );
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(s.request_tokens(&rid("r1")), Some(5));
}

#[test]
fn forward_events_for_unknown_ids_are_refused() {
    let mut s = sched(fixture());
    for event in [
        extend("ghost", &[1]),
        finish("ghost"),
        abort("ghost"),
        reserve("ghost", 1),
    ] {
        let name = event.name();
        let err = single_error(s.advance(vec![event]));
        assert_eq!(err, SchedError::UnknownRequest(rid("ghost")), "{name}");
    }
    assert_eq!(s.stats().stale_events, 0);
}

/// Invalid transitions of the §3 "illegal" list that our API can reach; each is refused
/// and leaves the state unchanged.
#[test]
fn invalid_transitions_are_refused_without_change() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 4,
        ..fixture()
    });
    submit(&mut s, "sub", tokens(1, 4));
    submit(&mut s, "pre", tokens(100, 10));
    s.next_plan(); // "pre" admitted first (smaller id), Prefilling
    assert_eq!(state(&s, "pre"), StateKind::Prefilling);
    assert_eq!(state(&s, "sub"), StateKind::Submitted);
    let cases = [
        (finish("sub"), "Finish", StateKind::Submitted),
        (extend("sub", &[9]), "ExtendResult", StateKind::Submitted),
        (reserve("sub", 1), "UpdateReserve", StateKind::Submitted),
        (finish("pre"), "Finish", StateKind::Prefilling),
        (extend("pre", &[9]), "ExtendResult", StateKind::Prefilling),
        (reserve("pre", 1), "UpdateReserve", StateKind::Prefilling),
    ];
    for (event, name, kind) in cases {
        let id = event.request_id().expect("names a request").clone();
        let tokens_before = s.request_tokens(&id);
        let err = single_error(s.advance(vec![event]));
        match &err {
            SchedError::InvalidTransition { event, state, .. } => {
                assert_eq!((*event, *state), (name, kind));
            }
            other => panic!("{name}: {other:?}"),
        }
        assert!(err.to_string().contains("FSM transition invalid"));
        assert_eq!(s.request_state(&id), Some(kind));
        assert_eq!(s.request_tokens(&id), tokens_before);
    }
    // PrefillDone takes no UpdateReserve either.
    s.next_plan();
    s.next_plan();
    assert_eq!(state(&s, "pre"), StateKind::PrefillDone);
    let err = single_error(s.advance(vec![reserve("pre", 1)]));
    assert!(matches!(
        err,
        SchedError::InvalidTransition {
            state: StateKind::PrefillDone,
            ..
        }
    ));
    check(&mut s);
}

/// ExtendResult is accepted in Retracting and Retracted (overlap results); UpdateReserve
/// is ignored there.
#[test]
fn retracted_requests_accept_late_results() {
    let mut s = sched(d0_device3());
    let plan = retract_r1(&mut s);
    assert_eq!(state(&s, "r1"), StateKind::Retracting);
    advance(&mut s, vec![extend("r1", &[7]), reserve("r1", 9)]);
    assert_eq!(s.request_tokens(&rid("r1")), Some(7));
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(state(&s, "r1"), StateKind::Retracted);
    advance(&mut s, vec![extend("r1", &[8]), reserve("r1", 9)]);
    assert_eq!(s.request_tokens(&rid("r1")), Some(8));
    let plan = s.next_plan();
    let r = row_of(&plan, "r1");
    assert_eq!(r.kind, RowKind::Recovery);
    assert_eq!(r.decode_input_id, 8);
    assert_eq!(r.hist_token_len, 7);
    check(&mut s);
}

/// L3 acknowledgements for ops never issued are refused (the prefetch and backup paths
/// are tested in `l3_prefetch.rs`), and change nothing.
#[test]
fn stray_l3_events_are_refused() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let err = single_error(s.advance(vec![EngineEvent::PrefetchDone {
        op_id: 1,
        request_id: rid("r1"),
        success: true,
        completed_pages: 1,
    }]));
    assert_eq!(err, SchedError::UnknownOp(1));
    let err = single_error(s.advance(vec![EngineEvent::BackupDone {
        op_id: 1,
        success: true,
    }]));
    assert_eq!(err, SchedError::UnknownOp(1));
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
}

/// Disaggregation events (deferred to the PD issue) are refused as unsupported, for
/// known and unknown ids alike (the C++ throws `IndexError` for unknown ids, P10).
#[test]
fn pd_events_are_unsupported() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    for id in ["r1", "ghost"] {
        for event in [
            EngineEvent::Bootstrapped {
                request_id: rid(id),
            },
            EngineEvent::RemotePrefillDone {
                request_id: rid(id),
                token: 7,
            },
        ] {
            let err = single_error(s.advance(vec![event]));
            assert!(matches!(err, SchedError::Unsupported(_)), "{err:?}");
        }
    }
    assert_eq!(state(&s, "r1"), StateKind::PrefillDone);
    assert_eq!(s.request_tokens(&rid("r1")), Some(4));
    // Roles P and D are refused at construction.
    for role in [kvtier_types::Role::Prefill, kvtier_types::Role::Decode] {
        assert!(kvtier_fsm::Scheduler::new(SchedulerConfig { role, ..fixture() }).is_err());
    }
}

/// Negative tokens in a result are refused (the engine strips placeholders).
#[test]
fn negative_result_tokens_are_refused() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    let err = single_error(s.advance(vec![extend("r1", &[5, -1])]));
    assert_eq!(
        err,
        SchedError::InvalidToken {
            id: rid("r1"),
            token: -1
        }
    );
    assert_eq!(s.request_tokens(&rid("r1")), Some(4));
}
