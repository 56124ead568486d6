//! What the scenario tests share: a run of a model, the check every run passes, the
//! `longdoc` defaults, and the cache-off run every answer is compared with.

// Each test binary uses part of this module.
#![allow(dead_code)]

use kvtier_sim::Path;
use kvtier_sim::scenario::{Model, Scenario, ScenarioOptions, ScenarioReport, run_scenario};

/// `scenario` on `model`, the cache on or off, through `path`.
pub fn run_model(model: Model, scenario: Scenario, cache: bool, path: Path) -> ScenarioReport {
    let options = ScenarioOptions {
        model,
        cache,
        path,
        ..ScenarioOptions::new(scenario)
    };
    run_scenario(&options).expect("the scenario runs")
}

/// Asserts that a run read no wrong KV and answered every request (`what` names it).
pub fn clean(r: &ScenarioReport, what: &str) {
    assert_eq!(
        r.integrity_errors, 0,
        "{what}: first errors {:?}",
        r.first_errors
    );
    assert_eq!(r.finished, r.requests, "{what}: every request answered");
}

/// `longdoc` on its defaults (the embedded L3 store).
pub fn longdoc() -> ScenarioOptions {
    ScenarioOptions::new(Scenario::Longdoc)
}

/// Asserts that a run read no wrong KV and answered every question.
pub fn checked(r: ScenarioReport) -> ScenarioReport {
    clean(&r, "");
    r
}

/// Runs `options` and checks the run.
pub fn run_checked(options: &ScenarioOptions) -> ScenarioReport {
    checked(run_scenario(options).expect("longdoc runs"))
}

/// `longdoc` without prefix cache, host tier or L3: the answers every other run must give.
pub fn cache_off() -> ScenarioReport {
    run_checked(&ScenarioOptions {
        cache: false,
        ..longdoc()
    })
}

/// Asserts that `on` answered as the cache-off run `off` did, and that every question
/// after the first of its document (4 documents × 3 questions, round-robin) found the
/// whole document in L3, every page of it backed up first.
pub fn assert_later_questions_came_from_l3(on: &ScenarioReport, off: &ScenarioReport) {
    assert_eq!(
        on.outputs, off.outputs,
        "answers differ from the cache-off run"
    );
    assert_eq!(on.l3_prefetch_ops, 8, "{on:#?}");
    assert_eq!(on.l3_prefetched_pages, 8 * 2048);
    assert_eq!(on.hit_tokens_l3, 8 * 32_768);
    assert_eq!(on.l3_failed_prefetches, 0);
    assert!(on.l3_backed_up_pages >= 4 * 2048);
    assert_eq!(on.l3_backed_up_bytes, on.l3_backed_up_pages * 512);
}

/// Flips a byte in the middle of the payload of every object in the local store at `dir`
/// that is not in `corrupted` yet, and adds it there (a page recomputed after its corrupt
/// object was dropped is put again, as a new record). Each segment file is read and
/// written once.
pub fn corrupt_new_objects(
    dir: &std::path::Path,
    corrupted: &mut std::collections::BTreeSet<(std::path::PathBuf, u64)>,
) {
    let mut by_segment: std::collections::BTreeMap<std::path::PathBuf, Vec<u64>> =
        std::collections::BTreeMap::new();
    for (path, payload) in kvtier_l3::payload_extents(dir).expect("store segments") {
        if corrupted.insert((path.clone(), payload.start)) {
            by_segment
                .entry(path)
                .or_default()
                .push((payload.start + payload.end) / 2);
        }
    }
    for (path, middles) in by_segment {
        let Ok(mut bytes) = std::fs::read(&path) else {
            continue;
        };
        for mid in middles {
            bytes[mid as usize] ^= 0x5a;
        }
        std::fs::write(&path, &bytes).expect("rewrite segment");
    }
}
