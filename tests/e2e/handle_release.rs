//! Every page and lock comes back to its owner, whatever order requests end in, across
//! actors and through shutdown, on both runtimes.
//!
//! A request's handles live in the Scheduler actor (node locks, device pages, request
//! slots) and belong to the Radix actor and the Host allocator; dropping one sends it
//! home over a release channel. `ShutdownReport::conservation` checks, page by page,
//! that every page is free or in the tree once the scheduler has let go of everything,
//! and `host.leased_pages == 0` that the radix cache's host lease went back.
//!
//! Each test drives the system in lockstep with the direct-path scheduler
//! ([`Lockstep`]): every answer must match, and the direct path names each request's
//! state, so the tests can end requests in exactly the state they mean to.

use std::collections::{BTreeMap, BTreeSet};

use crate::common::*;
use kvtier::{KvError, Runtime, ShutdownReport};
use kvtier_fsm::{SchedulerStats, StateKind};
use kvtier_types::{EngineEvent, ExecutionPlan, RequestId};
use proptest::prelude::*;

/// One step of an engine that acknowledges copies one step late: the plan, then its
/// results together with the previous plan's acks. Between two steps the write-backs
/// of the last plan are in flight.
fn lagged_step(ls: &mut Lockstep, engine: &mut Engine) -> ExecutionPlan {
    let plan = ls.next_plan();
    let mut events = engine.release_acks();
    engine.hold_write_backs = true;
    events.extend(engine.answer(&plan));
    ls.advance(events).expect("every event is accepted");
    plan
}

/// Steps (acking one step late) until nothing is live or in flight.
fn run_to_idle(ls: &mut Lockstep, engine: &mut Engine, what: &str) {
    for _ in 0..400 {
        if ls.stats().idle && engine.unacked.is_empty() {
            return;
        }
        lagged_step(ls, engine);
    }
    panic!("{what}: did not become idle: {:?}", ls.stats());
}

/// Free plus cached pages cover each pool again: nothing is held outside the tree.
fn assert_nothing_held(ls: &mut Lockstep, what: &str) {
    let s = ls.stats();
    let c = config();
    assert!(s.idle, "{what}: still busy: {s:?}");
    assert_eq!(
        u64::from(s.available_device_pages) + s.cached_device_pages,
        u64::from(c.device_pages - 1),
        "{what}: device pages held outside the tree: {s:?}"
    );
    assert_eq!(
        u64::from(s.available_host_pages) + s.cached_host_pages,
        u64::from(c.host_pages - 1),
        "{what}: host pages held outside the tree: {s:?}"
    );
    assert_eq!(
        (s.waiting, s.prefilling, s.decoding, s.retracted),
        (0, 0, 0, 0)
    );
}

/// Shutdown of an idle system: nothing live, in flight, held or leaked.
fn assert_clean_shutdown(ls: &Lockstep, what: &str) -> ShutdownReport {
    let report = ls.handle.shutdown().expect("shutdown");
    assert!(report.is_clean(), "{what}: {report:?}");
    assert_eq!(report.failure, None, "{what}");
    assert_eq!(
        report.host.free_pages, report.host.usable_pages,
        "{what}: every host page is back with the allocator"
    );
    report
}

fn gauges(s: &SchedulerStats) -> [usize; 4] {
    [s.waiting, s.prefilling, s.decoding, s.retracted]
}

/// The gauge (index into [`gauges`]) a request in `state` counts under, if any.
fn gauge_of(state: StateKind) -> Option<usize> {
    match state {
        StateKind::Submitted => Some(0),
        StateKind::Prefilling | StateKind::PrefillDone => Some(1),
        StateKind::Decoding => Some(2),
        StateKind::Retracting | StateKind::Retracted => Some(3),
        _ => None,
    }
}

/// Aborts `id` on both sides and checks that it left exactly its own gauge.
fn abort_checked(ls: &mut Lockstep, engine: &mut Engine, id: &RequestId, what: &str) {
    let state = ls.shadow.request_state(id).expect("a live request");
    let before = gauges(&ls.stats());
    ls.abort(id).expect("abort is accepted in any state");
    engine.forget(id);
    let mut expected = before;
    if let Some(g) = gauge_of(state) {
        expected[g] -= 1;
    }
    assert_eq!(
        gauges(&ls.stats()),
        expected,
        "{what}: aborting {id} in {state:?}"
    );
    assert!(
        matches!(
            ls.shadow.request_state(id),
            None | Some(StateKind::Finished)
        ),
        "{what}: {id} is gone after its abort"
    );
}

/// (a) Every request finishes; write-backs and load-backs ran and the pool retracted.
#[test]
fn finishing_everything_returns_everything() {
    for runtime in RUNTIMES {
        let what = format!("{runtime:?} finish all");
        let mut ls = Lockstep::new(runtime);
        ls.submit(requests(12)).expect("submit");
        let mut engine = Engine::new(10);
        let (mut write_backs, mut load_backs, mut cached_tokens) = (0, 0, 0);
        for _ in 0..400 {
            if ls.stats().idle && engine.unacked.is_empty() {
                break;
            }
            let plan = lagged_step(&mut ls, &mut engine);
            write_backs += plan.write_backs.len();
            load_backs += plan.load_backs.len();
            cached_tokens += plan
                .forward
                .prefill_rows()
                .iter()
                .map(|r| r.extend_prefix_len)
                .sum::<u32>();
        }
        assert_eq!(engine.finished.len(), 12, "{what}: {:?}", engine.finished);
        let s = ls.stats();
        assert!(
            s.retractions > 0,
            "{what}: the device pool was under pressure"
        );
        assert!(
            write_backs > 0 && load_backs > 0,
            "{what}: the host tier was used"
        );
        assert!(cached_tokens > 0, "{what}: shared prefixes were reused");
        assert!(
            s.cached_host_pages > 0,
            "{what}: finished requests were written back"
        );
        assert_nothing_held(&mut ls, &what);
        assert_clean_shutdown(&ls, &what);
    }
}

/// (b), (c) Abort everything, in id order or in reverse, at a point where requests are
/// in many states (queued, decoding, retracting with their copy in flight, retracted).
#[test]
fn aborts_in_forward_and_reverse_order_return_everything() {
    for runtime in RUNTIMES {
        for reverse in [false, true] {
            let what = format!("{runtime:?} abort all, reverse={reverse}");
            let mut ls = Lockstep::new(runtime);
            let specs = requests(12);
            let mut ids: Vec<RequestId> = specs.iter().map(|s| s.id.clone()).collect();
            ls.submit(specs).expect("submit");
            let mut engine = Engine::new(40);
            // Step until a retraction's copy is in flight (the pool is full by then).
            let mut steps = 0;
            while !ls
                .shadow
                .request_ids()
                .iter()
                .any(|id| ls.shadow.request_state(id) == Some(StateKind::Retracting))
            {
                lagged_step(&mut ls, &mut engine);
                steps += 1;
                assert!(steps < 50, "{what}: no retraction");
            }
            let states: BTreeSet<StateKind> = ids
                .iter()
                .filter_map(|id| ls.shadow.request_state(id))
                .collect();
            assert!(states.len() >= 3, "{what}: states {states:?}");
            assert!(!engine.unacked.is_empty(), "{what}: copies in flight");
            if reverse {
                ids.reverse();
            }
            for id in &ids {
                abort_checked(&mut ls, &mut engine, id, &what);
            }
            assert_eq!(gauges(&ls.stats()), [0; 4], "{what}");
            // Aborting again: the ids are remembered as just ended, so it is a no-op.
            for id in &ids {
                ls.abort(id)
                    .expect("a repeated abort is stale, not an error");
            }
            run_to_idle(&mut ls, &mut engine, &what);
            assert!(engine.finished.is_empty(), "{what}");
            assert_nothing_held(&mut ls, &what);
            assert_clean_shutdown(&ls, &what);
        }
    }
}

/// (d) One abort in each state a request passes through: queued, mid-prefill (a chunk
/// scheduled, more to come), prefill done, mid-decode, finished with its write-back
/// not yet issued or in flight, and retracting (its copy in flight) or retracted. The
/// copies' acks arrive after the aborts. The other requests run to completion.
#[test]
fn aborts_in_every_state_return_everything() {
    const WANTED: [StateKind; 8] = [
        StateKind::Submitted,
        StateKind::Prefilling,
        StateKind::PrefillDone,
        StateKind::Decoding,
        StateKind::Draining,
        StateKind::WritingBack,
        StateKind::Retracting,
        StateKind::Retracted,
    ];
    for runtime in RUNTIMES {
        let what = format!("{runtime:?} abort in every state");
        let mut ls = Lockstep::new(runtime);
        let specs = requests(24);
        let all: Vec<RequestId> = specs.iter().map(|s| s.id.clone()).collect();
        // Two waves, so that prefill states come back after the pool filled up.
        let (first, second) = specs.split_at(12);
        ls.submit(first.to_vec()).expect("submit");
        let mut engine = Engine::new(10);
        let mut aborted: BTreeMap<StateKind, RequestId> = BTreeMap::new();
        let mut late_acks = 0;
        for step in 0..400 {
            if step == 20 {
                ls.submit(second.to_vec()).expect("second wave");
            }
            if step > 20 && ls.stats().idle && engine.unacked.is_empty() {
                break;
            }
            lagged_step(&mut ls, &mut engine);
            for id in ls.shadow.request_ids() {
                let Some(state) = ls.shadow.request_state(&id) else {
                    continue;
                };
                if !WANTED.contains(&state) || aborted.contains_key(&state) {
                    continue;
                }
                if matches!(state, StateKind::WritingBack | StateKind::Retracting) {
                    // Its copy is still unacknowledged: the ack comes after the abort.
                    late_acks += 1;
                }
                abort_checked(&mut ls, &mut engine, &id, &what);
                aborted.insert(state, id);
            }
        }
        assert_eq!(
            aborted.keys().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from(WANTED),
            "{what}: an abort in each state"
        );
        assert_eq!(late_acks, 2, "{what}");
        // Requests aborted after their Finish (Draining, WritingBack) count as both.
        let after_finish: BTreeSet<&RequestId> = [StateKind::Draining, StateKind::WritingBack]
            .iter()
            .map(|s| &aborted[s])
            .collect();
        let aborted: BTreeSet<&RequestId> = aborted.values().collect();
        for id in &all {
            let finished = engine.finished.contains(id);
            let expected = if after_finish.contains(id) {
                (true, true)
            } else {
                (!aborted.contains(id), aborted.contains(id))
            };
            assert_eq!((finished, aborted.contains(id)), expected, "{what}: {id}");
        }
        assert_nothing_held(&mut ls, &what);
        assert_clean_shutdown(&ls, &what);
    }
}

/// (e) Shutdown while requests run and write-backs are unacknowledged, at several
/// points of a run: the report lists exactly what was live and in flight, and still
/// every page and the host lease come back.
#[test]
fn shutdown_with_work_in_flight_returns_everything() {
    for runtime in RUNTIMES {
        for stop_after in [1, 7, 8, 13, 30, 36] {
            let what = format!("{runtime:?} shutdown after {stop_after} steps");
            let mut ls = Lockstep::new(runtime);
            ls.submit(requests(12)).expect("submit");
            let mut engine = Engine::new(10);
            for _ in 0..stop_after {
                lagged_step(&mut ls, &mut engine);
            }
            let live = ls.shadow.request_ids();
            let in_flight = ls.shadow.core().ops_in_flight();
            let [device, host] = ls.shadow.outside_pages();
            assert!(!live.is_empty(), "{what}");
            let report = ls.handle.shutdown().expect("shutdown");
            assert_eq!(report.live_requests, live, "{what}");
            assert_eq!(report.ops_in_flight, in_flight, "{what}");
            assert_eq!(in_flight, engine.unacked.len(), "{what}: unacked copies");
            assert_eq!(report.held_pages, [device.len(), host.len()], "{what}");
            assert!(!report.is_clean(), "{what}");
            assert_eq!(report.conservation, Ok(()), "{what}");
            assert_eq!(
                report.host.leased_pages, 0,
                "{what}: the host lease came back"
            );
            assert_eq!(report.host.free_pages, report.host.usable_pages, "{what}");
            assert_eq!(report.failure, None, "{what}");
            let h = &ls.handle;
            let after: [Result<(), KvError>; 6] = [
                h.submit(requests(1)),
                h.next_plan().map(drop),
                h.advance(engine.release_acks()),
                h.abort("r00".into()),
                h.stats().map(drop),
                h.shutdown().map(drop),
            ];
            for result in after {
                assert_eq!(
                    result,
                    Err(KvError::ShutDown),
                    "{what}: calls after shutdown"
                );
            }
        }
    }
}

/// What a random schedule does next.
#[derive(Debug, Clone)]
enum Move {
    /// One engine step (acks of the previous step included unless held).
    Step,
    /// The client aborts request `n`.
    Abort(usize),
    /// The engine finishes request `n` now (refused unless it is running).
    Finish(usize),
    /// The held acks go out now.
    Ack,
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    let one = prop_oneof![
        3 => Just(Move::Step),
        2 => (0usize..6).prop_map(Move::Abort),
        2 => (0usize..6).prop_map(Move::Finish),
        1 => Just(Move::Ack),
    ];
    proptest::collection::vec(one, 1..40)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random interleavings of steps, aborts, early finishes and late acks over a small
    /// request set, on the deterministic runtime, in lockstep with the direct path.
    /// Shutdown mid-way reports what was live and leaks nothing; ending every request
    /// first gives a clean report.
    #[test]
    fn random_endings_leak_nothing(moves in moves(), wind_down in any::<bool>()) {
        let mut ls = Lockstep::new(Runtime::Deterministic);
        let specs = requests(6);
        let ids: Vec<RequestId> = specs.iter().map(|s| s.id.clone()).collect();
        ls.submit(specs).expect("submit");
        let mut engine = Engine::new(5);
        for m in moves {
            match m {
                Move::Step => {
                    lagged_step(&mut ls, &mut engine);
                }
                Move::Abort(n) => {
                    // Unknown once forgotten: then a typed error, the same on both sides.
                    if ls.abort(&ids[n]).is_ok() {
                        engine.forget(&ids[n]);
                    }
                }
                Move::Finish(n) => {
                    let finish = EngineEvent::Finish { request_id: ids[n].clone() };
                    if ls.advance(vec![finish]).is_ok() {
                        engine.forget(&ids[n]);
                    }
                }
                Move::Ack => {
                    let acks = engine.release_acks();
                    ls.advance(acks).expect("acks are accepted");
                }
            }
        }
        if wind_down {
            let acks = engine.release_acks();
            ls.advance(acks).expect("acks are accepted");
            for id in ls.shadow.request_ids() {
                ls.abort(&id).expect("abort");
                engine.forget(&id);
            }
            run_to_idle(&mut ls, &mut engine, "wind down");
            assert_nothing_held(&mut ls, "wind down");
            assert_clean_shutdown(&ls, "wind down");
        } else {
            let live = ls.shadow.request_ids();
            let in_flight = ls.shadow.core().ops_in_flight();
            let report = ls.handle.shutdown().expect("shutdown");
            prop_assert_eq!(report.live_requests, live);
            prop_assert_eq!(report.ops_in_flight, in_flight);
            prop_assert_eq!(report.conservation, Ok(()));
            prop_assert_eq!(report.host.leased_pages, 0);
        }
    }
}
