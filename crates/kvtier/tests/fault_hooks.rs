//! Fault hooks of the deterministic runtime: delays and reordering change no decision;
//! a failed delivery fails the call with a typed error, fails the system, and leaks
//! nothing.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use kvtier::{BlockingHandle, Delivery, Fault, FaultHooks, KvError, NoFaults, System};
use kvtier_types::ExecutionPlan;

/// Delays every delivery by a pseudo-random number of ticks.
#[derive(Debug)]
struct RandomDelays(u64);

impl FaultHooks for RandomDelays {
    fn on_send(&mut self, _: &Delivery) -> Fault {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Fault::Delay(self.0 % 5)
    }
}

/// Delivers the newest ready message first, counting the picks it had a choice in.
#[derive(Debug, Default)]
struct NewestFirst(Arc<AtomicUsize>);

impl FaultHooks for NewestFirst {
    fn pick(&mut self, ready: &[Delivery]) -> usize {
        if ready.len() > 1 {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        ready.len() - 1
    }
}

/// Fails the `n`-th `RunBatch`.
#[derive(Debug)]
struct FailNthBatch {
    n: usize,
    seen: usize,
}

impl FaultHooks for FailNthBatch {
    fn on_send(&mut self, d: &Delivery) -> Fault {
        if d.message != "RunBatch" {
            return Fault::Deliver;
        }
        self.seen += 1;
        if self.seen == self.n {
            Fault::Fail
        } else {
            Fault::Deliver
        }
    }
}

fn plans(hooks: impl FaultHooks + 'static) -> Vec<ExecutionPlan> {
    let handle = BlockingHandle::new(
        System::builder(config())
            .fault_hooks(hooks)
            .start()
            .expect("system starts"),
    );
    handle.submit(requests(10)).expect("submit");
    let mut engine = Engine::new(8);
    let mut plans = Vec::new();
    for _ in 0..300 {
        let plan = handle.next_plan().expect("plan");
        let events = engine.answer(&plan);
        let done = plan.is_empty() && events.is_empty();
        plans.push(plan);
        if done {
            break;
        }
        handle.advance(events).expect("events");
    }
    assert!(handle.shutdown().expect("shutdown").is_clean());
    plans
}

#[test]
fn delays_change_no_plan() {
    let reference = plans(NoFaults);
    assert!(reference.len() > 20);
    for seed in [1, 99, 12345] {
        assert_eq!(plans(RandomDelays(seed)), reference, "seed {seed}");
    }
}

#[test]
fn reordered_stats_queries_give_the_same_stats() {
    let stats = |hooks: Box<dyn FaultHooks>| {
        let builder = System::builder(config());
        let handle = BlockingHandle::new(
            builder
                .fault_hooks(BoxedHooks(hooks))
                .start()
                .expect("starts"),
        );
        handle.submit(requests(6)).expect("submit");
        let mut engine = Engine::new(4);
        run(&handle, &mut engine, 5);
        let stats = handle.stats().expect("stats");
        handle.shutdown().expect("shutdown");
        stats
    };
    let choices = Arc::new(AtomicUsize::new(0));
    let reversed = stats(Box::new(NewestFirst(Arc::clone(&choices))));
    assert!(
        choices.load(Ordering::Relaxed) > 0,
        "the radix and host queries of stats() were ready together and reordered"
    );
    assert_eq!(reversed, stats(Box::new(NoFaults)));
    assert!(
        reversed.scheduler.cached_device_pages > 0,
        "the stats say something"
    );
}

/// Boxed hooks, so one helper takes either kind.
#[derive(Debug)]
struct BoxedHooks(Box<dyn FaultHooks>);

impl FaultHooks for BoxedHooks {
    fn on_send(&mut self, d: &Delivery) -> Fault {
        self.0.on_send(d)
    }

    fn pick(&mut self, ready: &[Delivery]) -> usize {
        self.0.pick(ready)
    }
}

#[test]
fn a_failed_delivery_fails_the_system_and_leaks_nothing() {
    for n in [1, 2, 5, 9] {
        let handle = BlockingHandle::new(
            System::builder(config())
                .fault_hooks(FailNthBatch { n, seen: 0 })
                .start()
                .expect("system starts"),
        );
        handle.submit(requests(8)).expect("submit");
        let mut engine = Engine::new(6);
        let mut failure = None;
        for _ in 0..100 {
            let plan = match handle.next_plan() {
                Ok(plan) => plan,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let events = engine.answer(&plan);
            if let Err(e) = handle.advance(events) {
                failure = Some(e);
                break;
            }
        }
        assert!(
            matches!(
                failure,
                Some(KvError::DeliveryFailed {
                    to: "radix",
                    message: "RunBatch"
                })
            ),
            "batch {n}: {failure:?}"
        );
        assert!(
            matches!(handle.next_plan(), Err(KvError::Failed(_))),
            "batch {n}"
        );
        assert!(
            matches!(handle.submit(requests(1)), Err(KvError::Failed(_))),
            "batch {n}"
        );
        let report = handle.shutdown().expect("shutdown is still served");
        assert!(report.failure.is_some(), "batch {n}");
        assert_eq!(report.conservation, Ok(()), "batch {n}: pages leaked");
        assert_eq!(report.host.leased_pages, 0, "batch {n}");
    }
}
