//! L3 keys through the whole system (scheduler, radix, host, device and L3 actors, with
//! the oracle engine), against review bugs of the L3 pull request (reference 000):
//!
//! * J: keys without a namespace let two models collide in one cluster;
//! * K: a tag applied on some verbs only (get and put, not exists) made every lookup miss;
//! * D: pages published mid-flight had no hashes, so their backups were keyed from an
//!   empty seed;
//! * E: hash lists concatenated per node shifted every later key after one node without
//!   hashes.
//!
//! A store that records every key each verb is called with stands between the L3 actor
//! and a real `LocalStore`. Every key must be the namespace plus the page's full-chain
//! hash, computed here independently from the tokens.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use kvtier::LocalSystem;
use kvtier_l3::{
    Capabilities, L3Backend, L3Core, L3Error, L3Key, L3Stats, LocalStore, LocalStoreConfig,
    Namespace, PutOutcome,
};
use kvtier_sim::oracle::{OracleEngine, Verify};
use kvtier_sim::scenario::scenario_geometry;
use kvtier_sim::{Path, system_on};
use kvtier_types::hash::rolling_page_hashes;
use kvtier_types::{EngineEvent, RequestId, RequestSpec, SchedulerConfig, Token};

const PAGE: u32 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Verb {
    Exists,
    Get,
    Put,
}

type Log = Arc<Mutex<Vec<(Verb, Vec<L3Key>)>>>;

/// A `LocalStore` that logs the keys of every call.
#[derive(Debug)]
struct Recording {
    store: LocalStore,
    log: Log,
}

impl Recording {
    fn note(&self, verb: Verb, keys: &[L3Key]) {
        self.log
            .lock()
            .expect("log lock")
            .push((verb, keys.to_vec()));
    }
}

impl L3Backend for Recording {
    fn capabilities(&self) -> Capabilities {
        self.store.capabilities()
    }

    fn exists(&mut self, keys: &[L3Key], prefetch_to_memory: bool) -> Result<usize, L3Error> {
        self.note(Verb::Exists, keys);
        self.store.exists(keys, prefetch_to_memory)
    }

    fn get(&mut self, keys: &[L3Key], buffers: &mut [&mut [u8]]) -> Result<Vec<bool>, L3Error> {
        self.note(Verb::Get, keys);
        self.store.get(keys, buffers)
    }

    fn put(&mut self, keys: &[L3Key], buffers: &[&[u8]]) -> Result<Vec<PutOutcome>, L3Error> {
        self.note(Verb::Put, keys);
        self.store.put(keys, buffers)
    }

    fn remove(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        self.store.remove(keys)
    }

    fn stats(&self) -> L3Stats {
        self.store.stats()
    }
}

fn namespace(model: &str) -> Namespace {
    Namespace::new(model, "u16", "page-first", PAGE, 1, 0).expect("namespace")
}

/// The keys of every full page of `tokens`, computed from the tokens alone.
fn expected_keys(model: &str, tokens: &[Token]) -> Vec<L3Key> {
    let full = tokens.len() / PAGE as usize * PAGE as usize;
    namespace(model).keys(&rolling_page_hashes(None, &tokens[..full], PAGE as usize))
}

/// A system (device, host and L3 actors over a fresh device) whose store lives in `dir`.
struct Rig {
    system: LocalSystem,
    log: Log,
    /// Every token each request generated.
    generated: BTreeMap<RequestId, Vec<Token>>,
    /// Each request's cached prefix at its first prefill row, and that row's step.
    admitted: BTreeMap<RequestId, (u32, usize)>,
    /// The step each request finished in.
    finished: BTreeMap<RequestId, usize>,
}

impl Rig {
    fn start(path: Path, dir: &std::path::Path, model: &str) -> Self {
        let (device_pages, host_pages) = (257, 513);
        let config = SchedulerConfig {
            page_size: PAGE,
            device_pages,
            host_pages,
            max_batch_size: 8,
            max_scheduled_tokens: 512,
            enable_l3_storage: true,
            ..SchedulerConfig::default()
        };
        let mut device = OracleEngine::new(scenario_geometry(PAGE), device_pages, Verify::Full)
            .expect("engine")
            .into_device(host_pages)
            .expect("device");
        let log = Log::default();
        let store = Recording {
            store: LocalStore::open(LocalStoreConfig::new(dir, 1 << 20, 1 << 30)).expect("store"),
            log: log.clone(),
        };
        let l3 = L3Core::new(
            Box::new(store),
            namespace(model),
            PAGE,
            device.arenas_mut().host_arena(),
        )
        .expect("L3 core");
        Self {
            system: system_on(path, config, Some(device), Some(l3)).expect("system starts"),
            log,
            generated: BTreeMap::new(),
            admitted: BTreeMap::new(),
            finished: BTreeMap::new(),
        }
    }

    /// Submits `requests` at step `at` of the run (prompt, tokens to generate), and
    /// steps until idle.
    fn run(&mut self, mut requests: Vec<(usize, RequestSpec, usize)>) {
        requests.sort_by_key(|(at, ..)| std::cmp::Reverse(*at));
        let mut step = 0;
        loop {
            let mut specs = Vec::new();
            let mut announced = Vec::new();
            while requests.last().is_some_and(|(at, ..)| *at <= step) {
                let (_, spec, max_new_tokens) = requests.pop().expect("a request");
                announced.push(kvtier_device::NewRequest {
                    id: spec.id.clone(),
                    prompt: spec.tokens.clone(),
                    max_new_tokens,
                });
                specs.push(spec);
            }
            if !specs.is_empty() {
                self.system.submit(specs).expect("submit");
                self.system.settle_lookups().expect("lookups");
            }
            let plan = self.system.next_plan().expect("plan");
            if plan.is_empty()
                && announced.is_empty()
                && requests.is_empty()
                && self.system.stats().expect("stats").scheduler.idle
            {
                break;
            }
            for row in plan.forward.prefill_rows() {
                self.admitted
                    .entry(row.request_id.clone())
                    .or_insert((row.extend_prefix_len, step));
            }
            let events = self.system.execute(plan, announced).expect("execute");
            for event in &events {
                match event {
                    EngineEvent::ExtendResult { request_id, tokens } => {
                        self.generated
                            .entry(request_id.clone())
                            .or_default()
                            .extend(tokens);
                    }
                    EngineEvent::Finish { request_id, .. } => {
                        self.finished.insert(request_id.clone(), step);
                    }
                    _ => {}
                }
            }
            self.system.advance(events).expect("advance");
            step += 1;
            assert!(step < 10_000, "the run stalled");
        }
        let device = self
            .system
            .take_device()
            .expect("device")
            .expect("a device");
        let engine = device
            .runner()
            .and_then(|runner| runner.as_any().downcast_ref::<OracleEngine>())
            .expect("the oracle engine");
        assert!(engine.errors.is_empty(), "{:?}", engine.errors.first());
    }

    fn keys(&self, verb: Verb) -> Vec<Vec<L3Key>> {
        let log = self.log.lock().expect("log lock");
        log.iter()
            .filter(|(v, _)| *v == verb)
            .map(|(_, keys)| keys.clone())
            .collect()
    }

    fn stats(&mut self) -> kvtier_l3::L3TierStats {
        self.system.stats().expect("stats").l3.expect("an L3 actor")
    }
}

fn document(seed: Token, pages: usize) -> Vec<Token> {
    (0..pages * PAGE as usize + 5)
        .map(|i| seed.wrapping_mul(7919).wrapping_add(i as Token * 31) % 30_000 + 1)
        .collect()
}

/// J and K: exists, get and put use one formatter, so a page's key is the same on every
/// verb, always namespaced; a second model over the same store finds nothing.
#[test]
fn every_verb_uses_one_namespaced_key_per_page() {
    for path in [Path::Actors, Path::Deterministic, Path::Core] {
        let dir = tempfile::tempdir().expect("temp dir");
        let prompt = document(1, 24);
        let expected = expected_keys("model-a", &prompt);

        // A first system computes the document and backs it up.
        let mut first = Rig::start(path, dir.path(), "model-a");
        first.run(vec![(0, RequestSpec::new("a", prompt.clone()), 4)]);
        let put: BTreeSet<L3Key> = first.keys(Verb::Put).into_iter().flatten().collect();
        for key in &expected {
            assert!(
                put.contains(key),
                "{}: prompt page {key} was not backed up",
                path.name()
            );
        }
        let prefix = "kvtier/v1/model-a/u16/page-first/p16/tp0of1/";
        assert!(put.iter().all(|k| k.as_str().starts_with(prefix)), "J");

        // A second system (fresh device and host) over the same store finds every page
        // under the same keys: exists and get ask for exactly the keys put stored. (The
        // same request id: the oracle engine salts its answers with it.)
        let mut second = Rig::start(path, dir.path(), "model-a");
        second.run(vec![(0, RequestSpec::new("a", prompt.clone()), 4)]);
        let exists: Vec<L3Key> = second.keys(Verb::Exists).into_iter().flatten().collect();
        assert_eq!(exists, expected, "{}: K (exists)", path.name());
        let got: Vec<L3Key> = second.keys(Verb::Get).into_iter().flatten().collect();
        assert_eq!(got, expected, "{}: K (get)", path.name());
        let stats = second.stats();
        assert_eq!(stats.prefetched_pages, expected.len() as u64);
        assert_eq!(
            second.generated["a"],
            first.generated["a"],
            "{}: the answer from L3 KV is the computed one",
            path.name()
        );

        // Another model over the same store: the same tokens, no hits (J).
        let mut other = Rig::start(path, dir.path(), "model-b");
        other.run(vec![(0, RequestSpec::new("a", prompt.clone()), 4)]);
        let stats = other.stats();
        assert_eq!(
            (stats.lookup_hit_pages, stats.prefetch_ops),
            (0, 0),
            "{}: J",
            path.name()
        );
        assert!(
            other
                .keys(Verb::Exists)
                .iter()
                .flatten()
                .all(|k| k.as_str().contains("/model-b/"))
        );
    }
}

/// D and E: a prefix published mid-flight by one request, then split by a second that
/// shares part of it, is backed up page by page under the full-chain keys of the
/// tokens, whichever node a page ended up in; a later system prefetches both prompts
/// whole.
#[test]
fn pages_of_published_and_split_nodes_are_keyed_by_their_full_chain() {
    let dir = tempfile::tempdir().expect("temp dir");
    let shared = document(2, 12);
    // `a` decodes for a while; `b` arrives mid-flight, shares `a`'s first 7 pages and
    // a few tokens more, then diverges (the published node splits inside a page run).
    let a = shared.clone();
    let mut b = shared[..7 * PAGE as usize + 3].to_vec();
    b.extend(document(3, 9));
    let mut rig = Rig::start(Path::Actors, dir.path(), "model-a");
    rig.run(vec![
        (0, RequestSpec::new("a", a.clone()), 40),
        (3, RequestSpec::new("b", b.clone()), 4),
    ]);
    // `b` reused `a`'s first 7 pages while `a` was still decoding: published mid-flight.
    let (b_prefix, b_step) = rig.admitted["b"];
    assert_eq!(b_prefix, 7 * PAGE, "b hit a's published prefix");
    assert!(
        b_step < rig.finished["a"],
        "a was still running when b was admitted"
    );
    let put: Vec<L3Key> = rig.keys(Verb::Put).into_iter().flatten().collect();
    let put_set: BTreeSet<&L3Key> = put.iter().collect();
    assert_eq!(put.len(), put_set.len(), "no page is put twice");
    // Every key put is a full-chain key of one request's whole sequence (prompt and
    // answer), and every full prompt page of both is among them.
    let sequence = |id: &str, prompt: &[Token]| {
        let mut all = prompt.to_vec();
        all.extend(&rig.generated[id]);
        expected_keys("model-a", &all)
    };
    let valid: BTreeSet<L3Key> = sequence("a", &a)
        .into_iter()
        .chain(sequence("b", &b))
        .collect();
    for key in &put {
        assert!(
            valid.contains(key),
            "D/E: {key} is no page's full-chain key"
        );
    }
    for key in expected_keys("model-a", &a)
        .iter()
        .chain(&expected_keys("model-a", &b))
    {
        assert!(put_set.contains(key), "prompt page {key} was not backed up");
    }

    // A fresh system finds both prompts whole in L3.
    let mut later = Rig::start(Path::Actors, dir.path(), "model-a");
    later.run(vec![
        (0, RequestSpec::new("a2", a.clone()), 2),
        (40, RequestSpec::new("b2", b.clone()), 2),
    ]);
    // `a2` fetches all of `a`; `b2`, whose first 7 pages are on device and host by
    // then, fetches the rest of `b`: each page under its own full-chain key.
    let got: Vec<L3Key> = later.keys(Verb::Get).into_iter().flatten().collect();
    let want: Vec<L3Key> = expected_keys("model-a", &a)
        .into_iter()
        .chain(expected_keys("model-a", &b).into_iter().skip(7))
        .collect();
    assert_eq!(
        got, want,
        "both prompts came back from L3 under their own keys"
    );
}
