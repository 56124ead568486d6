//! Port of `tests/cpp/test_prefetch.cpp`. L3 prefetch is dormant in the reference at
//! 350cf505, whose test accepted either a prefetch or a plain prefill; kvtier's prefetch
//! path is live, so these tests pin the prefetch itself (the full path is tested in
//! `l3_prefetch.rs`), plus the validation of storage hints.

mod common;

use common::*;
use kvtier_fsm::SchedError;
use kvtier_types::{RequestSpec, SchedulerConfig};

fn l3() -> SchedulerConfig {
    SchedulerConfig {
        enable_l3_storage: true,
        ..fixture()
    }
}

fn spec(id: &str, n: usize, hit: u32) -> RequestSpec {
    let mut spec = RequestSpec::new(id, tokens(1, n));
    spec.storage_hit_pages = hit;
    spec
}

#[test]
fn prefetch_generated_for_l3_storage_hit() {
    let mut s = sched(l3());
    s.submit(vec![spec("r1", 10, 3)]).expect("accepted");
    let plan = s.next_plan();
    // 3 L3 pages past an empty host match: more than the threshold of 2.
    assert_eq!(plan.prefetches.len(), 1);
    assert_eq!(plan.prefetches[0].request_id.as_str(), "r1");
    assert_eq!(plan.prefetches[0].dst_pages.len(), 3);
    assert!(
        row(&plan, "r1").is_none(),
        "no chunk while the prefetch runs"
    );
    check(&mut s);
}

#[test]
fn no_prefetch_when_l3_disabled() {
    let mut s = sched(fixture());
    s.submit(vec![spec("r1", 10, 3)]).expect("accepted");
    let plan = s.next_plan();
    assert!(plan.prefetches.is_empty());
    assert!(row(&plan, "r1").is_some());
}

#[test]
fn no_prefetch_below_threshold() {
    let mut s = sched(l3());
    s.submit(vec![spec("r1", 10, 1)]).expect("accepted"); // 1 < threshold 2
    let plan = s.next_plan();
    assert!(plan.prefetches.is_empty());
    assert!(row(&plan, "r1").is_some());
}

/// Our validation: a storage hit longer than the prompt's except-last full pages is
/// refused.
#[test]
fn storage_hit_beyond_prompt_is_refused() {
    let mut s = sched(l3());
    // 10 tokens: 4 full pages before the last token.
    s.submit(vec![spec("ok", 10, 4)]).expect("4 pages fit");
    let err = single_error(s.submit(vec![spec("bad", 10, 5)]));
    assert!(
        matches!(&err, SchedError::InvalidStorageInfo { id, .. } if id.as_str() == "bad"),
        "{err:?}"
    );
    assert_eq!(s.request_state(&rid("bad")), None);
}
