//! What the `longdoc` tests share: the default options, a checked run, and the cache-off
//! run every answer is compared with.

use kvtier_sim::scenario::{Scenario, ScenarioOptions, ScenarioReport, run_scenario};

/// `longdoc` on its defaults (the embedded L3 store).
pub fn longdoc() -> ScenarioOptions {
    ScenarioOptions::new(Scenario::Longdoc)
}

/// Asserts that a run read no wrong KV and answered every question.
pub fn checked(r: ScenarioReport) -> ScenarioReport {
    assert_eq!(r.integrity_errors, 0, "{:?}", r.first_errors);
    assert_eq!(r.finished, r.requests, "every question is answered");
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
