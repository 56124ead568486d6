//! MooncakeStore against a real `mooncake_master` on loopback (`cargo xtask mooncake run
//! -- CMD`; `cargo xtask ci` runs its tests so). Without one these tests say so loudly and skip; under
//! CI (`CI=true`) they fail instead, so a missing install step cannot hide.

use kvtier_l3::{L3Backend, L3Key, MooncakeConfig, MooncakeStore, Namespace, PutOutcome, testing};
use kvtier_types::hash::PageHash;

const PAGE: usize = 64 << 10;

/// The cluster of `cargo xtask mooncake run`, or a loud skip (an error under CI).
fn cluster() -> Option<MooncakeConfig> {
    testing::cluster_from_env().expect("a Mooncake cluster under CI")
}

fn connect() -> Option<MooncakeStore> {
    let cfg = cluster()?;
    Some(MooncakeStore::connect(&cfg).expect("connect to the Mooncake master on loopback"))
}

/// Keys unique to this test run (the master keeps objects between runs).
fn keys(test: &str, n: u8) -> Vec<L3Key> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let model = format!("{test}-{}-{nanos}", std::process::id());
    let ns = Namespace::new(&model, "bf16", "page-first", 64, 1, 0).expect("namespace");
    (0..n).map(|i| ns.key(&PageHash([i; 32]))).collect()
}

fn page(i: u8) -> Vec<u8> {
    (0..PAGE)
        .map(|j| (j as u8).wrapping_mul(13).wrapping_add(i))
        .collect()
}

/// A registered host region of `pages` pages, as Mooncake's zero-copy calls need.
struct Arena(Vec<u8>);

impl Arena {
    fn new(store: &mut MooncakeStore, pages: usize) -> Self {
        let mut bytes = vec![0u8; pages * PAGE];
        store.register(&mut bytes).expect("register the arena");
        Self(bytes)
    }

    fn pages(&mut self) -> Vec<&mut [u8]> {
        self.0.chunks_exact_mut(PAGE).collect()
    }
}

#[test]
fn put_exists_get_round_trip_through_the_real_master() {
    let Some(mut store) = connect() else { return };
    assert!(
        !store.capabilities().prefetch_on_exist,
        "the C ABI has no exist options"
    );
    let keys = keys("roundtrip", 4);
    let mut arena = Arena::new(&mut store, 8);
    {
        let mut pages = arena.pages();
        for (i, p) in pages.iter_mut().take(4).enumerate() {
            p.copy_from_slice(&page(i as u8));
        }
    }
    let put = {
        let pages: Vec<&[u8]> = arena.0.chunks_exact(PAGE).take(4).collect();
        store.put(&keys, &pages).expect("put")
    };
    assert_eq!(put, [PutOutcome::Stored; 4]);
    assert_eq!(store.exists(&keys, false).expect("exists"), 4);
    let hits = {
        let mut pages = arena.pages();
        let (_, dst) = pages.split_at_mut(4);
        store.get(&keys, dst).expect("get")
    };
    assert_eq!(hits, [true; 4]);
    for i in 0..4u8 {
        assert_eq!(
            &arena.0[(4 + i as usize) * PAGE..(5 + i as usize) * PAGE],
            &page(i)[..]
        );
    }
}

#[test]
fn puts_are_write_once_and_partial_hits_count_from_the_start() {
    let Some(mut store) = connect() else { return };
    let keys = keys("writeonce", 3);
    let mut arena = Arena::new(&mut store, 4);
    arena.0[..PAGE].copy_from_slice(&page(1));
    arena.0[PAGE..2 * PAGE].copy_from_slice(&page(2));
    let first: Vec<&[u8]> = vec![&arena.0[..PAGE]];
    store.put(&keys[..1], &first).expect("put");
    // A second put of the same key keeps the first value.
    let second: Vec<&[u8]> = vec![&arena.0[PAGE..2 * PAGE]];
    store.put(&keys[..1], &second).expect("put again");
    let third: Vec<&[u8]> = vec![&arena.0[PAGE..2 * PAGE]];
    store.put(&keys[2..3], &third).expect("put");
    // keys[1] is missing: the run of hits stops there.
    assert_eq!(store.exists(&keys, false).expect("exists"), 1);
    let hits = {
        let mut pages = arena.pages();
        store.get(&keys[..1], &mut pages[2..3]).expect("get")
    };
    assert_eq!(hits, [true]);
    assert_eq!(&arena.0[2 * PAGE..3 * PAGE], &page(1)[..]);
}

#[test]
fn missing_and_vanished_objects_are_misses() {
    let Some(mut store) = connect() else { return };
    let keys = keys("misses", 2);
    let mut arena = Arena::new(&mut store, 3);
    let hits = {
        let mut pages = arena.pages();
        store.get(&keys, &mut pages[..2]).expect("get")
    };
    assert_eq!(hits, [false, false]);
    assert!(
        arena.0.iter().all(|&b| b == 0),
        "a miss leaves the buffer untouched"
    );
    // An object that exists, then vanishes before the get (Mooncake evicts silently):
    // the get is a miss, never stale bytes.
    arena.0[2 * PAGE..].copy_from_slice(&page(9));
    let src: Vec<&[u8]> = vec![&arena.0[2 * PAGE..]];
    store.put(&keys[..1], &src).expect("put");
    assert_eq!(store.exists(&keys[..1], false).expect("exists"), 1);
    assert_eq!(store.remove(&keys[..1]).expect("remove"), 1);
    let hits = {
        let mut pages = arena.pages();
        store.get(&keys[..1], &mut pages[..1]).expect("get")
    };
    assert_eq!(hits, [false]);
    assert!(arena.0[..PAGE].iter().all(|&b| b == 0));
    assert_eq!(store.stats().get_misses, 3);
}

/// The master dies mid-run: every exists and get becomes a miss (quickly), never an
/// error that stops the caller and never stale bytes.
#[test]
fn killing_the_master_turns_everything_into_misses() {
    let Some(cluster) = cluster() else { return };
    let master = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    let cfg = master.config(&cluster);
    let mut store = MooncakeStore::connect(&cfg).expect("connect to the test's master");
    let keys = keys("killed", 2);
    let mut arena = Arena::new(&mut store, 3);
    arena.0[..2 * PAGE].fill(5);
    let put = {
        let pages: Vec<&[u8]> = arena.0.chunks_exact(PAGE).take(2).collect();
        store.put(&keys, &pages).expect("put")
    };
    assert_eq!(put, [PutOutcome::Stored; 2]);
    assert_eq!(store.exists(&keys, false).expect("exists"), 2);
    master.kill().expect("kill the master");
    assert_eq!(
        store.exists(&keys, false).unwrap_or(0),
        0,
        "no hits without a master"
    );
    let hits = {
        let mut pages = arena.pages();
        store
            .get(&keys[..1], &mut pages[2..3])
            .expect("get still answers")
    };
    assert_eq!(hits, [false]);
    assert!(
        arena.0[2 * PAGE..].iter().all(|&b| b == 0),
        "no bytes from a dead cluster"
    );
}
