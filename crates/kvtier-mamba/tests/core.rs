//! The Mamba family's core: the reference's slot, eviction and cache tests
//! (`tests/cpp/test_mamba_{eviction,cache}.cpp`, mapped in
//! docs/test-inventory/mamba.md), and its bugs to avoid (hybrid-l3.md §1.7).
//!
//! The reference attaches slots to radix-tree nodes; here a state is known by the prefix
//! it follows, so its tests' nodes are prefixes: a node `[3, 4]` under `[1, 2]` is the
//! prefix `[1, 2, 3, 4]`.

use kvtier_mamba::{MambaConfig, MambaCore, MambaError, StateSource};
use kvtier_types::hash::{PageHash, rolling_page_hashes};
use kvtier_types::{Tier, Token, TransferKind};

const P: u32 = 2;

/// The reference fixtures: P 2, Mamba chunk 4, 8 device slots; 8 host slots with L2.
fn core(host_slots: u32) -> MambaCore {
    sized(8, host_slots)
}

fn sized(device_slots: u32, host_slots: u32) -> MambaCore {
    MambaCore::new(MambaConfig {
        page_size: P,
        device_slots,
        host_slots,
        kernel_chunk: 4,
    })
    .expect("valid config")
}

/// Page hashes of `tokens` (full pages).
fn path(tokens: &[Token]) -> Vec<PageHash> {
    rolling_page_hashes(None, tokens, P as usize)
}

/// `start .. start + pages * P`, as the reference's `MakeAlignedTokens`.
fn aligned(pages: usize, start: Token) -> Vec<Token> {
    (start..start + (pages * P as usize) as Token).collect()
}

/// Caches the state after `tokens` through a request's checkpoint slot.
fn cache_state(c: &mut MambaCore, tokens: &[Token]) {
    let admitted = c.admit(None).expect("slots for a pair");
    let slot = admitted.states.checkpoint.expect("a checkpoint slot");
    assert!(c.publish(&path(tokens), slot).expect("a valid path"));
}

/// Writes the state after `tokens` back to host and acknowledges it.
fn write_back(c: &mut MambaCore, op: u32, tokens: &[Token]) {
    let p = path(tokens);
    let pairs = c
        .prepare_write_back(op, &p[p.len() - 1..])
        .expect("a fresh op");
    assert_eq!(pairs.len(), 1);
    c.ack_write_back(op, true).expect("in flight");
}

/// Forces exactly one eviction (one slot more than is free).
fn evict_one(c: &mut MambaCore) -> bool {
    let free = c.stats().free_device_slots;
    c.ensure_device(free + 1)
}

fn has_device(c: &MambaCore, tokens: &[Token]) -> bool {
    c.device_slot(&path(tokens)).is_some()
}

fn check(c: &mut MambaCore) {
    c.check_invariants().expect("invariants hold");
}

// ----- eviction (`test_mamba_eviction.cpp`) -----------------------------------------

/// `EvictFreesSlotButKeepsKV`: eviction frees the state's slot; the KV is the radix
/// cache's, untouched (a prefix now caps shallower).
#[test]
fn eviction_frees_the_state_slot() {
    let mut c = core(0);
    cache_state(&mut c, &[1, 2, 3, 4]);
    assert_eq!(c.stats().free_device_slots, 7);
    assert!(evict_one(&mut c));
    assert_eq!(c.stats().free_device_slots, 8);
    assert!(!has_device(&c, &[1, 2, 3, 4]));
    assert_eq!(c.stats().device_evictions, 1);
    check(&mut c);
}

/// `EvictLRUOrder`: the state used in the earlier step goes first.
#[test]
fn eviction_takes_the_least_recently_used_state() {
    let mut c = core(0);
    cache_state(&mut c, &[1, 2]);
    c.begin_step();
    cache_state(&mut c, &[3, 4]);
    // Three pairs take the 6 free slots.
    let mut held: Vec<_> = (0..3).filter_map(|_| c.admit(None)).collect();
    assert_eq!(c.stats().free_device_slots, 0);
    held.pop();
    assert_eq!(c.stats().free_device_slots, 2);
    assert!(c.ensure_device(3));
    assert!(!has_device(&c, &[1, 2]), "the older state went");
    assert!(has_device(&c, &[3, 4]));
    drop(held);
    check(&mut c);
}

/// `SkipsLockedNodes`: a state being read (here by a write-back in flight) is not
/// evicted; an eviction that can free nothing else fails and changes nothing.
#[test]
fn a_state_being_read_is_not_evicted() {
    let mut c = core(8);
    cache_state(&mut c, &[1, 2, 3, 4]);
    let p = path(&[1, 2, 3, 4]);
    assert_eq!(c.prepare_write_back(1, &p[1..]).expect("fresh").len(), 1);
    assert!(!evict_one(&mut c));
    assert!(has_device(&c, &[1, 2, 3, 4]));
    assert_eq!(c.stats().device_evictions, 0);
    c.ack_write_back(1, false).expect("in flight");
    check(&mut c);
}

/// `EnsureCapacityEvictsEnough`: two states, 6 free; asking for 8 evicts both.
#[test]
fn ensure_capacity_evicts_enough() {
    let mut c = core(0);
    cache_state(&mut c, &[1, 2]);
    cache_state(&mut c, &[3, 4]);
    assert_eq!(c.stats().free_device_slots, 6);
    assert!(c.ensure_device(8));
    assert_eq!(c.stats().free_device_slots, 8);
    check(&mut c);
}

/// `LeafPromotion`: only the deeper state is a leaf; once it goes, the shallower one
/// is, and goes next.
#[test]
fn a_state_becomes_a_leaf_when_the_state_below_it_goes() {
    let mut c = core(0);
    cache_state(&mut c, &[1, 2]);
    c.begin_step();
    cache_state(&mut c, &[1, 2, 3, 4]);
    assert!(evict_one(&mut c));
    assert!(
        !has_device(&c, &[1, 2, 3, 4]),
        "the leaf went first, though newer"
    );
    assert!(has_device(&c, &[1, 2]));
    assert!(evict_one(&mut c));
    assert!(!has_device(&c, &[1, 2]));
    check(&mut c);
}

/// `EvictDeterministicOnTimeTies` and `TreeNodeSeqId.IsMonotonicAcrossConstruction`:
/// states used in the same step go in insertion order.
#[test]
fn time_ties_go_to_the_earlier_state() {
    let mut c = core(0);
    cache_state(&mut c, &[1, 2]);
    cache_state(&mut c, &[3, 4]);
    cache_state(&mut c, &[5, 6]);
    assert!(evict_one(&mut c));
    assert!(!has_device(&c, &[1, 2]));
    assert!(evict_one(&mut c));
    assert!(!has_device(&c, &[3, 4]));
    assert!(has_device(&c, &[5, 6]));
    check(&mut c);
}

/// Reference defect (notes C.8): leaves were decided by direct children only, and a
/// split could leave a state with no state below it untracked, never evictable. Here a
/// leaf is a state with no device state anywhere below it: two levels apart, the
/// deeper goes first, and then the shallower.
#[test]
fn a_state_two_levels_above_another_is_evictable_once_it_goes() {
    let mut c = sized(4, 0);
    cache_state(&mut c, &aligned(1, 1));
    cache_state(&mut c, &aligned(3, 1));
    assert_eq!(c.stats().free_device_slots, 2);
    assert!(c.ensure_device(4), "both states are evictable");
    check(&mut c);
}

// ----- match (`test_mamba_cache.cpp`, no L2) -------------------------------------------

/// `MatchWithoutMambaTruncatesToRoot`: 3 KV pages, no state: nothing reusable, and a
/// branching snapshot at align(6) = 4.
#[test]
fn match_without_a_state_reuses_nothing() {
    let c = core(0);
    let m = c.match_prefix(&path(&aligned(3, 1)), 3, 0);
    assert_eq!((m.pages, m.source, m.branching), (0, None, Some(4)));
}

/// `MatchWithFullMambaKeepsDepth`: a state at the KV depth keeps it, no branching.
#[test]
fn match_with_a_state_at_the_kv_depth_keeps_it() {
    let mut c = core(0);
    let t = aligned(3, 1);
    cache_state(&mut c, &t);
    let m = c.match_prefix(&path(&t), 3, 0);
    assert_eq!(m.pages, 3);
    assert!(matches!(m.source, Some(StateSource::Device(_))));
    assert_eq!(m.branching, None);
}

/// `MatchWithPartialMambaTruncatesToMambaDepth` and `FindLastMambaNodeWalksUp`: a state
/// at 2 pages under 4 KV pages caps the match at 2; branching align(8) = 8.
#[test]
fn match_caps_at_the_deepest_state_within_the_kv() {
    let mut c = core(0);
    let t = aligned(4, 1);
    cache_state(&mut c, &t[..4]);
    let m = c.match_prefix(&path(&t), 4, 0);
    assert_eq!((m.pages, m.branching), (2, Some(8)));
    assert!(matches!(m.source, Some(StateSource::Device(_))));
}

/// `SplitPrefixWithoutMambaStillRequestsBranchingSnapshot`: a state at 4 pages; a query
/// that diverges in page 3 matches 2 KV pages and no state (a split cannot move the
/// state: it stays at its depth, on the other branch).
#[test]
fn a_query_diverging_above_the_state_finds_none() {
    let mut c = core(0);
    cache_state(&mut c, &aligned(4, 1));
    let mut q = aligned(2, 1);
    q.extend([1001, 1002]);
    let m = c.match_prefix(&path(&q), 2, 0);
    assert_eq!((m.pages, m.source, m.branching), (0, None, Some(4)));
}

/// `BranchingSeqlenIsSuppressedWhenAlignedInsideMambaPrefix`: state at 2, KV at 3:
/// align(6) = 4 is not past the state: no branching.
#[test]
fn no_branching_when_the_aligned_kv_is_not_past_the_state() {
    let mut c = core(0);
    let t = aligned(3, 1);
    cache_state(&mut c, &t[..4]);
    let m = c.match_prefix(&path(&t), 3, 0);
    assert_eq!((m.pages, m.branching), (2, None));
}

/// `OnKVEvictRemovesMamba` and `KVEvictionTriggersMambaEviction`: KV leaving the device
/// takes the state there with it, and its slot comes back.
#[test]
fn kv_eviction_takes_the_state_with_it() {
    let mut c = core(0);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let free = c.stats().free_device_slots;
    c.drop_states(&path(&t), Tier::Device);
    assert!(!has_device(&c, &t));
    assert_eq!(c.stats().free_device_slots, free + 1);
    check(&mut c);
}

/// `PruneOfMambaNodeUntracksSoLaterEvictIsSafe` (#357): a state removed with its KV is
/// no longer an eviction candidate; an eviction that cannot be satisfied afterwards
/// fails cleanly and every set is consistent.
#[test]
fn a_removed_state_is_no_eviction_candidate() {
    let mut c = core(0);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    c.drop_states(&path(&t), Tier::Device);
    assert!(!c.ensure_device(9));
    check(&mut c);
}

/// Bug #612: a host-only KV hit whose state is cached nowhere was reused without any
/// state. It caps to nothing, with and without host copies.
#[test]
fn a_host_only_kv_hit_without_its_state_is_not_reused() {
    for host_slots in [0, 8] {
        let c = core(host_slots);
        let m = c.match_prefix(&path(&aligned(4, 1)), 0, 4);
        assert_eq!((m.pages, m.source), (0, None), "host slots {host_slots}");
    }
}

// ----- match and copies with host states (`test_mamba_cache.cpp`, L2) ---------------------

/// `HostKVRequiresHostMambaForHybridMatch`: with host-only KV a device state is not a
/// hit (its KV is not on device); once the state is on host it is, loaded back.
#[test]
fn host_kv_needs_a_host_state() {
    let mut c = core(8);
    let t = aligned(3, 1);
    cache_state(&mut c, &t);
    assert_eq!(c.match_prefix(&path(&t), 0, 3).pages, 0);
    write_back(&mut c, 1, &t);
    let m = c.match_prefix(&path(&t), 0, 3);
    assert_eq!(m.pages, 3);
    assert_eq!(
        m.source,
        Some(StateSource::Host(*path(&t).last().expect("3 pages")))
    );
    check(&mut c);
}

/// `DeeperHostMambaMatchTakesPriorityOverShallowDeviceMamba`: a device state at 2 pages,
/// a host state at 4: the host one wins (loaded back).
#[test]
fn a_deeper_host_state_beats_a_shallower_device_state() {
    let mut c = core(8);
    let t = aligned(4, 1);
    cache_state(&mut c, &t[..4]);
    cache_state(&mut c, &t);
    write_back(&mut c, 1, &t);
    let m = c.match_prefix(&path(&t), 2, 4);
    assert_eq!(m.pages, 4);
    assert!(matches!(m.source, Some(StateSource::Host(_))));
    check(&mut c);
}

/// `PrefillFirstChunkRequiresCheckpointSlot`: with one free slot a first chunk is
/// refused outright (the reference threw inside the transition); nothing is taken.
#[test]
fn a_first_chunk_needs_both_slots_or_gets_none() {
    let mut c = sized(2, 0);
    let a = c.admit(None).expect("a pair");
    assert_eq!(
        (
            a.states.working.id(),
            a.states.checkpoint.as_ref().map(|s| s.id())
        ),
        (0, Some(1))
    );
    drop(a.states.checkpoint);
    assert_eq!(c.stats().free_device_slots, 1);
    assert!(c.admit(None).is_none());
    assert_eq!(c.stats().free_device_slots, 1, "nothing taken");
    drop(a.states.working);
    check(&mut c);
}

/// `PrepareMambaLoadBackAllocatesDeviceSlotAndTransferPair`: starting from a host state
/// attaches a device slot to it at once and yields one host → device state copy.
#[test]
fn starting_from_a_host_state_loads_it_back() {
    let mut c = core(8);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    write_back(&mut c, 1, &t);
    let host = c.host_slot(&path(&t)).expect("host copy");
    let m = c.match_prefix(&path(&t), 0, 2);
    let a = c.admit(m.source).expect("admitted");
    let pair = a.load_back.expect("a load-back");
    assert_eq!((pair.kind, pair.src), (TransferKind::Mamba, host));
    assert_eq!(Some(pair.dst), c.device_slot(&path(&t)));
    assert_eq!(a.cow_src, Some(pair.dst));
    check(&mut c);
}

/// `ExactWriteBackAckDoesNotPublishUnackedAncestor`: an ack gives host copies to
/// exactly its own states.
#[test]
fn an_ack_gives_host_copies_to_exactly_its_states() {
    let mut c = core(8);
    let t = aligned(4, 1);
    cache_state(&mut c, &t[..4]);
    cache_state(&mut c, &t);
    let p = path(&t);
    assert_eq!(c.prepare_write_back(1, &p[1..2]).expect("fresh").len(), 1);
    assert_eq!(c.prepare_write_back(2, &p[3..4]).expect("fresh").len(), 1);
    c.ack_write_back(2, true).expect("in flight");
    assert!(
        c.host_slot(&p[..2]).is_none(),
        "the ancestor's copy is not acked"
    );
    assert!(c.host_slot(&p).is_some());
    c.ack_write_back(1, true).expect("in flight");
    assert!(c.host_slot(&p[..2]).is_some());
    check(&mut c);
}

/// `PrepareMambaWriteBackPublishesHostSlotOnlyAfterAck`: pending until the ack, then a
/// host hit, and the idle device copy demoted.
#[test]
fn a_host_copy_is_a_hit_only_after_its_ack() {
    let mut c = core(8);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let p = path(&t);
    let device = c.device_slot(&p).expect("device state");
    let pairs = c.prepare_write_back(1, &p).expect("fresh");
    assert_eq!(pairs.len(), 1);
    assert_eq!((pairs[0].kind, pairs[0].src), (TransferKind::Mamba, device));
    assert_eq!(c.host_slot(&p), None, "pending");
    assert_eq!(c.match_prefix(&p, 0, 2).pages, 0);
    c.ack_write_back(1, true).expect("in flight");
    assert_eq!(c.host_slot(&p), Some(pairs[0].dst));
    assert_eq!(c.device_slot(&p), None, "the idle device copy was demoted");
    let m = c.match_prefix(&p, 0, 2);
    assert_eq!(m.pages, 2);
    assert!(matches!(m.source, Some(StateSource::Host(_))));
    check(&mut c);
}

/// `HostWriteBackDemotesAfterDeviceRefUnlock`: a state read in this step keeps its
/// device copy through the ack; the next step demotes it.
#[test]
fn a_state_read_this_step_is_demoted_at_the_next() {
    let mut c = core(8);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let p = path(&t);
    c.prepare_write_back(1, &p).expect("fresh");
    let m = c.match_prefix(&p, 2, 0);
    let a = c.admit(m.source).expect("a pair");
    c.ack_write_back(1, true).expect("in flight");
    assert!(c.device_slot(&p).is_some() && c.host_slot(&p).is_some());
    c.begin_step();
    assert_eq!(c.device_slot(&p), None, "demoted once idle");
    drop(a);
    check(&mut c);
}

/// `WriteBackDoneDropsDeviceMambaWhenKVChildKeepsDeviceNode`: demoting a prefix's KV
/// drops its device state even though a deeper state keeps its own device copy.
#[test]
fn a_demoted_prefix_drops_its_device_state_whatever_lies_below() {
    let mut c = core(8);
    let t = aligned(5, 1);
    cache_state(&mut c, &t[..8]);
    cache_state(&mut c, &t);
    let p = path(&t);
    c.drop_states(&p[3..4], Tier::Device);
    assert_eq!(c.device_slot(&p[..4]), None);
    assert!(c.device_slot(&p).is_some());
    check(&mut c);
}

/// Bug #620: a failed write-back frees its pending host slot and demotes nothing.
#[test]
fn a_failed_state_write_back_frees_its_host_slot_and_demotes_nothing() {
    let mut c = core(4);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let p = path(&t);
    c.prepare_write_back(9, &p).expect("fresh");
    assert_eq!(c.stats().free_host_slots, 3);
    c.ack_write_back(9, false).expect("in flight");
    assert_eq!(c.host_slot(&p), None);
    assert!(c.device_slot(&p).is_some(), "the device state stays");
    assert_eq!(c.stats().free_host_slots, 4);
    assert_eq!(
        c.ack_write_back(9, true),
        Err(MambaError::UnknownWriteBack(9))
    );
    check(&mut c);
}

/// A write-back that the host pool cannot take whole takes nothing.
#[test]
fn a_state_write_back_is_all_or_nothing() {
    let mut c = core(1);
    let t = aligned(2, 1);
    cache_state(&mut c, &t[..2]);
    cache_state(&mut c, &t);
    assert!(
        c.prepare_write_back(1, &path(&t))
            .expect("fresh")
            .is_empty()
    );
    assert_eq!(c.stats().free_host_slots, 1);
    check(&mut c);
}

// ----- publication and admission ---------------------------------------------------------

/// Reference defect (notes C.10): re-publishing a depth replaced its slot at once, while
/// an op of the same plan could still name the old one. Here the first state stays and
/// the new slot is freed.
#[test]
fn publishing_a_depth_twice_keeps_the_first_state() {
    let mut c = core(0);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let first = c.device_slot(&path(&t));
    let a = c.admit(None).expect("slots");
    let slot = a.states.checkpoint.expect("checkpoint");
    assert!(!c.publish(&path(&t), slot).expect("valid"));
    assert_eq!(c.device_slot(&path(&t)), first);
    assert_eq!(c.stats().duplicates, 1);
    drop(a.states.working);
    check(&mut c);
}

/// `LocalMambaAllocatorTest.*`: a request's pair is two distinct slots; taking one out
/// moves it without freeing it; dropping the pair frees what it still holds.
#[test]
fn a_request_pair_returns_its_slots_when_dropped() {
    let mut c = core(0);
    let mut a = c.admit(None).expect("a pair");
    let working = a.states.working.id();
    let checkpoint = a.states.checkpoint.take().expect("a checkpoint");
    assert_ne!(working, checkpoint.id());
    assert_eq!(c.stats().free_device_slots, 6);
    drop(a);
    assert_eq!(c.stats().free_device_slots, 7, "the working slot came back");
    drop(checkpoint);
    assert_eq!(c.stats().free_device_slots, 8);
    check(&mut c);
}

/// A state follows at least one page: an empty path is refused, and the slot freed.
#[test]
fn an_empty_path_is_refused_and_frees_the_slot() {
    let mut c = core(0);
    let a = c.admit(None).expect("slots");
    let slot = a.states.checkpoint.expect("checkpoint");
    assert_eq!(c.publish(&[], slot), Err(MambaError::EmptyPath));
    drop(a.states.working);
    assert_eq!(c.stats().free_device_slots, 8);
    check(&mut c);
}

/// An admission never evicts the state it starts from, even the oldest.
#[test]
fn an_admission_never_evicts_its_own_source() {
    let mut c = sized(3, 0);
    let t = aligned(2, 1);
    cache_state(&mut c, &t[..2]); // the oldest
    c.begin_step();
    cache_state(&mut c, &t);
    c.begin_step();
    let m = c.match_prefix(&path(&t[..2]), 1, 0);
    let a = c.admit(m.source).expect("evicts the other state");
    assert_eq!(a.cow_src, c.device_slot(&path(&t[..2])));
    assert!(a.cow_src.is_some());
    assert!(!has_device(&c, &t));
    drop(a);
    check(&mut c);
}

/// An admission eviction cannot satisfy evicts nothing.
#[test]
fn a_refused_admission_evicts_nothing() {
    let mut c = sized(3, 0);
    let t = aligned(2, 1);
    cache_state(&mut c, &t);
    let m = c.match_prefix(&path(&t), 2, 0);
    let a = c.admit(m.source).expect("fits beside its source");
    assert!(c.admit(None).is_none());
    assert!(has_device(&c, &t), "not evicted for a refusal");
    drop(a);
    check(&mut c);
}

/// Recovery resumes from the deepest device state on the KV path (it survives its
/// KV's demotion to host), else from a host state.
#[test]
fn recovery_finds_a_device_state_beyond_the_device_kv() {
    let mut c = core(8);
    let t = aligned(3, 1);
    cache_state(&mut c, &t[..2]);
    cache_state(&mut c, &t);
    let p = path(&t);
    // KV on host only: the normal match sees nothing; recovery finds the device state.
    assert_eq!(c.match_prefix(&p, 0, 3).pages, 0);
    assert!(matches!(
        c.match_for_recovery(&p, 3),
        Some((3, StateSource::Device(_)))
    ));
    c.drop_states(&p[2..], Tier::Device);
    write_back(&mut c, 1, &t[..2]);
    assert!(matches!(
        c.match_for_recovery(&p, 3),
        Some((1, StateSource::Host(_)))
    ));
    check(&mut c);
}
