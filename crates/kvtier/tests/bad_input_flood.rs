//! Bad input through the API gets the core's typed errors, changes nothing, and leaves
//! the system healthy: a flood of malformed calls, then a normal workload to the end.

mod common;

use common::*;
use kvtier::{KvError, System};
use kvtier_fsm::SchedError;
use kvtier_types::{EngineEvent, RequestSpec, SchedulerConfig};

fn refused(result: Result<(), KvError>) -> Vec<(usize, SchedError)> {
    match result {
        Err(KvError::Batch(batch)) => batch
            .rejected
            .into_iter()
            .map(|r| (r.index, r.error))
            .collect(),
        other => panic!("expected refused items, got {other:?}"),
    }
}

#[test]
fn an_invalid_config_is_a_typed_error() {
    let config = SchedulerConfig {
        page_size: 0,
        ..config()
    };
    for runtime in RUNTIMES {
        let started = System::builder(config.clone()).runtime(runtime).start();
        assert!(
            matches!(started, Err(KvError::Sched(SchedError::Config(_)))),
            "{runtime:?}: {started:?}"
        );
    }
}

#[test]
fn a_flood_of_bad_input_leaves_the_system_healthy() {
    for runtime in RUNTIMES {
        let handle = start(runtime);
        let long: Vec<i32> = (0..10_000).collect();
        for round in 0..20 {
            let ok = RequestSpec::new(format!("ok{round}"), vec![1, 2, 3]);
            let mut bad_hits = RequestSpec::new(format!("hits{round}"), vec![1, 2, 3, 4, 5]);
            bad_hits.storage_hit_pages = 9;
            let rejected = refused(handle.submit(vec![
                RequestSpec::new(format!("empty{round}"), Vec::new()),
                ok.clone(),
                ok,
                RequestSpec::new(format!("neg{round}"), vec![1, -5, 3]),
                RequestSpec::new(format!("long{round}"), long.clone()),
                bad_hits,
            ]));
            let kinds: Vec<(usize, &str)> = rejected
                .iter()
                .map(|(i, e)| {
                    let kind = match e {
                        SchedError::EmptyPrompt(_) => "empty",
                        SchedError::DuplicateRequest(_) => "duplicate",
                        SchedError::InvalidToken { .. } => "token",
                        SchedError::PromptTooLong { .. } => "long",
                        SchedError::InvalidStorageInfo { .. } => "storage",
                        _ => "other",
                    };
                    (*i, kind)
                })
                .collect();
            assert_eq!(
                kinds,
                [
                    (0, "empty"),
                    (2, "duplicate"),
                    (3, "token"),
                    (4, "long"),
                    (5, "storage")
                ],
                "{runtime:?} round {round}"
            );
            // A duplicate of a request queued by an earlier call is refused too.
            let again =
                refused(handle.submit(vec![RequestSpec::new(format!("ok{round}"), vec![9])]));
            assert!(matches!(again[..], [(0, SchedError::DuplicateRequest(_))]));

            let rejected = refused(handle.advance(vec![
                EngineEvent::Finish {
                    request_id: "ghost".into(),
                },
                EngineEvent::WriteBackDone {
                    op_id: 9_999_999,
                    success: true,
                },
                EngineEvent::ExtendResult {
                    request_id: format!("ok{round}").into(),
                    tokens: vec![4],
                },
                EngineEvent::ExtendResult {
                    request_id: "ghost".into(),
                    tokens: vec![-1],
                },
                EngineEvent::PrefetchDone {
                    op_id: 9_999_998,
                    request_id: format!("ok{round}").into(),
                    success: true,
                    completed_pages: 99,
                },
                EngineEvent::Bootstrapped {
                    request_id: format!("ok{round}").into(),
                },
            ]));
            let kinds: Vec<(usize, bool)> = rejected
                .iter()
                .map(|(i, e)| {
                    let expected = match i {
                        0 => matches!(e, SchedError::UnknownRequest(_)),
                        1 => matches!(e, SchedError::UnknownOp(_)),
                        2 => matches!(
                            e,
                            SchedError::InvalidTransition {
                                event: "ExtendResult",
                                ..
                            }
                        ),
                        3 => matches!(e, SchedError::InvalidToken { .. }),
                        4 => matches!(e, SchedError::UnknownOp(_)),
                        5 => matches!(e, SchedError::Unsupported(_)),
                        _ => false,
                    };
                    (*i, expected)
                })
                .collect();
            assert_eq!(
                kinds,
                (0..6).map(|i| (i, true)).collect::<Vec<_>>(),
                "{runtime:?} round {round}: {rejected:?}"
            );
            assert!(matches!(
                handle.abort("ghost".into()),
                Err(KvError::Sched(SchedError::UnknownRequest(_)))
            ));
            // The valid request of each round is aborted again: the flood leaves nothing.
            handle
                .abort(format!("ok{round}").into())
                .expect("a queued request aborts");
        }
        let stats = handle.stats().expect("stats").scheduler;
        assert_eq!(
            stats.waiting, 0,
            "{runtime:?}: refused specs queued nothing"
        );

        // A normal workload still runs to completion.
        handle.submit(requests(6)).expect("valid requests");
        let mut engine = Engine::new(6);
        run(&handle, &mut engine, 300);
        assert_eq!(engine.finished.len(), 6, "{runtime:?}");
        let report = handle.shutdown().expect("shutdown");
        assert!(report.is_clean(), "{runtime:?}: {report:?}");
    }
}
