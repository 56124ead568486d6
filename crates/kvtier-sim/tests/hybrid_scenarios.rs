//! The scenarios on a Mamba-hybrid model: every row's recurrent state is checked by the
//! reference engine, and reuse must never change an answer — the cache on gives the
//! tokens of the cache off, with zero integrity errors, on every path.

use kvtier_sim::Path;
use kvtier_sim::scenario::{Model, Scenario, ScenarioOptions, ScenarioReport, run_scenario};

fn hybrid(scenario: Scenario, cache: bool, path: Path) -> ScenarioReport {
    let options = ScenarioOptions {
        model: Model::MambaHybrid,
        cache,
        path,
        ..ScenarioOptions::new(scenario)
    };
    run_scenario(&options).expect("the scenario runs")
}

fn clean(r: &ScenarioReport, what: &str) {
    assert_eq!(
        r.integrity_errors, 0,
        "{what}: first errors {:?}",
        r.first_errors
    );
    assert_eq!(r.finished, r.requests, "{what}: every request answered");
}

#[test]
fn hybrid_chat_answers_as_without_the_cache() {
    let off = hybrid(Scenario::Chat, false, Path::Core);
    clean(&off, "chat, cache off");
    for path in [Path::Core, Path::Deterministic, Path::Actors] {
        let on = hybrid(Scenario::Chat, true, path);
        clean(&on, "chat, cache on");
        assert_eq!(on.output_digest, off.output_digest, "{}", path.name());
        assert_eq!(on.outputs, off.outputs, "{}", path.name());
        // Follow-up turns resume from the state cached at the end of the last answer.
        assert!(on.hit_tokens > 0, "{}: no reuse", path.name());
        assert_eq!(on.hit_tokens, on.ideal_hit_tokens, "{}", path.name());
    }
}

#[test]
fn hybrid_rollout_and_longdoc_answer_as_without_the_cache() {
    for scenario in [Scenario::Rollout, Scenario::Longdoc] {
        let off = hybrid(scenario, false, Path::Core);
        let on = hybrid(scenario, true, Path::Core);
        clean(&off, scenario.name());
        clean(&on, scenario.name());
        assert_eq!(on.outputs, off.outputs, "{}", scenario.name());
    }
}

/// A hybrid model's answers are the dense model's: the reference engine's tokens depend
/// on the recurrent state only through how wrong it is.
#[test]
fn a_right_state_changes_no_answer() {
    let dense = run_scenario(&ScenarioOptions {
        path: Path::Core,
        ..ScenarioOptions::new(Scenario::Chat)
    })
    .expect("dense chat runs");
    let hybrid = hybrid(Scenario::Chat, true, Path::Core);
    assert_eq!(hybrid.output_digest, dense.output_digest);
    assert_eq!(hybrid.model, "mamba-hybrid");
    assert_eq!(dense.model, "dense");
}
