//! A cache family registered through the embedding API (`SystemBuilder::cache_family`):
//! every runtime hosts it on the radix cache, whose hooks give each request its part and
//! take it back, and its counters reach the system's stats. (`kvtier-fsm`'s
//! `tests/toy_family.rs` walks the recipe through every hook.)

use std::collections::{BTreeMap, BTreeSet};

use kvtier::{KvError, LocalSystem, SetupError, System};
use kvtier_radix::{CacheFamily, NodeId, RadixCore, RadixError, TreeStats};
use kvtier_types::{MambaSettings, SchedulerConfig};

use crate::common::{Engine, RUNTIMES, config, requests};

/// Counts the parts it gives and takes back.
#[derive(Debug, Default)]
struct Tally {
    held: BTreeSet<u32>,
    next: u32,
    counts: BTreeMap<&'static str, u64>,
}

impl CacheFamily for Tally {
    fn name(&self) -> &'static str {
        "tally"
    }

    fn grant(&mut self, _tree: &RadixCore) -> u32 {
        self.next += 1;
        self.held.insert(self.next);
        *self.counts.entry("granted").or_default() += 1;
        self.next
    }

    fn settle(&mut self, _tree: &RadixCore, request: u32, _terminal: NodeId, _publish: bool) {
        assert!(self.held.remove(&request), "settled twice");
        *self.counts.entry("settled").or_default() += 1;
    }

    fn release(&mut self, request: u32) {
        assert!(self.held.remove(&request), "released twice");
        *self.counts.entry("released").or_default() += 1;
    }

    fn report(&mut self, _tree: &RadixCore, stats: &mut TreeStats) {
        stats.registered = self.counts.iter().map(|(&k, &v)| (k, v)).collect();
        stats.registered.push(("held", self.held.len() as u64));
    }
}

fn count(system: &mut LocalSystem, name: &str) -> u64 {
    let stats = system.stats().expect("stats");
    let registered = stats.scheduler.registered;
    registered
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0, |&(_, v)| v)
}

#[test]
fn every_runtime_hosts_a_registered_family() {
    for runtime in RUNTIMES {
        let mut system = System::builder(config())
            .runtime(runtime)
            .cache_family(Box::<Tally>::default())
            .start_local()
            .expect("system starts");
        system.submit(requests(12)).expect("submit");
        let mut engine = Engine::new(4);
        for _ in 0..200 {
            let plan = system.next_plan().expect("plan");
            let events = engine.answer(&plan);
            if plan.is_empty() && events.is_empty() {
                break;
            }
            system.advance(events).expect("events accepted");
        }
        assert_eq!(engine.finished.len(), 12, "{runtime:?}");
        let granted = count(&mut system, "granted");
        assert!(granted >= 12, "{runtime:?}: {granted}");
        let back = count(&mut system, "settled") + count(&mut system, "released");
        assert_eq!(
            (granted, count(&mut system, "held")),
            (back, 0),
            "{runtime:?}"
        );
        assert!(
            system.shutdown().expect("shutdown").is_clean(),
            "{runtime:?}"
        );
    }
}

#[test]
fn a_registered_family_beside_a_built_in_one_does_not_start() {
    let hybrid = SchedulerConfig {
        mamba: Some(MambaSettings {
            device_slots: 8,
            host_slots: 0,
            chunk: 64,
        }),
        ..config()
    };
    let started = System::builder(hybrid)
        .cache_family(Box::<Tally>::default())
        .start_local();
    assert!(
        matches!(
            started,
            Err(KvError::Setup(SetupError::Cache(RadixError::TwoFamilies {
                registered: "tally",
                hosted: "mamba",
            })))
        ),
        "{started:?}"
    );
}
