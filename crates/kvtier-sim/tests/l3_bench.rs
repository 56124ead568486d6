//! `bench l3` runs end to end on both stores: every round's pages come back intact on
//! both sides (the bench checks the bytes itself and fails otherwise), and each figure
//! is a real measurement. Speed is for `cargo xtask bench`, not asserted here.

use kvtier_l3::testing;
use kvtier_sim::l3_bench::{L3BenchOptions, run_l3_bench};
use kvtier_sim::scenario::L3Store;

fn small(store: L3Store) -> L3BenchOptions {
    L3BenchOptions {
        page_kib: vec![16, 64],
        batch_bytes: 1 << 20,
        rounds: 2,
        ..L3BenchOptions::new(store)
    }
}

fn check(options: &L3BenchOptions) {
    let r = run_l3_bench(options).expect("bench l3 runs");
    assert_eq!(r.store, options.store.name());
    assert_eq!(r.rows.len(), 2);
    for (row, kib) in r.rows.iter().zip([16, 64]) {
        assert_eq!((row.page_kib, row.pages), (kib, 1024 / kib));
        for gbps in [
            row.raw_put_gbps,
            row.actor_backup_gbps,
            row.raw_get_gbps,
            row.actor_prefetch_gbps,
        ] {
            assert!(gbps.is_finite() && gbps > 0.0, "{row:?}");
        }
    }
}

#[test]
fn bench_l3_moves_intact_pages_through_the_local_store() {
    check(&small(L3Store::Local));
}

#[test]
fn bench_l3_moves_intact_pages_through_mooncake() {
    let Some(cluster) = testing::cluster_from_env().expect("a Mooncake cluster under CI") else {
        return;
    };
    // A master of its own: every page must come back, so no other test's objects may
    // compete for the master's memory (it evicts when full).
    let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    check(&L3BenchOptions {
        mooncake: Some(own.config(&cluster)),
        ..small(L3Store::Mooncake)
    });
}

#[test]
fn bench_l3_refuses_an_empty_configuration() {
    let none = L3BenchOptions {
        rounds: 0,
        ..small(L3Store::Local)
    };
    assert!(run_l3_bench(&none).is_err());
    assert!(run_l3_bench(&L3BenchOptions::new(L3Store::Off)).is_err());
}
