//! Several instances replaying one trace behind the router (`kvtier_sim::cluster`):
//! one instance is the single replay exactly; a shared L3 store serves pages one
//! instance wrote to the others (each read checked by its instance's integrity oracle);
//! prefix routing, fed only by the instances' KV events over ZeroMQ, beats round-robin.
//! The Mooncake variants (a client per instance, one master; the master killed mid-run)
//! are in `cluster_mooncake.rs`.

mod common;

use common::conversations;
use kvtier_router::Policy;
use kvtier_sim::cluster::{ClusterOptions, ClusterReport, L3Scope, run_cluster};
use kvtier_sim::scenario::{ScenarioOptions, run_scenario};

fn cluster(base: &ScenarioOptions, n: usize, policy: Policy, l3: L3Scope) -> ClusterReport {
    let r = run_cluster(&ClusterOptions::new(base.clone(), n, policy, l3))
        .expect("the cluster replays");
    assert_eq!(r.integrity_errors, 0, "{r:#?}");
    assert_eq!(r.finished + r.aborted + r.refused, r.requests);
    r
}

#[test]
fn one_instance_is_the_single_replay() {
    let base = conversations(13, 3);
    let single = run_scenario(&base).expect("replay");
    let r = cluster(&base, 1, Policy::RoundRobin, L3Scope::Shared);
    let one = &r.per_instance[0];
    assert_eq!(
        (
            one.steps,
            one.hit_tokens,
            one.hit_tokens_host,
            one.hit_tokens_l3,
            &one.output_digest
        ),
        (
            single.steps,
            single.hit_tokens,
            single.hit_tokens_host,
            single.hit_tokens_l3,
            &single.output_digest
        ),
    );
    assert_eq!(one.virtual_s, single.virtual_s);
    assert_eq!(r.router.routed, [39]);
    // A router tells at most 64 instances apart: more is a typed error, before any starts.
    let too_many = run_cluster(&ClusterOptions::new(base, 65, Policy::Prefix, L3Scope::Off));
    assert!(matches!(
        too_many,
        Err(kvtier_sim::scenario::ScenarioError::Router(_))
    ));
}

#[test]
fn a_shared_store_serves_one_instances_pages_to_the_others() {
    let base = conversations(13, 4);
    let private = cluster(&base, 3, Policy::RoundRobin, L3Scope::Private);
    let shared = cluster(&base, 3, Policy::RoundRobin, L3Scope::Shared);
    let off = cluster(&base, 3, Policy::RoundRobin, L3Scope::Off);
    eprintln!(
        "off {} private {} shared {} (L3 {} / {}) of {}",
        off.hit_tokens,
        private.hit_tokens,
        shared.hit_tokens,
        private.hit_tokens_l3,
        shared.hit_tokens_l3,
        off.unbounded_hit_tokens
    );
    assert_eq!(off.hit_tokens_l3, 0);
    // Round-robin spreads a conversation's turns over the instances: with a store of
    // its own, an instance finds in L3 only what it wrote itself.
    assert!(
        shared.hit_tokens_l3 > 2 * private.hit_tokens_l3.max(1),
        "shared {} vs private {}",
        shared.hit_tokens_l3,
        private.hit_tokens_l3
    );
    assert!(shared.hit_tokens > private.hit_tokens && private.hit_tokens >= off.hit_tokens);
    assert!(shared.hit_ratio_of_ideal <= 1.0);
    // Every instance read from the store.
    assert!(
        shared.l3_prefetched_bytes.iter().all(|&b| b > 0),
        "{:?}",
        shared.l3_prefetched_bytes
    );
}

#[test]
fn prefix_routing_from_kv_events_beats_round_robin() {
    let base = conversations(13, 4);
    let rr = cluster(&base, 3, Policy::RoundRobin, L3Scope::Off);
    let prefix = cluster(&base, 3, Policy::Prefix, L3Scope::Off);
    eprintln!(
        "round-robin {} prefix {} of {}",
        rr.hit_tokens, prefix.hit_tokens, rr.unbounded_hit_tokens
    );
    assert!(
        prefix.hit_tokens > rr.hit_tokens,
        "prefix {} vs round-robin {}",
        prefix.hit_tokens,
        rr.hit_tokens
    );
    // The index heard every instance (the first batch of each came by replay or SUB).
    let q = &prefix.router;
    eprintln!("{q:#?}");
    assert!(
        q.events > 0 && q.batches >= 3 && q.index_peak_blocks > 0,
        "{q:#?}"
    );
    assert!(q.predicted_hit_tokens > 0);
    // Its view lags: some requests found less than it showed, never most of them.
    assert!(q.overestimated < prefix.requests / 4, "{q:#?}");
    assert!(
        q.routed.iter().all(|&n| n > 0),
        "every instance gets work: {:?}",
        q.routed
    );
    // The same run again: the same decisions (the feed holds batches to the virtual
    // clock, whatever the sockets' timing).
    let again = cluster(&base, 3, Policy::Prefix, L3Scope::Off);
    assert_eq!(
        (again.router.routed, again.hit_tokens),
        (q.routed.clone(), prefix.hit_tokens)
    );
}
