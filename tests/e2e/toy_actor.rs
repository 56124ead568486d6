//! The recipe for a new actor (`docs/architecture.md`), followed by a toy: a core and its
//! protocol (this file), one name, one line in the builder. Nothing else in the
//! workspace knows it, yet every runtime hosts it, fault hooks see its mail, shutdown
//! stops it and `take_core` hands it back.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvtier::{
    ActorCore, ActorName, Delivery, Fault, FaultHooks, KvError, LocalSystem, Runtime, SetupError,
    System,
};
use kvtier_types::RequestSpec;

use crate::common::{RUNTIMES, config};

// ----- step 1: the core and its protocol, runtime-free -----------------------------

/// Adds numbers; remembers the total.
#[derive(Debug, Default)]
struct Counter {
    total: u64,
    /// Set when the core is dropped.
    dropped: Arc<AtomicBool>,
}

impl Drop for Counter {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug)]
enum CounterMsg {
    Add(u64),
    Total,
}

#[derive(Debug, PartialEq, Eq)]
enum CounterReply {
    Total(u64),
}

impl ActorCore for Counter {
    // ----- step 2: its name -----
    const NAME: ActorName = ActorName::new("counter");
    type Msg = CounterMsg;
    type Reply = CounterReply;

    fn handle(&mut self, msg: CounterMsg) -> CounterReply {
        if let CounterMsg::Add(n) = msg {
            self.total += n;
        }
        CounterReply::Total(self.total)
    }

    fn message_name(msg: &CounterMsg) -> &'static str {
        match msg {
            CounterMsg::Add(_) => "Add",
            CounterMsg::Total => "Total",
        }
    }

    fn reply_name(_: &CounterReply) -> &'static str {
        "CounterTotal"
    }
}

// ----- step 3: one line in the builder -----------------------------------------------

fn start(runtime: Runtime, counter: Counter, local: bool) -> LocalSystem {
    let builder = System::builder(config()).runtime(runtime).actor(counter);
    if local {
        builder.start_local().expect("system starts")
    } else {
        LocalSystem::from_handle(builder.start().expect("system starts"))
    }
}

#[test]
fn every_runtime_hosts_the_toy_beside_the_scheduler() {
    for runtime in RUNTIMES {
        for local in [true, false] {
            let what = format!("{runtime:?} local={local}");
            let dropped = Arc::new(AtomicBool::new(false));
            let counter = Counter {
                total: 0,
                dropped: Arc::clone(&dropped),
            };
            let mut system = start(runtime, counter, local);
            assert_eq!(
                system.ask::<Counter>(CounterMsg::Add(2)),
                Ok(CounterReply::Total(2)),
                "{what}"
            );
            // The scheduler works as ever around it.
            system
                .submit(vec![RequestSpec::new("r1", vec![1, 2, 3, 4, 5])])
                .expect("submit");
            let plan = system.next_plan().expect("plan");
            assert_eq!(plan.forward.rows.len(), 1, "{what}");
            assert_eq!(
                system.ask::<Counter>(CounterMsg::Add(3)),
                Ok(CounterReply::Total(5)),
                "{what}"
            );
            assert_eq!(
                system.ask::<Counter>(CounterMsg::Total),
                Ok(CounterReply::Total(5)),
                "{what}"
            );
            assert!(!dropped.load(Ordering::SeqCst), "{what}");
            let report = system.shutdown().expect("shutdown");
            assert!(report.failure.is_none(), "{what}: {report:?}");
            assert!(
                dropped.load(Ordering::SeqCst),
                "{what}: shutdown stopped the toy"
            );
        }
    }
}

#[test]
fn take_core_hands_the_toy_back_and_later_mail_finds_no_actor() {
    for runtime in RUNTIMES {
        let mut system = start(runtime, Counter::default(), true);
        system.ask::<Counter>(CounterMsg::Add(7)).expect("add");
        let core = system
            .take_core::<Counter>()
            .expect("take")
            .expect("a counter");
        assert_eq!(core.total, 7, "{runtime:?}");
        assert_eq!(
            system.ask::<Counter>(CounterMsg::Total),
            Err(KvError::NoActor(Counter::NAME)),
            "{runtime:?}"
        );
        assert!(system.take_core::<Counter>().expect("take").is_none());
        assert!(system.shutdown().expect("shutdown").is_clean());
    }
}

#[test]
fn a_system_without_the_toy_says_so() {
    let mut system = System::builder(config()).start_local().expect("starts");
    assert_eq!(
        system.ask::<Counter>(CounterMsg::Total),
        Err(KvError::NoActor(ActorName::new("counter")))
    );
    assert!(matches!(system.take_core::<Counter>(), Ok(None)));
}

#[test]
fn two_actors_of_one_name_are_refused() {
    let started = System::builder(config())
        .actor(Counter::default())
        .actor(Counter::default())
        .start_local();
    assert!(
        matches!(
            started,
            Err(KvError::Setup(SetupError::DuplicateActor(name))) if name == Counter::NAME
        ),
        "{started:?}"
    );
}

/// Fails every delivery of one message name.
#[derive(Debug)]
struct FailAll(&'static str);

impl FaultHooks for FailAll {
    fn on_send(&mut self, delivery: &Delivery) -> Fault {
        if delivery.message == self.0 {
            Fault::Fail
        } else {
            Fault::Deliver
        }
    }
}

#[test]
fn fault_hooks_see_the_toys_mail_on_every_runtime() {
    for (message, to) in [
        ("Add", Counter::NAME),
        ("CounterTotal", ActorName::SCHEDULER),
    ] {
        for runtime in RUNTIMES {
            let what = format!("{message} {runtime:?}");
            let mut system = System::builder(config())
                .runtime(runtime)
                .actor(Counter::default())
                .fault_hooks(FailAll(message))
                .start_local()
                .expect("starts");
            let answer = system.ask::<Counter>(CounterMsg::Add(1));
            assert_eq!(
                answer,
                Err(KvError::DeliveryFailed { to, message }),
                "{what}"
            );
            assert!(
                matches!(system.next_plan(), Err(KvError::Failed(_))),
                "{what}: a runtime fault fails the system"
            );
            let report = system.shutdown().expect("shutdown");
            assert!(report.failure.is_some(), "{what}");
            assert_eq!(report.conservation, Ok(()), "{what}");
        }
    }
}

#[test]
fn dropping_the_view_of_a_threaded_system_shuts_it_down() {
    for runtime in RUNTIMES {
        let dropped = Arc::new(AtomicBool::new(false));
        let counter = Counter {
            total: 0,
            dropped: Arc::clone(&dropped),
        };
        drop(start(runtime, counter, false));
        assert!(
            dropped.load(Ordering::SeqCst),
            "{runtime:?}: the system's thread was left running"
        );
    }
}

/// The toy again, on a thread of its own (as the L3 store's client is), and as slow to
/// drop as asked (as a store client that unregisters its memory is): a drop that does
/// not wait for it cannot see it done.
#[derive(Debug)]
struct Lonely {
    counter: Counter,
    drop_delay: std::time::Duration,
}

impl Drop for Lonely {
    fn drop(&mut self) {
        std::thread::sleep(self.drop_delay);
    }
}

impl ActorCore for Lonely {
    const NAME: ActorName = ActorName::new("lonely");
    const PLACEMENT: kvtier::Placement = kvtier::Placement::OwnThread;
    type Msg = CounterMsg;
    type Reply = CounterReply;

    fn handle(&mut self, msg: CounterMsg) -> CounterReply {
        self.counter.handle(msg)
    }

    fn message_name(msg: &CounterMsg) -> &'static str {
        Counter::message_name(msg)
    }

    fn reply_name(reply: &CounterReply) -> &'static str {
        Counter::reply_name(reply)
    }
}

/// A system on the caller's thread dropped without `shutdown` drops every core before
/// the drop returns, those on threads of their own included: a store client left alive
/// in a forgotten thread would keep its memory registered with a shared master (which
/// then placed other processes' objects in it, and their transfers failed).
#[test]
fn dropping_a_local_system_drops_the_cores_on_their_own_threads() {
    for runtime in RUNTIMES {
        let dropped = Arc::new(AtomicBool::new(false));
        let lonely = Lonely {
            counter: Counter {
                total: 0,
                dropped: Arc::clone(&dropped),
            },
            drop_delay: std::time::Duration::from_millis(50),
        };
        let mut system = System::builder(config())
            .runtime(runtime)
            .actor(lonely)
            .start_local()
            .expect("system starts");
        assert_eq!(
            system.ask::<Lonely>(CounterMsg::Add(2)).expect("answers"),
            CounterReply::Total(2)
        );
        drop(system);
        assert!(
            dropped.load(Ordering::SeqCst),
            "{runtime:?}: the core outlived its system"
        );
    }
}

/// Two actix systems on one thread, the first dropped after the second started (as a
/// test that builds a second system for a later run does). The caller's thread-local
/// system handle then names the second system; an actor thread of the first must not end
/// up holding the first system's last handle, whose drop as that thread ends woke a
/// controller on a runtime already gone and aborted the process (about one run in 40
/// before the fix).
#[test]
fn a_local_system_dropped_after_a_newer_one_started_ends_cleanly() {
    for round in 0..200 {
        let start = || {
            let mut system = System::builder(config())
                .runtime(Runtime::Actix)
                .actor(Lonely {
                    counter: Counter {
                        total: 0,
                        dropped: Arc::new(AtomicBool::new(false)),
                    },
                    drop_delay: std::time::Duration::ZERO,
                })
                .start_local()
                .expect("system starts");
            assert_eq!(
                system.ask::<Lonely>(CounterMsg::Add(1)).expect("answers"),
                CounterReply::Total(1),
                "round {round}"
            );
            system
        };
        let first = start();
        let second = start();
        drop(first);
        drop(second);
    }
}
