//! Port of `tests/cpp/test_cache_operation_kinds.cpp`. The C++ tests flatten ops into
//! per-kind buckets ("kv", "mamba"); our ops carry typed `TransferPair`s and there are
//! no Mamba transfers until the hybrid issue, so the Mamba buckets are deferred. What
//! carries over: every pair is a KV pair, and a (kind, src, dst) pair emitted by an
//! earlier op of the same plan is omitted from later ops, which keep their slot.

mod common;

use std::collections::BTreeSet;

use common::*;
use kvtier_types::{TransferKind, TransferPair};

#[test]
fn write_back_pairs_deduplicated_across_ops_of_a_plan() {
    let mut s = sched(fixture());
    // [1,2,3,4] and [1,2,5,6] share page [1,2]; both finish in the same step.
    submit(&mut s, "r1", vec![1, 2, 3, 4]);
    submit(&mut s, "r2", vec![1, 2, 5, 6]);
    s.next_plan();
    advance(
        &mut s,
        vec![
            extend("r1", &[7]),
            finish("r1"),
            extend("r2", &[8]),
            finish("r2"),
        ],
    );
    let plan = s.next_plan();
    assert_eq!(plan.write_backs.len(), 2);
    // r1's op copies both of its pages; r2's op only its own page, the shared one
    // having been emitted already.
    assert_eq!(plan.write_backs[0].pairs.len(), 2);
    assert_eq!(plan.write_backs[1].pairs.len(), 1);
    let all: Vec<TransferPair> = plan
        .write_backs
        .iter()
        .flat_map(|op| op.pairs.iter().copied())
        .collect();
    let unique: BTreeSet<TransferPair> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len());
    assert!(all.iter().all(|p| p.kind == TransferKind::Kv));
    check(&mut s);
}

#[test]
fn load_back_pairs_are_kv_and_unique() {
    let mut s = sched(fixture());
    submit(&mut s, "r0", tokens(1, 8));
    s.next_plan();
    advance(&mut s, vec![extend("r0", &[9]), finish("r0")]);
    let plan = s.next_plan();
    ack_write_backs(&mut s, &plan, true);
    // Three requests over the host-only prefix (4 pages), matching 3, 2 and 4 pages.
    submit(&mut s, "a", tokens(1, 8));
    submit(&mut s, "b", tokens(1, 5));
    submit(&mut s, "c", tokens(1, 9));
    let plan = s.next_plan();
    assert_eq!(row_ids(&plan), ["a", "b", "c"]);
    let all: Vec<TransferPair> = plan
        .load_backs
        .iter()
        .flat_map(|op| op.pairs.iter().copied())
        .collect();
    assert!(all.iter().all(|p| p.kind == TransferKind::Kv));
    let src: BTreeSet<u32> = all.iter().map(|p| p.src).collect();
    let dst: BTreeSet<u32> = all.iter().map(|p| p.dst).collect();
    assert_eq!((src.len(), dst.len()), (all.len(), all.len()));
    // r0 wrote back its 4 pages; "a" loads back 3 of them, "c" the 4th.
    assert_eq!(all.len(), 4);
    check(&mut s);
}
