//! The `longdoc` scenario with a real Mooncake cluster as the L3 store (`cargo xtask
//! mooncake run -- CMD`; `cargo xtask ci` runs its tests so): documents come back from Mooncake with the
//! answers of a run without cache, and a master killed mid-run turns the rest of the run
//! into misses, never wrong KV. Without a cluster these tests say so loudly and skip;
//! under CI (`CI=true`) they fail instead.

mod common;

use common::{
    assert_later_questions_came_from_l3, cache_off, checked, fresh_model, longdoc, run_checked,
};
use kvtier_l3::{MooncakeConfig, testing};
use kvtier_model::ModelKind;
use kvtier_sim::scenario::{L3Store, ScenarioOptions, ScenarioReport, run_scenario_with};

fn mooncake_options(test: &str, cluster: MooncakeConfig) -> ScenarioOptions {
    ScenarioOptions {
        l3: L3Store::Mooncake,
        l3_model: fresh_model("longdoc", test),
        mooncake: Some(cluster),
        ..longdoc()
    }
}

#[test]
fn documents_come_back_from_mooncake_with_the_answers_of_a_run_without_cache() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let off = cache_off();
    // A master of its own: every question must find its document, so no other test's
    // objects may compete for the master's memory (it evicts when full).
    let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    let on = run_checked(&mooncake_options("roundtrip", own.config(&cluster)));
    assert_eq!(on.l3, "mooncake");
    assert_later_questions_came_from_l3(&on, &off);
}

/// `longdoc` on `model` against a master of the test's own: the cache-off run, then the
/// run with Mooncake as L3 (`test` names its objects).
fn model_against_mooncake(
    model: ModelKind,
    test: &str,
    cluster: &MooncakeConfig,
) -> (ScenarioReport, ScenarioReport) {
    let on_model = |options: ScenarioOptions| ScenarioOptions { model, ..options };
    let off = run_checked(&on_model(ScenarioOptions {
        cache: false,
        ..longdoc()
    }));
    let own = testing::LoopbackMaster::start(cluster).expect("start the test's own master");
    let on = run_checked(&on_model(mooncake_options(test, own.config(cluster))));
    assert_eq!(
        (on.l3.as_str(), on.model.as_str()),
        ("mooncake", model.name())
    );
    (on, off)
}

/// A hybrid model's documents come back with the recurrent states at their ends, stored
/// in Mooncake as objects of their own from a second registered buffer.
#[test]
fn hybrid_documents_come_back_from_mooncake_with_their_states() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let (on, off) = model_against_mooncake(ModelKind::MambaHybrid, "hybrid", &cluster);
    assert_later_questions_came_from_l3(&on, &off);
    assert_eq!(on.l3_prefetched_states, on.l3_prefetch_ops);
    assert!(on.l3_backed_up_states >= 4, "{on:#?}");
}

/// A window model's documents come back from Mooncake as KV pages only: each first
/// chunk computes the window before its prefix again (`GroupTable::fill_from`), and the
/// answers are the cache-off run's.
#[test]
fn window_documents_come_back_from_mooncake_and_refill_their_windows() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let (on, off) = model_against_mooncake(ModelKind::SlidingWindow, "window", &cluster);
    assert_eq!(
        on.outputs, off.outputs,
        "answers differ from the cache-off run"
    );
    // Most of every later document comes back from Mooncake (a few pages may still be
    // on host when its question comes).
    assert_eq!(
        (on.l3_prefetch_ops, on.l3_failed_prefetches),
        (8, 0),
        "{on:#?}"
    );
    assert!(on.hit_tokens_l3 * 10 >= 8 * 32_768 * 9, "{on:#?}");
}

/// The master dies once the first two documents have come back from it: later lookups,
/// prefetches and backups fail, those documents are recomputed, answers stay right.
#[test]
fn killing_the_master_mid_run_turns_the_rest_into_misses() {
    let Some(cluster) = common::mooncake() else {
        return;
    };
    let off = cache_off();
    // A master of its own (on free ports), apart from the shared one.
    let own = testing::LoopbackMaster::start(&cluster).expect("start the test's own master");
    let options = mooncake_options("killed", own.config(&cluster));
    let mut master = Some(own);
    // Questions are answered one at a time: d0q0, d1q0, d2q0, d3q0, d0q1, d1q1, ...
    // Kill the master as soon as six are answered (two of them prefetched from it),
    // before the seventh is submitted.
    let r = run_scenario_with(
        &options,
        |answered, _| {
            if answered >= 6 {
                master.take();
            }
        },
        |_| {},
    )
    .expect("a dead L3 store never stops the run");
    assert!(master.is_none(), "the master was killed mid-run");
    let r = checked(r);
    assert_eq!(
        r.outputs, off.outputs,
        "answers differ from the cache-off run"
    );
    assert_eq!(
        r.hit_tokens_l3,
        2 * 32_768,
        "the two documents prefetched before the kill, and none after: {r:#?}"
    );
}
