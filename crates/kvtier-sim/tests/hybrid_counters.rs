//! The hybrid workloads (HYBRID-WORKLOADS.md): under the reference-compatible policy,
//! kvtier reproduces the reference scheduler's counters and its decision and page
//! digests exactly (§3), on every path; the default policy, which fixes the defects of
//! §4, gains on the same workloads.
//!
//! The digests pin every scheduling decision, every state slot and every page id of
//! every plan: a single different choice anywhere changes them. `tools/reference/`
//! drives the reference's own module (`tokenspeed-scheduler==0.1.0`) through the same
//! workloads, plan by plan, to find where a change diverges.

use kvtier_sim::Path;
use kvtier_sim::hybrid::{HybridOptions, HybridReport, HybridVariant, run_hybrid};
use kvtier_types::Policy;

const PATHS: [Path; 4] = [
    Path::Core,
    Path::Actors,
    Path::ActorsThreaded,
    Path::Deterministic,
];

fn run(variant: HybridVariant, policy: Policy, path: Path) -> HybridReport {
    let options = HybridOptions {
        path,
        policy,
        ..HybridOptions::new(variant)
    };
    run_hybrid(&options).expect("the workload runs")
}

#[test]
fn h1_main_reproduces_the_reference_on_every_path() {
    for path in PATHS {
        let r = run(HybridVariant::H1Main, Policy::Reference, path);
        let c = &r.counters;
        let p = path.name();
        assert_eq!((c.steps, c.flush_plans), (1734, 2), "{p}");
        assert_eq!((c.finished, c.aborted), (192, 0), "{p}");
        assert_eq!(
            (c.prefill_rows, c.later_chunks, c.decode_rows),
            (205, 13, 19_008),
            "{p}"
        );
        assert_eq!((c.prefill_tokens, c.decode_tokens), (92_352, 19_008), "{p}");
        assert_eq!(c.prompt_tokens, 374_400, "{p}");
        assert_eq!(
            (c.hit_tokens, c.device_hit_tokens, c.host_hit_tokens),
            (282_048, 237_888, 44_160),
            "{p}"
        );
        assert_eq!(
            (c.writeback_ops, c.writeback_kv_pages, c.writeback_mamba),
            (192, 1942, 280),
            "{p}"
        );
        assert_eq!(
            (c.loadback_ops, c.loadback_kv_pages, c.loadback_mamba),
            (66, 690, 66),
            "{p}"
        );
        assert_eq!(c.min_device_free_pages, 1, "{p}");
        assert_eq!(r.digest, "1669394b7195a42a", "{p}: the decision digest");
        assert_eq!(r.digest_pages, "c9eee6c66004b3e4", "{p}: the page digest");
    }
}

#[test]
fn h1_without_host_tier_reproduces_the_reference() {
    for path in [Path::Core, Path::Deterministic] {
        let r = run(HybridVariant::H1NoL2, Policy::Reference, path);
        let p = path.name();
        assert_eq!((r.counters.steps, r.counters.finished), (1518, 192), "{p}");
        assert_eq!(r.digest, "73955ebdf54fe931", "{p}: the decision digest");
        assert_eq!(r.digest_pages, "2dbf2b3342b00f6b", "{p}: the page digest");
    }
}

#[test]
fn h3_reproduces_the_reference_on_every_path() {
    for path in PATHS {
        let r = run(HybridVariant::H3Main, Policy::Reference, path);
        let c = &r.counters;
        let p = path.name();
        assert_eq!((c.steps, c.flush_plans), (141, 2), "{p}");
        assert_eq!(
            (c.finished, c.aborted),
            (7, 1),
            "{p}: one request loses its state"
        );
        assert_eq!((c.decode_rows, c.decode_tokens), (553, 553), "{p}");
        assert_eq!(
            (c.writeback_ops, c.writeback_kv_pages, c.writeback_mamba),
            (8, 39, 7),
            "{p}"
        );
        assert_eq!(
            (
                c.retract_writeback_ops,
                c.retract_writeback_kv_pages,
                c.retract_writeback_mamba
            ),
            (1, 4, 0),
            "{p}: the retract write-back carries no state"
        );
        assert_eq!(r.digest, "7c98a25036a417c2", "{p}: the decision digest");
        assert_eq!(r.digest_pages, "e3c89a24be039d73", "{p}: the page digest");
    }
}

/// The default policy caches decode-phase states (§4.2), keeps only the states a plan
/// reads from eviction, and restores or recomputes a retracted request instead of
/// losing it (§4.5): more prompt tokens reused in fewer steps, and no abort.
#[test]
fn the_default_policy_gains_on_the_same_workloads() {
    for variant in [HybridVariant::H1Main, HybridVariant::H1NoL2] {
        let reference = run(variant, Policy::Reference, Path::Core);
        let default = run(variant, Policy::Default, Path::Core);
        let (r, d) = (&reference.counters, &default.counters);
        let v = variant.name();
        assert_eq!(d.finished, 192, "{v}");
        assert!(
            d.hit_tokens > r.hit_tokens,
            "{v}: hits {} ≤ {}",
            d.hit_tokens,
            r.hit_tokens
        );
        assert!(d.steps < r.steps, "{v}: steps {} ≥ {}", d.steps, r.steps);
    }
    let reference = run(HybridVariant::H3Main, Policy::Reference, Path::Core);
    let default = run(HybridVariant::H3Main, Policy::Default, Path::Core);
    assert_eq!(reference.counters.aborted, 1);
    assert_eq!(
        (default.counters.finished, default.counters.aborted),
        (8, 0),
        "no request loses its state"
    );
    assert!(default.counters.steps < reference.counters.steps);
}

#[test]
fn the_default_policy_is_the_same_on_every_path() {
    let runs: Vec<HybridReport> = PATHS
        .iter()
        .map(|&path| run(HybridVariant::H1Main, Policy::Default, path))
        .collect();
    for r in &runs[1..] {
        assert_eq!(
            r.digest_pages, runs[0].digest_pages,
            "{} against core",
            r.path
        );
        assert_eq!(r.counters, runs[0].counters, "{} against core", r.path);
    }
}

/// H2 (DeepSeek-V4's groups at production pool sizes, no host tier) under kvtier's
/// default policy: every path makes the same decisions; every turn finishes (the
/// reference aborts one: its state pools fill with snapshots and the retraction that
/// follows has no host tier), with more hit tokens than the reference's 333,056; no
/// group pool ever refuses an allocation the admission let through.
#[test]
fn h2_default_policy_finishes_every_turn_on_every_path() {
    let mut digests = Vec::new();
    for path in [Path::Core, Path::Actors, Path::Deterministic] {
        let r = run(HybridVariant::H2Main, Policy::Default, path);
        let c = &r.counters;
        let p = path.name();
        assert_eq!((c.finished, c.aborted), (64, 0), "{p}");
        assert_eq!(c.prompt_tokens, 451_200, "{p}");
        assert!(c.hit_tokens > 333_056, "{p}: {}", c.hit_tokens);
        assert_eq!(c.host_hit_tokens, 0, "{p}: V4 has no host tier");
        assert_eq!(r.groups.len(), 6, "{p}");
        for (id, g) in &r.groups {
            assert_eq!(g.failed_alloc, 0, "{p}: group {id}");
        }
        let paged = r.paged.as_ref().expect("paged counters");
        assert!(
            paged.snapshots_created > 0 && paged.snapshots_adopted > 0,
            "{p}"
        );
        // Only snapshots hold group pages once every request is gone.
        assert_eq!(paged.tables_end, 0, "{p}");
        digests.push(r.digest.clone());
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
}

/// H2 under the reference-compatible policy (the reference's chunk commits at the
/// admission of the request's next op, its decode ops one position on, history-only
/// required groups, no #460 detach, the abort of a retraction without host room):
/// HYBRID-WORKLOADS.md §3's counters and decision digest, on every path.
#[test]
fn h2_main_reproduces_the_reference_decisions_on_every_path() {
    for path in [Path::Core, Path::Actors, Path::Deterministic] {
        let r = run(HybridVariant::H2Main, Policy::Reference, path);
        let c = &r.counters;
        let p = path.name();
        assert_eq!((c.steps, c.flush_plans), (3257, 1), "{p}");
        assert_eq!((c.finished, c.aborted), (63, 1), "{p}");
        assert_eq!(
            (c.prefill_rows, c.later_chunks, c.decode_rows),
            (85, 21, 12_700),
            "{p}"
        );
        assert_eq!(
            (c.prefill_tokens, c.decode_tokens),
            (117_644, 12_700),
            "{p}"
        );
        assert_eq!((c.prompt_tokens, c.hit_tokens), (450_700, 333_056), "{p}");
        assert_eq!((c.writeback_ops, c.loadback_ops), (0, 0), "{p}");
        let s = r.paged.as_ref().expect("paged counters");
        assert_eq!(
            (s.terminal_continuations, s.prune_state_only, s.prune_full),
            (147, 117, 0),
            "{p}"
        );
        assert_eq!(s.admission_denied, 14_918, "{p}");
        assert_eq!(r.digest, "ad59cf276e146654", "{p}: the decision digest");
    }
}

/// The PyPI wheel `tokenspeed-scheduler==0.1.0` is a later build than the one §3
/// measured (docs/paged.md): through `tools/reference/hybrid_workloads.py h2-main` it
/// gives 1,853 steps, 62 finished and 2 aborted, decision digest `0d2336fa22f25cc1`.
/// `Policy::ReferenceWheel` (#460's detach by the wheel's rule) reproduces that run,
/// and H1 and H3, where the two builds agree, as `Policy::Reference` does. The Python
/// test `test_hybrid_workloads.py` compares the same runs against the wheel itself.
#[test]
fn the_wheels_build_reproduces_its_own_h2_run_on_every_path() {
    for path in [Path::Core, Path::Actors, Path::Deterministic] {
        let r = run(HybridVariant::H2Main, Policy::ReferenceWheel, path);
        let c = &r.counters;
        let p = path.name();
        assert_eq!((c.steps, c.flush_plans), (1853, 1), "{p}");
        assert_eq!((c.finished, c.aborted), (62, 2), "{p}");
        assert_eq!(r.digest, "0d2336fa22f25cc1", "{p}: the decision digest");
        let s = r.paged.as_ref().expect("paged counters");
        assert!(s.stale_state_detached > 0, "{p}: the detach ran");
    }
    for (variant, digest) in [
        (HybridVariant::H1Main, "1669394b7195a42a"),
        (HybridVariant::H3Main, "7c98a25036a417c2"),
    ] {
        let r = run(variant, Policy::ReferenceWheel, Path::Core);
        assert_eq!(r.digest, digest, "{}", variant.name());
    }
}
