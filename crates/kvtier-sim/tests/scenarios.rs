//! The oracle engine's integrity oracle on the scenario workloads: cache reuse never
//! changes an answer, and failures become misses (the oracle's own mutation tests are in
//! `oracle.rs`). The seeded campaign (docs/campaign.md) runs here too: a CI-sized range of
//! seeds, the seeds that once failed, and a planted store bug it must catch.

use kvtier_sim::campaign::{
    CampaignOptions, Check, FaultKind, FaultRates, RunSpec, run_campaign, run_seed, run_spec,
};
use kvtier_sim::scenario::{Scenario, ScenarioOptions, ScenarioReport, run_scenario};

fn run(scenario: Scenario, cache: bool, publish: bool) -> kvtier_sim::scenario::ScenarioReport {
    let options = ScenarioOptions {
        cache,
        publish,
        ..ScenarioOptions::new(scenario)
    };
    run_scenario(&options).expect("scenario runs")
}

/// Each scenario with the prefix cache and host tier on, and off: the same tokens for
/// every request, and no integrity error in either run.
#[test]
fn cache_on_and_off_generate_identical_tokens() {
    for scenario in [Scenario::Chat, Scenario::Rollout] {
        let on = run(scenario, true, true);
        let off = run(scenario, false, false);
        assert_eq!(
            on.integrity_errors, 0,
            "{}: {:?}",
            on.workload, on.first_errors
        );
        assert_eq!(
            off.integrity_errors, 0,
            "{}: {:?}",
            off.workload, off.first_errors
        );
        assert!(on.hit_tokens > 0, "{}: the cache was used", on.workload);
        assert_eq!(off.hit_tokens, 0);
        assert_eq!(on.finished, on.requests);
        assert_eq!(on.outputs, off.outputs, "{}: answers differ", on.workload);
    }
}

#[test]
fn chat_exercises_the_host_tier() {
    let r = run(Scenario::Chat, true, true);
    assert!(r.hit_tokens_host > 0 && r.writeback_ops > 0 && r.loadback_ops > 0);
}

/// With mid-flight publication, rollout siblings reuse the prefix their first samples
/// computed: at least 90 % of the ideal bound. Without it they reuse nothing.
#[test]
fn rollout_hits_at_least_ninety_percent_of_the_bound() {
    let on = run(Scenario::Rollout, true, true);
    assert!(on.ideal_hit_tokens > 0);
    assert!(
        on.hit_tokens * 10 >= on.ideal_hit_tokens * 9,
        "{} of {} ideal",
        on.hit_tokens,
        on.ideal_hit_tokens
    );
    let off = run(Scenario::Rollout, true, false);
    assert!(off.hit_tokens < on.hit_tokens);
}

/// Runs `scenario` with `faults` set and checks that the faults were injected
/// (`injected` says how often, and why that is enough), the oracle found nothing, and the
/// answers equal the cache-off run's. The scenario also checks at shutdown that every
/// page is free or cached: nothing leaked.
fn faults_become_misses(
    scenario: Scenario,
    faults: impl FnOnce(&mut ScenarioOptions),
    injected: impl FnOnce(&ScenarioReport) -> Result<(), String>,
) {
    let mut options = ScenarioOptions::new(scenario);
    faults(&mut options);
    let faulty = run_scenario(&options).expect("scenario runs");
    let off = run(scenario, false, false);
    if let Err(why) = injected(&faulty) {
        panic!("{}: {why}", faulty.workload);
    }
    assert_eq!(
        faulty.integrity_errors, 0,
        "{}: {:?}",
        faulty.workload, faulty.first_errors
    );
    assert_eq!(
        faulty.outputs, off.outputs,
        "{}: answers differ",
        faulty.workload
    );
}

/// Failed write-back copies: the host pages never received the KV, so the scheduler must
/// treat them as a miss. Answers equal the cache-off run and the oracle finds nothing.
#[test]
fn failed_write_backs_become_misses_never_wrong_kv() {
    for scenario in [Scenario::Chat, Scenario::Rollout] {
        faults_become_misses(
            scenario,
            |o| o.fail_every_nth_write_back = 2,
            |r| match r.failed_write_backs {
                0 => Err("no write-back failed".into()),
                _ => Ok(()),
            },
        );
    }
}

/// Failed load-back copies (half the pages copied, then the op fails): the device
/// pages hold no valid KV, so the rows that would read them are void and their requests
/// run again as misses. The oracle would find wrong KV had a row read a failed page or
/// had the cache kept the failed device copy for a later match.
#[test]
fn failed_load_backs_become_misses_never_wrong_kv() {
    for scenario in [Scenario::Chat, Scenario::Longdoc] {
        faults_become_misses(
            scenario,
            |o| o.fail_every_nth_load_back = 2,
            |r| match (r.failed_load_backs, r.void_rows) {
                (0, _) | (_, 0) => Err(format!(
                    "{} load-backs failed, {} rows voided",
                    r.failed_load_backs, r.void_rows
                )),
                _ => Ok(()),
            },
        );
    }
}

/// The virtual clock: reusing the cache makes first tokens come sooner, and the figures
/// are consistent with the cost model.
#[test]
fn virtual_clock_reports_ttft_tpot_and_throughput() {
    let on = run(Scenario::Chat, true, true);
    let off = run(Scenario::Chat, false, false);
    for r in [&on, &off] {
        assert!(r.virtual_s > 0.0 && r.ttft_mean_ms > 0.0 && r.tpot_mean_ms > 0.0);
        let expected = r.generated_tokens as f64 / r.virtual_s;
        assert!((r.throughput_tokens_per_s - expected).abs() < 1e-6 * expected);
    }
    assert!(
        on.ttft_mean_ms < off.ttft_mean_ms,
        "{} vs {}",
        on.ttft_mean_ms,
        off.ttft_mean_ms
    );
    use kvtier_sim::scenario::{CostModel, StepWork};
    let model = CostModel::default();
    let cost = |prefill_tokens, loaded_tokens, prefetched_tokens| {
        model.step_cost(StepWork {
            prefill_tokens,
            decode_rows: 0,
            loaded_tokens,
            prefetched_tokens,
        })
    };
    assert!(cost(10, 0, 0) < cost(20, 0, 0));
    assert!(cost(0, 0, 0) < cost(0, 64, 0));
    assert!(cost(0, 0, 0) < cost(0, 0, 64));
    // L3 is slower than the host link: the same tokens cost more from L3.
    assert!(cost(0, 64, 0) < cost(0, 0, 64));
}

/// The replay through the actor system (actix on this thread, on its own thread, and the
/// deterministic runtime) gives the direct path's answers and counters exactly.
#[test]
fn scenarios_are_identical_on_every_path() {
    use kvtier_sim::Path;
    for scenario in [Scenario::Chat, Scenario::Rollout] {
        let run = |path| {
            let options = ScenarioOptions {
                path,
                fail_every_nth_write_back: 3,
                fail_every_nth_load_back: 4,
                ..ScenarioOptions::new(scenario)
            };
            run_scenario(&options).expect("scenario runs")
        };
        let core = run(Path::Core);
        assert_eq!(core.integrity_errors, 0);
        for path in [Path::Actors, Path::ActorsThreaded, Path::Deterministic] {
            let other = run(path);
            assert_eq!(other.outputs, core.outputs, "{scenario:?} on {path:?}");
            let counters = |r: &kvtier_sim::scenario::ScenarioReport| {
                (
                    r.steps,
                    r.hit_tokens,
                    r.writeback_pages,
                    r.loadback_pages,
                    r.failed_write_backs,
                    r.failed_load_backs,
                    r.void_rows,
                    r.moved_bytes,
                    r.integrity_errors,
                )
            };
            assert_eq!(
                counters(&other),
                counters(&core),
                "{scenario:?} on {path:?}"
            );
        }
    }
}

// ----- the seeded campaign ------------------------------------------------------------

/// Seeds whose runs failed (shrunk reproductions: `kvtier campaign --from SEED --seeds 1`),
/// all fixed (docs/campaign.md#bugs-found): 1064, a device copy left below a failed
/// load-back's discarded one (bug D); 9069, a host copy orphaned by a write-back
/// rollback (bug C); 21788 and 78329, a request requeued to recompute that outgrew the
/// device pool (bug A); 87256 and 93004, a failed write-back's shared pairs read as
/// written (bug B); 8561, the valid specs' L3 lookups of a batch with a refused one not
/// settled before the next plan (issue 13).
const REGRESSION_SEEDS: &[u64] = &[1064, 8561, 9069, 21788, 78329, 87256, 93004];

/// Those of `REGRESSION_SEEDS` that still fail because their scheduler bug is open, with
/// the check they fail (docs/campaign.md#bugs-found). A fixed bug makes its seeds pass:
/// the regression test then says so, and they leave this list.
const OPEN_BUGS: &[(u64, Check, &str)] = &[];

/// The CI-sized campaign: seeds `0..CI_SEEDS`.
const CI_SEEDS: u64 = 1000;

/// Every seed of the CI range passes every check (or fails as its open bug says), and the
/// range reaches every path and fault the campaign is there to exercise.
#[test]
fn a_ci_sized_campaign_passes_and_reaches_every_path() {
    let report = run_campaign(
        &CampaignOptions {
            from: 0,
            seeds: CI_SEEDS,
            jobs: 1,
            shrink_budget: kvtier_sim::campaign::SHRINK_BUDGET,
        },
        |_, _| {},
    );
    assert_eq!(report.errors.len(), 0, "{:?}", report.errors);
    for failure in &report.failures {
        let open = OPEN_BUGS
            .iter()
            .find(|(seed, check, _)| *seed == failure.seed && *check == failure.failure.check);
        assert!(
            open.is_some(),
            "seed {} failed: {}\nshrunk: {}\n{}",
            failure.seed,
            failure.failure,
            failure.shrunk_failure,
            failure.shrunk_spec
        );
    }
    let unreached: Vec<&str> = report
        .coverage
        .iter()
        .filter(|row| row.runs == 0)
        .map(|row| row.metric.as_str())
        .collect();
    assert!(unreached.is_empty(), "never reached: {unreached:?}");
}

/// Every seed that once failed passes, but for the open bugs, which fail as recorded.
#[test]
fn the_seeds_that_once_failed_pass_unless_their_bug_is_open() {
    for &seed in REGRESSION_SEEDS {
        let failure = run_seed(seed).expect("the seed runs").failure;
        match OPEN_BUGS.iter().find(|(open, _, _)| *open == seed) {
            Some(&(_, check, bug)) => assert_eq!(
                failure.as_ref().map(|f| f.check),
                Some(check),
                "seed {seed} no longer fails as bug {bug} did: fixed? Then take it off \
                 OPEN_BUGS. {failure:?}"
            ),
            None => assert_eq!(failure, None, "seed {seed}"),
        }
    }
    assert!(
        OPEN_BUGS
            .iter()
            .all(|(seed, _, _)| REGRESSION_SEEDS.contains(seed)),
        "every open bug's seed is a regression seed"
    );
}

/// The campaign fails closed: a store that serves another page's bytes under a key (its
/// own checks passing) is caught by the oracle, and the shrunk spec still shows it.
#[test]
fn a_store_serving_wrong_objects_fails_the_campaign() {
    let planted = |seed| {
        let mut spec = RunSpec::draw(seed);
        spec.faults = FaultRates(
            [(FaultKind::L3ServesWrongObject, 1000)]
                .into_iter()
                .collect(),
        );
        spec
    };
    // The first L3 seed the planted bug fires in (it needs a get of two pages or more).
    let (seed, spec, failure) = (0..300)
        .filter(|&seed| RunSpec::draw(seed).l3.is_some())
        .find_map(|seed| {
            let spec = planted(seed);
            let failure = run_spec(&spec).expect("the spec runs").failure?;
            Some((seed, spec, failure))
        })
        .expect("the planted bug is found");
    assert_eq!(failure.check, Check::Integrity, "seed {seed}: {failure}");
    assert!(failure.detail.contains("Prefetched"), "{failure}");
    let (shrunk, shrunk_failure, _) = kvtier_sim::campaign::shrink(&spec, &failure, 50);
    assert_eq!(shrunk_failure.check, Check::Integrity);
    assert!(
        shrunk.weight() < spec.weight(),
        "the shrinker found a smaller spec"
    );
}
