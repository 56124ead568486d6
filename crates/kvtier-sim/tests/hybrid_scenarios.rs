//! The scenarios on a Mamba-hybrid model: every row's recurrent state is checked by the
//! oracle engine, and reuse must never change an answer — the cache on gives the
//! tokens of the cache off, with zero integrity errors, on every path.

mod common;

use common::{clean, run_model};
use kvtier_model::ModelKind;
use kvtier_sim::Path;
use kvtier_sim::scenario::{Scenario, ScenarioOptions, run_scenario};

fn hybrid(scenario: Scenario, cache: bool, path: Path) -> kvtier_sim::scenario::ScenarioReport {
    run_model(ModelKind::MambaHybrid, scenario, cache, path)
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

/// A hybrid model's answers are the dense model's: the oracle engine's tokens depend
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

/// Failed copies of states are misses, never wrong state: a state write-back that fails
/// leaves no host copy (and the device copy stays), a state load-back that fails voids
/// the rows that copied it and their requests run again.
#[test]
fn failed_state_copies_become_misses_never_wrong_state() {
    let off = hybrid(Scenario::Chat, false, Path::Core);
    for (write_backs, load_backs) in [(2, 0), (0, 2), (3, 3)] {
        let options = ScenarioOptions {
            model: ModelKind::MambaHybrid,
            fail_every_nth_write_back: write_backs,
            fail_every_nth_load_back: load_backs,
            path: Path::Core,
            ..ScenarioOptions::new(Scenario::Chat)
        };
        let r = run_scenario(&options).expect("chat runs");
        let what = format!("every {write_backs}th write-back, every {load_backs}th load-back");
        clean(&r, &what);
        assert_eq!(r.outputs, off.outputs, "{what}");
        if write_backs > 0 {
            assert!(r.failed_write_backs > 0, "{what}: no write-back failed");
        }
        if load_backs > 0 {
            assert!(r.failed_load_backs > 0, "{what}: no load-back failed");
            assert!(r.void_rows > 0, "{what}: no row read a failed load-back");
        }
    }
}
