//! Every page and lock comes back to its owner, whatever order requests end in, across
//! actors and through shutdown, on both runtimes.
//!
//! A request's handles live in the Scheduler actor (node locks, device pages, request
//! slots) and belong to the Radix actor and the Host allocator; dropping one sends it
//! home over a release channel. `ShutdownReport::conservation` checks, page by page,
//! that every page is free or in the tree once the scheduler has let go of everything,
//! and `host.leased_pages == 0` that the radix cache's host lease went back.

mod common;

use common::*;
use kvtier::{BlockingHandle, ShutdownReport};
use kvtier_types::RequestId;
use proptest::prelude::*;

fn assert_clean(report: &ShutdownReport, what: &str) {
    assert!(report.is_clean(), "{what}: {report:?}");
}

/// Free device pages plus cached ones cover the whole pool again: nothing is held.
fn assert_nothing_held(handle: &BlockingHandle, what: &str) {
    let s = handle.stats().expect("stats").scheduler;
    let usable = u64::from(config().device_pages - 1);
    assert_eq!(
        u64::from(s.available_device_pages) + s.cached_device_pages,
        usable,
        "{what}: device pages held outside the tree"
    );
    assert!(s.idle, "{what}: still busy: {s:?}");
}

#[test]
fn finishing_everything_returns_everything() {
    for runtime in RUNTIMES {
        let handle = start(runtime);
        handle.submit(requests(10)).expect("submit");
        let mut engine = Engine::new(16);
        run(&handle, &mut engine, 400);
        assert_eq!(engine.finished.len(), 10, "{runtime:?}");
        let stats = handle.stats().expect("stats");
        assert!(
            stats.scheduler.retractions > 0,
            "{runtime:?}: the pool was under pressure"
        );
        assert_nothing_held(&handle, "finish");
        assert_clean(&handle.shutdown().expect("shutdown"), "finish");
    }
}

#[test]
fn aborts_in_forward_and_reverse_order_return_everything() {
    for runtime in RUNTIMES {
        for reverse in [false, true] {
            let handle = start(runtime);
            let specs = requests(8);
            let mut ids: Vec<RequestId> = specs.iter().map(|s| s.id.clone()).collect();
            handle.submit(specs).expect("submit");
            let mut engine = Engine::new(50);
            run(&handle, &mut engine, 6);
            if reverse {
                ids.reverse();
            }
            for id in ids {
                handle.abort(id).expect("abort in any state");
            }
            run(&handle, &mut engine, 20);
            let what = format!("{runtime:?} abort reverse={reverse}");
            assert_nothing_held(&handle, &what);
            assert_clean(&handle.shutdown().expect("shutdown"), &what);
        }
    }
}

/// Aborts mid-prefill and mid-decode while write-backs are still in flight; the acks
/// arrive after the aborts.
#[test]
fn aborts_with_write_backs_in_flight_return_everything() {
    for runtime in RUNTIMES {
        let handle = start(runtime);
        handle.submit(requests(10)).expect("submit");
        let mut engine = Engine::new(3);
        engine.hold_write_backs = true;
        let mut aborted = std::collections::BTreeSet::new();
        for step in 0..60 {
            let plan = handle.next_plan().expect("plan");
            let events = engine.answer(&plan);
            handle.advance(events).expect("events");
            if step == 4 {
                // Some requests are decoding, some still prefilling or waiting.
                let decoding = engine.in_decode();
                assert!(!decoding.is_empty(), "{runtime:?}: requests are decoding");
                for id in decoding.iter().take(2) {
                    handle.abort(id.clone()).expect("abort mid-decode");
                    aborted.insert(id.clone());
                }
                for id in ["r08", "r09"] {
                    handle.abort(id.into()).expect("abort before or in prefill");
                    aborted.insert(RequestId::from(id));
                }
            }
        }
        assert!(
            !engine.unacked.is_empty(),
            "{runtime:?}: write-backs were in flight when the requests ended"
        );
        let acks = engine.release_acks();
        handle.advance(acks).expect("late acks are accepted");
        run(&handle, &mut engine, 100);
        for spec in requests(10) {
            assert!(
                engine.finished.contains(&spec.id) != aborted.contains(&spec.id),
                "{runtime:?}: {} either finished or was aborted, not both",
                spec.id
            );
        }
        assert_nothing_held(&handle, "aborts with write-backs in flight");
        assert_clean(&handle.shutdown().expect("shutdown"), "in-flight");
    }
}

/// Shutdown while requests run and write-backs are unacknowledged: the report lists
/// them, and still every page and the host lease come back.
#[test]
fn shutdown_with_work_in_flight_returns_everything() {
    for runtime in RUNTIMES {
        let handle = start(runtime);
        handle.submit(requests(8)).expect("submit");
        let mut engine = Engine::new(2);
        engine.hold_write_backs = true;
        run(&handle, &mut engine, 8);
        let report = handle.shutdown().expect("shutdown");
        assert!(!report.live_requests.is_empty(), "{runtime:?}: {report:?}");
        assert!(report.ops_in_flight > 0, "{runtime:?}: {report:?}");
        assert!(!report.is_clean());
        assert_eq!(report.conservation, Ok(()), "{runtime:?}");
        assert_eq!(
            report.host.leased_pages, 0,
            "{runtime:?}: the host lease came back"
        );
        assert!(
            matches!(handle.next_plan(), Err(kvtier::KvError::ShutDown)),
            "{runtime:?}: calls after shutdown are refused"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random interleavings of steps, aborts and held acks on the deterministic
    /// runtime: at shutdown nothing leaks.
    #[test]
    fn random_endings_leak_nothing(
        moves in proptest::collection::vec((0usize..8, 0u8..4), 1..40),
        hold in any::<bool>(),
    ) {
        let handle = start(kvtier::Runtime::Deterministic);
        handle.submit(requests(8)).expect("submit");
        let mut engine = Engine::new(4);
        engine.hold_write_backs = hold;
        for (who, what) in moves {
            match what {
                0 => {
                    let id = RequestId::from(format!("r{who:02}"));
                    // Unknown once forgotten: a typed error, never a panic.
                    let _ = handle.abort(id);
                }
                1 => {
                    let acks = engine.release_acks();
                    handle.advance(acks).expect("acks");
                }
                _ => run(&handle, &mut engine, 1),
            }
        }
        let report = handle.shutdown().expect("shutdown");
        prop_assert_eq!(report.conservation, Ok(()));
        prop_assert_eq!(report.host.leased_pages, 0);
    }
}
