//! Port of `python/tests/test_new_occupied_pages.py` (python fixture: ps 16, device
//! 1024, L2 off): the newly appended pages of each row are `page_table[begin..begin+size]`.

mod common;

use std::collections::BTreeSet;

use common::*;
use kvtier_types::{ExecutionPlan, RowKind, SchedulerConfig};

/// Every row's new pages are the tail slice of its page table.
fn assert_rows_consistent(plan: &ExecutionPlan) {
    for r in &plan.forward.rows {
        let table = plan.forward.page_table_of(r);
        let new = plan.forward.new_pages_of(r);
        assert_eq!(new.len(), r.size as usize);
        assert_eq!(r.begin + r.size, table.len() as u32);
        assert_eq!(new, &table[r.begin as usize..]);
    }
}

#[test]
fn one_page_list_per_row() {
    let mut s = sched(python_fixture());
    submit(&mut s, "r0", tokens(1, 20));
    submit(&mut s, "r1", tokens(100, 40));
    let plan = s.next_plan();
    assert_eq!(plan.forward.rows.len(), 2);
    let total: u32 = plan.forward.rows.iter().map(|r| r.pages_len).sum();
    assert_eq!(plan.forward.page_table.len(), total as usize);
    assert_rows_consistent(&plan);
}

#[test]
fn begins_zero_on_first_schedule() {
    let mut s = sched(python_fixture());
    submit(&mut s, "r0", tokens(1, 20));
    submit(&mut s, "r1", tokens(100, 40));
    let plan = s.next_plan();
    assert!(plan.forward.rows.iter().all(|r| r.begin == 0));
}

#[test]
fn first_prefill_size_positive() {
    let mut s = sched(python_fixture());
    submit(&mut s, "r0", tokens(1, 20));
    let plan = s.next_plan();
    let r = row_of(&plan, "r0");
    // 20 tokens + d 1 → 2 pages.
    assert!(r.size > 0);
    assert_eq!(r.size, 2);
}

#[test]
fn second_chunk_begin_positive() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 20,
        ..python_fixture()
    });
    submit(&mut s, "r0", tokens(1, 50));
    let p1 = s.next_plan();
    let p2 = s.next_plan();
    let (a, b) = (row_of(&p1, "r0"), row_of(&p2, "r0"));
    assert!(b.begin > 0);
    assert_eq!(b.begin, a.size);
    // The second chunk's table starts with the first chunk's pages.
    assert_eq!(
        &p2.forward.page_table_of(b)[..a.size as usize],
        p1.forward.page_table_of(a)
    );
    assert_rows_consistent(&p2);
}

#[test]
fn decode_size_consistent() {
    let mut s = sched(python_fixture());
    submit(&mut s, "r0", tokens(1, 14));
    let mut engine = Engine::default();
    let mut saw_growth = false;
    for _ in 0..6 {
        let plan = step(&mut s, &mut engine);
        assert_rows_consistent(&plan);
        let r = row_of(&plan, "r0");
        if r.kind == RowKind::Decode && r.size > 0 {
            saw_growth = true;
            assert_eq!(r.size, 1);
        }
    }
    // 14 + 1 slots, then one per step: the second page starts at slot 16.
    assert!(saw_growth);
    check(&mut s);
}

#[test]
fn two_rows_disjoint_new_pages() {
    let mut s = sched(python_fixture());
    submit(&mut s, "r0", tokens(1, 40));
    submit(&mut s, "r1", tokens(100, 40));
    let plan = s.next_plan();
    let a: BTreeSet<u32> = plan
        .forward
        .new_pages_of(row_of(&plan, "r0"))
        .iter()
        .copied()
        .collect();
    let b: BTreeSet<u32> = plan
        .forward
        .new_pages_of(row_of(&plan, "r1"))
        .iter()
        .copied()
        .collect();
    assert!(!a.is_empty() && !b.is_empty());
    assert!(a.is_disjoint(&b));
}

/// ps 20, 16-token prompt: 17 slots after prefill, then 18 and 19: no new page.
#[test]
fn page_size_twenty_decode_sizes_zero() {
    let mut s = sched(SchedulerConfig {
        page_size: 20,
        ..python_fixture()
    });
    submit(&mut s, "r0", tokens(1, 16));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r0").size, 1);
    advance(&mut s, vec![extend("r0", &[17])]);
    let mut sizes = Vec::new();
    for t in 18..20 {
        let plan = s.next_plan();
        let r = row_of(&plan, "r0");
        assert_eq!(r.kind, RowKind::Decode);
        sizes.push(r.size);
        advance(&mut s, vec![extend("r0", &[t])]);
    }
    assert_eq!(sizes, [0, 0]);
}

/// Steps `s` with the engine, asserting that for every request keeping its slot the
/// page-table entries before `begin` are those the previous plan sent.
fn assert_incremental_page_tables(s: &mut kvtier_fsm::Scheduler, steps: usize) {
    let mut last: std::collections::BTreeMap<String, (u32, Vec<u32>)> = Default::default();
    let mut engine = Engine::with_max_new(2);
    for _ in 0..steps {
        let plan = step(s, &mut engine);
        for r in &plan.forward.rows {
            let table = plan.forward.page_table_of(r).to_vec();
            let id = r.request_id.to_string();
            if let Some((_, prev)) = last.get(&id).filter(|(slot, _)| *slot == r.slot) {
                let keep = r.begin as usize;
                assert_eq!(
                    &table[..keep],
                    &prev[..keep],
                    "{id}: entries before begin {keep} changed without being reported"
                );
            }
            last.insert(id, (r.slot, table));
        }
    }
    check(s);
}

/// The engine keeps one page-table row per slot and writes only the new pages
/// `page_table[begin..begin+size]` into it (that is what `begin`/`size` are for). So for
/// a request keeping its slot, the part of its page table before `begin` must be what
/// the previous plan sent. Mid-flight publication can replace a request's own pages by
/// identical pages another request published first (the duplicates are freed); those
/// replaced entries must then be reported as new (begin at or before them), or the
/// engine keeps pointing at freed pages.
///
/// Decode path: ps 2, budget 12. r1 (8 tokens) prefills at once; r2 (same prompt) gets
/// a 4-token chunk in the same plan and publishes [1..4] at its second chunk, before
/// r1's first decode publishes the same pages.
#[test]
fn pages_replaced_by_mid_flight_publication_are_reported_new() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 12,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 8));
    submit(&mut s, "r2", tokens(1, 8));
    assert_incremental_page_tables(&mut s, 6);
}

/// Chunk path: with mixed batches r1's first decode publishes [1..8] before r2's second
/// chunk publishes its own copy of [1..4].
#[test]
fn pages_replaced_at_a_later_chunk_are_reported_new() {
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 12,
        enable_mixed_prefill_decode: true,
        ..fixture()
    });
    submit(&mut s, "r1", tokens(1, 8));
    submit(&mut s, "r2", tokens(1, 16));
    assert_incremental_page_tables(&mut s, 6);
}
