//! Bad input through the API gets the core's typed errors with the right indices,
//! changes nothing, and leaves the system healthy, on both runtimes.
//!
//! The system gets every call, good and bad; a direct-path scheduler
//! ([`Lockstep::shadow`]) gets only the valid items. Both must keep making the same
//! plans and reporting the same stats: a refused item leaves no trace.

use crate::common::*;
use kvtier::{KvError, Runtime, System};
use kvtier_fsm::{SchedError, StateKind};
use kvtier_types::{EngineEvent, RequestId, RequestSpec, Role, SchedulerConfig, TypesError};

/// The refused items of a call that must have refused some.
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

/// A short name for each kind of refusal, to compare lists of them.
fn kind(e: &SchedError) -> &'static str {
    match e {
        SchedError::Config(_) => "config",
        SchedError::DuplicateRequest(_) => "duplicate",
        SchedError::UnknownRequest(_) => "unknown request",
        SchedError::EmptyPrompt(_) => "empty",
        SchedError::PromptTooLong { .. } => "too long",
        SchedError::InvalidToken { .. } => "token",
        SchedError::InvalidTransition { .. } => "transition",
        SchedError::UnknownOp(_) => "unknown op",
        SchedError::InvalidStorageInfo { .. } => "storage",
        SchedError::Unsupported(_) => "unsupported",
        SchedError::Busy => "busy",
        SchedError::UnexpectedReply => "unexpected reply",
        other => panic!("a refusal this flood does not know yet: {other}"),
    }
}

fn kinds(rejected: &[(usize, SchedError)]) -> Vec<(usize, &'static str)> {
    rejected.iter().map(|(i, e)| (*i, kind(e))).collect()
}

#[test]
fn invalid_configs_are_typed_errors() {
    let cases = [
        (
            SchedulerConfig {
                page_size: 0,
                ..config()
            },
            "page_size",
        ),
        (
            SchedulerConfig {
                device_pages: 1,
                ..config()
            },
            "device_pages",
        ),
        (
            SchedulerConfig {
                max_scheduled_tokens: 0,
                ..config()
            },
            "max_scheduled_tokens",
        ),
        (
            SchedulerConfig {
                max_batch_size: 0,
                ..config()
            },
            "max_batch_size",
        ),
        (
            SchedulerConfig {
                host_pages: 1,
                ..config()
            },
            "host_pages",
        ),
        (
            SchedulerConfig {
                role: Role::Decode,
                ..config()
            },
            "role",
        ),
        (
            SchedulerConfig {
                host_pages: 0,
                disable_l2_cache: true,
                enable_l3_storage: true,
                ..config()
            },
            "enable_l3_storage",
        ),
        (
            SchedulerConfig {
                page_size: 1 << 16,
                device_pages: 1 << 16,
                ..config()
            },
            "device_pages",
        ),
    ];
    for runtime in RUNTIMES {
        for (config, field) in &cases {
            let started = System::builder(config.clone()).runtime(runtime).start();
            assert!(
                matches!(
                    &started,
                    Err(KvError::Sched(SchedError::Config(TypesError::InvalidConfig { field: f, .. })))
                        if f == field
                ),
                "{runtime:?} {field}: {started:?}"
            );
            let local = System::builder(config.clone())
                .runtime(runtime)
                .start_local();
            assert!(
                matches!(local, Err(KvError::Sched(SchedError::Config(_)))),
                "{runtime:?} {field}: start_local"
            );
        }
        let handle = System::builder(config()).runtime(runtime).start();
        let handle = kvtier::BlockingHandle::new(handle.expect("a valid config starts"));
        assert!(handle.shutdown().expect("shutdown").is_clean());
    }
}

/// Rounds of malformed submits and events interleaved with a running workload's valid
/// calls, then one large batch of nothing but bad events; the workload then runs to the
/// end with exactly the plans of a scheduler that never saw the bad input.
#[test]
fn a_flood_of_bad_input_leaves_the_system_healthy() {
    for runtime in RUNTIMES {
        let mut ls = Lockstep::new(runtime);
        let workload = requests(8);
        let workload_ids: Vec<RequestId> = workload.iter().map(|s| s.id.clone()).collect();
        ls.submit(workload).expect("the workload is valid");
        let mut engine = Engine::new(12);
        let long: Vec<i32> = (0..10_000).collect();

        for round in 0..20 {
            let what = format!("{runtime:?} round {round}");
            // The workload's step, whose results are mixed with bad events below.
            let plan = ls.next_plan();
            let valid_events = engine.answer(&plan);

            // --- submits: bad items around one valid one, within one batch.
            let ok_id: RequestId = format!("ok{round}").into();
            let ok = RequestSpec::new(ok_id.clone(), vec![1, 2, 3]);
            let mut bad_hits = RequestSpec::new(format!("hits{round}"), vec![1, 2, 3, 4, 5]);
            bad_hits.storage_hit_pages = 9;
            let mut batch = vec![
                RequestSpec::new(format!("empty{round}"), Vec::new()),
                ok.clone(),
                ok.clone(),
                RequestSpec::new(format!("neg{round}"), vec![1, -5, 3]),
                RequestSpec::new(format!("long{round}"), long.clone()),
                bad_hits,
            ];
            let mut expected = vec![
                (0, "empty"),
                (2, "duplicate"),
                (3, "token"),
                (4, "too long"),
                (5, "storage"),
            ];
            // A request of the workload still known to the scheduler: a duplicate across
            // batches.
            if let Some(live) = ls.shadow.request_ids().first() {
                batch.push(RequestSpec::new(live.clone(), vec![4]));
                expected.push((6, "duplicate"));
            }
            let rejected = refused(ls.handle.submit(batch));
            assert_eq!(kinds(&rejected), expected, "{what}: {rejected:?}");
            assert!(
                matches!(&rejected[1].1, SchedError::DuplicateRequest(id) if *id == ok_id),
                "{what}"
            );
            ls.shadow.submit(vec![ok.clone()]).expect("the valid item");
            // A duplicate of a request queued by the earlier call.
            let again = refused(
                ls.handle
                    .submit(vec![RequestSpec::new(ok_id.clone(), vec![9])]),
            );
            assert_eq!(kinds(&again), [(0, "duplicate")], "{what}");

            // --- events: the workload's valid results with bad ones between them.
            let running = plan.forward.rows.first().map(|r| r.request_id.clone());
            let mut bad = vec![
                (
                    EngineEvent::Finish {
                        request_id: "ghost".into(),
                    },
                    "unknown request",
                ),
                (
                    EngineEvent::WriteBackDone {
                        op_id: 9_999_999,
                        success: true,
                    },
                    "unknown op",
                ),
                (
                    EngineEvent::ExtendResult {
                        request_id: ok_id.clone(),
                        tokens: vec![4],
                    },
                    "transition",
                ),
                (
                    EngineEvent::Finish {
                        request_id: ok_id.clone(),
                    },
                    "transition",
                ),
                (
                    EngineEvent::UpdateReserve {
                        request_id: ok_id.clone(),
                        tokens: 2,
                    },
                    "transition",
                ),
                (
                    EngineEvent::ExtendResult {
                        request_id: "ghost".into(),
                        tokens: vec![-1],
                    },
                    "token",
                ),
                (
                    EngineEvent::PrefetchDone {
                        op_id: 9_999_998,
                        request_id: ok_id.clone(),
                        success: true,
                        completed_pages: 99,
                    },
                    "unknown op",
                ),
                (
                    EngineEvent::PrefetchDone {
                        op_id: 9_999_998,
                        request_id: "ghost".into(),
                        success: true,
                        completed_pages: 1,
                    },
                    "unknown request",
                ),
                (
                    EngineEvent::Bootstrapped {
                        request_id: ok_id.clone(),
                    },
                    "unsupported",
                ),
                (
                    EngineEvent::RemotePrefillDone {
                        request_id: ok_id.clone(),
                        token: 5,
                    },
                    "unsupported",
                ),
                (
                    EngineEvent::BackupDone {
                        op_id: 9_999_997,
                        success: true,
                    },
                    "unknown op",
                ),
                (
                    EngineEvent::WriteBackDone {
                        op_id: 0,
                        success: false,
                    },
                    "unknown op",
                ),
            ];
            if let Some(id) = running {
                // A negative token for a running request: refused whatever its state.
                bad.push((
                    EngineEvent::ExtendResult {
                        request_id: id,
                        tokens: vec![3, -7],
                    },
                    "token",
                ));
            }
            let mut mixed = Vec::new();
            let mut expected = Vec::new();
            let mut valid = valid_events.clone().into_iter();
            for (event, k) in bad {
                if let Some(v) = valid.next() {
                    mixed.push(v);
                }
                expected.push((mixed.len(), k));
                mixed.push(event);
            }
            mixed.extend(valid);
            let rejected = refused(ls.handle.advance(mixed));
            assert_eq!(kinds(&rejected), expected, "{what}: {rejected:?}");
            ls.shadow.advance(valid_events).expect("the valid events");

            // --- aborts: an unknown id, then the round's valid request.
            assert_eq!(
                ls.handle.abort("ghost".into()),
                Err(KvError::Sched(SchedError::UnknownRequest("ghost".into()))),
                "{what}"
            );
            ls.abort(&ok_id).expect("a queued request aborts");
            ls.stats();
        }

        // One large batch of nothing but bad events: every index comes back.
        let flood: Vec<EngineEvent> = (0..1000)
            .map(|i| match i % 4 {
                0 => EngineEvent::Finish {
                    request_id: format!("ghost{i}").into(),
                },
                1 => EngineEvent::WriteBackDone {
                    op_id: 5_000_000 + i,
                    success: i % 8 == 1,
                },
                2 => EngineEvent::ExtendResult {
                    request_id: "r00".into(),
                    tokens: vec![-(i as i32)],
                },
                _ => EngineEvent::Bootstrapped {
                    request_id: "r00".into(),
                },
            })
            .collect();
        let rejected = refused(ls.handle.advance(flood));
        assert_eq!(
            rejected.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..1000).collect::<Vec<_>>(),
            "{runtime:?}"
        );
        ls.stats();

        // The workload runs to the end, in lockstep with the direct path.
        for _ in 0..400 {
            let plan = ls.next_plan();
            let events = engine.answer(&plan);
            if plan.is_empty() && events.is_empty() {
                break;
            }
            ls.advance(events).expect("valid events");
        }
        for id in &workload_ids {
            assert!(engine.finished.contains(id), "{runtime:?}: {id} finished");
        }
        let report = ls.handle.shutdown().expect("shutdown");
        assert!(report.is_clean(), "{runtime:?}: {report:?}");
        ls.shadow
            .check_invariants()
            .expect("the direct path is clean");
    }
}

/// An L3 prefetch acknowledged with more completed pages than it fetched is refused;
/// the right acknowledgement then goes through and the request runs to the end.
#[test]
fn a_prefetch_ack_with_too_many_pages_is_refused() {
    let l3 = SchedulerConfig {
        enable_l3_storage: true,
        prefetch_threshold: 1,
        ..config()
    };
    for runtime in RUNTIMES {
        let mut ls = Lockstep::with_config(runtime, l3.clone());
        let mut spec = requests(1).remove(0);
        spec.storage_hit_pages = 4;
        let id = spec.id.clone();
        ls.submit(vec![spec]).expect("valid L3 hint");
        let plan = ls.next_plan();
        let [prefetch] = &plan.prefetches[..] else {
            panic!("{runtime:?}: one prefetch expected: {plan:?}");
        };
        assert_eq!(prefetch.request_id, id);
        let pages = prefetch.dst_pages.len() as u32;
        assert!(pages > 0);
        assert_eq!(ls.shadow.request_state(&id), Some(StateKind::Prefetching));

        let too_many = EngineEvent::PrefetchDone {
            op_id: prefetch.op_id,
            request_id: id.clone(),
            success: true,
            completed_pages: pages + 1,
        };
        let early = EngineEvent::ExtendResult {
            request_id: id.clone(),
            tokens: vec![1],
        };
        let rejected = refused(ls.handle.advance(vec![early, too_many]));
        assert_eq!(
            kinds(&rejected),
            [(0, "transition"), (1, "storage")],
            "{runtime:?}"
        );
        assert!(
            matches!(&rejected[1].1, SchedError::InvalidStorageInfo { id: i, .. } if *i == id),
            "{runtime:?}"
        );
        ls.stats();

        // The right ack is still accepted: nothing of the refused one was applied.
        ls.advance(vec![EngineEvent::PrefetchDone {
            op_id: prefetch.op_id,
            request_id: id.clone(),
            success: true,
            completed_pages: pages,
        }])
        .expect("the right ack");
        let mut engine = Engine::new(4);
        for _ in 0..100 {
            let plan = ls.next_plan();
            let events = engine.answer(&plan);
            // L3 backups of the written-back pages are acknowledged as they come.
            let backups = plan.backups.iter().map(|b| EngineEvent::BackupDone {
                op_id: b.op_id,
                success: true,
            });
            let events: Vec<EngineEvent> = events.into_iter().chain(backups).collect();
            if plan.is_empty() && events.is_empty() {
                break;
            }
            ls.advance(events).expect("valid events");
        }
        assert_eq!(engine.finished, [id], "{runtime:?}");
        let report = ls.handle.shutdown().expect("shutdown");
        assert!(report.is_clean(), "{runtime:?}: {report:?}");
    }
}

/// The deterministic and actix runtimes refuse the same things the same way.
#[test]
fn both_runtimes_refuse_alike() {
    let answers = |runtime: Runtime| {
        let handle = start(runtime);
        let a = handle.submit(vec![
            RequestSpec::new("a", vec![1, 2, 3]),
            RequestSpec::new("a", vec![1]),
            RequestSpec::new("b", vec![]),
        ]);
        let b = handle.advance(vec![
            EngineEvent::Finish {
                request_id: "a".into(),
            },
            EngineEvent::Abort {
                request_id: "zz".into(),
            },
        ]);
        let c = handle.abort("a".into());
        let d = handle.abort("a".into());
        handle.shutdown().expect("shutdown");
        (a, b, c, d)
    };
    let actix = answers(Runtime::Actix);
    assert!(actix.0.is_err() && actix.1.is_err() && actix.2.is_ok() && actix.3.is_ok());
    assert_eq!(actix, answers(Runtime::Deterministic));
}
