//! What the scenario tests share: a run of a model, the check every run passes, the
//! `longdoc` defaults, the cache-off run every answer is compared with, the cluster
//! tests' conversations, and the Mooncake cluster of the environment.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::sync::Arc;

use kvtier_l3::{MooncakeConfig, testing};
use kvtier_model::ModelKind;
use kvtier_sim::Path;
use kvtier_sim::oracle::Verify;
use kvtier_sim::scenario::{
    Scenario, ScenarioOptions, ScenarioReport, TraceWorkload, run_scenario,
};
use kvtier_sim::trace::{TraceSlice, parse_trace};

/// `scenario` on `model`, the cache on or off, through `path`.
pub fn run_model(model: ModelKind, scenario: Scenario, cache: bool, path: Path) -> ScenarioReport {
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

/// The Mooncake cluster the environment describes, or a loud skip (a failure under CI).
pub fn mooncake() -> Option<MooncakeConfig> {
    testing::cluster_from_env().expect("a Mooncake cluster under CI")
}

/// A model id no earlier run used (`what` and `test` name it): a master keeps objects
/// between runs.
pub fn fresh_model(what: &str, test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{what}-{test}-{}-{nanos}", std::process::id())
}

/// `conversations` conversations of `turns` turns in a trace of the Mooncake format:
/// turn `t` of a conversation repeats its earlier blocks and adds one (512 tokens),
/// turns interleaved over the conversations two seconds apart. With 13 conversations
/// round-robin sends a conversation's turns to different instances of three.
pub fn conversations(conversations: u64, turns: u64) -> ScenarioOptions {
    let mut lines = Vec::new();
    for t in 0..turns {
        for c in 0..conversations {
            let blocks: Vec<String> = (0..=t).map(|b| (c * 100 + b).to_string()).collect();
            lines.push(format!(
                r#"{{"timestamp": {}, "input_length": {}, "output_length": 8, "hash_ids": [{}]}}"#,
                (t * conversations + c) * 2000,
                512 * (t + 1) - 100,
                blocks.join(", ")
            ));
        }
    }
    let requests = parse_trace(&lines.join("\n"), &TraceSlice::default()).expect("a valid trace");
    ScenarioOptions {
        // Device and host hold about four conversations of one instance.
        device_pages: Some(257),
        host_pages: Some(513),
        verify: Verify::Full,
        ..ScenarioOptions::shared_trace(Arc::new(TraceWorkload {
            name: "conversations".into(),
            requests,
            time_scale: 1.0,
        }))
    }
}
