//! The deterministic counters of the reference scheduler (WORKLOADS.md §5), reproduced
//! exactly by the benchmark workloads.

use kvtier_sim::{Report, WorkloadKind, WorkloadOptions, run_workload};

fn run(kind: WorkloadKind, page_size: u32, l2: bool, requests: Option<usize>) -> Report {
    let options = WorkloadOptions {
        page_size,
        l2,
        requests,
        ..WorkloadOptions::new(kind)
    };
    run_workload(&options).expect("workload runs")
}

#[test]
fn w1_page_64_matches_the_reference() {
    let r = run(WorkloadKind::W1, 64, false, None);
    assert_eq!(r.pass1_hit_tokens, Some(10_035_200));
    assert_eq!(r.pass1_steps, Some(676));
    assert_eq!(r.pass1_prefill_rows, Some(10_025));
    assert_eq!(r.pass1_non_first_chunks, Some(25));
    assert_eq!(r.pass2_hit_tokens, Some(14_720_000));
    assert_eq!(r.pass2_steps, Some(101));
    assert_eq!(r.counters.finished, 20_000);
    assert_eq!(r.counters.hit_tokens_host, 0);
}

#[test]
fn w1_page_16_matches_the_reference() {
    let r = run(WorkloadKind::W1, 16, false, None);
    assert_eq!(r.pass1_hit_tokens, Some(10_035_200), "ratio 0.6533");
    assert_eq!(r.pass1_steps, Some(676));
    assert_eq!(r.pass2_hit_tokens, Some(15_200_000), "ratio 0.9896");
    assert_eq!(r.pass2_steps, Some(51));
}

#[test]
fn w1_l2_matches_the_reference() {
    let r = run(WorkloadKind::W1, 64, true, None);
    assert_eq!(r.pass1_writeback_ops, Some(10_000));
    assert_eq!(r.pass1_writeback_pages, Some(83_200));
    assert_eq!(r.pass1_loadback_ops, Some(9_800));
    assert_eq!(r.pass1_loadback_pages, Some(156_800));
    assert_eq!(r.pass1_steps, Some(677));
    assert_eq!(
        r.pass1_hit_tokens_host, r.pass1_hit_tokens,
        "all pass-1 hits are host-tier"
    );
    assert_eq!(r.pass2_loadback_ops, Some(10_000));
    assert_eq!(r.pass2_loadback_pages, Some(73_200));
    assert_eq!(r.pass2_hit_tokens_host, Some(4_684_800));
    assert_eq!(
        r.pass2_hit_tokens.map(|h| h - 4_684_800),
        Some(10_035_200),
        "device-tier"
    );
}

#[test]
fn w2_matches_the_reference() {
    for (n, steps, prefill) in [(256, 576, 64), (1024, 768, 256)] {
        let r = run(WorkloadKind::W2, 64, false, Some(n));
        assert_eq!(r.counters.steps, steps, "N={n}");
        assert_eq!(r.prefill_steps, Some(prefill), "N={n}");
        assert_eq!(r.steady_steps, Some(509), "N={n}");
        assert_eq!(r.counters.finished, n as u64);
        assert_eq!(r.counters.starved_decode_slots, 0);
    }
}

/// W3's reference counters are held back on purpose; it must complete every turn and be
/// deterministic run to run.
#[test]
fn w3_completes_and_is_deterministic() {
    let a = run(WorkloadKind::W3, 64, false, None);
    let b = run(WorkloadKind::W3, 64, false, None);
    assert_eq!(a.counters, b.counters);
    assert_eq!(a.counters.finished + a.counters.aborts, 512);
    assert!(
        a.counters.hit_tokens_host > 0,
        "the host tier serves hits under pressure"
    );
    assert!(a.counters.writeback_ops > 0 && a.counters.loadback_ops > 0);
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
    let plain = run(WorkloadKind::W3, 64, false, None);
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
    use kvtier_sim::{Path, StepDriver, WorkloadError, scheduler_on};
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
