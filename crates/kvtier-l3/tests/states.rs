//! Hybrid models in L3: a prefix's pages are of use only with the recurrent state at its
//! end, so states travel beside pages as objects of their own. A lookup stops at the
//! deepest page the store holds a state after, and a prefetch brings its pages with the
//! state at their end, or a shorter prefix with an earlier state, or nothing.

use kvtier_host::HostArena;
use kvtier_l3::{L3Core, LocalStore, LocalStoreConfig, Namespace};
use kvtier_types::hash::{PageHash, rolling_page_hashes};
use kvtier_types::{BackupOp, EngineEvent, PrefetchOp, RequestSpec, StateObject};
use std::sync::Arc;

const PAGE: usize = 16;
const PAGE_BYTES: u64 = 256;
const STATE_BYTES: u64 = 96;

fn ns() -> Namespace {
    Namespace::new("hybrid-model", "bf16", "page-first", PAGE as u32, 1, 0).expect("namespace")
}

/// Four full pages and one token more (the last token is never a hit).
fn prompt() -> Vec<i32> {
    (0..4 * PAGE as i32 + 1).map(|t| t * 7 + 3).collect()
}

fn hashes() -> Vec<PageHash> {
    rolling_page_hashes(None, &prompt()[..4 * PAGE], PAGE)
}

struct Fixture {
    _dir: tempfile::TempDir,
    l3: L3Core,
    pages: Arc<HostArena>,
    states: Arc<HostArena>,
}

/// An L3 core over a fresh local store: host pages 1..=4 hold the prompt's KV, host state
/// slots 0 and 1 (arena pages 1 and 2) the states after its second and fourth page.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = Arc::new(HostArena::new(16, PAGE_BYTES).expect("page arena"));
    let states = Arc::new(HostArena::new(8, STATE_BYTES).expect("state arena"));
    {
        let mut write = pages.write(&[1, 2, 3, 4]).expect("pages");
        for (i, page) in write.slices_mut().into_iter().enumerate() {
            page.fill(0x10 + i as u8);
        }
        let mut write = states.write(&[1, 2]).expect("state slots");
        for (i, slot) in write.slices_mut().into_iter().enumerate() {
            slot.fill(0xa0 + i as u8);
        }
    }
    let store =
        LocalStore::open(LocalStoreConfig::new(dir.path(), 1 << 20, 1 << 20)).expect("local store");
    let l3 = L3Core::new(Box::new(store), ns(), PAGE as u32, Arc::clone(&pages))
        .expect("L3 core")
        .with_states(Arc::clone(&states));
    Fixture {
        _dir: dir,
        l3,
        pages,
        states,
    }
}

fn state(slot: u32, after_page: usize) -> StateObject {
    StateObject {
        slot,
        page_hash: hashes()[after_page - 1],
    }
}

fn backup(op_id: u32, pages: usize, states: Vec<StateObject>) -> BackupOp {
    BackupOp {
        op_id,
        src_pages: (1..=pages as u32).collect(),
        page_hashes: hashes()[..pages].to_vec(),
        states,
    }
}

fn prefetch(op_id: u32, pages: usize, state: Option<StateObject>) -> PrefetchOp {
    PrefetchOp {
        op_id,
        request_id: "r".into(),
        dst_pages: (5..5 + pages as u32).collect(),
        page_hashes: hashes()[..pages].to_vec(),
        state,
    }
}

fn lookup(l3: &mut L3Core) -> u32 {
    let mut specs = [RequestSpec::new("r", prompt())];
    l3.lookup(&mut specs, 0);
    specs[0].storage_hit_pages
}

fn stored(f: &mut Fixture, ops: &[BackupOp]) {
    for event in f.l3.transfer(&[], ops) {
        assert!(
            matches!(event, EngineEvent::BackupDone { success: true, .. }),
            "{event:?}"
        );
    }
}

/// Runs one prefetch; its (success, completed pages).
fn prefetched(f: &mut Fixture, op: PrefetchOp) -> (bool, u32) {
    match f.l3.transfer(&[op], &[]).as_slice() {
        [
            EngineEvent::PrefetchDone {
                success,
                completed_pages,
                ..
            },
        ] => (*success, *completed_pages),
        events => panic!("one PrefetchDone expected: {events:?}"),
    }
}

#[test]
fn a_lookup_stops_at_the_deepest_stored_state() {
    let mut f = fixture();
    // Pages without any state: nothing a hybrid model can resume from.
    stored(&mut f, &[backup(1, 4, Vec::new())]);
    assert_eq!(lookup(&mut f.l3), 0);
    stored(&mut f, &[backup(2, 2, vec![state(0, 2)])]);
    assert_eq!(
        lookup(&mut f.l3),
        2,
        "the pages up to the state after page 2"
    );
    stored(&mut f, &[backup(3, 4, vec![state(1, 4)])]);
    assert_eq!(lookup(&mut f.l3), 4);
    let stats = f.l3.stats();
    assert_eq!((stats.backed_up_states, stats.backed_up_pages), (2, 4));
    // The state after page 4 lost (evicted by the store): back to page 2.
    let key = ns().state_key(&hashes()[3]);
    f.l3.backend_mut().remove(&[key]).expect("remove");
    assert_eq!(lookup(&mut f.l3), 2);
}

#[test]
fn a_prefetch_brings_its_pages_and_state_whole() {
    let mut f = fixture();
    stored(&mut f, &[backup(1, 4, vec![state(0, 2), state(1, 4)])]);
    assert_eq!(
        prefetched(&mut f, prefetch(2, 4, Some(state(3, 4)))),
        (true, 4)
    );
    let pages = f.pages.read(&[5, 6, 7, 8]).expect("pages");
    for (i, page) in pages.slices().into_iter().enumerate() {
        assert!(page.iter().all(|&b| b == 0x10 + i as u8), "page {i}");
    }
    let slot = f.states.read(&[4]).expect("state slot 3");
    assert!(
        slot.slices()[0].iter().all(|&b| b == 0xa1),
        "the state after page 4"
    );
    assert_eq!(f.l3.stats().prefetched_states, 1);
}

/// The state after the last page is gone (evicted, or corrupt and dropped): the prefetch
/// falls back to the deepest earlier state and completes the pages it follows — a shorter
/// prefix, never pages without their state.
#[test]
fn a_prefetch_whose_state_is_gone_serves_a_shorter_prefix() {
    let mut f = fixture();
    stored(&mut f, &[backup(1, 4, vec![state(0, 2), state(1, 4)])]);
    let key = ns().state_key(&hashes()[3]);
    f.l3.backend_mut().remove(&[key]).expect("remove");
    assert_eq!(
        prefetched(&mut f, prefetch(2, 4, Some(state(3, 4)))),
        (true, 2)
    );
    let slot = f.states.read(&[4]).expect("state slot 3");
    assert!(
        slot.slices()[0].iter().all(|&b| b == 0xa0),
        "the state after page 2"
    );
    drop(slot);
    let stats = f.l3.stats();
    assert_eq!(
        (
            stats.prefetched_states,
            stats.shorter_state_prefetches,
            stats.prefetched_pages
        ),
        (1, 1, 2)
    );
    // A page lost past the earlier state: the same shorter prefix.
    let key = ns().key(&hashes()[2]);
    f.l3.backend_mut().remove(&[key]).expect("remove");
    assert_eq!(
        prefetched(&mut f, prefetch(3, 4, Some(state(3, 4)))),
        (true, 2)
    );
}

/// With no earlier state to fall back to, the prefetch completes no page (a miss: the
/// request computes the prefix) and the state slot is not written.
#[test]
fn a_prefetch_with_no_state_left_completes_nothing() {
    let mut f = fixture();
    stored(&mut f, &[backup(1, 4, vec![state(1, 4)])]);
    let key = ns().state_key(&hashes()[3]);
    f.l3.backend_mut().remove(&[key]).expect("remove");
    assert_eq!(
        prefetched(&mut f, prefetch(2, 4, Some(state(3, 4)))),
        (true, 0)
    );
    assert!(
        f.states.read(&[4]).expect("slot").slices()[0]
            .iter()
            .all(|&b| b == 0)
    );
    assert_eq!(f.l3.stats().prefetched_states, 0);
}

/// A core without a state arena refuses state objects rather than dropping them.
#[test]
fn state_objects_need_a_state_arena() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = Arc::new(HostArena::new(16, PAGE_BYTES).expect("page arena"));
    let store =
        LocalStore::open(LocalStoreConfig::new(dir.path(), 1 << 20, 1 << 20)).expect("local store");
    let mut l3 = L3Core::new(Box::new(store), ns(), PAGE as u32, pages).expect("L3 core");
    let events = l3.transfer(
        &[prefetch(1, 2, Some(state(0, 2)))],
        &[backup(2, 2, vec![state(0, 2)])],
    );
    assert!(
        matches!(
            events.as_slice(),
            [
                EngineEvent::PrefetchDone { success: false, .. },
                EngineEvent::BackupDone { success: false, .. }
            ]
        ),
        "{events:?}"
    );
}
