//! Cluster replays against a real Mooncake master (`cargo xtask mooncake run -- CMD`;
//! `cargo xtask ci` runs them so): every instance is a Mooncake client of its own (its
//! own segment, loopback TCP) of one master, pages one instance backed up are
//! prefetched by another and checked by that instance's integrity oracle, a namespace
//! per instance keeps them apart, and killing the master mid-run turns the rest of the
//! run into misses on every instance, nothing else. Without a cluster these tests say
//! so loudly and skip; under CI (`CI=true`) they fail instead.

mod common;

use common::{conversations, fresh_model};
use kvtier_l3::{MooncakeConfig, testing};
use kvtier_router::Policy;
use kvtier_sim::cluster::{ClusterOptions, ClusterReport, L3Scope, run_cluster, run_cluster_with};
use kvtier_sim::scenario::{L3Store, ScenarioOptions};

fn options(test: &str, master: MooncakeConfig, l3: L3Scope) -> ClusterOptions {
    let base = ScenarioOptions {
        l3: L3Store::Mooncake,
        l3_model: fresh_model("cluster", test),
        mooncake: Some(master),
        ..conversations(13, 4)
    };
    ClusterOptions::new(base, 3, Policy::RoundRobin, l3)
}

fn checked(r: ClusterReport) -> ClusterReport {
    assert_eq!(r.integrity_errors, 0, "{r:#?}");
    assert_eq!(r.finished, r.requests, "{r:#?}");
    r
}

#[test]
fn instances_read_each_others_pages_through_one_master() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    let master = own.config(&cluster);
    let shared =
        checked(run_cluster(&options("shared", master.clone(), L3Scope::Shared)).expect("replay"));
    assert_eq!(shared.l3, "shared mooncake");
    // Round-robin puts a conversation's next turn on another instance: its earlier
    // turns come from what another instance backed up.
    assert!(
        shared.hit_tokens_l3 * 10 >= shared.unbounded_hit_tokens * 9,
        "{shared:#?}"
    );
    assert!(
        shared.l3_prefetched_bytes.iter().all(|&b| b > 0),
        "{:?}",
        shared.l3_prefetched_bytes
    );
    // A namespace per instance (as different models would have): nothing crosses.
    let private =
        checked(run_cluster(&options("private", master, L3Scope::Private)).expect("replay"));
    assert!(
        private.hit_tokens_l3 * 4 < shared.hit_tokens_l3,
        "private {} vs shared {}",
        private.hit_tokens_l3,
        shared.hit_tokens_l3
    );
}

#[test]
fn killing_the_master_mid_run_turns_the_rest_into_misses_on_every_instance() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let whole = {
        let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
        checked(
            run_cluster(&options("whole", own.config(&cluster), L3Scope::Shared)).expect("replay"),
        )
    };
    let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    let o = options("killed", own.config(&cluster), L3Scope::Shared);
    let mut master = Some(own);
    let mut steps = 0u64;
    // Two thirds through the run's steps (of all instances), the master dies: each
    // operation after it waits out the client's RPC timeout, so not too many.
    let total: u64 = whole.per_instance.iter().map(|r| r.steps).sum();
    let r = run_cluster_with(&o, |_, _| {
        steps += 1;
        if steps * 3 >= total * 2 {
            master.take();
        }
    })
    .expect("a dead L3 store never stops the run");
    assert!(master.is_none(), "the master was killed mid-run");
    let r = checked(r);
    assert!(
        0 < r.hit_tokens_l3 && r.hit_tokens_l3 < whole.hit_tokens_l3,
        "some pages came from L3 before the kill, fewer than without it: {} of {}",
        r.hit_tokens_l3,
        whole.hit_tokens_l3
    );
    // Every instance saw the store die (a lookup of a dead master finds nothing; its
    // backups fail).
    let failures: Vec<u64> = r
        .per_instance
        .iter()
        .map(|i| i.l3_failed_prefetches + i.l3_lookup_errors + i.l3_failed_backups)
        .collect();
    assert!(failures.iter().all(|&f| f > 0), "{failures:?}");
}
