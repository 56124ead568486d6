//! One test per reference-scheduler bug that kvtier fixes (spec/fsm-scheduler.md §13,
//! spec/cache-core.md §10). Each test is named after the bug and fails on the buggy
//! behaviour. Cache-level fixes (zombie nodes, LRU touch, transactional eviction) are
//! tested in `kvtier-radix/tests/bug_fixes.rs`.

mod common;

use common::*;
use kvtier_fsm::{SchedError, StateKind};
use kvtier_types::{AbortReason, EngineEvent, ExecutionPlan, Policy, RequestSpec, SchedulerConfig};

/// P11: a second spec with a live id was silently dropped. Now it is refused with a
/// typed error naming its index, and the first request is untouched.
#[test]
fn duplicate_request_ids_dropped_silently() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let err = s
        .submit(vec![
            RequestSpec::new("r2", tokens(10, 4)),
            RequestSpec::new("r1", tokens(50, 6)),
            RequestSpec::new("r3", tokens(20, 4)),
            RequestSpec::new("r3", tokens(30, 4)),
        ])
        .unwrap_err();
    let refused: Vec<(usize, SchedError)> = err
        .rejected
        .into_iter()
        .map(|r| (r.index, r.error))
        .collect();
    assert_eq!(
        refused,
        vec![
            (1, SchedError::DuplicateRequest(rid("r1"))),
            (3, SchedError::DuplicateRequest(rid("r3"))),
        ]
    );
    assert_eq!(
        s.request_tokens(&rid("r1")),
        Some(4),
        "the first r1 is kept as it was"
    );
    assert_eq!(s.request_ids(), vec![rid("r1"), rid("r2"), rid("r3")]);
}

/// P4: a retraction whose prefix does not fit the host pool aborted the request without
/// telling the engine, which kept waiting for it. Under the reference's policy the plan
/// now carries an abort notice; by default the request is not given up at all
/// (`a_retraction_the_host_cannot_take_recomputes_the_request`).
#[test]
fn requests_aborted_without_telling_the_engine() {
    let config = SchedulerConfig {
        device_pages: 6,
        host_pages: 2,
        policy: Policy::Reference,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "r1", tokens(1, 3));
    submit(&mut s, "r2", tokens(100, 3));
    let mut engine = Engine::default();
    let plans = run_until(&mut s, &mut engine, 50, |_, plan| !plan.aborted.is_empty());
    let plan = plans.last().expect("a plan");
    assert_eq!(plan.aborted.len(), 1);
    let notice = &plan.aborted[0];
    assert_eq!(notice.reason, AbortReason::HostPoolExhausted);
    assert_eq!(
        s.request_state(&notice.request_id),
        Some(StateKind::Finished),
        "the aborted request holds nothing and is forgotten at the next plan"
    );
    assert_eq!(s.stats().scheduler_aborts, 1);
    check(&mut s);
    // The survivor keeps running.
    let survivor = if notice.request_id == rid("r1") {
        "r2"
    } else {
        "r1"
    };
    let plan = step(&mut s, &mut engine);
    assert!(row(&plan, survivor).is_some(), "{survivor} still decodes");
    check(&mut s);
}

/// P4, by default: the victim of a retraction whose prefix the host pool cannot take
/// computes its history again (its tail pages freed, its prefix left as evictable
/// cache) instead of being aborted: both requests finish, nothing is aborted, and the
/// pages add up after every plan.
#[test]
fn a_retraction_the_host_cannot_take_recomputes_the_request() {
    let config = SchedulerConfig {
        device_pages: 6,
        host_pages: 2,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "r1", tokens(1, 3));
    submit(&mut s, "r2", tokens(100, 3));
    let mut engine = Engine::with_max_new(4);
    let plans = run_until(&mut s, &mut engine, 100, |s, _| {
        check(s);
        s.is_idle()
    });
    assert!(
        plans.iter().all(|p| p.aborted.is_empty()),
        "nobody is given up"
    );
    let stats = s.stats();
    assert!(
        stats.retractions >= 1,
        "the host pool could not take a prefix"
    );
    assert!(
        stats.recomputes >= 1,
        "its request computed its history again"
    );
    assert_eq!(stats.scheduler_aborts, 0);
    let mut finished = engine.finished.clone();
    finished.sort();
    assert_eq!(finished, ["r1", "r2"]);
}

/// Finishes `r1` (prompt 1..=8) with the L2 cache on and returns the plan that carries
/// its write-back, not yet acknowledged.
fn finish_with_pending_write_back(s: &mut kvtier_fsm::Scheduler) -> ExecutionPlan {
    submit(s, "r1", tokens(1, 8));
    let mut engine = Engine {
        ack_write_backs: false,
        ..Engine::with_max_new(2)
    };
    let plans = run_until(s, &mut engine, 10, |_, plan| !plan.write_backs.is_empty());
    plans.into_iter().last().expect("a plan")
}

/// P6: `WriteBackDone` for a request that was aborted or finished while its copy was in
/// flight threw. Now it completes the copy's bookkeeping and is accepted.
#[test]
fn write_back_completion_for_finished_request_throwing() {
    let mut s = sched(fixture());
    let plan = finish_with_pending_write_back(&mut s);
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    // The copy is still in flight: its host pages stay pinned until the ack.
    assert!(locked_pages(&mut s, kvtier_types::Tier::Host) > 0);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(locked_pages(&mut s, kvtier_types::Tier::Host), 0);
    assert_eq!(locked_pages(&mut s, kvtier_types::Tier::Device), 0);
    s.next_plan();
    assert_eq!(s.request_state(&rid("r1")), None);
    check(&mut s);
    // A second ack of the same op is stale, not an error.
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(s.stats().stale_events, 1);
}

/// P8 / cache-core §10: `WriteBackDone{success: false}` was treated as success, so the
/// tree served host pages that never received their data. Now the host copy is rolled
/// back and the device copy stays authoritative.
#[test]
fn failed_write_back_treated_as_success() {
    let mut s = sched(fixture());
    let host_before = free_host(&mut s);
    let plan = finish_with_pending_write_back(&mut s);
    assert!(
        free_host(&mut s) < host_before,
        "host pages were attached for the copy"
    );
    ack_write_backs(&mut s, &plan, false);
    assert_eq!(
        free_host(&mut s),
        host_before,
        "the failed copy host pages are back"
    );
    assert_eq!(s.stats().failed_write_backs, 1);
    check(&mut s);
    // The same prompt hits the device copy: no load-back from the unfilled host pages.
    submit(&mut s, "r2", tokens(1, 8));
    let plan = s.next_plan();
    let r2 = row_of(&plan, "r2");
    assert_eq!(
        r2.extend_prefix_len, 6,
        "three full pages reused from device"
    );
    assert!(
        plan.load_backs.is_empty(),
        "nothing is loaded from a failed host copy"
    );
    check(&mut s);
}

/// P1: op ids and candidate order came from hash-map iteration, so ranks could disagree.
/// Now the same requests give the same plans whatever order they arrive in.
#[test]
fn randomized_map_order_reaching_a_plan() {
    let specs: Vec<(String, Vec<i32>)> = (0..8)
        .map(|i| {
            (
                format!("req-{}", (i * 5) % 8),
                tokens(1 + (i % 3) * 40, 5 + i as usize),
            )
        })
        .collect();
    let run = |order: &[usize]| -> Vec<ExecutionPlan> {
        let config = SchedulerConfig {
            device_pages: 24,
            ..fixture()
        };
        let mut s = sched(config);
        for &i in order {
            let (id, prompt) = &specs[i];
            submit(&mut s, id, prompt.clone());
        }
        let mut engine = Engine::with_max_new(3);
        let plans = drain(&mut s, &mut engine, 200);
        check(&mut s);
        plans
    };
    let forward: Vec<usize> = (0..8).collect();
    let backward: Vec<usize> = (0..8).rev().collect();
    let shuffled = [3, 7, 0, 5, 1, 6, 2, 4];
    let reference = run(&forward);
    assert!(
        reference.iter().any(|p| !p.write_backs.is_empty()),
        "ops were issued"
    );
    assert_eq!(run(&backward), reference);
    assert_eq!(run(&shuffled), reference);
}

/// P16: results that grew a request past its allocated slots made Finish take more
/// pages than the request held. Now publication is clamped to what it holds.
#[test]
fn finish_after_overgrown_extend_result_does_not_overrun() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    let mut engine = Engine::default();
    step(&mut s, &mut engine); // prefill + first token
    step(&mut s, &mut engine); // first decode
    // Overlap scheduling: several results arrive before the next schedule.
    advance(
        &mut s,
        vec![EngineEvent::ExtendResult {
            request_id: rid("r1"),
            tokens: vec![7, 8, 9, 10, 11],
        }],
    );
    advance(&mut s, vec![finish("r1")]);
    check(&mut s);
    let mut engine = Engine::default();
    drain(&mut s, &mut engine, 10);
    check(&mut s);
}

/// The reference checks a later chunk against `ceil(t / ps)` fresh pages, ignoring the
/// free slots of the tail page: a prompt that fits the pool exactly stalls mid-prefill
/// with nothing to retract. kvtier checks the exact need.
#[test]
fn chunk_need_ignoring_tail_slack_stalls_an_exact_fit() {
    let config = SchedulerConfig {
        device_pages: 8, // 7 usable: 13 tokens + 1 reserved slot = 7 pages exactly
        max_scheduled_tokens: 5,
        max_batch_size: 1,
        disable_l2_cache: true,
        host_pages: 0,
        publish_prefix_mid_flight: false,
        ..fixture()
    };
    let mut s = sched(config);
    submit(&mut s, "r1", tokens(1, 13));
    let mut engine = Engine::with_max_new(1);
    let plans = drain(&mut s, &mut engine, 10);
    let chunks: Vec<u32> = plans
        .iter()
        .filter_map(|p| row(p, "r1").map(|r| r.input_length))
        .collect();
    assert_eq!(chunks, [5, 5, 3]);
    check(&mut s);
}
