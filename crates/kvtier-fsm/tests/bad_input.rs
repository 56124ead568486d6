//! Bad input gets a typed error with a clear message and leaves the scheduler intact.

mod common;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::{EngineEvent, RequestSpec, SchedulerConfig, TypesError};

#[test]
fn invalid_configs_are_refused_with_the_field_named() {
    let cases = [
        (
            SchedulerConfig {
                page_size: 0,
                ..fixture()
            },
            "page_size",
        ),
        (
            SchedulerConfig {
                device_pages: 0,
                ..fixture()
            },
            "device_pages",
        ),
        (
            SchedulerConfig {
                max_batch_size: 0,
                ..fixture()
            },
            "max_batch_size",
        ),
        (
            SchedulerConfig {
                max_scheduled_tokens: 0,
                ..fixture()
            },
            "max_scheduled_tokens",
        ),
        (
            SchedulerConfig {
                host_pages: 0,
                ..fixture()
            },
            "host_pages",
        ),
    ];
    for (config, field) in cases {
        let err = Scheduler::new(config).unwrap_err();
        assert!(
            matches!(&err, SchedError::Config(TypesError::InvalidConfig { field: f, .. }) if *f == field),
            "{field}: {err}"
        );
        assert!(err.to_string().contains(field));
    }
}

#[test]
fn bad_specs_are_refused_one_by_one() {
    let mut s = sched(fixture());
    let err = s
        .submit(vec![
            RequestSpec::new("ok1", tokens(1, 4)),
            RequestSpec::new("empty", vec![]),
            RequestSpec::new("negative", vec![1, -5, 2]),
            RequestSpec::new("huge", tokens(1, 200)),
            RequestSpec {
                storage_hit_pages: 9,
                ..RequestSpec::new("l3", tokens(1, 4))
            },
            RequestSpec::new("ok2", tokens(1, 4)),
        ])
        .unwrap_err();
    let kinds: Vec<(usize, String)> = err
        .rejected
        .iter()
        .map(|r| (r.index, format!("{:?}", r.error)))
        .collect();
    assert_eq!(kinds.len(), 4, "{kinds:?}");
    assert!(matches!(err.rejected[0].error, SchedError::EmptyPrompt(_)));
    assert!(matches!(
        err.rejected[1].error,
        SchedError::InvalidToken { token: -5, .. }
    ));
    assert!(
        matches!(
            err.rejected[2].error,
            SchedError::PromptTooLong {
                tokens: 200,
                usable: 31,
                ..
            }
        ),
        "{}",
        err.rejected[2].error
    );
    assert!(matches!(
        err.rejected[3].error,
        SchedError::InvalidStorageInfo { .. }
    ));
    assert!(err.to_string().contains("4 of the batch refused"), "{err}");
    assert_eq!(s.request_ids(), vec![rid("ok1"), rid("ok2")]);
}

#[test]
fn unknown_ids_and_ops_are_typed_errors() {
    let mut s = sched(fixture());
    for event in [
        extend("ghost", &[1]),
        finish("ghost"),
        abort("ghost"),
        reserve("ghost", 1),
    ] {
        let err = single_error(s.advance(vec![event]));
        assert_eq!(err, SchedError::UnknownRequest(rid("ghost")));
    }
    assert_eq!(
        single_error(s.advance(vec![wb_done(77, true)])),
        SchedError::UnknownOp(77)
    );
    assert!(s.abort(&rid("ghost")).is_err());
    check(&mut s);
}

#[test]
fn events_in_the_wrong_state_change_nothing() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let before = s.stats();
    for event in [finish("r1"), extend("r1", &[5]), reserve("r1", 2)] {
        let err = single_error(s.advance(vec![event]));
        assert!(
            matches!(
                err,
                SchedError::InvalidTransition {
                    state: StateKind::Submitted,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("FSM transition invalid"));
    }
    assert_eq!(s.stats(), before);
    assert_eq!(state(&s, "r1"), StateKind::Submitted);
    assert_eq!(s.request_tokens(&rid("r1")), Some(4));
}

#[test]
fn valid_events_in_a_batch_apply_around_refused_ones() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let mut engine = Engine::default();
    step(&mut s, &mut engine); // r1 → PrefillDone with its first token
    let result = s.advance(vec![
        finish("ghost"),
        extend("r1", &[9]),
        EngineEvent::ExtendResult {
            request_id: rid("r1"),
            tokens: vec![-3],
        },
    ]);
    let err = result.unwrap_err();
    assert_eq!(
        err.rejected.iter().map(|r| r.index).collect::<Vec<_>>(),
        vec![0, 2]
    );
    assert_eq!(
        s.request_tokens(&rid("r1")),
        Some(6),
        "the valid ExtendResult applied"
    );
}

#[test]
fn unsupported_capabilities_say_so() {
    let mut s = sched(fixture());
    let err = single_error(s.advance(vec![EngineEvent::Bootstrapped {
        request_id: rid("r1"),
    }]));
    assert!(matches!(err, SchedError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("not supported yet"));
}

/// Each refused item's index and reason.
fn reasons_of(refused: &kvtier_fsm::BatchError) -> Vec<(usize, &SchedError)> {
    refused
        .rejected
        .iter()
        .map(|r| (r.index, &r.error))
        .collect()
}

/// A flood of malformed submits and events, then a normal workload runs to completion
/// with exactly the plans of a scheduler that never saw the flood.
#[test]
fn system_stays_healthy_after_a_flood_of_bad_input() {
    let run = |flood: bool| {
        let mut s = sched(SchedulerConfig {
            device_pages: 20,
            ..fixture()
        });
        if flood {
            for i in 0..200 {
                // Every item is refused, each for its own reason.
                let refused = s
                    .submit(vec![
                        RequestSpec::new(format!("bad{i}"), vec![]),
                        RequestSpec::new(format!("neg{i}"), vec![-1]),
                        RequestSpec::new(format!("big{i}"), tokens(1, 100)),
                    ])
                    .expect_err("every spec is bad");
                let reasons = reasons_of(&refused);
                assert!(
                    matches!(
                        reasons[..],
                        [
                            (0, SchedError::EmptyPrompt(_)),
                            (1, SchedError::InvalidToken { .. }),
                            (2, SchedError::PromptTooLong { .. })
                        ]
                    ),
                    "{reasons:?}"
                );
                let refused = s
                    .advance(vec![
                        finish("nobody"),
                        wb_done(1000 + i, false),
                        EngineEvent::PrefetchDone {
                            op_id: i,
                            request_id: rid("nobody"),
                            success: true,
                            completed_pages: 3,
                        },
                    ])
                    .expect_err("every event is bad");
                let reasons = reasons_of(&refused);
                assert!(
                    matches!(
                        reasons[..],
                        [
                            (0, SchedError::UnknownRequest(_)),
                            (1, SchedError::UnknownOp(_)),
                            (2, SchedError::UnknownRequest(_))
                        ]
                    ),
                    "{reasons:?}"
                );
            }
        }
        for i in 0..6 {
            submit(
                &mut s,
                &format!("r{i}"),
                tokens(1 + (i % 2) * 30, 6 + i as usize),
            );
        }
        let mut engine = Engine::with_max_new(4);
        let plans = drain(&mut s, &mut engine, 200);
        check(&mut s);
        assert_eq!(engine.finished.len(), 6);
        plans
    };
    assert_eq!(run(true), run(false));
}
