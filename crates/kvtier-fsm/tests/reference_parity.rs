//! Behaviour the differential run against the reference module found kvtier getting
//! wrong, pinned by the scripts it shrank them to (crates/kvtier-py/tests/differential.py;
//! docs/python.md).

mod common;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{Policy, RowKind, SchedulerConfig};

fn reference(config: SchedulerConfig) -> SchedulerConfig {
    SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        max_scheduled_tokens: 64,
        max_batch_size: 4,
        ..config
    }
}

/// Seed 18: a retracted request waits while a finished request's write-back is in
/// flight (its acknowledgement frees device pages), and then resumes from its host copy.
/// The deadlock breaker used to requeue it to recompute as soon as a plan ran nothing.
#[test]
fn a_write_back_in_flight_is_no_deadlock() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 4,
        device_pages: 4,
        host_pages: 134,
        ..fixture()
    }));
    submit(&mut s, "r03", vec![1]);
    submit(&mut s, "r06", vec![1, 1]);
    let mut engine = Engine::default();
    engine.max_new.insert("r03".into(), 4);
    engine.max_new.insert("r06".into(), 7);
    let plans = drain(&mut s, &mut engine, 50);
    // r03's finish write-back goes out while r06 is retracted: r06 waits for its ack...
    let write_back_of_r03 = plans
        .iter()
        .position(|p| p.write_backs.iter().any(|op| !op.is_retract))
        .expect("r03's finish is written back");
    assert!(plans[write_back_of_r03].forward.is_empty());
    // ...and then resumes where it stopped, loading its prefix back.
    let resumed = &plans[write_back_of_r03 + 1];
    assert_eq!(row_kinds(resumed), [RowKind::Recovery]);
    assert_eq!(resumed.load_backs.len(), 1);
    let stats = s.stats();
    assert_eq!((stats.retractions, stats.recomputes), (1, 0));
    check(&mut s);
}

/// Seed 0: a finish and an abort in one step free their pages in event order (the
/// finished request's tail, then the aborted request's pages), so the next allocation
/// gets the aborted request's last page, as the reference's free list hands it out.
#[test]
fn an_abort_frees_its_pages_after_a_finish_before_it() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 2,
        device_pages: 16,
        host_pages: 0,
        disable_l2_cache: true,
        ..fixture()
    }));
    submit(&mut s, "a", tokens(1, 3));
    submit(&mut s, "b", tokens(10, 5));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[7]), extend("b", &[8])]);
    s.next_plan();
    let b_table = s.occupied_pages(&rid("b")).expect("b runs");
    assert_eq!(b_table.len(), 4);
    // a publishes its full page and frees its partial one; b frees all of its pages.
    advance(&mut s, vec![extend("a", &[9]), finish("a"), abort("b")]);
    submit(&mut s, "c", vec![42]);
    let plan = s.next_plan();
    let c_first_page = s.occupied_pages(&rid("c")).expect("c runs")[0];
    assert_eq!(c_first_page, *b_table.last().expect("b held pages"));
    assert_eq!(row_ids(&plan), ["c"]);
    assert_eq!(state(&s, "c"), StateKind::PrefillDone);
    check(&mut s);
}

/// Paged-cache groups without a required history group (the reference's groups without
/// a prefix-cache adjunct) are a typed config error; the cache used to be built without
/// them, after a debug assertion, which reached Python as a panic.
#[test]
fn paged_groups_without_a_required_history_group_are_refused() {
    let config = SchedulerConfig {
        page_size: 4,
        device_pages: 32,
        paged: Some(kvtier_types::PagedSettings {
            groups: vec![kvtier_types::GroupSpec::sliding(
                "swa",
                4,
                1,
                32,
                8,
                kvtier_types::GroupRole::History,
            )],
            required: Vec::new(),
        }),
        ..fixture()
    };
    let err = kvtier_fsm::Scheduler::new(config).expect_err("refused");
    assert!(err.to_string().contains("required history group"), "{err}");
}

/// Seed 79: a retraction whose published prefix is already on host needs no copy. kvtier
/// frees the device copy at once; the reference leaves it cached, for eviction to take
/// (its `BlockRemoved` comes when a later admission evicts it), and so does
/// `Policy::Reference`.
#[test]
fn a_retraction_with_nothing_to_copy_keeps_the_device_copy_under_the_reference_policy() {
    let removed_at_the_retraction = |policy: Policy| {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 2,
            decode_input_tokens: 2,
            device_pages: 8,
            host_pages: 7,
            max_scheduled_tokens: 64,
            max_batch_size: 8,
            enable_kv_cache_events: true,
            ..fixture()
        });
        for (id, prompt) in [
            ("r01", vec![1]),
            ("r06", vec![1]),
            ("r03", vec![35, 8]),
            ("r00", vec![35, 8]),
        ] {
            submit(&mut s, id, prompt);
        }
        let mut engine = Engine::default();
        for (id, n) in [("r01", 3), ("r06", 2), ("r03", 3), ("r00", 1)] {
            engine.max_new.insert(id.into(), n);
        }
        for _ in 0..40 {
            let plan = s.next_plan();
            let events = s.drain_kv_events();
            // r03's retraction: nothing to copy (its prefix is r00's, written back).
            if s.request_state(&rid("r03")) == Some(StateKind::Retracted)
                && plan.write_backs.is_empty()
            {
                return events
                    .iter()
                    .any(|e| matches!(e, kvtier_types::KvEvent::BlockRemoved { .. }));
            }
            let answer = engine.answer(&plan);
            advance(&mut s, answer);
        }
        panic!("r03 was never retracted without a copy");
    };
    assert!(!removed_at_the_retraction(Policy::Reference));
    assert!(removed_at_the_retraction(Policy::Default));
}

/// A paged model decoding with two reserved tokens a step: the result accepts one, and
/// the group tables give back the page the reservation took past it at once, as the
/// reference's rewind does (the next decode takes it again).
#[test]
fn a_result_rewinds_the_group_pages_its_row_reserved_past_it() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 8,
        device_pages: 32,
        host_pages: 0,
        disable_l2_cache: true,
        decode_input_tokens: 2,
        max_scheduled_tokens: 64,
        max_batch_size: 4,
        paged: Some(PagedSettings {
            groups: vec![
                GroupSpec::full_history("full", 4, 2, 30),
                GroupSpec::sliding("swa", 4, 1, 30, 3, GroupRole::History),
            ],
            required: vec!["full".into()],
        }),
        ..fixture()
    });
    let free = |s: &mut kvtier_fsm::Scheduler| -> Vec<u32> {
        let stats = s.stats();
        let report = stats.groups.expect("paged groups");
        report.groups.iter().map(|g| g.free_pages).collect()
    };
    submit(&mut s, "a", tokens(1, 14));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[100])]);
    // The decode row reserves tokens 15 and 16: the full group's third page (16..24).
    let plan = s.next_plan();
    assert_eq!(row_kinds(&plan), [RowKind::Decode]);
    let reserved = free(&mut s);
    // One token accepted: 16 tokens need two full-group pages, and the window's pages
    // past token 15 go too.
    advance(&mut s, vec![extend("a", &[101])]);
    let after = free(&mut s);
    assert!(
        after.iter().zip(&reserved).all(|(a, r)| a > r),
        "group pages given back: {reserved:?} -> {after:?}"
    );
    check(&mut s);
}

/// Seed 87 (hybrid): a window state group that is not required. The admission credits
/// the pages its window's slide frees (as the reference does), but the commit before
/// the acquisition checkpointed that window at the terminal depth into the snapshot
/// (kvtier's terminal continuation), so the acquisition fell short: a debug assertion,
/// reached from Python as a panic, and a short table in release builds. An admitted op
/// now prunes unpinned snapshots to take its pages.
#[test]
fn an_admitted_op_gets_its_group_pages_after_a_terminal_continuation() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    for policy in [Policy::Reference, Policy::Default] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 8,
            device_pages: 12,
            host_pages: 0,
            disable_l2_cache: true,
            decode_input_tokens: 1,
            max_scheduled_tokens: 30,
            max_batch_size: 6,
            paged: Some(PagedSettings {
                groups: vec![
                    GroupSpec::full_history("full", 8, 1, 28),
                    GroupSpec::sliding("swa", 4, 1, 13, 8, GroupRole::State),
                ],
                required: vec!["full".into()],
            }),
            ..fixture()
        });
        submit(&mut s, "r00", vec![1; 32]);
        submit(&mut s, "r03", tokens(100, 49));
        let mut engine = Engine::with_max_new(1);
        drain(&mut s, &mut engine, 200);
        check(&mut s);
    }
}

/// Hybrid seed 26: a decode result crosses a page and its `Finish` comes in the same
/// step. The decode's publication is still on its way when the finish settles, so the
/// finish has no new pages: the reference caches no state then (it inserts nothing),
/// and kvtier, under its own policy, caches the working state where that publication
/// ended. The finish used to publish the decode's pages again from the old prefix, and
/// under the reference policy cached a state the reference frees.
#[test]
fn a_finish_in_the_step_of_a_decode_publication_publishes_nothing_twice() {
    for policy in [Policy::Reference, Policy::Default] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 2,
            device_pages: 5,
            host_pages: 0,
            disable_l2_cache: true,
            max_scheduled_tokens: 5,
            max_batch_size: 1,
            mamba: Some(kvtier_types::MambaSettings {
                device_slots: 38,
                host_slots: 0,
                chunk: 2,
            }),
            ..fixture()
        });
        submit(&mut s, "r02", vec![1]);
        let mut engine = Engine::default();
        engine.max_new.insert("r02".into(), 6);
        drain(&mut s, &mut engine, 20);
        // 7 tokens: the 6 computed ones fill 3 pages; the last result ended page 3.
        let tokens = [1, 1000, 1001, 1002, 1003, 1004, 1005];
        let cached = s.cache().cached_states(&tokens);
        let states = s.stats().states.expect("hybrid");
        match policy {
            Policy::Reference => {
                assert!(cached.is_empty(), "{cached:?}");
                assert_eq!(states.free_device_slots, 38);
            }
            Policy::Default => {
                assert_eq!(cached.len(), 1, "{cached:?}");
                assert_eq!(cached[0].pages, 3);
                assert_eq!(states.free_device_slots, 37);
            }
        }
        // Every page is back: 3 cached on the path, the 4th (token 7's) free.
        assert_eq!(free_device(&mut s), 1);
        check(&mut s);
    }
}

/// Hybrid seed 61: with pages of one token every decode result ends a page at the
/// depth its row checkpointed, and the reference caches that checkpoint (its
/// prefill-chunk rule holds there). Under the reference policy kvtier used to free
/// every decode checkpoint, so the finish's write-back lacked that state.
#[test]
fn a_decode_checkpoint_the_reference_rule_keeps_is_cached() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 1,
        device_pages: 5,
        host_pages: 162,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 4,
            host_slots: 33,
            chunk: 4,
        }),
        ..fixture()
    }));
    submit(&mut s, "r01", vec![1]);
    let mut engine = Engine::default();
    engine.max_new.insert("r01".into(), 2);
    let plans = drain(&mut s, &mut engine, 20);
    // Tokens 1, 1000, 1001: the prefill's state at depth 1, the decode's at depth 2.
    let cached = s.cache().cached_states(&[1, 1000, 1001]);
    assert_eq!(
        cached.iter().map(|c| c.pages).collect::<Vec<_>>(),
        [1, 2],
        "{cached:?}"
    );
    let copied: usize = plans
        .iter()
        .flat_map(|p| &p.write_backs)
        .map(|op| {
            op.pairs
                .iter()
                .filter(|p| p.kind == kvtier_types::TransferKind::Mamba)
                .count()
        })
        .sum();
    assert_eq!(copied, 2, "both states go to host with the finish");
    check(&mut s);
}
