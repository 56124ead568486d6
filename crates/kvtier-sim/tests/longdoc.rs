//! The `longdoc` scenario through the whole actor system with the embedded L3 store:
//! documents leave device and host, come back from L3, and every answer equals a run
//! with caching off. Failures of the store (down, objects lost between lookup and get,
//! corrupt files on disk) are misses: the request computes its pages, answers stay right.

mod common;

use common::{
    assert_later_questions_came_from_l3, cache_off, checked, corrupt_new_objects,
    longdoc as options, run_checked as run,
};
use kvtier_sim::Path;
use kvtier_sim::scenario::{L3Fault, L3Store, ScenarioOptions, run_scenario_with};

#[test]
fn documents_come_back_from_l3_with_the_answers_of_a_run_without_cache() {
    let off = cache_off();
    assert_eq!((off.l3.as_str(), off.hit_tokens), ("off", 0));
    let on = run(&options());
    assert_eq!(on.l3, "local");
    assert_later_questions_came_from_l3(&on, &off);
    // Gone from device and host by then: L3 only.
    assert_eq!(on.l3_prefetched_bytes, on.l3_prefetched_pages * 512);
    assert_eq!(
        on.hit_tokens, on.hit_tokens_l3,
        "no hit came from device or host"
    );
    assert!(on.l3_lookup_hit_pages >= on.l3_prefetched_pages);
    assert!(on.l3_backup_ops > 0);
    assert!(on.prompt_tokens - on.hit_tokens < off.prompt_tokens / 2);
    assert!(
        on.virtual_s < off.virtual_s,
        "reuse from L3 is faster than recomputing"
    );
}

#[test]
fn longdoc_is_identical_on_every_path() {
    let base = run(&options());
    for path in [Path::Core, Path::Deterministic, Path::ActorsThreaded] {
        let r = run(&ScenarioOptions { path, ..options() });
        assert_eq!(r.outputs, base.outputs, "{}", path.name());
        // The scheduler's hit counters (the metrics' source) agree with what the
        // replay counted from the plans, tier by tier.
        assert!(r.hit_tokens_l3 > 0);
        assert_eq!(
            r.scheduler_hit_tokens,
            [r.hit_tokens, r.hit_tokens_host, r.hit_tokens_l3],
            "{}",
            path.name()
        );
        assert_eq!(
            (
                r.steps,
                r.hit_tokens_l3,
                r.l3_backed_up_pages,
                r.loadback_pages
            ),
            (
                base.steps,
                base.hit_tokens_l3,
                base.l3_backed_up_pages,
                base.loadback_pages
            ),
            "{}",
            path.name()
        );
    }
}

#[test]
fn a_store_that_is_down_or_loses_objects_gives_misses_never_wrong_kv() {
    let off = cache_off();
    let down = run(&ScenarioOptions {
        l3_fault: L3Fault::FailEveryNthGet(2),
        ..options()
    });
    assert_eq!(down.outputs, off.outputs);
    assert_eq!(down.l3_failed_prefetches, 4, "every second prefetch failed");
    assert_eq!(down.l3_prefetched_pages, 4 * 2048);
    let lossy = run(&ScenarioOptions {
        l3_fault: L3Fault::LoseHalfOfEveryNthGet(1),
        ..options()
    });
    assert_eq!(lossy.outputs, off.outputs);
    assert_eq!(lossy.l3_failed_prefetches, 0);
    assert!(
        lossy.l3_prefetched_pages > 0 && lossy.l3_prefetched_pages < 8 * 2048,
        "partial hits: {}",
        lossy.l3_prefetched_pages
    );
}

/// Backups that fail outright or part-way leave nothing in the store (a backup is all or
/// nothing), and lookups that fail find nothing: every later question recomputes its
/// document, and the answers are those of a run without cache.
#[test]
fn failed_backups_and_lookups_leave_nothing_to_serve() {
    let off = cache_off();
    for fault in [
        L3Fault::FailEveryNthPut(1),
        L3Fault::StoreHalfOfEveryNthPut(1),
        L3Fault::FailEveryNthLookup(1),
    ] {
        let r = run(&ScenarioOptions {
            l3_fault: fault,
            ..options()
        });
        assert_eq!(r.outputs, off.outputs, "{fault:?}");
        assert!(r.l3_backup_ops > 0, "{fault:?}: documents were backed up");
        assert_eq!(
            (r.l3_lookup_hit_pages, r.l3_prefetch_ops, r.hit_tokens_l3),
            (0, 0, 0),
            "{fault:?}: nothing came from L3"
        );
        match fault {
            L3Fault::FailEveryNthLookup(_) => {
                assert!(r.l3_lookup_errors > 0 && r.l3_failed_backups == 0, "{r:#?}");
            }
            _ => assert_eq!(
                r.l3_failed_backups, r.l3_backup_ops,
                "{fault:?}: every backup failed"
            ),
        }
    }
}

/// Objects corrupted on disk between their backup and their prefetch read as misses.
#[test]
fn corrupt_store_files_are_misses_never_wrong_kv() {
    let off = cache_off();
    let dir = tempfile::tempdir().expect("temp dir");
    let options = ScenarioOptions {
        l3_dir: Some(dir.path().to_path_buf()),
        // No memory tier to hide behind: every get reads the disk.
        l3_memory_bytes: 0,
        ..options()
    };
    // After each step, flip a byte in the middle of every object's payload that this
    // test has not corrupted yet (a page recomputed after its corrupt object was dropped
    // is put again, as a new record).
    let mut corrupted: std::collections::BTreeSet<(std::path::PathBuf, u64)> =
        std::collections::BTreeSet::new();
    let r = run_scenario_with(
        &options,
        |_, _| {},
        |_| corrupt_new_objects(dir.path(), &mut corrupted),
    )
    .expect("longdoc runs");
    assert!(!corrupted.is_empty(), "the test corrupted objects");
    let r = checked(r);
    assert_eq!(r.outputs, off.outputs);
    assert_eq!(r.hit_tokens_l3, 0, "no corrupt object was served as KV");
    assert!(r.l3_corrupt_objects > 0, "{r:#?}");
}

#[test]
fn without_l3_the_documents_are_recomputed() {
    let off = cache_off();
    let r = run(&ScenarioOptions {
        l3: L3Store::Off,
        ..options()
    });
    assert_eq!(r.outputs, off.outputs);
    assert_eq!(
        (r.l3.as_str(), r.hit_tokens_l3, r.l3_prefetch_ops),
        ("off", 0, 0)
    );
}

/// Mutation test of the oracle (see `oracle.rs`): a store that serves the wrong object
/// under a right key, its own checks passing, is caught where the row reads it — the
/// first page of the document, prefetched from L3 — and the answer changes; under full
/// and sampled verification.
#[test]
fn a_wrong_object_under_a_right_key_is_caught_by_the_oracle() {
    use kvtier_sim::oracle::{Provenance, Verify};
    use kvtier_types::Tier;
    let off = cache_off();
    for verify in [Verify::Full, Verify::Sampled(16)] {
        let r = kvtier_sim::scenario::run_scenario(&ScenarioOptions {
            verify,
            l3_fault: L3Fault::ServeWrongObjectOnEveryNthGet(1),
            ..options()
        })
        .expect("longdoc runs");
        let first = r.first_errors.first().expect("the oracle reports it");
        let wrong = first.wrong_kv().expect("a wrong slot");
        assert_eq!(
            (wrong.position, wrong.tier),
            (0, Tier::Device),
            "{verify:?}"
        );
        assert!(
            matches!(wrong.provenance, Provenance::Prefetched { .. }),
            "{verify:?}: {first:?}"
        );
        assert_ne!(
            r.outputs.get(&wrong.request),
            off.outputs.get(&wrong.request),
            "{verify:?}: the answer depends on the KV read"
        );
    }
}
