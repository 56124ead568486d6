//! Port of `tests/cpp/test_scheduler_plan.cpp` (fixture), plus the plan-assembly order
//! (finish write-backs before the retract write-back) and determinism (P1: plans depend
//! only on ids and states, never on submission or map order).

mod common;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{ExecutionPlan, RequestSpec, RowKind, SchedulerConfig};

/// The C++ test (dormant prefetch at 350cf505) accepted either outcome. With the prefetch
/// path live: the first plan prefetches the 3 L3 pages into host, and once they land the
/// request's first chunk loads them back and reuses them.
#[test]
fn load_back_triggered_after_prefetch_populates_host_cache() {
    let mut s = sched(SchedulerConfig {
        enable_l3_storage: true,
        ..fixture()
    });
    let mut spec = RequestSpec::new("r1", tokens(1, 8));
    spec.storage_hit_pages = 3; // > threshold 2
    s.submit(vec![spec]).expect("accepted");
    let plan = s.next_plan();
    assert_eq!(plan.prefetches.len(), 1);
    assert!(row(&plan, "r1").is_none());
    let op_id = plan.prefetches[0].op_id;
    advance(
        &mut s,
        vec![kvtier_types::EngineEvent::PrefetchDone {
            op_id,
            request_id: rid("r1"),
            success: true,
            completed_pages: 3,
        }],
    );
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").extend_prefix_len, 6);
    assert_eq!(plan.load_back_pages(), 3);
    check(&mut s);
}

#[test]
fn load_back_not_triggered_without_host_cache_hit() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 8));
    let plan = s.next_plan();
    assert!(plan.load_backs.is_empty());
    assert_eq!(row_of(&plan, "r1").extend_prefix_len, 0);
}

#[test]
fn no_cache_ops_when_no_requests() {
    let mut s = sched(fixture());
    let plan = s.next_plan();
    assert!(plan.write_backs.is_empty());
    assert!(plan.load_backs.is_empty());
    assert!(plan.prefetches.is_empty());
    assert!(plan.backups.is_empty());
    assert!(plan.is_empty());
}

#[test]
fn no_cache_ops_plain_request_no_cache_hit() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 8));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r1"]);
    assert!(plan.write_backs.is_empty());
    assert!(plan.load_backs.is_empty());
    assert!(plan.prefetches.is_empty());
    assert!(plan.backups.is_empty());
}

/// With the prefix cache disabled a repeated prompt is computed again from scratch:
/// no prefix, full input, no load-back.
#[test]
fn disable_prefix_cache_same_prompt_does_not_reuse_device_prefix() {
    let mut s = sched(SchedulerConfig {
        disable_prefix_cache: true,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[6]), finish("r1")]);
    let plan = s.next_plan();
    assert!(plan.write_backs.is_empty());
    submit(&mut s, "r2", tokens(1, 4));
    let plan = s.next_plan();
    let r = row_of(&plan, "r2");
    assert_eq!(plan.forward.rows[0].request_id, rid("r2"));
    assert_eq!((r.extend_prefix_len, r.input_length), (0, 4));
    assert!(plan.load_backs.is_empty());
    check(&mut s);
}

#[test]
fn disable_prefix_cache_prefetch_not_generated_for_storage_hit() {
    let mut s = sched(SchedulerConfig {
        disable_prefix_cache: true,
        enable_l3_storage: true,
        ..fixture()
    });
    let mut spec = RequestSpec::new("r1", tokens(1, 8));
    spec.storage_hit_pages = 3;
    s.submit(vec![spec]).expect("accepted");
    let plan = s.next_plan();
    assert!(plan.prefetches.is_empty());
    assert_eq!(row_of(&plan, "r1").extend_prefix_len, 0);
}

#[test]
fn new_forward_operation_tie_breaks_on_request_id() {
    let mut s = sched(SchedulerConfig {
        max_batch_size: 1,
        ..fixture()
    });
    submit(&mut s, "r_bbb", tokens(1, 4));
    submit(&mut s, "r_aaa", tokens(100, 4));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r_aaa"]);
}

/// Ids compare as strings: "r10" < "r2" < "r9".
#[test]
fn tie_break_is_lexicographic() {
    let mut s = sched(SchedulerConfig {
        max_batch_size: 2,
        ..fixture()
    });
    for id in ["r9", "r2", "r10"] {
        submit(&mut s, id, tokens(1, 4));
    }
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r10", "r2"]);
    assert_eq!(state(&s, "r9"), StateKind::Submitted);
}

fn run_script(order: &[&str]) -> Vec<ExecutionPlan> {
    let mut s = sched(SchedulerConfig {
        device_pages: 12,
        host_pages: 12,
        max_scheduled_tokens: 10,
        max_batch_size: 3,
        ..fixture()
    });
    let specs: Vec<RequestSpec> = order
        .iter()
        .map(|&id| {
            let n: i32 = id[1..].parse().expect("numeric suffix");
            // Shared first page across requests, then distinct tokens.
            let mut prompt = vec![1, 2];
            prompt.extend(tokens(10 * n, 3 + n as usize));
            RequestSpec::new(id, prompt)
        })
        .collect();
    s.submit(specs).expect("accepted");
    let mut engine = Engine::with_max_new(3);
    let plans = drain(&mut s, &mut engine, 100);
    check(&mut s);
    plans
}

/// The whole sequence of plans is independent of submission order.
#[test]
fn forward_op_is_insertion_order_independent() {
    let a = run_script(&["r1", "r2", "r3", "r4", "r5"]);
    let b = run_script(&["r5", "r3", "r1", "r4", "r2"]);
    assert!(a.len() > 3);
    assert_eq!(a, b);
}

/// Plan order of write-backs: finish write-backs first, then the retract write-back,
/// with increasing op ids.
#[test]
fn finish_write_backs_precede_retract_write_back() {
    let mut s = sched(SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 4,
        ..fixture()
    });
    submit(&mut s, "r1", vec![1, 2]);
    submit(&mut s, "r2", vec![11, 12]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[3]), extend("r2", &[13])]);
    s.next_plan();
    // r1 finishes; r2 asks for 2 pages while 1 is free.
    advance(
        &mut s,
        vec![
            extend("r1", &[4]),
            finish("r1"),
            extend("r2", &[14]),
            reserve("r2", 4),
        ],
    );
    let plan = s.next_plan();
    assert!(plan.forward.is_empty());
    let kinds: Vec<bool> = plan.write_backs.iter().map(|op| op.is_retract).collect();
    assert_eq!(kinds, [false, true]);
    assert!(plan.write_backs[0].op_id < plan.write_backs[1].op_id);
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    assert_eq!(state(&s, "r2"), StateKind::Retracting);
    check(&mut s);
}

/// Op ids come from one counter starting at 1, shared by write-backs and load-backs.
#[test]
fn op_ids_shared_counter_from_one() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[5]), finish("r1")]);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs[0].op_id, 1);
    ack_write_backs(&mut s, &plan, true);
    submit(&mut s, "r2", tokens(1, 5));
    let plan = s.next_plan();
    assert_eq!(plan.load_backs.len(), 1);
    assert_eq!(plan.load_backs[0].op_id, 2);
    assert_eq!(row_of(&plan, "r2").kind, RowKind::Prefill);
}

/// The batch limit stops the admission loop: a request without a slot waits while the
/// running requests decode.
#[test]
fn decodes_respect_batch_limit() {
    let mut s = sched(SchedulerConfig {
        max_batch_size: 2,
        ..fixture()
    });
    for id in ["a", "b", "c"] {
        submit(&mut s, id, tokens(1, 4));
    }
    let p = s.next_plan();
    assert_eq!(row_ids(&p), ["a", "b"]);
    advance(&mut s, vec![extend("a", &[5]), extend("b", &[5])]);
    // "c" cannot get a slot: decodes of a and b run.
    let p = s.next_plan();
    assert_eq!(row_ids(&p), ["a", "b"]);
    assert_eq!(row_kinds(&p), [RowKind::Decode, RowKind::Decode]);
    assert_eq!(state(&s, "c"), StateKind::Submitted);
}
