//! Port of `tests/cpp/test_host_node_ref_lifetime.cpp`: every state that reads a host
//! copy keeps its host lock after the scheduling call returns, and forward transitions
//! carry it (Prefilling → PrefillDone → Decoding), so a load-back source can never be
//! evicted mid-copy (history #41). Locks are observed as locked host pages of the tree
//! (`cached - evictable`). `RemotePrefillDoneEvent_PreservesHostLock` needs role D,
//! deferred to the PD issue; here a refused RemotePrefillDone leaves the lock alone.

mod common;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::{EngineEvent, SchedulerConfig, Tier};

/// The prompt [1..8] finished and was written back: 4 host-only pages. Host pool of
/// `host_pages` (4 pages are needed).
fn with_host_prefix(config: SchedulerConfig) -> Scheduler {
    let mut s = sched(config);
    submit(&mut s, "r0", tokens(1, 8));
    // One generated token, then Finish; the engine acknowledges the write-back.
    let plans = drain(&mut s, &mut Engine::with_max_new(1), 20);
    assert_eq!(plans.iter().map(|p| p.write_back_pages()).sum::<usize>(), 4);
    let st = s.stats();
    assert_eq!((st.cached_device_pages, st.cached_host_pages), (0, 4));
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    s
}

#[test]
fn prefilling_holds_host_lock_after_caller_exits() {
    let mut s = with_host_prefix(SchedulerConfig {
        max_scheduled_tokens: 2,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 14));
    let plan = s.next_plan();
    assert_eq!(plan.load_back_pages(), 4);
    assert_eq!(state(&s, "r1"), StateKind::Prefilling);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    // Still held at the next chunk.
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Prefilling);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    check(&mut s);
}

#[test]
fn prefill_done_holds_host_lock_after_caller_exits() {
    let mut s = with_host_prefix(fixture());
    submit(&mut s, "r1", tokens(1, 10));
    let plan = s.next_plan();
    assert_eq!(plan.load_back_pages(), 4);
    assert_eq!(state(&s, "r1"), StateKind::PrefillDone);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    check(&mut s);
}

#[test]
fn decoding_holds_host_lock_after_caller_exits() {
    let mut s = with_host_prefix(fixture());
    submit(&mut s, "r1", tokens(1, 10));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[50])]);
    s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::Decoding);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    s.next_plan();
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    check(&mut s);
    // Finish hands the path to the write-back (Draining/WritingBack hold it), whose
    // acknowledgement releases everything.
    advance(&mut s, vec![extend("r1", &[51]), finish("r1")]);
    assert!(locked_pages(&mut s, Tier::Host) >= 4);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
}

#[test]
fn draining_holds_host_lock_after_caller_exits() {
    let mut s = sched(fixture());
    submit(&mut s, "r1", tokens(1, 8));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[9]), finish("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Draining);
    // The 4 attached (not yet written) host pages are pinned, and the device source.
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    assert_eq!(locked_pages(&mut s, Tier::Device), 4);
    let plan = s.next_plan();
    assert_eq!(state(&s, "r1"), StateKind::WritingBack);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    assert_eq!(locked_pages(&mut s, Tier::Device), 0);
    check(&mut s);
}

/// The lock is released when the request is aborted.
#[test]
fn host_lock_released_on_abort() {
    let mut s = with_host_prefix(fixture());
    submit(&mut s, "r1", tokens(1, 10));
    submit(&mut s, "r2", tokens(1, 10));
    s.next_plan();
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    advance(&mut s, vec![abort("r1")]);
    // r2 (which hit r1's freshly attached device copy) holds no host lock.
    assert_eq!(locked_pages(&mut s, Tier::Host), 0);
    check(&mut s);
}

/// What the lock is for: while r1 reads the host copy, a write-back that needs host
/// room cannot evict it (it finishes without a write-back instead).
#[test]
fn locked_host_copy_is_not_evicted() {
    // 5 usable host pages: 4 hold [1..8], 1 free.
    let mut s = with_host_prefix(SchedulerConfig {
        host_pages: 6,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 10));
    s.next_plan();
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
    // Another request finishes with 2 new pages: 1 free host page, nothing evictable.
    submit(&mut s, "x", tokens(500, 4));
    s.next_plan();
    advance(&mut s, vec![extend("x", &[504]), finish("x")]);
    assert_eq!(state(&s, "x"), StateKind::Finished);
    assert_eq!(s.stats().cached_host_pages, 4);
    check(&mut s);
}

/// RemotePrefillDone (role D) is unsupported; refusing it leaves the host lock held.
#[test]
fn remote_prefill_done_refused_keeps_host_lock() {
    let mut s = with_host_prefix(SchedulerConfig {
        max_scheduled_tokens: 2,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 14));
    s.next_plan();
    let err = single_error(s.advance(vec![EngineEvent::RemotePrefillDone {
        request_id: rid("r1"),
        token: 7,
    }]));
    assert!(matches!(err, SchedError::Unsupported(_)));
    assert_eq!(state(&s, "r1"), StateKind::Prefilling);
    assert_eq!(locked_pages(&mut s, Tier::Host), 4);
}
