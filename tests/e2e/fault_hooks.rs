//! Fault hooks of the deterministic runtime: delays and reordering change no decision;
//! a failed delivery fails the call with a typed error, fails the system, and leaks
//! nothing.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::*;
use kvtier::{
    ActorName, BlockingHandle, Delivery, Fault, FaultHooks, KvError, NoFaults, Runtime, System,
    SystemStats,
};
use kvtier_types::{EngineEvent, ExecutionPlan};

/// xorshift64: a reproducible pseudo-random sequence.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Delays every delivery by a pseudo-random number of ticks (counting the non-zero ones).
#[derive(Debug)]
struct RandomDelays {
    state: u64,
    delayed: Arc<AtomicUsize>,
}

impl RandomDelays {
    fn new(seed: u64, delayed: &Arc<AtomicUsize>) -> Self {
        Self {
            state: seed,
            delayed: Arc::clone(delayed),
        }
    }
}

impl FaultHooks for RandomDelays {
    fn on_send(&mut self, _: &Delivery) -> Fault {
        let ticks = next(&mut self.state) % 5;
        if ticks > 0 {
            self.delayed.fetch_add(1, Ordering::Relaxed);
        }
        Fault::Delay(ticks)
    }
}

/// Random delays and a random pick among the ready messages.
#[derive(Debug)]
struct Chaos(u64);

impl FaultHooks for Chaos {
    fn on_send(&mut self, _: &Delivery) -> Fault {
        Fault::Delay(next(&mut self.0) % 7)
    }

    fn pick(&mut self, ready: &[Delivery]) -> usize {
        (next(&mut self.0) % ready.len() as u64) as usize
    }
}

/// Delivers the newest ready message first, recording the picks it had a choice in.
#[derive(Debug, Default)]
struct NewestFirst(Arc<Mutex<Vec<Vec<Delivery>>>>);

impl FaultHooks for NewestFirst {
    fn pick(&mut self, ready: &[Delivery]) -> usize {
        if ready.len() > 1 {
            self.0.lock().expect("lock").push(ready.to_vec());
        }
        ready.len() - 1
    }
}

fn start_hooked(hooks: impl FaultHooks + 'static) -> BlockingHandle {
    BlockingHandle::new(
        System::builder(config())
            .runtime(Runtime::Deterministic)
            .fault_hooks(hooks)
            .start()
            .expect("system starts"),
    )
}

/// The plans of a multi-step workload (shared prefixes, retraction, write-backs and
/// load-backs) run to the end, and its final stats.
fn plans(handle: BlockingHandle) -> (Vec<ExecutionPlan>, SystemStats) {
    handle.submit(requests(10)).expect("submit");
    let mut engine = Engine::new(8);
    let mut plans = Vec::new();
    for step in 0..300 {
        if step == 3 {
            handle.abort("r03".into()).expect("abort mid-run");
            engine.forget(&"r03".into());
        }
        let plan = handle.next_plan().expect("plan");
        let events = engine.answer(&plan);
        let done = plan.is_empty() && events.is_empty();
        plans.push(plan);
        if done {
            break;
        }
        handle.advance(events).expect("events");
    }
    assert_eq!(engine.finished.len(), 9);
    let stats = handle.stats().expect("stats");
    assert!(handle.shutdown().expect("shutdown").is_clean());
    (plans, stats)
}

#[test]
fn delays_change_no_plan() {
    let (reference, stats) = plans(start_hooked(NoFaults));
    assert!(reference.len() > 20);
    assert!(
        stats.scheduler.retractions > 0,
        "the pool was under pressure"
    );
    assert!(reference.iter().any(|p| !p.write_backs.is_empty()));
    assert!(reference.iter().any(|p| !p.load_backs.is_empty()));
    for seed in [1, 99, 12345, 0xdead_beef] {
        let delayed = Arc::new(AtomicUsize::new(0));
        let got = plans(start_hooked(RandomDelays::new(seed, &delayed)));
        assert!(
            delayed.load(Ordering::Relaxed) > 0,
            "seed {seed}: delays applied"
        );
        assert_eq!(got, (reference.clone(), stats.clone()), "seed {seed}");
        assert_eq!(plans(start_hooked(Chaos(seed))), got, "chaos seed {seed}");
    }
    // The same plans as the actix runtime.
    let actix = start(Runtime::Actix);
    assert_eq!(plans(actix), (reference, stats));
}

#[test]
fn reordered_stats_queries_give_the_same_stats() {
    let stats = |handle: BlockingHandle| {
        handle.submit(requests(6)).expect("submit");
        let mut engine = Engine::new(4);
        let mut all = Vec::new();
        for _ in 0..12 {
            run(&handle, &mut engine, 1);
            all.push(handle.stats().expect("stats"));
        }
        handle.shutdown().expect("shutdown");
        all
    };
    let choices = Arc::new(Mutex::new(Vec::new()));
    let reversed = stats(start_hooked(NewestFirst(Arc::clone(&choices))));
    let choices = choices.lock().expect("lock").clone();
    // The choices were all within stats(): its two queries sent together, then the
    // remaining query with the first reply. Plans and advances never had a choice.
    assert_eq!(choices.len(), 2 * reversed.len(), "{choices:?}");
    for pair in choices.chunks(2) {
        let names = |ready: &[Delivery]| ready.iter().map(|d| d.message).collect::<Vec<_>>();
        assert_eq!(names(&pair[0]), ["CacheStats", "HostStatsQuery"]);
        assert_eq!(names(&pair[1]), ["CacheStats", "HostStats"]);
    }
    assert_eq!(reversed, stats(start_hooked(NoFaults)));
    assert_eq!(reversed, stats(start(Runtime::Actix)));
    assert!(
        reversed.iter().any(|s| s.scheduler.cached_device_pages > 0),
        "the stats say something"
    );
}

/// Every call but shutdown is refused once the system failed.
fn assert_failed(handle: &BlockingHandle, what: &str) {
    let calls: [(&str, Result<(), KvError>); 6] = [
        ("submit", handle.submit(requests(1))),
        ("next_plan", handle.next_plan().map(drop)),
        (
            "advance",
            handle.advance(vec![EngineEvent::Finish {
                request_id: "r00".into(),
            }]),
        ),
        ("abort", handle.abort("r01".into())),
        ("stats", handle.stats().map(drop)),
        (
            "execute",
            handle
                .execute(ExecutionPlan::default(), Vec::new())
                .map(drop),
        ),
    ];
    for (call, result) in calls {
        assert!(
            matches!(result, Err(KvError::Failed(_))),
            "{what}: {call} after the failure: {result:?}"
        );
    }
}

/// Fails the `n`-th delivery of a message in the middle of a workload: plans, advances
/// with write-back acks, and stats. The failing call returns `DeliveryFailed`, every
/// later call `Failed`, and shutdown reports the failure with nothing leaked, although
/// the dropped message carried handles (a batch's locks and pages, or a reply's).
#[test]
fn a_failed_delivery_fails_the_system_and_leaks_nothing() {
    let cases = [
        (
            "RunBatch",
            ActorName::RADIX,
            [1, 2, 3, 5, 9, 14, 20, 31].as_slice(),
        ),
        (
            "CacheReply",
            ActorName::SCHEDULER,
            [1, 2, 4, 7, 12, 25].as_slice(),
        ),
        ("CacheStats", ActorName::RADIX, [1, 3].as_slice()),
        ("HostStatsQuery", ActorName::HOST, [2].as_slice()),
        ("TreeStats", ActorName::SCHEDULER, [4].as_slice()),
    ];
    let mut failing_calls = BTreeSet::new();
    for (message, to, ns) in cases {
        for &n in ns {
            let what = format!("{message} #{n}");
            let handle = start_hooked(FailNth {
                message,
                n,
                seen: 0,
            });
            handle.submit(requests(8)).expect("submit");
            let mut engine = Engine::new(6);
            let mut failure = None;
            for _ in 0..100 {
                let stats = handle.stats();
                if let Err(e) = stats {
                    failure = Some(("stats", e));
                    break;
                }
                let plan = match handle.next_plan() {
                    Ok(plan) => plan,
                    Err(e) => {
                        failure = Some(("next_plan", e));
                        break;
                    }
                };
                let events = engine.answer(&plan);
                if let Err(e) = handle.advance(events) {
                    failure = Some(("advance", e));
                    break;
                }
            }
            let Some((call, error)) = failure else {
                panic!("{what}: nothing failed");
            };
            failing_calls.insert(call);
            assert_eq!(error, KvError::DeliveryFailed { to, message }, "{what}");
            assert_failed(&handle, &what);
            let report = handle.shutdown().expect("shutdown is still served");
            assert_eq!(report.failure, Some(error), "{what}");
            assert_eq!(report.conservation, Ok(()), "{what}: pages leaked");
            assert_eq!(report.host.leased_pages, 0, "{what}");
            assert_eq!(report.host.free_pages, report.host.usable_pages, "{what}");
            assert_eq!(handle.submit(requests(1)), Err(KvError::ShutDown), "{what}");
        }
    }
    assert_eq!(
        failing_calls,
        BTreeSet::from(["advance", "next_plan", "stats"]),
        "failures hit each kind of call"
    );
}

/// After a failure only `shutdown` is served: `take_kv_events` is refused too (it once
/// answered `Ok` on both runtimes).
#[test]
fn take_kv_events_is_refused_after_a_failure() {
    let handle = start_hooked(FailNth {
        message: "RunBatch",
        n: 1,
        seen: 0,
    });
    handle.submit(requests(2)).expect("submit");
    assert!(handle.next_plan().is_err());
    assert!(
        matches!(handle.take_kv_events(), Err(KvError::Failed(_))),
        "take_kv_events after the failure"
    );
    handle.shutdown().expect("shutdown");
}
