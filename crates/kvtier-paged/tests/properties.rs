//! Property tests over random group configurations and random request lives on one
//! prefix path: every group page is free, owned by exactly one table or held by
//! exactly one snapshot; every table's view is consistent with its base; an admitted
//! op always acquires; at quiescence only snapshots hold pages.

mod support;

use kvtier_paged::{
    Adjunct, GroupRole, GroupSpec, PagedFamily, RequestTables, SnapshotTree, Starved,
};
use kvtier_types::TreeView;
use proptest::prelude::*;
use support::TestTree;

/// A random family: one or two history groups (their pages set the alignment), and
/// state groups whose pages divide it, some required.
fn family_strategy() -> impl Strategy<Value = (Vec<GroupSpec>, Vec<String>)> {
    (
        prop::sample::select(vec![(4u32, 1u32), (2, 2), (8, 1), (4, 4)]),
        prop::option::of(prop::sample::select(vec![(2u32, 2u32), (8, 1)])),
        prop::collection::vec(
            (
                prop::sample::select(vec![1u32, 2, 4]),
                1u32..4,
                any::<bool>(),
            ),
            0..3,
        ),
        any::<bool>(),
        12u32..40,
    )
        .prop_map(|(h1, h2, states, sliding_history, pages)| {
            let mut groups = vec![GroupSpec::full_history("h0", h1.0, h1.1, pages)];
            let mut required = vec!["h0".to_owned()];
            if let Some((rows, stride)) = h2 {
                groups.push(GroupSpec::full_history("h1", rows, stride, pages));
                required.push("h1".into());
            }
            for (i, (rows, windows, req)) in states.into_iter().enumerate() {
                let id = format!("s{i}");
                groups.push(GroupSpec::sliding(
                    &id,
                    rows,
                    1,
                    pages * 2,
                    rows * windows,
                    GroupRole::State,
                ));
                if req {
                    required.push(id);
                }
            }
            if sliding_history {
                groups.push(GroupSpec::sliding("w", 2, 1, pages, 6, GroupRole::History));
            }
            (groups, required)
        })
}

#[derive(Debug, Clone)]
enum Op {
    /// Start a request whose prompt ends at block `blocks` of the path.
    Start { blocks: u32, chunk: u32 },
    /// Run the next chunk (or a decode step) of live request `which`.
    Step { which: usize },
    /// Finish live request `which`.
    Finish { which: usize },
    /// Evict the KV of the `which`-th unpinned snapshot node.
    Evict { which: usize },
    /// Prune for a history- or state-starved admission.
    Prune { history: bool },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u32..6, 1u32..20).prop_map(|(blocks, chunk)| Op::Start { blocks, chunk }),
        6 => (0usize..4).prop_map(|which| Op::Step { which }),
        2 => (0usize..4).prop_map(|which| Op::Finish { which }),
        1 => (0usize..8).prop_map(|which| Op::Evict { which }),
        1 => any::<bool>().prop_map(|history| Op::Prune { history }),
    ]
}

struct Live {
    tables: RequestTables,
    /// Tokens computed so far.
    pos: u32,
    /// The prompt's end.
    prompt: u32,
    chunk: u32,
    /// The node its lock sits on.
    pinned: usize,
}

/// The node ending at `depth` on the one path (the leaf is deep enough for every
/// request), unless that would cut a snapshot node.
fn node_at(
    tree: &mut TestTree,
    family: &PagedFamily<usize>,
    leaf: usize,
    depth: u32,
) -> Option<usize> {
    if depth == 0 {
        return Some(0);
    }
    let mut n = leaf;
    while let Some(p) = tree.parent(n) {
        if tree.depth(p) < depth {
            break;
        }
        n = p;
    }
    if tree.depth(n) != depth && family.has_snapshot(n) {
        return None;
    }
    tree.split_at(leaf, depth)
}

fn check(family: &mut PagedFamily<usize>, live: &[Live]) -> Result<(), TestCaseError> {
    family
        .check_invariants(live.iter().map(|l| &l.tables))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    for l in live {
        for (g, t) in family.adjunct().groups().iter().zip(l.tables.iter()) {
            prop_assert_eq!(t.pages_have(), t.base() + t.len());
            if !g.is_sliding() {
                prop_assert_eq!(t.base(), 0, "a full-history table never slides");
            }
            prop_assert!(
                t.pages_have() >= g.pages_for(t.cursor()) || t.is_empty() && g.is_sliding(),
                "group {} covers its cursor {}",
                g.id,
                t.cursor()
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pages_are_always_in_exactly_one_place(
        (groups, required) in family_strategy(),
        detach in any::<bool>(),
        ops in prop::collection::vec(op_strategy(), 1..60),
    ) {
        let required: Vec<&str> = required.iter().map(String::as_str).collect();
        let adjunct = Adjunct::new(groups, &required).expect("valid by construction");
        let a = adjunct.alignment();
        let mut family = PagedFamily::new(adjunct, detach);
        let mut tree = TestTree::default();
        let leaf = tree.insert(0, 64 * a);
        let mut live: Vec<Live> = Vec::new();
        for op in ops {
            match op {
                Op::Start { blocks, chunk } => {
                    let prompt = blocks * a;
                    let Some(end) = node_at(&mut tree, &family, leaf, prompt) else { continue };
                    let (hit, node) = family.cap_match(&tree, end);
                    // A prefill computes at least one token.
                    let hit = (hit.prefix_len > 0 && hit.prefix_len < prompt).then_some(hit);
                    let first_pos = hit.as_ref().map_or(0, |h| h.prefix_len);
                    let tables = family.new_tables();
                    let target = (first_pos + chunk).min(prompt);
                    let mut free = family.available();
                    if family.admit(&tree, &tables, first_pos, target, hit.as_ref().map(|h| (h, node)), &mut free) {
                        let mut tables = tables;
                        family.acquire(&mut tables, first_pos, target, hit.as_ref())
                            .map_err(|e| TestCaseError::fail(format!("admitted, then {e}")))?;
                        let pinned = if hit.is_some() { node } else { 0 };
                        tree.lock_path(pinned, 1);
                        live.push(Live { tables, pos: target, prompt, chunk, pinned });
                    }
                }
                Op::Step { which } if which < live.len() => {
                    let l = &mut live[which];
                    // Commit what it computed at the deepest aligned node, which its
                    // lock moves to first (as a publication moves it), then admit
                    // and acquire its next op.
                    let done = l.pos / a * a;
                    if let Some(terminal) = node_at(&mut tree, &family, leaf, done)
                        && terminal != 0
                    {
                        tree.lock_path(terminal, 1);
                        tree.lock_path(l.pinned, -1);
                        l.pinned = terminal;
                        family.commit_chunk(&mut tree, &mut l.tables, terminal);
                    }
                    let target = if l.pos < l.prompt { (l.pos + l.chunk).min(l.prompt) } else { l.pos + 1 };
                    let mut free = family.available();
                    if family.admit(&tree, &l.tables, l.pos, target, None, &mut free) {
                        family.acquire(&mut l.tables, l.pos, target, None)
                            .map_err(|e| TestCaseError::fail(format!("admitted, then {e}")))?;
                        l.pos = target;
                    }
                }
                Op::Finish { which } if which < live.len() => {
                    let mut l = live.remove(which);
                    family.release(&mut l.tables);
                    tree.lock_path(l.pinned, -1);
                }
                Op::Evict { which } => {
                    let candidates: Vec<usize> = family
                        .snapshot_nodes()
                        .filter(|&n| tree.device_refs(n) == 0)
                        .collect();
                    if let Some(&n) = candidates.get(which) {
                        family.on_kv_evicted(n);
                    }
                }
                Op::Prune { history } => {
                    family.prune(&tree, if history { Starved::History } else { Starved::State });
                }
                _ => {}
            }
            check(&mut family, &live)?;
        }
        for mut l in live.drain(..) {
            family.release(&mut l.tables);
        }
        // Quiescence: every page is free or a snapshot's.
        family.check_invariants([]).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}
