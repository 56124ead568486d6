//! Hybrid models through the whole scheduler: each request's working and checkpoint
//! slots in its rows, the states it caches, reuse capped at the deepest cached state,
//! host copies and load-backs beside the KV, retraction and recovery. Ports of the
//! reference's `test_mamba_integration.cpp` (its fixture: pages of 2 tokens, 32 device
//! and 32 host pages, budget 64, batch 8), the review bug of reference 003 and the bugs
//! of spec/hybrid-l3.md §1.7 (mapped in docs/test-inventory/mamba.md).

mod common;

use common::*;
use kvtier_fsm::Scheduler;
use kvtier_mamba::MambaStats;
use kvtier_radix::CachedState;
use kvtier_types::{
    ExecutionPlan, MambaSettings, Policy, RowKind, SchedulerConfig, Token, TransferKind,
};

/// The fixture with `device_slots` state slots (host copies off), kernel chunk 64.
fn hybrid(device_slots: u32) -> SchedulerConfig {
    SchedulerConfig {
        mamba: Some(MambaSettings {
            device_slots,
            host_slots: 0,
            chunk: 64,
        }),
        ..fixture()
    }
}

/// The reference's `MambaL2IntegrationTest`: 16 device and 16 host state slots.
fn hybrid_l2() -> SchedulerConfig {
    SchedulerConfig {
        mamba: Some(MambaSettings {
            device_slots: 16,
            host_slots: 16,
            chunk: 64,
        }),
        ..fixture()
    }
}

fn states(s: &mut Scheduler) -> MambaStats {
    s.stats().states.expect("a hybrid scheduler")
}

/// The states cached along `tokens`.
fn cached(s: &Scheduler, tokens: &[Token]) -> Vec<CachedState> {
    s.cache().cached_states(tokens)
}

/// State copies among `pairs`.
fn state_pairs(pairs: &[kvtier_types::TransferPair]) -> usize {
    pairs
        .iter()
        .filter(|p| p.kind == TransferKind::Mamba)
        .count()
}

fn load_back_states(plan: &ExecutionPlan) -> usize {
    plan.load_backs
        .iter()
        .map(|op| state_pairs(&op.pairs))
        .sum()
}

fn write_back_states(plan: &ExecutionPlan) -> usize {
    plan.write_backs
        .iter()
        .map(|op| state_pairs(&op.pairs))
        .sum()
}

/// Every state slot is free or cached (nothing held once no request runs).
fn all_slots_home(s: &mut Scheduler, config: &SchedulerConfig) {
    let m = config.mamba.expect("hybrid");
    let st = states(s);
    assert_eq!(
        (
            st.free_device_slots + st.device_states + st.held_at_root,
            st.free_host_slots + st.host_states
        ),
        (m.device_slots, m.host_slots),
        "{st:?}"
    );
    check(s);
}

/// r1 (4 tokens) prefills and decodes: its rows name its own slots; the first decode's
/// plan caches the prefill's checkpoint, the state after the 2 pages.
#[test]
fn basic_prefill_decode_finish() {
    let config = hybrid(16);
    let mut s = sched(config.clone());
    submit(&mut s, "r1", tokens(1, 4));
    let plan = s.next_plan();
    let row = row_of(&plan, "r1");
    assert_eq!(row.kind, RowKind::Prefill);
    let (working, checkpoint) = (row.mamba.working, row.mamba.checkpoint_dst);
    assert!(working.is_some() && checkpoint.is_some() && working != checkpoint);
    assert_eq!((row.mamba.cow_src, row.mamba.branching), (None, None));
    advance(&mut s, vec![extend("r1", &[100])]);
    let plan = s.next_plan();
    let row = row_of(&plan, "r1");
    assert_eq!((row.kind, row.mamba.working), (RowKind::Decode, working));
    assert_ne!(
        row.mamba.checkpoint_dst, checkpoint,
        "the old one is cached"
    );
    assert_eq!(
        cached(&s, &tokens(1, 4)),
        [CachedState {
            pages: 2,
            device: checkpoint,
            host: None
        }]
    );
    advance(&mut s, vec![finish("r1")]);
    s.next_plan();
    all_slots_home(&mut s, &config);
}

/// r2 shares 3 of r1's 4 pages as its except-last prefix: no state lies on that path
/// (r1's is after page 4), so r2 reuses nothing and copies no state.
#[test]
fn prefix_sharing_needs_a_state_on_the_shared_path() {
    let config = hybrid(16);
    let mut s = sched(config.clone());
    let mut e = Engine::with_max_new(1);
    submit(&mut s, "r1", tokens(1, 8));
    drain(&mut s, &mut e, 10);
    assert_eq!(cached(&s, &tokens(1, 8)).last().map(|c| c.pages), Some(4));
    submit(&mut s, "r2", tokens(1, 8));
    let plan = s.next_plan();
    let row = row_of(&plan, "r2");
    assert_eq!((row.extend_prefix_len, row.mamba.cow_src), (0, None));
    // A request whose except-last prefix reaches the state resumes from it.
    let mut longer = tokens(1, 8);
    longer.push(9);
    submit(&mut s, "r3", longer);
    let plan = s.next_plan();
    let row = row_of(&plan, "r3");
    assert_eq!(row.extend_prefix_len, 8);
    assert_eq!(row.mamba.cow_src, cached(&s, &tokens(1, 8))[0].device);
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// A request finished from PrefillDone returns its pair; eight one-page requests then
/// get eight pairs from the 16 slots (the reference admitted only 7: its finish cached
/// the checkpoint at a depth whose state it does not hold, notes C.3).
#[test]
fn a_finish_from_prefill_done_returns_the_pair() {
    let config = hybrid(16);
    let mut s = sched(config.clone());
    submit(&mut s, "r1", tokens(1, 4));
    s.next_plan();
    advance(&mut s, vec![finish("r1")]);
    s.next_plan();
    assert!(
        cached(&s, &tokens(1, 4)).is_empty(),
        "the checkpoint holds the state after 4 tokens, the finish publishes 1 page"
    );
    all_slots_home(&mut s, &config);
    for i in 0..8 {
        submit(&mut s, &format!("fill_{i}"), tokens(100 + 10 * i, 2));
    }
    let plan = s.next_plan();
    assert_eq!(plan.forward.rows.len(), 8);
    check(&mut s);
}

/// State pressure at the first decode (2 slots, both the request's): it decodes without
/// a fresh checkpoint rather than failing a transition.
#[test]
fn state_pressure_at_the_first_decode_fails_nothing() {
    let config = SchedulerConfig {
        max_batch_size: 1,
        ..hybrid(2)
    };
    let mut s = sched(config.clone());
    submit(&mut s, "r1", tokens(1, 2));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[100])]);
    let plan = s.next_plan();
    let row = row_of(&plan, "r1");
    assert_eq!(row.kind, RowKind::Decode);
    assert!(row.mamba.working.is_some());
    assert_eq!(
        row.mamba.checkpoint_dst, None,
        "no fresh checkpoint: the prefill's is cached, no slot is free"
    );
    assert_eq!(cached(&s, &tokens(1, 2)).len(), 1);
    assert_eq!((s.stats().retractions, plan.write_backs.len()), (0, 0));
    check(&mut s);
    let mut e = Engine::with_max_new(4);
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// 24 slots hold 12 pairs: of 16 one-page requests, 12 are admitted, each with its own
/// pair, and 4 wait.
#[test]
fn twenty_four_slots_admit_twelve_pairs() {
    let config = SchedulerConfig {
        max_batch_size: 16,
        max_scheduled_tokens: 1024,
        ..hybrid(24)
    };
    let mut s = sched(config);
    for i in 0..16 {
        submit(&mut s, &format!("r{i:02}"), tokens(100 * (i + 1), 2));
    }
    let plan = s.next_plan();
    assert_eq!(plan.forward.rows.len(), 12);
    let mut slots = std::collections::BTreeSet::new();
    for row in &plan.forward.rows {
        for slot in [row.mamba.working, row.mamba.checkpoint_dst] {
            assert!(slots.insert(slot.expect("a slot")), "slot named twice");
        }
    }
    let stats = s.stats();
    assert_eq!((stats.waiting, stats.prefilling), (4, 12));
    check(&mut s);
}

/// A chunk that ends off the kernel's 4-token grid holds no checkpoint: nothing is
/// cached for it, nor by the finish after it (the reference cached the unwritten
/// checkpoint there, notes C.3), and a request sharing its first page reuses nothing.
#[test]
fn an_unaligned_chunk_caches_no_state() {
    let config = SchedulerConfig {
        max_scheduled_tokens: 3,
        mamba: Some(MambaSettings {
            device_slots: 16,
            host_slots: 0,
            chunk: 4,
        }),
        ..fixture()
    };
    let mut s = sched(config.clone());
    submit(&mut s, "r1", vec![1, 2, 3, 4, 5]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").input_length, 3);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").input_length, 2);
    advance(&mut s, vec![finish("r1")]);
    s.next_plan();
    assert_eq!(cached(&s, &[1, 2, 3, 4, 5]), []);
    submit(&mut s, "r2", vec![1, 2, 9]);
    let plan = s.next_plan();
    let row = row_of(&plan, "r2");
    assert_eq!((row.extend_prefix_len, row.mamba.cow_src), (0, None));
    check(&mut s);
}

/// r1 of 4 tokens, decoded once and finished: its finish write-back copies its state
/// beside its KV pages.
fn finish_with_write_back(s: &mut Scheduler) -> ExecutionPlan {
    submit(s, "r1", tokens(1, 4));
    s.next_plan();
    advance(s, vec![extend("r1", &[100])]);
    s.next_plan();
    advance(s, vec![finish("r1")]);
    s.next_plan()
}

#[test]
fn the_finish_write_back_carries_the_state_pair() {
    let mut s = sched(hybrid_l2());
    let plan = finish_with_write_back(&mut s);
    assert_eq!(plan.write_backs.len(), 1);
    assert_eq!(write_back_states(&plan), 1, "{:?}", plan.write_backs);
    check(&mut s);
}

/// After the write-back's ack the device copies are demoted; a request extending the
/// prefix loads KV and state back in one op — the host hit survives write-back and
/// demotion (the review bug of reference 003: its walk started at the device terminal,
/// where the hit had vanished).
#[test]
fn a_host_hit_survives_write_back_and_demotion() {
    let config = hybrid_l2();
    let mut s = sched(config.clone());
    let plan = finish_with_write_back(&mut s);
    ack_write_backs(&mut s, &plan, true);
    s.next_plan();
    let st = states(&mut s);
    assert_eq!((st.device_states, st.host_states), (0, 1), "{st:?}");
    submit(&mut s, "r2", tokens(1, 6));
    let plan = s.next_plan();
    let [load] = plan.load_backs.as_slice() else {
        panic!("one load-back: {:?}", plan.load_backs)
    };
    assert_eq!(state_pairs(&load.pairs), 1);
    assert!(load.pairs.iter().any(|p| p.kind == TransferKind::Kv));
    let row = row_of(&plan, "r2");
    assert_eq!(row.extend_prefix_len, 4, "the host hit is reused");
    let state = load.pairs.iter().find(|p| p.kind == TransferKind::Mamba);
    assert_eq!(row.mamba.cow_src, state.map(|p| p.dst));
    let mut e = Engine::with_max_new(1);
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// The ack lands while a child request reads the device state: the device copy stays
/// until the child lets go (it aborts), then is demoted; a later request loads the host
/// state back although the KV is on device.
#[test]
fn a_host_only_state_loads_back_after_its_reader_lets_go() {
    let config = hybrid_l2();
    let mut s = sched(config.clone());
    let plan = finish_with_write_back(&mut s);
    submit(&mut s, "child", tokens(1, 6));
    let child = s.next_plan();
    assert_eq!(row_of(&child, "child").extend_prefix_len, 4);
    assert!(row_of(&child, "child").mamba.cow_src.is_some());
    advance(&mut s, vec![extend("child", &[200])]);
    s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    s.next_plan();
    advance(&mut s, vec![abort("child")]);
    s.next_plan();
    let cached_r1 = cached(&s, &tokens(1, 4));
    assert_eq!(
        cached_r1
            .iter()
            .map(|c| (c.pages, c.device.is_some(), c.host.is_some()))
            .collect::<Vec<_>>(),
        [(2, false, true)],
        "demoted once the child let go"
    );
    submit(&mut s, "probe", vec![1, 2, 3, 4, 9]);
    let plan = s.next_plan();
    assert_eq!(load_back_states(&plan), 1);
    assert_eq!(row_of(&plan, "probe").extend_prefix_len, 4);
    let mut e = Engine::with_max_new(1);
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// With the prefix cache off, a retracted request still resumes from the state it
/// cached (recovery matches whatever the tree holds).
#[test]
fn a_retracted_request_recovers_from_its_cached_state_with_the_prefix_cache_off() {
    let config = SchedulerConfig {
        disable_prefix_cache: true,
        decode_input_tokens: 0,
        device_pages: 3,
        host_pages: 16,
        mamba: Some(MambaSettings {
            device_slots: 16,
            host_slots: 0,
            chunk: 64,
        }),
        ..fixture()
    };
    let mut s = sched(config.clone());
    submit(&mut s, "r1", tokens(1, 2));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[100])]);
    s.next_plan();
    advance(&mut s, vec![reserve("r1", 3)]);
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 1, "retracted: {plan:?}");
    ack_write_backs(&mut s, &plan, true);
    assert_eq!(s.stats().retracted, 1);
    let plan = s.next_plan();
    let row = row_of(&plan, "r1");
    assert_eq!(row.kind, RowKind::Recovery);
    assert!(row.mamba.cow_src.is_some() && row.mamba.working.is_some());
    assert!(row.mamba.checkpoint_dst.is_some());
    check(&mut s);
}

// ----- spec/hybrid-l3.md §1.7 and the lifecycle -------------------------------------------

/// #612: without host states, KV that only the host holds has no state: a request whose
/// prefix was written back and demoted computes it again.
#[test]
fn a_host_only_kv_hit_without_its_state_is_not_reused() {
    let config = hybrid(16);
    let mut s = sched(config.clone());
    let plan = finish_with_write_back(&mut s);
    ack_write_backs(&mut s, &plan, true);
    s.next_plan();
    let kv = s.cache().probe(&tokens(1, 4));
    assert_eq!(
        (kv.device_pages, kv.host_pages),
        (0, 2),
        "written back, demoted"
    );
    assert_eq!(
        states(&mut s).device_states,
        1,
        "the state stays, on a host-only node"
    );
    submit(&mut s, "r2", tokens(1, 6));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r2").extend_prefix_len, 0);
    assert!(plan.load_backs.is_empty());
    check(&mut s);
}

/// Allocating in a transition what admission did not reserve: with 2 slots, both r1's,
/// r2 waits — and its wait takes nothing.
#[test]
fn a_first_chunk_needs_both_slots_or_waits_taking_nothing() {
    let config = SchedulerConfig {
        max_batch_size: 2,
        ..hybrid(2)
    };
    let mut s = sched(config.clone());
    submit(&mut s, "r1", tokens(1, 2));
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[100])]);
    let before = (free_device(&mut s), states(&mut s));
    submit(&mut s, "r2", tokens(50, 2));
    let plan = s.next_plan();
    assert!(row(&plan, "r2").is_none());
    assert_eq!(state(&s, "r2"), kvtier_fsm::StateKind::Submitted);
    let after = (free_device(&mut s), states(&mut s));
    assert_eq!(before.1.free_device_slots, after.1.free_device_slots);
    check(&mut s);
    let mut e = Engine::with_max_new(1);
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// The state a request starts from is never evicted to make room for its own slots: with
/// room for only a pair, it gives the cached state up and computes from scratch, never
/// copying from a slot it was just handed.
#[test]
fn an_admission_never_copies_from_its_own_slot() {
    let config = SchedulerConfig {
        max_batch_size: 1,
        ..hybrid(2)
    };
    let mut s = sched(config.clone());
    let mut e = Engine::with_max_new(1);
    submit(&mut s, "r1", tokens(1, 4));
    drain(&mut s, &mut e, 10);
    assert_eq!(states(&mut s).device_states, 1, "r1 cached a state");
    let mut prompt = tokens(1, 4);
    prompt.push(9);
    submit(&mut s, "r2", prompt);
    let plan = s.next_plan();
    let row = row_of(&plan, "r2");
    assert_eq!((row.extend_prefix_len, row.mamba.cow_src), (0, None));
    drain(&mut s, &mut e, 20);
    all_slots_home(&mut s, &config);
}

/// Every exit returns a request's pair: finish, abort in every state, retraction.
#[test]
fn every_exit_returns_the_pair() {
    let config = SchedulerConfig {
        device_pages: 9,
        ..hybrid(6)
    };
    let mut s = sched(config.clone());
    // Abort while waiting, while prefilling, while decoding.
    submit(&mut s, "waiting", tokens(1, 4));
    advance(&mut s, vec![abort("waiting")]);
    all_slots_home(&mut s, &config);
    submit(&mut s, "prefilling", tokens(10, 4));
    s.next_plan();
    advance(&mut s, vec![abort("prefilling")]);
    s.next_plan();
    all_slots_home(&mut s, &config);
    submit(&mut s, "decoding", tokens(20, 4));
    s.next_plan();
    advance(&mut s, vec![extend("decoding", &[1])]);
    s.next_plan();
    advance(&mut s, vec![abort("decoding")]);
    s.next_plan();
    all_slots_home(&mut s, &config);
    // Retraction under page pressure, then recovery, decode and finish.
    let mut e = Engine::with_max_new(6);
    for i in 0..3 {
        submit(&mut s, &format!("r{i}"), tokens(100 * (i + 1), 4));
    }
    drain(&mut s, &mut e, 100);
    assert!(s.stats().retractions > 0, "the pool forced a retraction");
    all_slots_home(&mut s, &config);
}

/// Ties never reach a decision by address: two schedulers fed the same requests plan
/// alike, state slots included, under both policies.
#[test]
fn decisions_are_deterministic() {
    for policy in [Policy::Default, Policy::Reference] {
        let config = SchedulerConfig {
            policy,
            device_pages: 12,
            ..hybrid(6)
        };
        let run = || {
            let mut s = sched(config.clone());
            let mut e = Engine::with_max_new(3);
            for i in 0..6 {
                let mut prompt = tokens(1, 4);
                prompt.extend(tokens(50 + i, 3));
                submit(&mut s, &format!("r{i}"), prompt);
            }
            drain(&mut s, &mut e, 200)
        };
        assert_eq!(run(), run(), "{policy:?}");
    }
}
