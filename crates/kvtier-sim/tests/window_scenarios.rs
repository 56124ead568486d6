//! The scenarios on window and compressed-state models: every row's group entries are
//! checked by the oracle engine (the window its tokens attend, the compressed
//! history, the compressor states), and reuse must never change an answer — the cache on
//! gives the tokens of the cache off, with zero integrity errors, on every path.

mod common;

use common::{clean, run_model as run};
use kvtier_model::ModelKind;
use kvtier_sim::Path;
use kvtier_sim::scenario::Scenario;

const MODELS: [ModelKind; 2] = [ModelKind::SlidingWindow, ModelKind::CompressedState];

#[test]
fn window_chat_answers_as_without_the_cache_on_every_path() {
    for model in MODELS {
        let off = run(model, Scenario::Chat, false, Path::Core);
        clean(&off, "chat, cache off");
        for path in [Path::Core, Path::Deterministic, Path::Actors] {
            let what = format!("chat, {}, {}", model.name(), path.name());
            let on = run(model, Scenario::Chat, true, path);
            clean(&on, &what);
            assert_eq!(on.outputs, off.outputs, "{what}");
            // Follow-up turns resume from the snapshot at the end of the last answer.
            assert!(on.hit_tokens > 0, "{what}: no reuse");
        }
    }
}

/// A window model reuses KV from any tier: the host (chat) and the embedded L3 store
/// (longdoc) bring back KV pages only, and the first chunk computes each window before
/// its prefix again; the answers are the cache-off run's. (A compressed-state model
/// reuses device snapshots only: its compressed history cannot be computed from a
/// window.)
#[test]
fn a_window_model_reuses_host_and_l3_prefixes_by_refilling_its_windows() {
    let off = run(ModelKind::SlidingWindow, Scenario::Chat, false, Path::Core);
    let on = run(ModelKind::SlidingWindow, Scenario::Chat, true, Path::Core);
    clean(&on, "chat");
    assert_eq!(on.outputs, off.outputs);
    assert_eq!(
        on.hit_tokens, on.ideal_hit_tokens,
        "every follow-up reuses its history"
    );
    assert!(on.hit_tokens_host > 0, "{on:?}");
    let off = run(
        ModelKind::SlidingWindow,
        Scenario::Longdoc,
        false,
        Path::Core,
    );
    let on = run(
        ModelKind::SlidingWindow,
        Scenario::Longdoc,
        true,
        Path::Core,
    );
    clean(&on, "longdoc");
    assert_eq!(on.outputs, off.outputs);
    assert!(on.hit_tokens_l3 > 0 && on.l3_prefetch_ops > 0, "{on:?}");
}

#[test]
fn window_rollout_and_longdoc_answer_as_without_the_cache() {
    for model in MODELS {
        for scenario in [Scenario::Rollout, Scenario::Longdoc] {
            let what = format!("{}, {}", scenario.name(), model.name());
            let off = run(model, scenario, false, Path::Core);
            let on = run(model, scenario, true, Path::Core);
            clean(&off, &what);
            clean(&on, &what);
            assert_eq!(on.outputs, off.outputs, "{what}");
        }
        // Siblings of a prompt reuse it at the deepest snapshot boundary.
        let on = run(model, Scenario::Rollout, true, Path::Core);
        assert!(on.hit_tokens * 10 >= on.ideal_hit_tokens * 8, "{on:?}");
    }
}

/// The window answers are not the dense model's: the group entries a row reads feed its
/// next token, so an engine that ignored them could not tell a wrong window.
#[test]
fn group_entries_reach_the_answer() {
    let dense = run(ModelKind::Dense, Scenario::Chat, false, Path::Core);
    for model in MODELS {
        let window = run(model, Scenario::Chat, false, Path::Core);
        assert_ne!(
            window.output_digest,
            dense.output_digest,
            "{}",
            model.name()
        );
    }
}

/// A wrong group table is caught: with a row's window read through the wrong pages
/// (its table one column off), the oracle reports the first entry read wrong.
#[test]
fn a_misplaced_window_is_an_integrity_error() {
    use kvtier_sim::groups::{GroupMemory, RowGroups};
    use kvtier_types::{GroupRole, GroupSpec, GroupTable, RequestId};

    let spec = GroupSpec::sliding("swa", 4, 1, 16, 8, GroupRole::State);
    let mut memory = GroupMemory::new(vec![spec]);
    let prefix: Vec<u64> = (0..32).map(|i| 1000 + i).collect();
    let request = RequestId::from("r1");
    fn row<'a>(request: &'a RequestId, tables: &'a [GroupTable]) -> RowGroups<'a> {
        RowGroups { request, tables }
    }
    // The first chunk [0, 16) on pages 1-4.
    let first = [GroupTable {
        base: 0,
        pages: vec![1, 2, 3, 4],
        fill_from: None,
    }];
    assert_eq!(memory.write(row(&request, &first), &prefix, 0..16), None);
    let mut digest = 0;
    let read = memory.read_after(row(&request, &first), &prefix, 16, &mut digest, |_| true);
    assert_eq!(read, None);
    // The next chunk [16, 20) attends [9, 16): pages 2 and 3 of the window (ids 3, 4)
    // from base 2, then a new page for its own tokens. A table one column off:
    let off = [GroupTable {
        base: 2,
        pages: vec![2, 3, 5],
        fill_from: None,
    }];
    let wrong = memory
        .check_before(row(&request, &off), &prefix, 16, |_| true)
        .expect("the window read from the wrong pages");
    assert_eq!((wrong.group.as_str(), wrong.position), ("swa", 9));
    let right = [GroupTable {
        base: 2,
        pages: vec![3, 4, 5],
        fill_from: None,
    }];
    assert_eq!(
        memory.check_before(row(&request, &right), &prefix, 16, |_| true),
        None
    );
}
