//! `longdoc` on a Mamba-hybrid model with the embedded L3 store: a document's pages are
//! worth something only with the recurrent state at their end, so its checkpoints are
//! backed up beside its pages and prefetched with them. Every answer equals a run with
//! caching off, and the oracle checks every state a row reads; a store that loses or
//! corrupts objects gives shorter prefixes or misses, never a wrong state.

mod common;

use common::{assert_later_questions_came_from_l3, checked, corrupt_new_objects, run_checked};
use kvtier_model::ModelKind;
use kvtier_sim::Path;
use kvtier_sim::scenario::{L3Fault, ScenarioOptions, ScenarioReport, run_scenario_with};

fn hybrid() -> ScenarioOptions {
    ScenarioOptions {
        model: ModelKind::MambaHybrid,
        ..common::longdoc()
    }
}

fn hybrid_cache_off() -> ScenarioReport {
    run_checked(&ScenarioOptions {
        cache: false,
        ..hybrid()
    })
}

#[test]
fn documents_come_back_from_l3_with_their_states() {
    let off = hybrid_cache_off();
    let on = run_checked(&hybrid());
    assert_eq!(on.model, "mamba-hybrid");
    assert_later_questions_came_from_l3(&on, &off);
    // One state per prefetch (the one at the document's end), and a checkpoint per
    // prefill chunk backed up.
    assert_eq!(on.l3_prefetched_states, on.l3_prefetch_ops);
    assert!(on.l3_backed_up_states >= 4, "{on:#?}");
    for path in [Path::Deterministic, Path::ActorsThreaded] {
        let r = run_checked(&ScenarioOptions { path, ..hybrid() });
        assert_eq!(r.outputs, on.outputs, "{}", path.name());
        assert_eq!(
            (r.steps, r.hit_tokens_l3, r.l3_backed_up_states),
            (on.steps, on.hit_tokens_l3, on.l3_backed_up_states),
            "{}",
            path.name()
        );
    }
}

/// A prefetch that loses objects — the state, always last in its batch, among them —
/// serves the shorter prefix up to the deepest checkpoint that came back: the question
/// computes the rest of its document.
#[test]
fn a_store_that_is_down_or_loses_objects_gives_shorter_prefixes_never_wrong_state() {
    let off = hybrid_cache_off();
    let whole = run_checked(&hybrid());
    let down = run_checked(&ScenarioOptions {
        l3_fault: L3Fault::FailEveryNthGet(2),
        ..hybrid()
    });
    assert_eq!(down.outputs, off.outputs);
    assert_eq!(down.l3_failed_prefetches, 4, "every second prefetch failed");
    assert_eq!(down.l3_prefetched_states, 4);
    let lossy = run_checked(&ScenarioOptions {
        l3_fault: L3Fault::LoseHalfOfEveryNthGet(1),
        ..hybrid()
    });
    assert_eq!(lossy.outputs, off.outputs);
    assert_eq!(
        lossy.l3_prefetched_states, lossy.l3_prefetch_ops,
        "each fell back to an earlier checkpoint"
    );
    assert!(
        lossy.hit_tokens_l3 > 0 && lossy.hit_tokens_l3 <= whole.hit_tokens_l3 / 2,
        "shorter prefixes: {} of {} tokens",
        lossy.hit_tokens_l3,
        whole.hit_tokens_l3
    );
}

/// States and pages corrupted on disk between their backup and their prefetch read as
/// misses.
#[test]
fn corrupt_state_objects_are_misses_never_wrong_state() {
    let off = hybrid_cache_off();
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ScenarioOptions {
        l3_dir: Some(dir.path().to_path_buf()),
        l3_memory_bytes: 0,
        ..hybrid()
    };
    let mut corrupted = std::collections::BTreeSet::new();
    let r = run_scenario_with(
        &options,
        |_, _| {},
        |_| corrupt_new_objects(dir.path(), &mut corrupted),
    )
    .expect("longdoc runs");
    let r = checked(r);
    assert!(!corrupted.is_empty(), "the test corrupted objects");
    assert_eq!(r.outputs, off.outputs);
    assert_eq!((r.hit_tokens_l3, r.l3_prefetched_states), (0, 0));
    assert!(r.l3_corrupt_objects > 0, "{r:#?}");
}
