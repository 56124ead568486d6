//! Behaviour the differential run against the reference module found kvtier getting
//! wrong, pinned by the scripts it shrank them to (crates/kvtier-py/tests/differential.py;
//! docs/python.md).

mod common;

use common::*;
use kvtier_fsm::StateKind;
use kvtier_types::{Policy, RowKind, SchedulerConfig};

/// The 0.1.0 wheel as the binding configures it: its reference policy, and no
/// publication of a prefix mid-flight.
fn wheel(config: SchedulerConfig) -> SchedulerConfig {
    SchedulerConfig {
        policy: Policy::ReferenceWheel,
        publish_prefix_mid_flight: false,
        ..config
    }
}

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
    submit(&mut s, "a", tokens(1, 14));
    s.next_plan();
    advance(&mut s, vec![extend("a", &[100])]);
    // The decode row reserves tokens 15 and 16: the full group's third page (16..24).
    let plan = s.next_plan();
    assert_eq!(row_kinds(&plan), [RowKind::Decode]);
    let reserved = group_free(&mut s);
    // One token accepted: 16 tokens need two full-group pages, and the window's pages
    // past token 15 go too.
    advance(&mut s, vec![extend("a", &[101])]);
    let after = group_free(&mut s);
    assert!(
        after.values().zip(reserved.values()).all(|(a, r)| a > r),
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
            Policy::Reference | Policy::ReferenceWheel => {
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

/// Hybrid seeds 48, 63 and 88: a pool of two state slots and no host room. The first
/// request is retracted at its first decode (its pair fills the pool) and, with no
/// host page for its copy, given up. The reference aborts it before caching anything
/// and frees both slots. kvtier, under the reference policy, used to cache its state
/// at depth 4, so the next request with that prompt needed that state kept beside a
/// fresh pair (three slots of two) and, as the reference would, waited forever.
#[test]
fn a_request_given_up_for_want_of_host_room_caches_no_state() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 2,
        device_pages: 12,
        host_pages: 0,
        disable_l2_cache: true,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 2,
            host_slots: 0,
            chunk: 4,
        }),
        ..fixture()
    }));
    let prompt = vec![3, 2, 8, 21, 16];
    submit(&mut s, "r00", prompt.clone());
    let mut engine = Engine::with_max_new(3);
    drain(&mut s, &mut engine, 20);
    assert_eq!(s.stats().retractions, 1);
    assert!(
        s.cache().cached_states(&prompt).is_empty(),
        "both slots freed"
    );
    submit(&mut s, "r04", prompt.clone());
    let plans = drain(&mut s, &mut engine, 20);
    let first = plans.iter().find_map(|p| row(p, "r04")).expect("r04 runs");
    assert_eq!(first.extend_prefix_len, 0, "computed from scratch");
    check(&mut s);
}

/// Hybrid seed 40: a paged model's request finishes right after its prefill. The
/// reference commits a chunk into snapshots only when the request's next row is
/// scheduled, so what a request computed since its last row is never cached when it
/// stops: here nothing. Under the reference policy kvtier used to commit at the finish
/// and keep one group page cached that the reference frees; under its own policy it
/// still does, so the next request with that prompt reuses it.
#[test]
fn a_stopping_request_commits_its_group_tables_only_under_kvtiers_policy() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    for policy in [Policy::Reference, Policy::Default] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 8,
            device_pages: 3,
            host_pages: 0,
            disable_l2_cache: true,
            max_batch_size: 1,
            paged: Some(PagedSettings {
                groups: vec![
                    GroupSpec::sliding("swa", 4, 1, 19, 9, GroupRole::History),
                    GroupSpec::full_history("full", 4, 2, 15),
                ],
                required: vec!["full".into()],
            }),
            ..fixture()
        });
        let empty = group_free(&mut s);
        submit(&mut s, "r02", vec![1; 8]);
        s.next_plan();
        advance(&mut s, vec![extend("r02", &[17]), finish("r02")]);
        s.next_plan();
        let after = group_free(&mut s);
        match policy {
            Policy::Reference | Policy::ReferenceWheel => {
                assert_eq!(after, empty, "nothing cached")
            }
            Policy::Default => {
                let mut expected = empty.clone();
                *expected.get_mut("full").expect("full") -= 1;
                assert_eq!(after, expected, "the prefix's full-group page");
            }
        }
        check(&mut s);
    }
}

fn hybrid_rows(plans: &[kvtier_types::ExecutionPlan], id: &str) -> Vec<(Option<u32>, Option<u32>)> {
    plans
        .iter()
        .filter_map(|p| row(p, id))
        .map(|r| (r.mamba.working, r.mamba.checkpoint_dst))
        .collect()
}

/// Hybrid seed 33: two requests with one prompt, one after the other. The second's
/// first decode publishes its checkpoint at the node where the first's state is
/// cached. The reference attaches the new slot there and frees the old one (C.10 in
/// docs/notes/mamba-reference.md), so its next checkpoint is the old slot; kvtier
/// used to keep the old slot and free the new one, so later slot ids differed.
#[test]
fn a_state_published_again_replaces_the_cached_slot_under_the_reference_policy() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 1,
        device_pages: 6,
        host_pages: 0,
        disable_l2_cache: true,
        max_scheduled_tokens: 1,
        max_batch_size: 1,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 4,
            host_slots: 0,
            chunk: 4,
        }),
        ..fixture()
    });
    submit(&mut s, "r00", vec![29]);
    submit(&mut s, "r02", vec![29]);
    let mut engine = Engine::default();
    engine.max_new.insert("r00".into(), 3);
    engine.max_new.insert("r02".into(), 2);
    let plans = drain(&mut s, &mut engine, 20);
    assert_eq!(
        hybrid_rows(&plans, "r00"),
        [(Some(0), Some(1)), (Some(0), Some(2)), (Some(0), None)]
    );
    // The reference's slots: the first decode's checkpoint is slot 1, freed when
    // slot 3 replaced it at the prompt's node.
    assert_eq!(
        hybrid_rows(&plans, "r02"),
        [(Some(0), Some(3)), (Some(0), Some(1))]
    );
    check(&mut s);
}

/// Hybrid seed 99: without host states, a prompt whose KV prefix is on host only (its
/// device copy went after the write-back) has no state to start from, so its row
/// computes from scratch. The reference counts only the device prefix for the
/// branching point, so the row's checkpoint goes where the chunk's own rule puts it
/// (depth 8); kvtier used to count the host prefix and checkpoint at depth 4.
#[test]
fn without_host_states_the_branching_point_ignores_a_host_only_prefix() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 4,
        device_pages: 4,
        host_pages: 44,
        max_batch_size: 1,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 34,
            host_slots: 0,
            chunk: 4,
        }),
        ..fixture()
    });
    let prompt = vec![23, 17, 16, 37, 22, 35, 25, 2];
    submit(&mut s, "r01", prompt.clone());
    submit(&mut s, "r02", prompt);
    let mut engine = Engine::with_max_new(1);
    let plans = drain(&mut s, &mut engine, 20);
    let branching: Vec<_> = ["r01", "r02"]
        .iter()
        .map(|id| {
            let r = plans.iter().find_map(|p| row(p, id)).expect("runs");
            (r.extend_prefix_len, r.mamba.branching)
        })
        .collect();
    assert_eq!(branching, [(0, Some(8)), (0, Some(8))]);
    check(&mut s);
}

/// Hybrid seeds 54 and 96: a decoding request of a paged model asks for a larger KV
/// reserve (`UpdateReserveNumTokens`). The reference reserves the KV slots, but its
/// group tables grow by the row's own input only; kvtier used to grow them over the
/// whole reserve (here three full-group pages and six window pages where the
/// reference takes two and three).
#[test]
fn a_reserve_update_grows_the_kv_reserve_but_not_the_group_tables() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 4,
        device_pages: 4,
        host_pages: 0,
        disable_l2_cache: true,
        max_scheduled_tokens: 8,
        max_batch_size: 1,
        paged: Some(PagedSettings {
            groups: vec![
                GroupSpec::sliding("swa", 2, 1, 21, 9, GroupRole::State),
                GroupSpec::full_history("full", 4, 1, 10),
            ],
            required: vec!["full".into()],
        }),
        ..fixture()
    });
    submit(&mut s, "r02", vec![1]);
    s.next_plan();
    advance(&mut s, vec![extend("r02", &[17])]);
    s.next_plan();
    advance(&mut s, vec![extend("r02", &[39])]);
    s.next_plan();
    advance(&mut s, vec![extend("r02", &[5]), reserve("r02", 7)]);
    let plan = s.next_plan();
    assert_eq!(row_kinds(&plan), [RowKind::Decode]);
    // Groups in id byte order: "full", then "swa".
    let pages: Vec<usize> = plan
        .forward
        .groups_of(0)
        .iter()
        .map(|t| t.pages.len())
        .collect();
    assert_eq!(
        pages,
        [2, 3],
        "a decode row of 4 tokens' history and 1 input"
    );
    check(&mut s);
}

/// Hybrid seeds 6, 9, 40, 41, 54, 60, 96: a new request's first chunk evicts a cached
/// node to make room for its KV. The reference evicts first, so the evicted node's
/// snapshot pages go back to the group pools before the chunk takes its pages, and the
/// chunk gets them; kvtier took its group pages first, and so other ids.
#[test]
fn a_first_chunk_takes_the_group_pages_its_own_eviction_freed() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 8,
        device_pages: 3,
        host_pages: 0,
        disable_l2_cache: true,
        max_batch_size: 1,
        paged: Some(PagedSettings {
            groups: vec![
                GroupSpec::sliding("swa", 4, 1, 19, 9, GroupRole::History),
                GroupSpec::full_history("full", 4, 2, 15),
            ],
            required: vec!["full".into()],
        }),
        ..fixture()
    });
    let mut engine = Engine::default();
    engine.max_new.insert("r01".into(), 2);
    engine.max_new.insert("r00".into(), 1);
    submit(&mut s, "r01", vec![1; 7]);
    let mut plans = vec![step(&mut s, &mut engine)];
    submit(&mut s, "r00", vec![1; 8]);
    plans.extend(drain(&mut s, &mut engine, 20));
    let tables = |id: &str| -> Vec<Vec<u32>> {
        let (plan, i) = plans
            .iter()
            .find_map(|p| {
                p.forward
                    .rows
                    .iter()
                    .position(|r| r.request_id.as_str() == id)
                    .map(|i| (p, i))
            })
            .expect("runs");
        plan.forward
            .groups_of(i)
            .iter()
            .map(|t| t.pages.clone())
            .collect()
    };
    assert_eq!(tables("r01"), [vec![14], vec![18, 17]]);
    // r01's prefix is evicted for r00's KV: its snapshot's pages (14, and the window's
    // 16 and 17) are the ones r00 gets, in the reference's order.
    assert_eq!(tables("r00"), [vec![14], vec![16, 17]]);
    check(&mut s);
}

/// Hybrid seed 190: one request of 29 tokens on a window model (pages of 8; a history
/// group and a 4-token window state group, not required). Its first decode commits the
/// prompt: the terminal snapshot at 24 takes the window below it, and the 0.1.0 wheel
/// then detaches the window the snapshot at 16 kept (#460, by its rule: nothing else
/// holds it, and the request's own table no longer reads it once the checkpoint at 24
/// dropped what lies below its window). The reference at 350cf505 keeps it.
#[test]
fn the_wheel_detaches_a_superseded_window_at_the_first_decode_commit() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut freed = Vec::new();
    for policy in [Policy::Reference, Policy::ReferenceWheel] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 8,
            device_pages: 21,
            host_pages: 0,
            disable_l2_cache: true,
            max_batch_size: 1,
            max_scheduled_tokens: 16,
            paged: Some(PagedSettings {
                groups: vec![
                    GroupSpec::full_history("full", 4, 2, 11),
                    GroupSpec::sliding("swa", 4, 1, 11, 4, GroupRole::State),
                ],
                required: vec!["full".into()],
            }),
            ..fixture()
        });
        let swa_free = |s: &mut kvtier_fsm::Scheduler| group_free(s)["swa"];
        submit(&mut s, "r00", tokens(1, 29));
        s.next_plan();
        advance(&mut s, vec![]);
        s.next_plan();
        advance(&mut s, vec![extend("r00", &[23])]);
        let before = swa_free(&mut s);
        let plan = s.next_plan();
        assert_eq!(row_kinds(&plan), [RowKind::Decode], "{policy:?}");
        freed.push(swa_free(&mut s) - before);
        check(&mut s);
    }
    // The window slid past pages 3 and 4 (one freed, one the snapshot at 16 keeps) and
    // page 5 went into the snapshot at 24; the wheel also frees the one at 16.
    assert_eq!(freed, [1, 2]);
}

/// Hybrid seed 1425 (shrunk): r07 runs down the path r08 cached, snapshot by snapshot.
/// Its window group is not required, so its commits adopt only the history there, and
/// its window table keeps borrowing its hit's pages: the commit before its last chunk
/// spares the window at 4 for that, and the chunk's slide then drops the borrow. Its
/// first decode publishes no new page, yet the reference commits again, and the wheel
/// then detaches that window (#460). kvtier committed only what was new and kept it.
#[test]
fn the_wheel_commits_again_at_a_first_decode_that_publishes_nothing() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut freed = Vec::new();
    for policy in [Policy::Reference, Policy::ReferenceWheel] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 4,
            device_pages: 8,
            host_pages: 0,
            disable_l2_cache: true,
            max_batch_size: 1,
            max_scheduled_tokens: 4,
            paged: Some(PagedSettings {
                groups: vec![
                    GroupSpec::full_history("full", 2, 2, 46),
                    GroupSpec::sliding("swa", 2, 1, 28, 10, GroupRole::State),
                ],
                required: vec!["full".into()],
            }),
            ..fixture()
        });
        let mut engine = Engine::default();
        engine.max_new.insert("r08".into(), 1);
        submit(&mut s, "r08", tokens(1, 21));
        drain(&mut s, &mut engine, 20);
        let mut prompt = tokens(1, 16);
        prompt.push(100);
        submit(&mut s, "r07", prompt);
        run_until(&mut s, &mut engine, 10, |s, _| {
            state(s, "r07") == StateKind::PrefillDone
        });
        let before = group_free(&mut s)["swa"];
        let plan = s.next_plan();
        assert_eq!(row_kinds(&plan), [RowKind::Decode], "{policy:?}");
        freed.push(group_free(&mut s)["swa"] as i64 - before as i64);
        check(&mut s);
    }
    // The row takes a page (its slide only drops a borrow); the wheel also frees the
    // window at 4, two pages (1425: the wheel's pool has 15 free after the plan).
    assert_eq!(freed, [-1, 1]);
}

/// Hybrid seed 1196 (shrunk): r01 and r02 share a 4-token prompt prefix (pages of one
/// token; a 4-token window state group, not required) and finish in the same step, each
/// with a decode result first. The reference moves a request's lock to each node it
/// publishes and drops it at the finish, so r02's commit, after r01's finish, finds the
/// shared prefix's snapshots held by r02 alone and the wheel detaches their windows
/// (#460). kvtier's r01 still held both its old lock and the one its publication took
/// until the batch's reply, which kept those windows.
#[test]
fn a_request_that_finishes_after_a_publication_lets_go_of_its_locks_at_once() {
    use kvtier_types::{GroupRole, GroupSpec, PagedSettings};
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 1,
        device_pages: 24,
        host_pages: 0,
        disable_l2_cache: true,
        max_batch_size: 7,
        max_scheduled_tokens: 4,
        paged: Some(PagedSettings {
            groups: vec![
                GroupSpec::sliding("swa", 4, 1, 37, 4, GroupRole::State),
                GroupSpec::full_history("full", 1, 1, 40),
            ],
            required: vec!["full".into()],
        }),
        ..fixture()
    }));
    let mut engine = Engine::with_max_new(6);
    submit(&mut s, "r01", tokens(1, 4));
    let mut r02 = tokens(1, 4);
    r02.extend(tokens(100, 7));
    submit(&mut s, "r02", r02);
    let plans = drain(&mut s, &mut engine, 20);
    // Both finish in the last step, r01's result and finish first.
    let last = plans.iter().rev().find(|p| !p.forward.rows.is_empty());
    assert_eq!(row_ids(last.expect("rows ran")), ["r01", "r02"]);
    // Once both are forgotten: their tables' pages back, and the windows r02's last
    // commit detached (one fewer while r01's locks stayed).
    assert_eq!(group_free(&mut s)["swa"], 34);
    check(&mut s);
}

/// Hybrid seed 5873 (shrunk): with no host tier, r02 (7 tokens, one partial page) is
/// retracted with nothing to copy while r05 prefills. The reference keeps a retracted
/// request's group tables and resumes it as a decode from them: its recovery row reads
/// the same table. kvtier released them at the retraction and recomputed the request
/// from its deepest snapshot (still kvtier's own policy).
#[test]
fn a_retracted_paged_request_resumes_from_the_tables_it_kept() {
    use kvtier_types::{GroupSpec, PagedSettings};
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 8,
        device_pages: 10,
        host_pages: 0,
        disable_l2_cache: true,
        max_batch_size: 3,
        max_scheduled_tokens: 7,
        paged: Some(PagedSettings {
            groups: vec![GroupSpec::full_history("full", 4, 2, 10)],
            required: vec!["full".into()],
        }),
        ..fixture()
    }));
    let mut engine = Engine::with_max_new(1);
    engine.max_new.insert("r02".into(), 2);
    let r01 = tokens(1, 50);
    let mut r05 = r01[..30].to_vec();
    r05.extend(tokens(100, 11));
    submit(&mut s, "r05", r05);
    submit(&mut s, "r02", vec![1; 7]);
    submit(&mut s, "r01", r01);
    let plans = drain(&mut s, &mut engine, 40);
    assert_eq!(s.stats().retractions, 1);
    let rows: Vec<_> = plans
        .iter()
        .flat_map(|p| {
            let rows = p.forward.rows.iter().enumerate();
            rows.filter(|(_, r)| r.request_id.as_str() == "r02")
                .map(move |(i, r)| (r.kind, p.forward.groups_of(i)[0].pages.clone()))
        })
        .collect();
    // Its first chunk's table, its retraction, then a recovery row on that same table
    // (no second prefill).
    let first = rows[0].1.clone();
    assert_eq!(
        rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        [RowKind::Prefill, RowKind::Prefill, RowKind::Recovery]
    );
    assert_eq!(rows[2].1[0], first[0]);
    check(&mut s);
}

/// Hybrid seed 5371 (shrunk): r03 is retracted over the state r01 left at 32 (a pool of
/// three state slots) and cannot resume: its own state at 40 is protected for the
/// recovery, and the one at 32 above it is no leaf, so no slot can be evicted. The plan
/// runs nothing, and the reference waits: r04 arrives next and runs (its admission
/// evicts both states), and r03, its state lost, is given up. kvtier's deadlock breaker
/// requeued r03 at the first empty plan; under the reference policies it waits for a
/// second one with nothing in between, the fixed point nothing but a new request ends.
#[test]
fn a_retracted_request_waits_one_empty_plan_for_a_new_request() {
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 8,
        device_pages: 7,
        host_pages: 9,
        disable_l2_cache: true,
        max_batch_size: 1,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 3,
            host_slots: 0,
            chunk: 8,
        }),
        ..fixture()
    }));
    let mut engine = Engine::with_max_new(2);
    engine.max_new.insert("r01".into(), 1);
    let r01 = tokens(1, 32);
    submit(&mut s, "r01", r01.clone());
    drain(&mut s, &mut engine, 10);
    let mut r03 = r01.clone();
    r03.extend(tokens(100, 8));
    submit(&mut s, "r03", r03);
    run_until(&mut s, &mut engine, 10, |s, _| {
        state(s, "r03") == StateKind::Retracted
    });
    let plan = step(&mut s, &mut engine);
    assert!(plan.is_empty(), "the recovery cannot get its state slots");
    assert_eq!(state(&s, "r03"), StateKind::Retracted, "it waits");
    let mut r04 = r01[..24].to_vec();
    r04.extend(tokens(200, 8));
    submit(&mut s, "r04", r04);
    let plan = step(&mut s, &mut engine);
    assert_eq!(row_ids(&plan), ["r04"]);
    let plans = drain(&mut s, &mut engine, 10);
    let aborted: Vec<_> = plans.iter().flat_map(|p| p.aborted.iter()).collect();
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].request_id.as_str(), "r03");
    assert_eq!(aborted[0].reason, kvtier_types::AbortReason::StateLost);
    assert_eq!(s.stats().recomputes, 0);
    check(&mut s);
}

/// Hybrid seed 2094 (shrunk): r02's state at 8 is written to host and its device copy
/// demoted; r04 has r02's prompt. The reference's match prefers that host state (it
/// lies deeper than any device state), so its admission needs a third state slot for
/// the load-back, while r00's write-back still reads one: r04 waits a step. kvtier's own
/// match does not reuse that state (it holds 9 tokens, not 8) and asked for two slots
/// only, so it admitted r04 a step early. It makes the room the reference's view needs
/// now, then admits its own match.
#[test]
fn a_first_chunk_makes_room_for_the_host_state_the_references_view_loads_back() {
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 8,
        device_pages: 4,
        host_pages: 146,
        max_batch_size: 1,
        max_scheduled_tokens: 19,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 3,
            host_slots: 38,
            chunk: 32,
        }),
        ..fixture()
    }));
    let mut engine = Engine::with_max_new(1);
    let prompt = tokens(1, 9);
    submit(&mut s, "r02", prompt.clone());
    submit(&mut s, "r04", prompt);
    assert_eq!(row_ids(&step(&mut s, &mut engine)), ["r02"]);
    submit(&mut s, "r00", vec![1; 8]);
    assert_eq!(row_ids(&step(&mut s, &mut engine)), ["r00"]);
    let plan = step(&mut s, &mut engine);
    assert!(
        plan.forward.is_empty(),
        "r04 waits for the load-back's slot"
    );
    assert_eq!(plan.write_backs.len(), 1, "r00's write-back");
    assert_eq!(state(&s, "r04"), StateKind::Submitted);
    assert_eq!(row_ids(&step(&mut s, &mut engine)), ["r04"]);
    check(&mut s);
}

/// Hybrid seed 239 (shrunk): with prefix reuse off, the reference's finish matches
/// nothing (its prefix match answers the root), so a finished request's path is not
/// touched. Two requests finish in one step; the next request's room evicts the
/// leaf the reference's LRU order names. kvtier's finish matched (touching) the
/// finished paths all the same, which re-keyed them, and its room evicted another
/// leaf (the new request's first page was 4, not the reference's 2).
#[test]
fn with_prefix_reuse_off_a_finish_touches_nothing() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::Reference,
        publish_prefix_mid_flight: false,
        page_size: 8,
        device_pages: 9,
        host_pages: 0,
        disable_l2_cache: true,
        disable_prefix_cache: true,
        enable_mixed_prefill_decode: true,
        max_scheduled_tokens: 41,
        max_batch_size: 6,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 42,
            host_slots: 0,
            chunk: 16,
        }),
        ..fixture()
    });
    let r06 = vec![
        34, 11, 12, 6, 10, 12, 1, 7, 40, 11, 9, 20, 1, 11, 20, 31, 7, 14, 38, 34, 8, 27, 25, 28,
        35, 6,
    ];
    submit(&mut s, "r00", vec![1]);
    submit(&mut s, "r07", vec![1; 15]);
    submit(&mut s, "r06", r06);
    s.next_plan();
    advance(
        &mut s,
        vec![extend("r00", &[23]), finish("r00"), extend("r06", &[5])],
    );
    submit(&mut s, "r02", vec![1; 16]);
    let decodes = [(28, 19), (30, 25), (8, 7), (2, 30), (35, 12), (37, 2)];
    for (r07, r06) in decodes {
        s.next_plan();
        advance(&mut s, vec![extend("r07", &[r07]), extend("r06", &[r06])]);
    }
    s.next_plan();
    advance(
        &mut s,
        vec![
            extend("r06", &[8]),
            finish("r06"),
            extend("r07", &[31]),
            finish("r07"),
        ],
    );
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["r02"]);
    assert_eq!(s.occupied_pages(&rid("r02")), Some(vec![2, 8, 1]));
    check(&mut s);
}

/// Hybrid seeds 111, 253 and 963 (C.3 and C.5 in docs/notes/mamba-reference.md). Two
/// requests decode until the pool is short; the longer, r00, is retracted with 8
/// tokens, 7 of them computed, so its working slot holds a state 7 tokens deep while its
/// published prefix ends at 6. The reference caches that slot on the published node
/// all the same. Without host states its recovery then finds the slot from the host
/// terminal and resumes r00 from it, which for r00 is exactly right; kvtier's reference
/// policy cached no slot off its depth, found no state, and gave r00 up. With host
/// states the search starts at the deepest host state, there is none, and the
/// reference gives r00 up: kvtier must too, though the slot is still cached.
#[test]
fn a_retracted_request_resumes_from_the_slot_it_left_where_the_reference_finds_it() {
    for host_slots in [0, 4] {
        let mut s = sched(reference(SchedulerConfig {
            page_size: 2,
            device_pages: 8,
            host_pages: 32,
            mamba: Some(kvtier_types::MambaSettings {
                device_slots: 8,
                host_slots,
                chunk: 8,
            }),
            ..fixture()
        }));
        submit(&mut s, "r00", tokens(1, 5));
        submit(&mut s, "r01", tokens(100, 5));
        let mut engine = Engine::default();
        engine.max_new.insert("r00".into(), 8);
        engine.max_new.insert("r01".into(), 3);
        let mut left = None;
        let mut resumed = None;
        let mut given_up = false;
        for _ in 0..40 {
            let plan = step(&mut s, &mut engine);
            if let Some(r) = row(&plan, "r00") {
                // Its last decode before the retraction.
                if r.kind == RowKind::Decode && s.stats().retractions == 0 {
                    left = r.mamba.working;
                }
                if r.kind == RowKind::Recovery {
                    resumed = Some(r.mamba.cow_src);
                }
            }
            given_up |= plan.aborted.iter().any(|a| a.request_id.as_str() == "r00");
            if s.is_idle() {
                break;
            }
        }
        assert_eq!(s.stats().retractions, 1, "host slots {host_slots}");
        if host_slots == 0 {
            assert!(!given_up, "r00 resumes");
            assert_eq!(resumed, Some(left), "from the working slot it left");
        } else {
            assert!(given_up, "the reference's search finds no state (C.5)");
            assert_eq!(resumed, None);
        }
        check(&mut s);
    }
}

/// With `device_slots` state slots and no host copies of states: r00 (8 tokens) finishes
/// and its KV goes to host, its state staying on device; then r01 extends its prompt.
/// The scheduler, r00's cached state slot, and r01's plans.
fn a_prefix_left_on_host(
    device_slots: u32,
) -> (
    kvtier_fsm::Scheduler,
    Option<kvtier_types::SlotId>,
    Vec<kvtier_types::ExecutionPlan>,
) {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 1,
        device_pages: 64,
        host_pages: 64,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots,
            host_slots: 0,
            chunk: 4,
        }),
        ..fixture()
    }));
    let prompt = tokens(1, 8);
    submit(&mut s, "r00", prompt.clone());
    let mut engine = Engine::with_max_new(1);
    let plans = drain(&mut s, &mut engine, 20);
    let cached = row_of(&plans[0], "r00").mamba.checkpoint_dst;
    let mut longer = prompt;
    longer.extend(tokens(50, 4));
    submit(&mut s, "r01", longer);
    let plans = drain(&mut s, &mut engine, 20);
    (s, cached, plans)
}

/// Hybrid seeds 115, 139, 272, 553, 781 and 876 (#612, C.7 in
/// docs/notes/mamba-reference.md). Without host copies of states, a finished request's
/// state stays on device while its KV is written back and leaves the device. A later
/// request with that prompt matches nothing on device and the whole prompt on host. The
/// reference's #612 fix looks for a device state from the host terminal, loads the host
/// prefix back and copies that state; kvtier's reference policies capped a match
/// without a device terminal at the root and computed the prompt again. They now do as
/// the reference, down to the state found (the reference reuses the whole host prefix
/// even when the state is shallower: C.7). Where matches may not use the host tier
/// (`disable_l2_cache`), no such state is taken (hybrid seed 22).
#[test]
fn with_no_device_match_a_state_on_the_host_path_is_reused_with_its_prefix() {
    let (mut s, checkpoint, plans) = a_prefix_left_on_host(8);
    let first = row_of(&plans[0], "r01");
    assert_eq!(
        (first.extend_prefix_len, first.input_length),
        (8, 4),
        "the host prefix is reused"
    );
    assert_eq!(first.mamba.cow_src, checkpoint, "from r00's state at 8");
    assert_eq!(plans[0].load_backs.len(), 1);
    check(&mut s);
}

/// Hybrid seed 277: a pool of two state slots. A finished request's state stays on
/// device while its KV goes to host (no host copies of states); a second request with
/// its prompt reuses that prefix from host and needs the state and a fresh pair. The
/// reference's first chunk makes room for the pair without keeping the state it copies
/// from (its node's KV is not on device, so no lock pins it), and the evicted slot
/// comes back as the row's own: the engine copies from it before it writes it. kvtier
/// kept the source, found no room for three slots in two, and under the reference
/// policy waited for good.
#[test]
fn a_first_chunk_may_take_the_slot_it_copies_from_under_the_reference_policy() {
    let (mut s, cached, plans) = a_prefix_left_on_host(2);
    let first = row_of(&plans[0], "r01");
    assert_eq!(first.extend_prefix_len, 8, "r00's prefix is reused");
    assert_eq!(first.mamba.cow_src, cached, "from r00's state");
    assert!(
        [first.mamba.working, first.mamba.checkpoint_dst].contains(&cached),
        "whose slot is now the row's own: {:?}",
        first.mamba
    );
    check(&mut s);
}

/// Hybrid seed 967 (C.7 in docs/notes/mamba-reference.md). Without host copies of
/// states, rb's KV (12 tokens: its prompt and a decode) went to host while its state at
/// 11 stayed on device. rc extends rb's sequence and matches nothing on device. The
/// reference's #612 match finds that state from the host terminal but leaves the host
/// prefix uncapped: it makes room to load back all 12 pages and starts from the state
/// at 11 (the wrong state: token 12 never goes through it). kvtier loads back only down
/// to the state, but makes the reference's room, so rc waits while rd decodes, as in
/// the reference; it used to run at once and have rd retracted.
#[test]
fn a_state_found_from_the_host_terminal_waits_for_room_for_the_whole_host_prefix() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 8,
        ..reference(SchedulerConfig {
            page_size: 1,
            device_pages: 25,
            host_pages: 64,
            mamba: Some(kvtier_types::MambaSettings {
                device_slots: 8,
                host_slots: 0,
                chunk: 4,
            }),
            ..fixture()
        })
    });
    let mut engine = Engine::with_max_new(1);
    engine.max_new.insert("rb".into(), 3);
    engine.max_new.insert("rd".into(), 4);
    submit(&mut s, "ra", tokens(1, 8));
    drain(&mut s, &mut engine, 20);
    let mut rb = tokens(1, 8);
    rb.extend(tokens(50, 2));
    submit(&mut s, "rb", rb.clone());
    let plans = drain(&mut s, &mut engine, 20);
    let state_at_11 = plans[1].forward.rows[0].mamba.checkpoint_dst;
    submit(&mut s, "rd", tokens(200, 3));
    step(&mut s, &mut engine);
    // rb's sequence: its prompt and the tokens it generated (the engine counts from 1000;
    // ra took 1000).
    let mut rc = rb;
    rc.extend([1001, 1002]);
    rc.extend(tokens(70, 8));
    submit(&mut s, "rc", rc);
    let plans = drain(&mut s, &mut engine, 30);
    let first = plans
        .iter()
        .position(|p| row(p, "rc").is_some())
        .expect("rc runs");
    let last_of_rd = plans
        .iter()
        .rposition(|p| row(p, "rd").is_some())
        .expect("rd decodes");
    assert!(
        last_of_rd < first,
        "rc waits for rd's pages: rd's last row in plan {last_of_rd}, rc's first in {first}"
    );
    let row = row_of(&plans[first], "rc");
    assert_eq!(
        (row.extend_prefix_len, row.mamba.cow_src),
        (11, state_at_11),
        "from the state at 11, with the KV down to it"
    );
    let loaded: usize = plans[first].load_backs.iter().map(|l| l.pairs.len()).sum();
    assert_eq!(loaded, 11);
    assert_eq!(s.stats().retractions, 0);
    check(&mut s);
}

/// Hybrid seed 765, shrunk. r01 and r02 are retracted; r01's prefix is on device and on
/// host, its state on host only. The reference's recovery makes its room over its own
/// view of the match, the device KV capped at the deepest device state, so it evicts
/// r01's own device pages past that state, then finds no state slots and waits; the
/// evictions stay. kvtier's reference policies made the room of an exact resumption
/// over the whole device match, evicted nothing, and later page ids differed. They now
/// make the reference's room first in every recovery (and match again after it).
#[test]
fn a_recovery_makes_the_references_room_even_where_it_resumes_exactly() {
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 1,
        device_pages: 15,
        host_pages: 206,
        max_scheduled_tokens: 4,
        max_batch_size: 5,
        enable_mixed_prefill_decode: false,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 5,
            host_slots: 50,
            chunk: 4,
        }),
        ..fixture()
    }));
    let mut engine = Engine::with_max_new(2);
    engine.max_new.insert("r00".into(), 1);
    engine.max_new.insert("r05".into(), 1);
    submit(&mut s, "r00", vec![29, 4, 34, 36, 19, 13, 35, 26, 2]);
    submit(&mut s, "r05", vec![1]);
    submit(&mut s, "r04", vec![1, 1, 1]);
    submit(&mut s, "r02", vec![1, 1, 1, 1, 1, 1]);
    let mut seen = Vec::new();
    for i in 0..40 {
        if i == 4 {
            submit(&mut s, "r01", vec![29, 4, 34, 36]);
        } else if i > 4 && s.is_idle() {
            break;
        }
        let plan = step(&mut s, &mut engine);
        let stats = s.stats();
        seen.push((
            row_ids(&plan),
            stats.retracted,
            stats.evicted_device_pages,
            stats.available_device_pages,
        ));
    }
    // Plan 9: r04 decodes alone while r01 and r02 wait; the recovery's room evicted two
    // of r01's device pages, and the free count is the reference's.
    let lone_decode = seen
        .iter()
        .position(|(rows, retracted, ..)| *rows == ["r04"] && *retracted == 2)
        .expect("r04 decodes alone while two requests are retracted");
    assert_eq!(lone_decode, 9, "{seen:?}");
    assert_eq!(seen[8].2, 0, "nothing evicted before: {seen:?}");
    assert_eq!((seen[9].2, seen[9].3), (2, 6), "{seen:?}");
    assert!(s.is_idle(), "every request ends: {seen:?}");
    check(&mut s);
}

/// Hybrid seed 102 (C.9 in docs/notes/mamba-reference.md). A retracted request with no
/// full page has the root as its terminal: the reference caches its slot there, where no
/// match finds it, nothing evicts it and nothing frees it, so its pool is one slot
/// smaller for good (and the request is given up: its recovery finds no state). kvtier
/// freed that slot, so later slot ids and admissions differed. The reference policies
/// now hold it at the root too, except in a pool that would be left without room for a
/// pair, where the reference stalls for good (`reference-stall-hybrid-48.py`).
#[test]
fn a_retraction_at_the_root_holds_its_slot_there_for_good() {
    for slots in [4u32, 2] {
        let mut s = sched(reference(SchedulerConfig {
            page_size: 2,
            device_pages: 3,
            host_pages: 0,
            disable_l2_cache: true,
            max_batch_size: 2,
            mamba: Some(kvtier_types::MambaSettings {
                device_slots: slots,
                host_slots: 0,
                chunk: 4,
            }),
            ..fixture()
        }));
        submit(&mut s, "r01", vec![1]);
        submit(&mut s, "r03", vec![1]);
        let mut engine = Engine::with_max_new(4);
        let plans = drain(&mut s, &mut engine, 20);
        let left = row_of(&plans[0], "r01").mamba.checkpoint_dst;
        let given_up: Vec<String> = plans
            .iter()
            .flat_map(|p| &p.aborted)
            .map(|a| a.request_id.to_string())
            .collect();
        assert_eq!(given_up, ["r01", "r03"], "their recovery finds no state");
        let held = s.stats().states.expect("hybrid").held_at_root;
        assert_eq!(held, u32::from(slots > 2), "{slots} slots");
        submit(&mut s, "r05", vec![7]);
        engine.max_new.insert("r05".into(), 1);
        let plans = drain(&mut s, &mut engine, 20);
        let r05 = row_of(&plans[0], "r05").mamba;
        if slots > 2 {
            assert_eq!((r05.working, r05.checkpoint_dst), (Some(0), Some(2)));
            assert_eq!(
                left,
                Some(1),
                "the slot held at the root is r01's checkpoint"
            );
        } else {
            assert_eq!((r05.working, r05.checkpoint_dst), (Some(0), Some(1)));
        }
        check(&mut s);
    }
}

/// Seeds 5249, 6040 and 9789 (plain; 6040 shrunk), and hybrid 612. r04's finish finds
/// its last page already published by r01 (r04's prompt is r01's history), a leaf
/// whose LRU key is old. The reference's insert only touches such a node: a leaf is
/// keyed again when the leaf set changes around it or when one of the reference's own
/// locks on it is released, and its finish never locks the terminal. kvtier re-keyed it
/// twice, at the end of its insert and when it let go of the publication's lock, so a
/// later eviction took r00's newer leaf instead of r01's old one.
#[test]
fn a_finish_that_finds_its_pages_published_leaves_their_lru_order_alone() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::ReferenceWheel,
        page_size: 2,
        decode_input_tokens: 2,
        device_pages: 9,
        host_pages: 0,
        disable_l2_cache: true,
        max_batch_size: 1,
        ..fixture()
    });
    let mut engine = Engine::default();
    for (id, n) in [("r01", 3), ("r04", 1), ("r06", 2), ("r00", 2)] {
        engine.max_new.insert(id.into(), n);
    }
    let r01 = vec![16, 35, 38, 19, 16, 21, 37, 33];
    // r01 runs first (ids order the reference's queue) and generates 1000, 1001, 1002.
    let mut r04 = r01.clone();
    r04.extend([1000, 1001]);
    submit(&mut s, "r04", r04);
    submit(&mut s, "r06", vec![1]);
    submit(&mut s, "r01", r01);
    let mut plans = vec![step(&mut s, &mut engine)];
    submit(&mut s, "r00", vec![1]);
    plans.extend(drain(&mut s, &mut engine, 20));
    let rows: Vec<Vec<String>> = plans.iter().map(row_ids).collect();
    assert_eq!(rows[7], ["r06"], "{rows:?}");
    // r01's fifth page holds its tail block (1000, 1001): the oldest leaf at plan 7.
    let pages = |plan: &kvtier_types::ExecutionPlan| {
        let r = &plan.forward.rows[0];
        plan.forward.page_table[r.pages_start as usize..][..r.pages_len as usize].to_vec()
    };
    let r01_tail = pages(&plans[2])[4];
    let r06 = pages(&plans[7]);
    assert_eq!(
        r06.last(),
        Some(&r01_tail),
        "r06 takes r01's tail page: {r06:?}"
    );
    check(&mut s);
}

/// Hybrid seeds 316 and 839. A recovery row computes the history's last token, as a
/// decode row does: with pages of one token its checkpoint slot gets the state at the
/// history's new page, and the reference caches it there at the next decode's commit.
/// kvtier did not know what that slot held and freed it, so the next slots handed out
/// differed (r01's recovery took it).
#[test]
fn a_recovery_rows_checkpoint_is_cached_like_a_decodes() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 1,
        device_pages: 14,
        host_pages: 64,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 16,
            host_slots: 0,
            chunk: 1,
        }),
        ..fixture()
    }));
    submit(&mut s, "r00", tokens(1, 5));
    submit(&mut s, "r01", tokens(100, 5));
    let mut engine = Engine::with_max_new(8);
    let plans = drain(&mut s, &mut engine, 40);
    let recovery = |id: &str| {
        plans
            .iter()
            .filter_map(|p| row(p, id))
            .find(|r| r.kind == RowKind::Recovery)
            .map(|r| r.mamba)
            .unwrap_or_else(|| panic!("{id} is retracted and resumes"))
    };
    let (r00, r01) = (recovery("r00"), recovery("r01"));
    let cached = r00.checkpoint_dst.expect("a recovery row has a checkpoint");
    assert!(
        ![r01.working, r01.checkpoint_dst].contains(&Some(cached)),
        "r00's recovery checkpoint stays cached: {r00:?} {r01:?}"
    );
    check(&mut s);
}

/// Hybrid seeds 1419, 3608, 4070 and 6821 (3608 shrunk). r03 and r04 share a prompt.
/// r04's retraction copies the prefix and its states to host; at the acknowledgement,
/// their device copies stay, because r03 still runs on them. Then r03 is retracted
/// with nothing left to copy. The reference completes such a retraction as if its copy
/// were acknowledged at once, so device copies of states that have host copies and that
/// nothing holds any more are demoted, and their slots go out again (r07's checkpoint).
/// kvtier's reference policies kept them until the next acknowledgement.
#[test]
fn a_retraction_with_nothing_to_copy_demotes_idle_states_under_the_reference_policy() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::ReferenceWheel,
        page_size: 2,
        max_batch_size: 5,
        max_scheduled_tokens: 5,
        device_pages: 11,
        host_pages: 174,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 18,
            host_slots: 64,
            chunk: 4,
        }),
        ..fixture()
    });
    let mut engine = Engine::default();
    for (id, n) in [
        ("r01", 4),
        ("r05", 4),
        ("r04", 3),
        ("r00", 2),
        ("r03", 3),
        ("r07", 1),
    ] {
        engine.max_new.insert(id.into(), n);
    }
    let prompt = vec![35, 39, 14, 25, 34, 34, 14, 1];
    let mut longer = prompt.clone();
    longer.extend([37, 29]);
    submit(&mut s, "r01", vec![1]);
    submit(&mut s, "r05", vec![1]);
    submit(&mut s, "r04", prompt.clone());
    submit(&mut s, "r00", longer);
    submit(&mut s, "r03", prompt);
    submit(&mut s, "r07", vec![1, 1]);
    let demoted = |s: &mut kvtier_fsm::Scheduler| s.stats().states.expect("hybrid").device_demoted;
    let mut second_retraction = None;
    for _ in 0..40 {
        let before = (s.stats().retractions, demoted(&mut s));
        let plan = step(&mut s, &mut engine);
        let after = (s.stats().retractions, demoted(&mut s));
        if before.0 == 1 && after.0 == 2 {
            assert!(plan.write_backs.is_empty(), "nothing left to copy");
            second_retraction = Some(after.1 - before.1);
        }
        if s.is_idle() {
            break;
        }
    }
    assert_eq!(
        second_retraction,
        Some(2),
        "the shared prefix's two states are demoted"
    );
    check(&mut s);
}

/// Hybrid seed 4007 (and 25 seeds of 0–9,999 that showed as `unwritten-checkpoint`):
/// with prefix reuse off, the reference's finish looks its terminal up with a reuse
/// match, which answers the root, so the finished request's state goes to the root,
/// where it stays for good (C.9). Its pool is one slot short from then on: of two
/// requests that arrive together, only one gets its pair. kvtier's reference policy
/// cached the state on the published node, where the next admission evicted it, and
/// ran both.
#[test]
fn with_prefix_reuse_off_a_finished_requests_state_goes_to_the_root() {
    for policy in [Policy::ReferenceWheel, Policy::default()] {
        let mut s = sched(SchedulerConfig {
            policy,
            publish_prefix_mid_flight: false,
            page_size: 1,
            device_pages: 40,
            host_pages: 0,
            disable_l2_cache: true,
            disable_prefix_cache: true,
            mamba: Some(kvtier_types::MambaSettings {
                device_slots: 4,
                host_slots: 0,
                chunk: 1,
            }),
            ..fixture()
        });
        let mut engine = Engine::with_max_new(1);
        submit(&mut s, "r00", vec![3, 1, 4]);
        drain(&mut s, &mut engine, 10);
        submit(&mut s, "r01", vec![1, 5]);
        submit(&mut s, "r02", vec![9, 2]);
        let plan = step(&mut s, &mut engine);
        let held = s.stats().states.expect("hybrid").held_at_root;
        if policy == Policy::default() {
            assert_eq!(held, 0, "kvtier frees it");
            assert_eq!(row_ids(&plan), ["r01", "r02"]);
        } else {
            assert_eq!(held, 1, "the reference holds r00's state at the root");
            assert_eq!(row_ids(&plan), ["r01"], "three slots left: one pair");
        }
        drain(&mut s, &mut engine, 10);
        let held_after = s.stats().states.expect("hybrid").held_at_root;
        assert_eq!(held_after, held, "the root holds one state at most");
        check(&mut s);
    }
}

/// Hybrid seeds 1166, 1246 and 8833. Two requests that share a prefix finish in one
/// step, the later id's finish first. The reference's first finish claims host pages
/// for the whole prefix; the second copies only its own pages. kvtier issued the
/// write-backs in id order, so the earlier id's op carried the shared prefix. It issues
/// them in the order the finishes came now (under every policy: the order is the
/// engine's).
#[test]
fn the_first_of_two_finishes_in_a_step_copies_the_prefix_they_share() {
    // A hybrid model publishes a prompt at its first decode.
    let mut s = sched(reference(SchedulerConfig {
        enable_mixed_prefill_decode: true,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 16,
            host_slots: 16,
            chunk: 2,
        }),
        ..fixture()
    }));
    submit(&mut s, "r04", vec![1, 2, 3, 4, 5, 6]);
    s.next_plan();
    advance(&mut s, vec![extend("r04", &[9])]);
    s.next_plan(); // r04's first decode publishes its prompt
    advance(&mut s, vec![extend("r04", &[9])]);
    submit(&mut s, "r07", vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let plan = s.next_plan();
    assert_eq!(
        row_of(&plan, "r07").extend_prefix_len,
        6,
        "r07 reuses r04's prompt"
    );
    advance(&mut s, vec![extend("r04", &[9]), extend("r07", &[9])]);
    s.next_plan();
    let shared = s.occupied_pages(&rid("r04")).expect("live")[..3].to_vec();
    assert_eq!(
        s.occupied_pages(&rid("r07")).expect("live")[..3],
        shared[..],
        "shared"
    );
    let own = |s: &kvtier_fsm::Scheduler, id: &str| s.occupied_pages(&rid(id)).expect("live")[3];
    let (r04_own, r07_own) = (own(&s, "r04"), own(&s, "r07"));
    advance(
        &mut s,
        vec![
            extend("r04", &[10]),
            extend("r07", &[10]),
            finish("r07"),
            finish("r04"),
        ],
    );
    let plan = s.next_plan();
    let sources = |page| -> Vec<u32> {
        let op = plan
            .write_backs
            .iter()
            .find(|op| op.pairs.iter().any(|p| p.src == page))
            .expect("copied");
        op.pairs.iter().map(|p| p.src).collect()
    };
    assert!(
        shared.iter().all(|p| sources(r07_own).contains(p)),
        "r07 finished first: its op copies the shared pages ({:?})",
        plan.write_backs
    );
    assert!(!shared.iter().any(|p| sources(r04_own).contains(p)));
    check(&mut s);
}

/// Hybrid seeds 2842 and 5061 (shrunk by hand). Requests given up at their retraction
/// (no host room) publish their prompts first. r04's prompt is r02's, already cached:
/// the reference's insert and match only touch r02's leaf, and it locks nothing there
/// (it locks the published path only to copy it), so the leaf keeps its old place in
/// the LRU order. kvtier let go of a lock on it, which re-keyed it, and the next
/// eviction took r01's newer leaf instead.
#[test]
fn a_request_given_up_at_its_retraction_leaves_the_lru_order_of_its_prompt_alone() {
    let mut s = sched(reference(SchedulerConfig {
        page_size: 4,
        device_pages: 9,
        host_pages: 0,
        disable_l2_cache: true,
        enable_kv_cache_events: true,
        max_batch_size: 3,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 2,
            host_slots: 0,
            chunk: 16,
        }),
        ..fixture()
    }));
    let r02: Vec<i32> = (1..=12).collect();
    let mut r01 = r02[..8].to_vec();
    r01.extend([50, 51, 52, 53, 54, 55]);
    let mut engine = Engine::with_max_new(4);
    let mut stored = std::collections::BTreeMap::new();
    let mut removed = Vec::new();
    for (id, prompt) in [("r02", r02.clone()), ("r01", r01), ("r04", r02.clone())] {
        submit(&mut s, id, prompt);
        for plan in drain(&mut s, &mut engine, 10) {
            assert!(plan.forward.rows.iter().all(|r| r.extend_prefix_len == 0));
        }
        for e in s.drain_kv_events() {
            if let kvtier_types::KvEvent::BlockStored {
                block_hashes,
                token_ids,
                ..
            } = e
            {
                stored.insert(block_hashes[0], token_ids);
            }
        }
    }
    assert_eq!(stored.len(), 4, "r02's three pages and r01's last");
    submit(&mut s, "r05", (100..123).collect());
    drain(&mut s, &mut engine, 10);
    for e in s.drain_kv_events() {
        if let kvtier_types::KvEvent::BlockRemoved { block_hashes, .. } = e {
            removed.extend(block_hashes.iter().map(|h| stored[h].clone()));
        }
    }
    assert_eq!(
        removed.first(),
        Some(&vec![9, 10, 11, 12]),
        "r02's leaf is the older: {removed:?}"
    );
    check(&mut s);
}

/// Hybrid seeds 1811 and 3640 (3640 shrunk). r03's finish caches its checkpoint on its
/// published node, though the slot holds another depth (C.3). The reference's first
/// chunk for r08, whose prompt shares that node's prefix, makes room for its own view
/// of the match, which counts that state: a longer prefix, so fewer pages, and its
/// lock keeps the path from eviction. kvtier made room for its own match, which skips
/// the state: more pages, evicting what the reference keeps, and r08 ran a plan early.
#[test]
fn a_first_chunk_makes_room_for_the_references_view_of_its_match() {
    let mut s = sched(SchedulerConfig {
        policy: Policy::ReferenceWheel,
        page_size: 4,
        device_pages: 16,
        host_pages: 4,
        max_batch_size: 3,
        max_scheduled_tokens: 13,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 4,
            host_slots: 78,
            chunk: 8,
        }),
        ..fixture()
    });
    let mut engine = Engine::default();
    for (id, n) in [("r03", 1), ("r04", 2), ("r05", 1), ("r08", 1)] {
        engine.max_new.insert(id.into(), n);
    }
    let prefix = vec![37, 11, 8, 28, 15, 21, 35, 27, 24, 26, 6, 4];
    let with = |tail: &[i32]| [prefix.clone(), tail.to_vec()].concat();
    submit(&mut s, "r05", vec![1, 1, 1]);
    submit(&mut s, "r04", with(&[34]));
    submit(
        &mut s,
        "r03",
        with(&[35, 9, 30, 11, 37, 7, 37, 8, 30, 10, 39, 35]),
    );
    submit(&mut s, "r08", with(&[7]));
    let rows: Vec<Vec<String>> = (0..5)
        .map(|_| row_ids(&step(&mut s, &mut engine)))
        .collect();
    assert_eq!(
        rows[4],
        ["r05"],
        "r08 waits a plan, as in the reference: {rows:?}"
    );
    check(&mut s);
}

/// Hybrid seeds 5016 and 16131 (16131 shrunk): r01 and then r08 are retracted, their
/// states left on device nodes with no host copy. r01 resumes, is retracted again, and
/// r08's recovery, failing for room, evicts r01's path and its state. At the next plan
/// the reference gives r01 up (state lost) and frees its kept pages at once: r08, the
/// next candidate, resumes on them in that same plan. kvtier freed them once the plan's
/// admission was over, so r08 waited a plan. The kept pages travel with the recovery
/// intent now, and the cache frees them where it gives the request up.
#[test]
fn a_request_given_up_for_its_lost_state_frees_its_pages_for_the_next_recovery() {
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 2,
        device_pages: 21,
        host_pages: 230,
        max_batch_size: 7,
        max_scheduled_tokens: 8,
        decode_input_tokens: 2,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 20,
            host_slots: 0,
            chunk: 8,
        }),
        ..fixture()
    }));
    let mut engine = Engine::default();
    for (id, n) in [("r08", 5), ("r09", 5), ("r00", 8), ("r01", 4)] {
        engine.max_new.insert(id.into(), n);
    }
    submit(&mut s, "r08", vec![1; 7]);
    submit(&mut s, "r09", vec![9, 16]);
    submit(&mut s, "r00", vec![1]);
    submit(&mut s, "r01", vec![30, 7, 23, 9, 34, 1, 38, 39, 19, 17, 14]);
    let plans: Vec<_> = (0..14).map(|_| step(&mut s, &mut engine)).collect();
    let aborted: Vec<_> = plans.iter().flat_map(|p| p.aborted.iter()).collect();
    let lost = plans
        .iter()
        .position(|p| p.aborted.iter().any(|a| a.request_id.as_str() == "r01"))
        .expect("r01 is given up");
    assert_eq!(aborted.len(), 1, "{aborted:?}");
    assert_eq!(aborted[0].reason, kvtier_types::AbortReason::StateLost);
    let resumed = plans[lost]
        .forward
        .rows
        .iter()
        .find(|r| r.request_id.as_str() == "r08")
        .map(|r| r.kind);
    assert_eq!(
        resumed,
        Some(RowKind::Recovery),
        "r08 resumes in the plan that gives r01 up: {:?}",
        row_ids(&plans[lost])
    );
    check(&mut s);
}

/// Hybrid seed 39154 (shrunk; 13637, 17033 and 17593 of 10,000–39,999 too): r01 is
/// retracted with a state at the device terminal of its match, and the one its
/// recovery would start from above it. The reference makes room for two state slots
/// with that terminal locked, so the state there cannot go; no other state is an
/// unlocked leaf, and r01 stays retracted. kvtier unlocked the terminal before making
/// the state room, evicted that state for the slots, and requeued r01 to recompute.
#[test]
fn a_recovery_keeps_its_path_locked_while_it_makes_room_for_its_states() {
    let mut s = sched(wheel(SchedulerConfig {
        page_size: 1,
        device_pages: 27,
        host_pages: 182,
        max_batch_size: 8,
        max_scheduled_tokens: 4,
        mamba: Some(kvtier_types::MambaSettings {
            device_slots: 7,
            host_slots: 64,
            chunk: 1,
        }),
        ..fixture()
    }));
    let mut engine = Engine::default();
    for (id, n) in [("r00", 1), ("r01", 2), ("r02", 9)] {
        engine.max_new.insert(id.into(), n);
    }
    let r01 = vec![27, 8, 28, 15, 34, 4, 3, 7, 14, 32, 37];
    submit(&mut s, "r01", r01.clone());
    submit(&mut s, "r00", [r01, vec![2, 21, 39]].concat());
    submit(&mut s, "r02", vec![1; 5]);
    run_until(&mut s, &mut engine, 10, |s, _| {
        state(s, "r01") == StateKind::Retracted
    });
    for _ in 0..3 {
        step(&mut s, &mut engine);
        assert_eq!(state(&s, "r01"), StateKind::Retracted, "r01 waits");
    }
    assert_eq!(s.stats().recomputes, 0);
    check(&mut s);
}
