//! The state slot pools (reference `tests/cpp/test_mamba_slot.cpp`, mapped in
//! docs/test-inventory/mamba.md).

use kvtier_mamba::{Slot, SlotPool};
use kvtier_types::Tier;

/// Two pools emptied, then freed in different orders, hand out the same (smallest)
/// index next.
#[test]
fn allocation_takes_the_smallest_free_index_whatever_the_free_order() {
    for tier in [Tier::Device, Tier::Host] {
        let mut a = SlotPool::new(tier, 8);
        let mut b = SlotPool::new(tier, 8);
        let mut held_a: Vec<Option<Slot>> = (0..8).map(|_| a.allocate()).collect();
        let mut held_b: Vec<Option<Slot>> = (0..8).map(|_| b.allocate()).collect();
        assert!(a.allocate().is_none(), "an exhausted pool gives none");
        for i in [3, 6, 1] {
            held_a[i] = None;
        }
        for i in [1, 6, 3] {
            held_b[i] = None;
        }
        let (next_a, next_b) = (a.allocate().map(|s| s.id()), b.allocate().map(|s| s.id()));
        assert_eq!((next_a, next_b), (Some(1), Some(1)), "{tier:?}");
    }
}

/// Capacity is the whole pool (no dummy slot); allocation counts down, dropping a
/// handle counts back up.
#[test]
fn a_pool_of_n_has_n_slots_and_dropping_a_slot_frees_it() {
    let mut pool = SlotPool::new(Tier::Device, 4);
    assert_eq!((pool.total(), pool.available()), (4, 4));
    let first = pool.allocate().expect("free");
    let second = pool.allocate().expect("free");
    assert_ne!(first.id(), second.id());
    assert_eq!(pool.available(), 2);
    let moved = first;
    assert_eq!(pool.available(), 2, "moving a slot frees nothing");
    drop(moved);
    assert_eq!(pool.available(), 3);
    drop(second);
    assert_eq!(pool.available(), 4);
}

/// Returns drain sorted; a second drain is empty; out-of-range frees are ignored.
#[test]
fn returns_drain_sorted_and_out_of_range_frees_are_ignored() {
    let mut pool = SlotPool::new(Tier::Host, 8);
    let mut held: Vec<Option<Slot>> = (0..8).map(|_| pool.allocate()).collect();
    for i in [5, 1, 7, 3] {
        held[i] = None;
    }
    assert_eq!(pool.drain_returns(), [1, 3, 5, 7]);
    assert!(pool.drain_returns().is_empty());
    assert_eq!(pool.available(), 4);
    pool.release(8);
    pool.release(u32::MAX);
    assert_eq!(pool.available(), 4);
}

/// A slot moved into a box frees nothing; dropping the box frees it once.
#[test]
fn a_boxed_slot_is_freed_once_with_its_box() {
    let mut pool = SlotPool::new(Tier::Device, 2);
    let boxed = Box::new(pool.allocate().expect("free"));
    assert_eq!(pool.available(), 1);
    drop(boxed);
    assert_eq!(pool.available(), 2);
}

/// A request's pair: two distinct slots; taking the checkpoint out (or moving the
/// working slot out) frees nothing; dropping the pair frees both.
#[test]
fn a_request_pair_holds_two_slots_until_dropped() {
    use kvtier_mamba::RequestStates;
    let mut pool = SlotPool::new(Tier::Device, 8);
    let mut pair = RequestStates::new(
        pool.allocate().expect("free"),
        pool.allocate().expect("free"),
    );
    let (working, checkpoint) = (pair.working.id(), pair.checkpoint.as_ref().map(Slot::id));
    assert_ne!(Some(working), checkpoint);
    assert_eq!((pool.available(), pair.checkpoint_at), (6, None));
    pair.checkpoint_at = Some(4);
    let (taken, at) = pair.take_checkpoint().expect("a checkpoint");
    assert_eq!((Some(taken.id()), at), (checkpoint, Some(4)));
    assert!(pair.checkpoint.is_none() && pair.take_checkpoint().is_none());
    assert_eq!(
        pool.available(),
        6,
        "taking the checkpoint out frees nothing"
    );
    drop(taken);
    assert_eq!(pool.available(), 7);
    let RequestStates { working: moved, .. } = pair;
    assert_eq!((moved.id(), pool.available()), (working, 7));
    drop(moved);
    assert_eq!(pool.available(), 8);
    let pair = RequestStates::new(
        pool.allocate().expect("free"),
        pool.allocate().expect("free"),
    );
    assert_eq!(pool.available(), 6);
    drop(pair);
    assert_eq!(pool.available(), 8);
}
