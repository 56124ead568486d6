//! The L3 prefetch path of the core: Submitted → Prefetching → PrefetchDone → first
//! chunk, and Aborting. Each review bug of reference PR #293 that applies here has a test.

mod common;

use common::*;
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_types::hash::{PageHash, rolling_page_hashes};
use kvtier_types::{EngineEvent, ExecutionPlan, RequestSpec, SchedulerConfig};

fn l3_config() -> SchedulerConfig {
    SchedulerConfig {
        enable_l3_storage: true,
        prefetch_threshold: 1,
        ..fixture()
    }
}

/// A scheduler whose host tier holds the first 2 pages of `tokens(1, 12)` (written back
/// by a finished request, its device copies demoted).
fn with_host_prefix() -> Scheduler {
    let mut s = sched(l3_config());
    submit(&mut s, "r0", tokens(1, 5));
    drain(&mut s, &mut Engine::with_max_new(1), 20);
    assert_eq!(s.cache().probe(&tokens(1, 12)).host_pages, 2);
    assert_eq!(s.cache().probe(&tokens(1, 12)).device_pages, 0);
    s
}

/// Submits `r1` (prompt `tokens(1, 13)`) with 5 pages in L3 and plans once.
fn start_prefetch(s: &mut Scheduler, hashes: Vec<PageHash>) -> ExecutionPlan {
    let spec = RequestSpec {
        rolling_hashes: hashes,
        storage_hit_pages: 5,
        ..RequestSpec::new("r1", tokens(1, 13))
    };
    s.submit(vec![spec]).expect("submit");
    s.next_plan()
}

fn prefetch_done(op_id: u32, success: bool, completed: u32) -> EngineEvent {
    EngineEvent::PrefetchDone {
        op_id,
        request_id: rid("r1"),
        success,
        completed_pages: completed,
    }
}

/// Review bug A: the suffix was inserted at offset 0 despite a host hit. Here the 3
/// fetched pages extend the 2 host pages, at pages 2..5, and the request then reuses all
/// 5 (loaded back to device).
#[test]
fn prefetched_pages_land_at_their_absolute_offsets() {
    let mut s = with_host_prefix();
    let plan = start_prefetch(&mut s, Vec::new());
    assert!(
        row(&plan, "r1").is_none(),
        "no chunk while the prefetch runs"
    );
    let op = &plan.prefetches[0];
    assert_eq!(op.dst_pages.len(), 3);
    assert_eq!(state(&s, "r1"), StateKind::Prefetching);
    check(&mut s);
    let op_id = op.op_id;
    advance(&mut s, vec![prefetch_done(op_id, true, 3)]);
    assert_eq!(state(&s, "r1"), StateKind::PrefetchDone);
    assert_eq!(s.cache().probe(&tokens(1, 12)).host_pages, 5);
    assert_eq!(
        s.cache().prefix_page_hashes(&tokens(1, 10)),
        rolling_page_hashes(None, &tokens(1, 10), 2),
        "the inserted pages carry the hashes of their absolute positions"
    );
    check(&mut s);
    let plan = s.next_plan();
    let r1 = row_of(&plan, "r1");
    assert_eq!(r1.extend_prefix_len, 10);
    assert_eq!(plan.load_back_pages(), 5);
    check(&mut s);
}

/// Review bug C: hashes taken at admission could misalign with the host match at
/// prefetch time. Here the op's hashes are derived from the tokens at the current host
/// boundary, whatever the engine sent.
#[test]
fn prefetch_hashes_align_with_the_current_host_boundary() {
    let mut s = with_host_prefix();
    let wrong = vec![PageHash([7; 32]); 5];
    let plan = start_prefetch(&mut s, wrong);
    let expected = rolling_page_hashes(None, &tokens(1, 10), 2)[2..5].to_vec();
    assert_eq!(plan.prefetches[0].page_hashes, expected);
}

/// Review bug G: PrefetchDone without completed-page counts. A partial transfer inserts
/// exactly the completed pages; the rest return to the pool.
#[test]
fn a_partial_prefetch_inserts_only_completed_pages() {
    let mut s = with_host_prefix();
    let free_before = free_host(&mut s);
    let plan = start_prefetch(&mut s, Vec::new());
    advance(
        &mut s,
        vec![prefetch_done(plan.prefetches[0].op_id, true, 1)],
    );
    assert_eq!(s.cache().probe(&tokens(1, 12)).host_pages, 3);
    assert_eq!(free_host(&mut s), free_before - 1);
    check(&mut s);
}

#[test]
fn a_failed_prefetch_is_a_miss() {
    let mut s = with_host_prefix();
    let free_before = free_host(&mut s);
    let plan = start_prefetch(&mut s, Vec::new());
    advance(
        &mut s,
        vec![prefetch_done(plan.prefetches[0].op_id, false, 3)],
    );
    assert_eq!(s.cache().probe(&tokens(1, 12)).host_pages, 2);
    assert_eq!(free_host(&mut s), free_before);
    let plan = s.next_plan();
    assert_eq!(
        row_of(&plan, "r1").extend_prefix_len,
        4,
        "it computes what L3 did not bring"
    );
    check(&mut s);
}

/// An abort while pages are in flight keeps them until the transfer ends (the L3 DMA may
/// still write them), then frees them.
#[test]
fn abort_during_prefetch_keeps_pages_until_the_transfer_ends() {
    let mut s = with_host_prefix();
    let free_before = free_host(&mut s);
    let plan = start_prefetch(&mut s, Vec::new());
    advance(&mut s, vec![abort("r1")]);
    assert_eq!(state(&s, "r1"), StateKind::Aborting);
    assert_eq!(
        free_host(&mut s),
        free_before - 3,
        "pages held while the transfer runs"
    );
    s.next_plan();
    assert_eq!(
        state(&s, "r1"),
        StateKind::Aborting,
        "not forgotten before the transfer ends"
    );
    advance(
        &mut s,
        vec![prefetch_done(plan.prefetches[0].op_id, true, 3)],
    );
    assert_eq!(state(&s, "r1"), StateKind::Finished);
    assert_eq!(free_host(&mut s), free_before);
    s.next_plan();
    assert!(s.is_idle());
    check(&mut s);
}

#[test]
fn no_prefetch_below_the_threshold_or_without_l3() {
    for config in [
        SchedulerConfig {
            prefetch_threshold: 3,
            ..l3_config()
        },
        fixture(),
    ] {
        let mut s = sched(config);
        let spec = RequestSpec {
            storage_hit_pages: 3,
            ..RequestSpec::new("r1", tokens(1, 13))
        };
        s.submit(vec![spec]).expect("submit");
        let plan = s.next_plan();
        assert!(plan.prefetches.is_empty());
        assert!(row(&plan, "r1").is_some());
    }
}

#[test]
fn out_of_range_completed_pages_are_refused() {
    let mut s = with_host_prefix();
    let plan = start_prefetch(&mut s, Vec::new());
    let op_id = plan.prefetches[0].op_id;
    let err = single_error(s.advance(vec![prefetch_done(op_id, true, 9)]));
    assert!(
        matches!(err, SchedError::InvalidStorageInfo { .. }),
        "{err}"
    );
    assert_eq!(state(&s, "r1"), StateKind::Prefetching, "nothing changed");
    let err = single_error(s.advance(vec![prefetch_done(op_id + 100, true, 1)]));
    assert_eq!(err, SchedError::UnknownOp(op_id + 100));
    advance(&mut s, vec![prefetch_done(op_id, true, 3)]);
    check(&mut s);
}

/// Finishes `r0` (prompt 1..=5, one generated token) and acknowledges its write-back;
/// returns the plan that carries the backup.
fn backup_plan(s: &mut Scheduler, write_back_success: bool) -> ExecutionPlan {
    submit(s, "r0", tokens(1, 5));
    let mut engine = Engine {
        ack_write_backs: false,
        ..Engine::with_max_new(1)
    };
    let plans = run_until(s, &mut engine, 10, |_, p| !p.write_backs.is_empty());
    let op = plans.last().expect("plan").write_backs[0].op_id;
    advance(s, vec![wb_done(op, write_back_success)]);
    s.next_plan()
}

/// Review bug B: backup source pages could be reused before the put read them. The
/// pages a write-back made readable go out in a BackupOp with their rolling hashes, and
/// stay pinned on host until BackupDone.
#[test]
fn backups_follow_write_backs_and_pin_their_sources() {
    let mut s = sched(l3_config());
    let plan = backup_plan(&mut s, true);
    assert_eq!(plan.backups.len(), 1);
    let backup = &plan.backups[0];
    assert_eq!(backup.src_pages.len(), 2);
    assert_eq!(
        backup.page_hashes,
        rolling_page_hashes(None, &tokens(1, 4), 2)
    );
    assert_eq!(
        locked_pages(&mut s, kvtier_types::Tier::Host),
        2,
        "sources pinned"
    );
    assert!(!s.is_idle(), "a backup in flight is work in flight");
    check(&mut s);
    advance(
        &mut s,
        vec![EngineEvent::BackupDone {
            op_id: backup.op_id,
            success: true,
        }],
    );
    assert_eq!(locked_pages(&mut s, kvtier_types::Tier::Host), 0);
    s.next_plan();
    assert!(s.is_idle());
    // A second ack is stale, an unknown op an error.
    advance(
        &mut s,
        vec![EngineEvent::BackupDone {
            op_id: backup.op_id,
            success: true,
        }],
    );
    let err = single_error(s.advance(vec![EngineEvent::BackupDone {
        op_id: 999,
        success: true,
    }]));
    assert_eq!(err, SchedError::UnknownOp(999));
    check(&mut s);
}

#[test]
fn no_backup_without_l3_or_after_a_failed_write_back() {
    let mut s = sched(fixture());
    assert!(backup_plan(&mut s, true).backups.is_empty());
    let mut s = sched(l3_config());
    assert!(
        backup_plan(&mut s, false).backups.is_empty(),
        "nothing readable to back up"
    );
    check(&mut s);
}

// ----- lookups that do not block (issue 13) ---------------------------------------

/// A long prompt waits, looking up, with no rows; a short one is queued at once; the
/// answer puts the long one in line with its hits (the others ran meanwhile).
#[test]
fn a_request_waits_looking_up_while_others_run() {
    let mut s = sched(l3_config());
    let short = RequestSpec::new("short", tokens(1, 3)); // 1 full page: not looked up
    let long = RequestSpec::new("long", tokens(100, 13)); // 6 full pages
    let (ask, result) = s.submit_with_lookup(vec![short, long]);
    result.expect("both valid");
    let ask = ask.expect("the long prompt is looked up");
    assert_eq!(ask.prompts.len(), 1);
    assert_eq!(
        *ask.prompts[0],
        tokens(100, 13),
        "the prompt itself, shared"
    );
    assert_eq!(s.request_state(&rid("long")), Some(StateKind::LookingUp));
    assert_eq!(s.request_state(&rid("short")), Some(StateKind::Submitted));
    assert_eq!(s.stats().looking_up, 1);
    assert!(!s.is_idle());

    let plan = s.next_plan();
    assert!(row(&plan, "short").is_some());
    assert!(row(&plan, "long").is_none(), "no row while looking up");

    s.looked_up(ask.ticket, Some(vec![4]));
    assert_eq!(s.request_state(&rid("long")), Some(StateKind::Submitted));
    let plan = s.next_plan();
    let fetched: Vec<_> = plan
        .prefetches
        .iter()
        .map(|p| p.request_id.clone())
        .collect();
    assert_eq!(fetched, [rid("long")], "its 4 L3 pages are fetched");
}

/// A store's answer beyond the prompt's full pages is capped, and a lost lookup is a
/// miss (counted), never a failure.
#[test]
fn lookup_answers_are_capped_and_lost_ones_are_misses() {
    let mut s = sched(l3_config());
    let (ask, _) = s.submit_with_lookup(vec![RequestSpec::new("a", tokens(1, 13))]);
    s.looked_up(ask.expect("asked").ticket, Some(vec![1_000]));
    let plan = s.next_plan();
    assert_eq!(
        plan.prefetches[0].dst_pages.len(),
        6,
        "6 full pages at most"
    );

    let (ask, _) = s.submit_with_lookup(vec![RequestSpec::new("b", tokens(500, 13))]);
    s.looked_up(ask.expect("asked").ticket, None);
    assert_eq!(s.request_state(&rid("b")), Some(StateKind::Submitted));
    assert_eq!(s.stats().lost_lookups, 1);
}

/// Aborted while looking up: it is gone at once; its late answer changes nothing, not
/// even for a new request under the same id waiting on a lookup of its own.
#[test]
fn a_late_answer_never_reaches_an_aborted_request_or_its_successor() {
    let mut s = sched(l3_config());
    let (first, _) = s.submit_with_lookup(vec![RequestSpec::new("r", tokens(1, 13))]);
    s.abort(&rid("r")).expect("abort while looking up");
    s.next_plan(); // forgets it
    assert_eq!(s.request_state(&rid("r")), None);
    let (second, _) = s.submit_with_lookup(vec![RequestSpec::new("r", tokens(1, 13))]);
    let (first, second) = (first.expect("asked"), second.expect("asked"));
    assert_ne!(first.ticket, second.ticket);
    s.looked_up(first.ticket, Some(vec![6]));
    assert_eq!(s.request_state(&rid("r")), Some(StateKind::LookingUp));
    s.looked_up(second.ticket, Some(vec![0]));
    let plan = s.next_plan();
    assert!(plan.prefetches.is_empty(), "its own answer: no L3 pages");
    assert!(row(&plan, "r").is_some());
}

/// A duplicate of a request that is looking up is refused like any duplicate.
#[test]
fn a_request_looking_up_counts_as_live() {
    let mut s = sched(l3_config());
    let (_, result) = s.submit_with_lookup(vec![RequestSpec::new("r", tokens(1, 13))]);
    result.expect("valid");
    let (ask, result) = s.submit_with_lookup(vec![RequestSpec::new("r", tokens(1, 13))]);
    assert!(ask.is_none());
    assert!(matches!(
        single_error(result),
        SchedError::DuplicateRequest(_)
    ));
}

/// Every tier publishes KV events: a finished request's pages are stored on device,
/// then on host once the write-back is acknowledged, then in L3 once the backup is
/// (medium `Storage`), each page chained to the one before it by the same block hashes.
#[test]
fn every_tier_publishes_its_pages() {
    use kvtier_types::KvEvent;
    let mut s = sched(SchedulerConfig {
        enable_kv_cache_events: true,
        ..l3_config()
    });
    submit(&mut s, "r0", tokens(1, 7));
    drain(&mut s, &mut Engine::with_max_new(1), 20);
    let mut chains: [Vec<(u64, Option<u64>)>; 3] = Default::default();
    for event in s.drain_kv_events() {
        if let KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            medium,
            ..
        } = event
        {
            chains[medium.index()].push((block_hashes[0], parent_block_hash));
        }
    }
    let [device, host, storage] = &chains;
    assert_eq!(device.len(), 3, "the prompt's 3 full pages: {chains:?}");
    assert_eq!(host, device, "written back: {chains:?}");
    assert_eq!(storage, device, "backed up: {chains:?}");
    assert_eq!(device[0].1, None);
    assert!(device.windows(2).all(|w| w[1].1 == Some(w[0].0)));
}

/// A failed backup publishes nothing in L3.
#[test]
fn a_failed_backup_publishes_nothing() {
    use kvtier_types::{KvEvent, Medium};
    let mut s = sched(SchedulerConfig {
        enable_kv_cache_events: true,
        ..l3_config()
    });
    let plan = backup_plan(&mut s, true);
    let op_id = plan.backups[0].op_id;
    advance(
        &mut s,
        vec![EngineEvent::BackupDone {
            op_id,
            success: false,
        }],
    );
    s.next_plan();
    let in_l3 = s.drain_kv_events().into_iter().any(|e| {
        matches!(
            e,
            KvEvent::BlockStored {
                medium: Medium::Storage,
                ..
            }
        )
    });
    assert!(!in_l3);
}

/// Lost hits, by reason: a prompt whose pages the cache dropped counts them as
/// `evicted`; one never seen counts nothing; pages L3 had that no prefetch brought count
/// as `l3_not_prefetched`.
#[test]
fn lost_hits_are_counted_by_reason() {
    let mut s = sched(SchedulerConfig {
        track_lost_hits: true,
        disable_l2_cache: true,
        device_pages: 14,
        ..fixture()
    });
    submit(&mut s, "r0", tokens(1, 9));
    drain(&mut s, &mut Engine::with_max_new(1), 20);
    // A long prompt takes the device pool: r0's 4 pages are evicted.
    submit(&mut s, "r1", tokens(100, 21));
    drain(&mut s, &mut Engine::with_max_new(1), 30);
    assert!(s.stats().evicted_device_pages >= 4, "{:?}", s.stats());
    submit(&mut s, "r2", tokens(1, 9));
    submit(&mut s, "r3", tokens(500, 9));
    drain(&mut s, &mut Engine::with_max_new(1), 30);
    let stats = s.stats();
    assert_eq!(
        stats.lost_hit_tokens,
        [0, 0, 0, 8],
        "r0's 4 pages of 2 tokens, evicted"
    );

    // L3 had 5 pages; the threshold keeps the prefetch from running.
    let mut s = sched(SchedulerConfig {
        track_lost_hits: true,
        prefetch_threshold: 100,
        ..l3_config()
    });
    let spec = RequestSpec {
        storage_hit_pages: 5,
        ..RequestSpec::new("r1", tokens(1, 13))
    };
    s.submit(vec![spec]).expect("submit");
    s.next_plan();
    let stats = s.stats();
    assert_eq!(
        stats.lost_hit_tokens,
        [0, 10, 0, 0],
        "5 pages of 2 tokens in L3"
    );
}
