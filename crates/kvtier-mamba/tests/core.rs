//! The Mamba family's core against the behaviour of the reference (hybrid-l3.md §1) and
//! its bugs to avoid (§1.7).

use kvtier_mamba::{MambaConfig, MambaCore, StateMatch, StateSource, checkpoint_depth};
use kvtier_types::hash::{PageHash, rolling_page_hashes};
use kvtier_types::{Tier, Token, TransferKind};

const P: u32 = 2;

fn config(device_slots: u32, host_slots: u32) -> MambaConfig {
    MambaConfig {
        page_size: P,
        device_slots,
        host_slots,
        kernel_chunk: 4,
    }
}

fn core(device_slots: u32, host_slots: u32) -> MambaCore {
    MambaCore::new(config(device_slots, host_slots)).expect("valid config")
}

/// Page hashes of `tokens` (full pages only).
fn path(tokens: &[Token]) -> Vec<PageHash> {
    rolling_page_hashes(None, tokens, P as usize)
}

fn toks(n: usize) -> Vec<Token> {
    (1..=n as Token).collect()
}

/// Caches the state after the first `pages` pages of `tokens` through a request's pair.
fn cache_state(c: &mut MambaCore, tokens: &[Token], pages: usize) {
    let admitted = c.admit(None).expect("slots");
    let slot = admitted.states.checkpoint.expect("a checkpoint slot");
    assert!(
        c.publish(&path(tokens)[..pages], slot)
            .expect("valid publish")
    );
}

fn check(c: &mut MambaCore) {
    c.check_invariants().expect("invariants hold");
}

// ----- match cap (§1.4) ---------------------------------------------------------------

/// 3 KV pages and no state: nothing is reusable; the prefill checkpoints at the KV
/// depth aligned to the kernel chunk (4 tokens).
#[test]
fn kv_without_any_state_is_not_reusable() {
    let c = core(8, 0);
    let m = c.match_prefix(&path(&toks(8)), 3, 0);
    assert_eq!(
        m,
        StateMatch {
            pages: 0,
            source: None,
            branching: Some(4)
        }
    );
}

/// A state at 2 pages under 4 KV pages: the match caps at 2 pages, and the branching
/// length is the KV depth aligned (8 tokens).
#[test]
fn the_match_caps_at_the_deepest_state_within_the_kv_match() {
    let mut c = core(8, 0);
    let t = toks(10);
    cache_state(&mut c, &t, 2);
    let m = c.match_prefix(&path(&t), 4, 0);
    assert_eq!(m.pages, 2);
    assert!(matches!(m.source, Some(StateSource::Device(_))));
    assert_eq!(m.branching, Some(8));
    // With 3 KV pages the aligned depth (4 tokens) is the state's own: no branching.
    assert_eq!(c.match_prefix(&path(&t), 3, 0).branching, None);
    // A state deeper than the KV match is not reachable.
    assert_eq!(c.match_prefix(&path(&t), 1, 0).pages, 0);
    check(&mut c);
}

/// A prompt that diverges from a cached path inside the pages before the state finds
/// no state.
#[test]
fn a_prompt_diverging_before_the_state_finds_none() {
    let mut c = core(8, 0);
    cache_state(&mut c, &toks(8), 3);
    let mut other = toks(8);
    other[3] = 99;
    let m = c.match_prefix(&path(&other), 3, 0);
    assert_eq!((m.pages, m.source, m.branching), (0, None, Some(4)));
}

/// Bug #612: a host-only KV hit whose state is not cached anywhere was reused without
/// any state. Here it caps to nothing, with and without host copies of states.
#[test]
fn a_host_only_kv_hit_without_its_state_is_not_reused() {
    for host_slots in [0, 8] {
        let c = core(8, host_slots);
        let m = c.match_prefix(&path(&toks(10)), 0, 4);
        assert_eq!((m.pages, m.source), (0, None), "host slots {host_slots}");
    }
}

/// With host copies: a host state deeper than every device state wins (it is loaded
/// back); a device state at least as deep wins otherwise.
#[test]
fn a_deeper_host_state_beats_a_device_state() {
    let mut c = core(8, 8);
    let t = toks(12);
    cache_state(&mut c, &t, 1);
    cache_state(&mut c, &t, 3);
    // Write the 3-page state back and acknowledge: demoted to host only.
    let p = path(&t);
    let pairs = c.prepare_write_back(7, &p[2..3]).expect("prepared");
    assert_eq!(pairs.len(), 1);
    assert_eq!(pairs[0].kind, TransferKind::Mamba);
    c.ack_write_back(7, true).expect("acked");
    assert_eq!(c.device_slot(&p[..3]), None, "demoted");
    assert!(c.host_slot(&p[..3]).is_some());
    let m = c.match_prefix(&p, 1, 4);
    assert_eq!(m.pages, 3);
    assert!(matches!(m.source, Some(StateSource::Host(_))));
    // Only KV for 2 pages on host: the device state at 1 page is the deepest.
    let m = c.match_prefix(&p, 1, 2);
    assert_eq!(m.pages, 1);
    assert!(matches!(m.source, Some(StateSource::Device(_))));
    check(&mut c);
}

// ----- admission and request pairs (§1.3) -------------------------------------------------

/// An admission takes a working and a checkpoint slot, or nothing at all.
#[test]
fn admission_takes_a_pair_or_nothing() {
    let mut c = core(4, 0); // 3 usable
    let a = c.admit(None).expect("two of three");
    assert_eq!(
        (
            a.states.working.id(),
            a.states.checkpoint.as_ref().map(|s| s.id())
        ),
        (1, Some(2))
    );
    assert!(c.admit(None).is_none(), "one slot left: refused");
    assert_eq!(c.stats().free_device_slots, 1, "nothing taken");
    assert_eq!(c.stats().refused_admissions, 1);
    drop(a);
    assert_eq!(c.stats().free_device_slots, 3, "the pair came back");
    check(&mut c);
}

/// Admission from a device state copies it (cow) and never evicts it to make room,
/// even as the oldest leaf.
#[test]
fn admission_from_a_state_protects_it_from_its_own_eviction() {
    let mut c = core(4, 0); // 3 usable: two states leave one free
    let t = toks(8);
    cache_state(&mut c, &t, 1); // oldest
    cache_state(&mut c, &t, 2);
    let m = c.match_prefix(&path(&t), 1, 0);
    let a = c.admit(m.source).expect("evicts the other state");
    assert_eq!(a.cow_src, c.device_slot(&path(&t)[..1]));
    assert!(a.cow_src.is_some());
    assert_eq!(
        c.device_slot(&path(&t)[..2]),
        None,
        "the unprotected state went"
    );
    assert_eq!(c.stats().device_evictions, 1);
    check(&mut c);
}

/// Admission from a host state loads it back: a device slot attached at once, and a
/// host → device state copy for the plan.
#[test]
fn admission_from_a_host_state_loads_it_back() {
    let mut c = core(8, 8);
    let t = toks(8);
    cache_state(&mut c, &t, 2);
    let p = path(&t);
    c.prepare_write_back(1, &p[..2]).expect("prepared");
    c.ack_write_back(1, true).expect("acked");
    let host = c.host_slot(&p[..2]).expect("host copy");
    let m = c.match_prefix(&p, 0, 3);
    let a = c.admit(m.source).expect("admitted");
    let pair = a.load_back.expect("a load-back");
    assert_eq!((pair.kind, pair.src), (TransferKind::Mamba, host));
    assert_eq!(Some(pair.dst), c.device_slot(&p[..2]), "attached at once");
    assert_eq!(a.cow_src, Some(pair.dst));
    check(&mut c);
}

// ----- publication ----------------------------------------------------------------------

/// A depth that already has a device state keeps it; the new checkpoint is freed.
#[test]
fn publishing_a_depth_twice_keeps_the_first_state() {
    let mut c = core(8, 0);
    let t = toks(8);
    cache_state(&mut c, &t, 2);
    let first = c.device_slot(&path(&t)[..2]);
    let a = c.admit(None).expect("slots");
    let slot = a.states.checkpoint.expect("checkpoint");
    assert!(!c.publish(&path(&t)[..2], slot).expect("valid"));
    assert_eq!(c.device_slot(&path(&t)[..2]), first);
    assert_eq!(c.stats().duplicates, 1);
    drop(a.states.working);
    check(&mut c);
}

#[test]
fn an_empty_path_is_refused_and_frees_the_slot() {
    let mut c = core(8, 0);
    let a = c.admit(None).expect("slots");
    let slot = a.states.checkpoint.expect("checkpoint");
    assert_eq!(
        c.publish(&[], slot),
        Err(kvtier_mamba::MambaError::EmptyPath)
    );
    drop(a.states.working);
    assert_eq!(c.stats().free_device_slots, 7);
    check(&mut c);
}

// ----- eviction (§1.5) ------------------------------------------------------------------

/// Leaves go oldest first by (time, seq); the parent of an evicted leaf becomes a leaf.
#[test]
fn eviction_takes_the_oldest_leaf_and_promotes_its_parent() {
    let mut c = core(6, 0); // 5 usable
    let t = toks(8);
    let u: Vec<Token> = (100..108).collect();
    cache_state(&mut c, &t, 1); // A (parent of B), used at time 1
    cache_state(&mut c, &t, 3); // B, the leaf under A, time 2
    cache_state(&mut c, &u, 3); // C, a leaf of another path, time 3
    // 2 free; a pair fits without eviction.
    let a = c.admit(None).expect("pair");
    assert_eq!(c.stats().device_evictions, 0);
    // 0 free: the next pair evicts B (the oldest leaf; A is not one while B is there),
    // then A, a leaf once B went and older than C.
    let b = c.admit(None).expect("pair after evicting two");
    assert_eq!(c.stats().device_evictions, 2);
    assert_eq!(
        c.device_slot(&path(&t)[..3]),
        None,
        "B (oldest leaf) went first"
    );
    assert_eq!(
        c.device_slot(&path(&t)[..1]),
        None,
        "then A, a leaf once B went"
    );
    assert!(
        c.device_slot(&path(&u)[..3]).is_some(),
        "C, the newest, stays"
    );
    drop((a, b));
    check(&mut c);
}

/// Touching a state (a request starting from it) makes it the newest.
#[test]
fn a_used_state_is_evicted_last() {
    let mut c = core(6, 0);
    let t = toks(8);
    let u: Vec<Token> = (100..108).collect();
    cache_state(&mut c, &t, 2); // older
    cache_state(&mut c, &u, 2);
    c.begin_step();
    let m = c.match_prefix(&path(&t), 2, 0);
    let a = c.admit(m.source).expect("pair"); // touches t's state; 0 free now
    c.begin_step();
    let b = c.admit(None).expect("evicts");
    assert!(c.device_slot(&path(&t)[..2]).is_some(), "used: kept");
    assert_eq!(c.device_slot(&path(&u)[..2]), None, "the older one went");
    drop((a, b));
    check(&mut c);
}

/// An admission that eviction cannot satisfy changes nothing.
#[test]
fn an_admission_eviction_cannot_satisfy_evicts_nothing() {
    let mut c = core(4, 0); // 3 usable
    let t = toks(8);
    cache_state(&mut c, &t, 2); // 1 attached, 2 free
    let m = c.match_prefix(&path(&t), 2, 0);
    // From the state: needs 2, has 2 free; the state itself is protected.
    let a = c.admit(m.source).expect("fits");
    c.begin_step();
    assert!(c.admit(None).is_none());
    assert!(
        c.device_slot(&path(&t)[..2]).is_some(),
        "not evicted for a refusal"
    );
    drop(a);
    check(&mut c);
}

// ----- host copies (§1.6) ---------------------------------------------------------------

/// A host copy is pending until the write-back that fills it is acknowledged, and only
/// that write-back's states get one.
#[test]
fn host_copies_exist_only_after_the_ack_of_exactly_their_write_back() {
    let mut c = core(8, 8);
    let t = toks(8);
    cache_state(&mut c, &t, 1);
    cache_state(&mut c, &t, 3);
    let p = path(&t);
    let pairs = c.prepare_write_back(5, &p[2..3]).expect("prepared");
    assert_eq!(pairs.len(), 1);
    assert_eq!(c.host_slot(&p[..3]), None, "pending, not valid");
    assert_eq!(
        c.match_prefix(&p, 0, 3).pages,
        0,
        "no host hit while pending"
    );
    c.ack_write_back(5, true).expect("acked");
    assert!(c.host_slot(&p[..3]).is_some());
    assert_eq!(c.host_slot(&p[..1]), None, "never an ancestor");
    assert_eq!(
        c.ack_write_back(5, true),
        Err(kvtier_mamba::MambaError::UnknownWriteBack(5))
    );
    check(&mut c);
}

/// Bug #620: a failed write-back drops its pending host slot and demotes nothing.
#[test]
fn a_failed_state_write_back_frees_its_host_slot_and_demotes_nothing() {
    let mut c = core(8, 4);
    let t = toks(8);
    cache_state(&mut c, &t, 2);
    let p = path(&t);
    c.prepare_write_back(9, &p[..2]).expect("prepared");
    let free_host = c.stats().free_host_slots;
    c.ack_write_back(9, false).expect("acked");
    assert_eq!(c.host_slot(&p[..2]), None);
    assert!(c.device_slot(&p[..2]).is_some(), "the device state stays");
    assert_eq!(c.stats().free_host_slots, free_host + 1);
    check(&mut c);
}

/// A state read in this step (a copy source) is not demoted by an ack until the next
/// step.
#[test]
fn a_state_read_this_step_is_demoted_only_later() {
    let mut c = core(8, 8);
    let t = toks(8);
    cache_state(&mut c, &t, 2);
    let p = path(&t);
    c.prepare_write_back(3, &p[..2]).expect("prepared");
    let m = c.match_prefix(&p, 2, 0);
    let a = c.admit(m.source).expect("pair");
    c.ack_write_back(3, true).expect("acked");
    assert!(c.device_slot(&p[..2]).is_some(), "read this step: kept");
    c.begin_step();
    c.demote(&p[..2]);
    assert_eq!(c.device_slot(&p[..2]), None, "demoted once idle");
    drop(a);
    check(&mut c);
}

/// KV evicted from a tier takes the states there with it.
#[test]
fn states_follow_their_kv_out_of_a_tier() {
    let mut c = core(8, 8);
    let t = toks(8);
    cache_state(&mut c, &t, 2);
    let p = path(&t);
    c.drop_states(&p[..2], Tier::Device);
    assert_eq!(c.device_slot(&p[..2]), None);
    assert_eq!(c.stats().free_device_slots, 7);
    check(&mut c);
}

// ----- checkpoints (§1.2) ----------------------------------------------------------------

/// The scheduler publishes a chunk's checkpoint only at the depth the worker filled.
#[test]
fn checkpoints_land_where_the_worker_rule_says() {
    assert_eq!(checkpoint_depth(0, 8, 2, 4), Some(8));
    assert_eq!(checkpoint_depth(0, 7, 2, 4), None);
    assert_eq!(checkpoint_depth(4, 5, 2, 4), Some(8));
}
