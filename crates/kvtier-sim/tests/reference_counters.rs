//! The deterministic counters of the reference scheduler (WORKLOADS.md §5), reproduced
//! exactly by the benchmark workloads at full size, on every path: the cores called in
//! place, the actors on the caller's thread and on their own, and the deterministic bus.
//! Every comparison is between two values that exist (an expected count, or a field
//! unwrapped first), so a missing counter fails rather than matching another missing one.

use kvtier_sim::{Path, Report, WorkloadKind, WorkloadOptions, run_workload};

const PATHS: [Path; 4] = [
    Path::Core,
    Path::Actors,
    Path::ActorsThreaded,
    Path::Deterministic,
];

fn run_on(path: Path, kind: WorkloadKind, page_size: u32, l2: bool, n: Option<usize>) -> Report {
    let options = WorkloadOptions {
        page_size,
        l2,
        requests: n,
        path,
        ..WorkloadOptions::new(kind)
    };
    run_workload(&options).expect("workload runs")
}

/// The workload on every path, each report with its path's name.
fn on_every_path(
    kind: WorkloadKind,
    page_size: u32,
    l2: bool,
    n: Option<usize>,
) -> Vec<(&'static str, Report)> {
    PATHS
        .iter()
        .map(|&path| (path.name(), run_on(path, kind, page_size, l2, n)))
        .collect()
}

/// A per-pass counter that must be there.
fn pass(value: Option<u64>, what: &str, path: &str) -> u64 {
    value.unwrap_or_else(|| panic!("{path}: the report has no {what}"))
}

#[test]
fn w1_page_64_matches_the_reference() {
    for (path, r) in on_every_path(WorkloadKind::W1, 64, false, None) {
        assert_eq!(r.pass1_hit_tokens, Some(10_035_200), "{path}");
        assert_eq!(r.pass1_steps, Some(676), "{path}");
        assert_eq!(r.pass1_prefill_rows, Some(10_025), "{path}");
        assert_eq!(r.pass1_non_first_chunks, Some(25), "{path}");
        assert_eq!(r.pass2_hit_tokens, Some(14_720_000), "{path}");
        assert_eq!(r.pass2_steps, Some(101), "{path}");
        assert_eq!(r.counters.finished, 20_000, "{path}");
        assert_eq!(r.counters.hit_tokens_host, 0, "{path}");
    }
}

#[test]
fn w1_page_16_matches_the_reference() {
    for (path, r) in on_every_path(WorkloadKind::W1, 16, false, None) {
        assert_eq!(r.pass1_hit_tokens, Some(10_035_200), "{path}: ratio 0.6533");
        assert_eq!(r.pass1_steps, Some(676), "{path}");
        assert_eq!(r.pass2_hit_tokens, Some(15_200_000), "{path}: ratio 0.9896");
        assert_eq!(r.pass2_steps, Some(51), "{path}");
    }
}

#[test]
fn w1_l2_matches_the_reference() {
    for (path, r) in on_every_path(WorkloadKind::W1, 64, true, None) {
        assert_eq!(r.pass1_writeback_ops, Some(10_000), "{path}");
        assert_eq!(r.pass1_writeback_pages, Some(83_200), "{path}");
        assert_eq!(r.pass1_loadback_ops, Some(9_800), "{path}");
        assert_eq!(r.pass1_loadback_pages, Some(156_800), "{path}");
        assert_eq!(r.pass1_steps, Some(677), "{path}");
        assert_eq!(
            pass(r.pass1_hit_tokens_host, "pass-1 host hits", path),
            pass(r.pass1_hit_tokens, "pass-1 hits", path),
            "{path}: all pass-1 hits are host-tier"
        );
        assert_eq!(r.pass2_loadback_ops, Some(10_000), "{path}");
        assert_eq!(r.pass2_loadback_pages, Some(73_200), "{path}");
        assert_eq!(r.pass2_hit_tokens_host, Some(4_684_800), "{path}");
        assert_eq!(
            pass(r.pass2_hit_tokens, "pass-2 hits", path) - 4_684_800,
            10_035_200,
            "{path}: device-tier"
        );
    }
}

#[test]
fn w2_matches_the_reference() {
    for (n, steps, prefill) in [(256, 576, 64), (1024, 768, 256)] {
        for (path, r) in on_every_path(WorkloadKind::W2, 64, false, Some(n)) {
            assert_eq!(r.counters.steps, steps, "{path} N={n}");
            assert_eq!(r.prefill_steps, Some(prefill), "{path} N={n}");
            assert_eq!(r.steady_steps, Some(509), "{path} N={n}");
            assert_eq!(r.counters.finished, n as u64, "{path} N={n}");
            assert_eq!(r.counters.starved_decode_slots, 0, "{path} N={n}");
        }
    }
}

/// W3's reference counters are held back on purpose; it must complete every turn, be
/// deterministic run to run, and count the same on every path.
#[test]
fn w3_completes_and_is_deterministic_on_every_path() {
    let again = run_on(Path::Core, WorkloadKind::W3, 64, false, None);
    for (path, r) in on_every_path(WorkloadKind::W3, 64, false, None) {
        assert_eq!(r.counters, again.counters, "{path}");
        assert_eq!(r.counters.finished + r.counters.aborts, 512, "{path}");
        assert!(
            r.counters.hit_tokens_host > 0,
            "{path}: the host tier serves hits under pressure"
        );
        assert!(
            r.counters.writeback_ops > 0 && r.counters.loadback_ops > 0,
            "{path}"
        );
    }
}

#[test]
fn bad_options_are_refused() {
    let bad = WorkloadOptions {
        requests: Some(150),
        ..WorkloadOptions::new(WorkloadKind::W1)
    };
    assert!(run_workload(&bad).is_err());
    let bad = WorkloadOptions {
        page_size: 0,
        ..WorkloadOptions::new(WorkloadKind::W2)
    };
    assert!(run_workload(&bad).is_err());
}

/// WORKLOADS.md §4's diagnostic run: with KV-cache events on, W3 makes exactly the same
/// decisions, and the device tier reports stored and removed blocks.
#[test]
fn w3_kv_events_change_no_decision() {
    let plain = run_on(Path::Core, WorkloadKind::W3, 64, false, None);
    let options = WorkloadOptions {
        kv_events: true,
        ..WorkloadOptions::new(WorkloadKind::W3)
    };
    let with_events = run_workload(&options).expect("workload runs");
    assert!(with_events.counters.kv_blocks_stored > 0);
    assert!(with_events.counters.kv_blocks_removed > 0);
    let mut c = with_events.counters.clone();
    (c.kv_blocks_stored, c.kv_blocks_removed) = (0, 0);
    assert_eq!(c, plain.counters);
}

/// The workload engine answers only requests it submitted: a row for any other request
/// (here one submitted behind its back) fails the step with the request named, instead
/// of being skipped.
#[test]
fn a_row_for_a_request_the_engine_does_not_know_fails_the_step() {
    use kvtier_sim::{StepDriver, WorkloadError, scheduler_on};
    use kvtier_types::{RequestId, RequestSpec, SchedulerConfig};
    let config = SchedulerConfig {
        page_size: 2,
        device_pages: 32,
        host_pages: 32,
        ..SchedulerConfig::default()
    };
    let system = scheduler_on(Path::Core, config.clone()).expect("system");
    let mut driver = StepDriver::new(system, &config);
    driver
        .submit(vec![(RequestSpec::new("known", vec![1, 2, 3]), vec![7])])
        .expect("submit");
    let out = driver.step().expect("the engine knows `known`");
    assert_eq!(out.finished, [RequestId::from("known")]);
    driver
        .scheduler
        .submit(vec![RequestSpec::new("stranger", vec![4, 5, 6])])
        .expect("submit behind the engine's back");
    match driver.step() {
        Err(WorkloadError::UnknownRow(id)) => assert_eq!(id, RequestId::from("stranger")),
        other => panic!("expected UnknownRow, got {other:?}"),
    }
}
