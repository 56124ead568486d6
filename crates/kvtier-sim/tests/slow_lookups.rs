//! L3 lookups do not block the Scheduler actor (issue 13).
//!
//! A submission's L3 lookup is mail of its own: the request waits, looking up, while the
//! scheduler goes on planning for the others. Here the store is slow on purpose: on
//! actix its existence query blocks on a gate (an `L3Faults` hook on the L3 actor's
//! thread), on the deterministic bus the lookup's answer is held back by a delivery
//! hook. Either way a decoding request keeps getting its rows, and the looked-up one
//! joins once the answer is in, with the pages a previous system stored in L3. The same
//! answer before the same call gives the same plans on every runtime.

use std::sync::{Arc, Condvar, Mutex};

use kvtier::{Delivery, Fault, FaultHooks, LocalSystem, NoFaults};
use kvtier_device::NewRequest;
use kvtier_l3::{L3Core, L3Error, L3Faults, L3Key, LocalStore, LocalStoreConfig, Namespace};
use kvtier_sim::Path;
use kvtier_sim::api::system_with_hooks;
use kvtier_sim::oracle::{OracleEngine, Verify};
use kvtier_sim::scenario::scenario_geometry;
use kvtier_types::{ExecutionPlan, RequestId, RequestSpec, SchedulerConfig, Token};

const PAGE: u32 = 16;
/// Steps the slow lookup is held for.
const HELD_STEPS: usize = 6;

fn config() -> SchedulerConfig {
    SchedulerConfig {
        page_size: PAGE,
        device_pages: 257,
        host_pages: 513,
        max_batch_size: 8,
        max_scheduled_tokens: 256,
        enable_l3_storage: true,
        ..SchedulerConfig::default()
    }
}

/// A 40-page document.
fn document() -> Vec<Token> {
    (0..40 * PAGE as usize)
        .map(|i| (i as Token * 37 + 11) % 30_000 + 1)
        .collect()
}

/// The question after the document: a prompt whose first 40 pages are in L3.
fn question() -> Vec<Token> {
    let mut tokens = document();
    tokens.extend((0..9).map(|i| 20_000 + i));
    tokens
}

/// A gate the L3 actor's existence queries wait at while it is closed.
#[derive(Debug, Default)]
struct Gate {
    closed: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock().expect("gate lock") = closed;
        self.opened.notify_all();
    }
}

#[derive(Debug)]
struct SlowStore(Arc<Gate>);

impl L3Faults for SlowStore {
    fn before_exists(&mut self, _keys: &[L3Key]) -> Result<(), L3Error> {
        let mut closed = self.0.closed.lock().expect("gate lock");
        while *closed {
            closed = self.0.opened.wait(closed).expect("gate lock");
        }
        Ok(())
    }
}

/// Holds every lookup answer back (the bus delivers it when the lookups are settled).
#[derive(Debug)]
struct LateAnswers;

impl FaultHooks for LateAnswers {
    fn on_send(&mut self, delivery: &Delivery) -> Fault {
        if delivery.message == "L3LookedUp" {
            Fault::Delay(1 << 40)
        } else {
            Fault::Deliver
        }
    }
}

/// A system over the store in `dir`, with the oracle engine as its device.
fn system(
    path: Path,
    dir: &std::path::Path,
    gate: &Arc<Gate>,
    hooks: impl FaultHooks + 'static,
) -> LocalSystem {
    let config = config();
    let device = OracleEngine::new(scenario_geometry(PAGE), config.device_pages, Verify::Full)
        .expect("engine")
        .into_device(config.host_pages)
        .expect("device");
    let store = LocalStore::open(LocalStoreConfig::new(dir, 1 << 20, 1 << 30)).expect("store");
    let namespace = Namespace::new("slow", "u16", "page-first", PAGE, 1, 0).expect("namespace");
    let mut device = device;
    let arena = device.arenas_mut().host_arena();
    let l3 = L3Core::new(Box::new(store), namespace, PAGE, arena)
        .expect("L3 core")
        .with_faults(Box::new(SlowStore(Arc::clone(gate))));
    system_with_hooks(path, config, Some(device), Some(l3), hooks).expect("system starts")
}

/// One step: plan, execute, advance. Returns the plan.
fn step(s: &mut LocalSystem, announced: Vec<NewRequest>) -> ExecutionPlan {
    let plan = s.next_plan().expect("plan");
    let events = s.execute(plan.clone(), announced).expect("execute");
    s.advance(events).expect("advance");
    plan
}

fn announce(id: &str, prompt: Vec<Token>, max_new_tokens: usize) -> (RequestSpec, NewRequest) {
    let spec = RequestSpec::new(id, prompt.clone());
    let new = NewRequest {
        id: RequestId::new(id),
        prompt,
        max_new_tokens,
    };
    (spec, new)
}

/// Runs until idle; returns the plans.
fn drain(s: &mut LocalSystem) -> Vec<ExecutionPlan> {
    let mut plans = Vec::new();
    while !s.stats().expect("stats").scheduler.idle {
        plans.push(step(s, Vec::new()));
        assert!(plans.len() < 1_000, "the run stalled");
    }
    plans
}

fn rows(plan: &ExecutionPlan) -> Vec<&str> {
    plan.forward
        .rows
        .iter()
        .map(|r| r.request_id.as_str())
        .collect()
}

/// A first system reads the document and stores its pages in L3.
fn store_document(dir: &std::path::Path) {
    let gate = Arc::new(Gate::default());
    let mut s = system(Path::Core, dir, &gate, NoFaults);
    let (spec, new) = announce("reader", document(), 2);
    s.submit(vec![spec]).expect("submit");
    step(&mut s, vec![new]);
    drain(&mut s);
    let l3 = s.stats().expect("stats").l3.expect("an L3 actor");
    assert!(l3.backed_up_pages >= 39, "the document is in L3: {l3:?}");
    s.shutdown().expect("shutdown");
}

/// What a run shows: every plan, and the L3 pages the question was found with.
#[derive(Debug, PartialEq)]
struct Run {
    plans: Vec<ExecutionPlan>,
    lookup_hit_pages: u64,
}

/// `chat` decodes; the question is submitted and its lookup held for `HELD_STEPS`
/// steps (`hold`/`release` close and open the slow store), during which `chat` must
/// keep its rows and the question must have none; then it runs with its L3 pages.
fn run(
    path: Path,
    dir: &std::path::Path,
    hooks: impl FaultHooks + 'static,
    gate: Arc<Gate>,
    hold: bool,
) -> Run {
    let mut s = system(path, dir, &gate, hooks);
    let mut plans = Vec::new();
    let (spec, new) = announce("chat", (1..=20).collect(), 40);
    s.submit(vec![spec]).expect("submit");
    plans.push(step(&mut s, vec![new]));

    gate.set(hold);
    let (spec, new) = announce("question", question(), 4);
    s.submit(vec![spec])
        .expect("submit returns while the store is slow");
    let mut announced = vec![new];
    for _ in 0..HELD_STEPS {
        let plan = step(&mut s, std::mem::take(&mut announced));
        assert_eq!(rows(&plan), ["chat"], "{path:?}: the others are scheduled");
        plans.push(plan);
    }
    gate.set(false);
    s.settle_lookups().expect("lookups settle");
    let stats = s.stats().expect("stats");
    assert_eq!(stats.scheduler.looking_up, 0);
    plans.extend(drain(&mut s));
    let l3 = s.stats().expect("stats").l3.expect("an L3 actor");
    let device = s.take_device().expect("device").expect("a device");
    let engine = device
        .runner()
        .and_then(|r| r.as_any().downcast_ref::<OracleEngine>())
        .expect("the oracle engine");
    assert!(engine.errors.is_empty(), "{:?}", engine.errors.first());
    s.shutdown().expect("shutdown");
    Run {
        plans,
        lookup_hit_pages: l3.lookup_hit_pages,
    }
}

#[test]
fn a_slow_lookup_holds_back_its_request_not_the_scheduler() {
    let dir = tempfile::tempdir().expect("temp dir");
    store_document(dir.path());
    let on_actix = |path| run(path, dir.path(), NoFaults, Arc::default(), true);
    let actors = on_actix(Path::Actors);
    let threaded = on_actix(Path::ActorsThreaded);
    let bus = run(
        Path::Deterministic,
        dir.path(),
        LateAnswers,
        Arc::default(),
        false,
    );

    // The question found the document in L3: the first plan after the answer fetches
    // its pages, and it runs once they are in.
    assert!(actors.lookup_hit_pages >= 39, "{}", actors.lookup_hit_pages);
    let answered = &actors.plans[1 + HELD_STEPS];
    let fetched: Vec<&str> = answered
        .prefetches
        .iter()
        .map(|p| p.request_id.as_str())
        .collect();
    assert_eq!(fetched, ["question"]);
    assert!(
        actors.plans[2 + HELD_STEPS..]
            .iter()
            .any(|p| rows(p).contains(&"question"))
    );

    // The same answers before the same calls: the same plans on every runtime.
    assert_eq!(
        actors, threaded,
        "actix on the caller's thread and on its own"
    );
    assert_eq!(actors, bus, "actix and the deterministic bus");
}

#[test]
fn on_the_direct_path_a_lookup_answers_before_the_next_plan() {
    let dir = tempfile::tempdir().expect("temp dir");
    store_document(dir.path());
    let gate = Arc::new(Gate::default());
    let mut s = system(Path::Core, dir.path(), &gate, NoFaults);
    let (spec, new) = announce("question", question(), 4);
    s.submit(vec![spec]).expect("submit");
    assert_eq!(s.stats().expect("stats").scheduler.looking_up, 0);
    let plan = step(&mut s, vec![new]);
    assert!(
        !plan.prefetches.is_empty(),
        "the first plan prefetches its L3 pages"
    );
    drain(&mut s);
    s.shutdown().expect("shutdown");
}

/// Drops every lookup on its way to the store.
#[derive(Debug)]
struct LostLookups;

impl FaultHooks for LostLookups {
    fn on_send(&mut self, delivery: &Delivery) -> Fault {
        if delivery.message == "L3Lookup" {
            Fault::Fail
        } else {
            Fault::Deliver
        }
    }
}

/// A lookup that never reaches the store is a miss: the question runs without its L3
/// pages, and the system has not failed (a failed call's mail would fail it).
#[test]
fn a_lost_lookup_is_a_miss_on_every_runtime() {
    let dir = tempfile::tempdir().expect("temp dir");
    store_document(dir.path());
    for path in [Path::Core, Path::Deterministic, Path::Actors] {
        let mut s = system(path, dir.path(), &Arc::default(), LostLookups);
        let (spec, new) = announce("question", question(), 4);
        s.submit(vec![spec]).expect("submit");
        s.settle_lookups().expect("settled");
        let plans = [vec![step(&mut s, vec![new])], drain(&mut s)].concat();
        assert!(plans.iter().all(|p| p.prefetches.is_empty()), "{path:?}");
        assert!(plans.iter().any(|p| rows(p) == ["question"]), "{path:?}");
        let stats = s.stats().expect("stats");
        assert_eq!(stats.scheduler.lost_lookups, 1, "{path:?}");
        assert_eq!(stats.l3.expect("an L3 actor").lookups, 0, "{path:?}");
        let report = s.shutdown().expect("shutdown");
        assert!(report.failure.is_none(), "{path:?}: {:?}", report.failure);
        assert!(report.conservation.is_ok(), "{path:?}");
    }
}

/// A batch with a refused spec still queues the valid ones, and their lookups are out:
/// the submit answers with the refusal, and once the lookups are settled the next plan
/// sees the valid request (a replay that skipped the settle on the error planned
/// without it: campaign seed 8561).
#[test]
fn a_refused_spec_does_not_hold_back_the_others_lookups() {
    let dir = tempfile::tempdir().expect("temp dir");
    store_document(dir.path());
    let mut s = system(
        Path::Deterministic,
        dir.path(),
        &Arc::default(),
        LateAnswers,
    );
    let (spec, new) = announce("question", question(), 4);
    let refused = RequestSpec::new("empty", Vec::new());
    let error = s.submit(vec![refused, spec]).expect_err("the empty prompt");
    assert!(matches!(error, kvtier::KvError::Batch(_)), "{error}");
    assert_eq!(s.stats().expect("stats").scheduler.looking_up, 1);
    s.settle_lookups().expect("settled");
    let plan = step(&mut s, vec![new]);
    let fetched: Vec<&str> = plan
        .prefetches
        .iter()
        .map(|p| p.request_id.as_str())
        .collect();
    assert_eq!(
        fetched,
        ["question"],
        "the valid request is in the next plan"
    );
    drain(&mut s);
    s.shutdown().expect("shutdown");
}
