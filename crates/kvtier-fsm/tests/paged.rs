//! Window and compressed-state models through the whole scheduler: each row carries its
//! group tables, sliding groups release what the window left, commits snapshot the
//! computed prefix at every multiple of A, and a follow-up reuses a prefix only where
//! a snapshot makes every required group complete (spec/hybrid-l3.md §2).

mod common;

use common::*;
use kvtier_fsm::Scheduler;
use kvtier_paged::PagedReport;
use kvtier_types::{
    ExecutionPlan, ForwardRow, GroupRole, GroupSpec, GroupTable, PagedSettings, RowKind,
    SchedulerConfig,
};

/// Pages of 4 tokens, no host tier, budget 16, batch 8, and `groups` with `required`.
fn with_groups(groups: Vec<GroupSpec>, required: &[&str]) -> SchedulerConfig {
    SchedulerConfig {
        page_size: 4,
        device_pages: 64,
        host_pages: 0,
        disable_l2_cache: true,
        max_scheduled_tokens: 16,
        max_batch_size: 8,
        decode_input_tokens: 1,
        paged: Some(PagedSettings {
            groups,
            required: required.iter().map(|&id| id.to_owned()).collect(),
        }),
        ..SchedulerConfig::default()
    }
}

/// `fh`, a full history of 4 tokens a page (A = 4).
fn fh(pages: u32) -> GroupSpec {
    GroupSpec::full_history("fh", 4, 1, pages)
}

/// `swa`, a sliding state window of 8 tokens over pages of 4.
fn swa(pages: u32) -> GroupSpec {
    GroupSpec::sliding("swa", 4, 1, pages, 8, GroupRole::State)
}

/// The two groups, both required.
fn windowed(fh_pages: u32, swa_pages: u32) -> SchedulerConfig {
    with_groups(vec![fh(fh_pages), swa(swa_pages)], &["fh", "swa"])
}

fn report(s: &mut Scheduler) -> PagedReport {
    *s.stats().groups.expect("a paged scheduler")
}

/// The row of `id` in `plan` and its group tables.
fn row_groups<'a>(plan: &'a ExecutionPlan, id: &str) -> (&'a ForwardRow, &'a [GroupTable]) {
    let index = plan
        .forward
        .rows
        .iter()
        .position(|r| r.request_id.as_str() == id)
        .expect("a row for the request");
    (&plan.forward.rows[index], plan.forward.groups_of(index))
}

/// Group `i` of a row: (base, pages).
fn group(groups: &[GroupTable], i: usize) -> (u32, Vec<u32>) {
    (groups[i].base, groups[i].pages.clone())
}

/// Nothing but snapshots holds group pages once no request runs, and every page is
/// accounted for.
fn quiescent(s: &mut Scheduler) {
    check(s);
    let r = report(s);
    assert_eq!(r.live_tables, 0, "{r:?}");
}

/// Every row names both groups; the sliding group's view starts where the window of
/// the row's first token starts (the release bound comes from the op's first position).
#[test]
fn rows_carry_their_group_tables() {
    let mut s = sched(windowed(64, 64));
    submit(&mut s, "r1", tokens(1, 18));
    let plan = s.next_plan();
    let (row, groups) = row_groups(&plan, "r1");
    assert_eq!((row.input_length, groups.len()), (16, 2));
    assert_eq!((group(groups, 0).0, group(groups, 0).1.len()), (0, 4));
    assert_eq!((group(groups, 1).0, group(groups, 1).1.len()), (0, 4));
    advance(&mut s, vec![]);
    // The second chunk [16, 18): the window of token 16 starts at 9, on page 2.
    let plan = s.next_plan();
    let (row, groups) = row_groups(&plan, "r1");
    assert_eq!(row.extend_prefix_len, 16);
    let (fh, swa) = (group(groups, 0), group(groups, 1));
    assert_eq!((fh.0, fh.1.len()), (0, 5));
    assert_eq!((swa.0, swa.1.len()), (2, 3));
    check(&mut s);
}

/// A follow-up with the same first 16 tokens reuses them: its first row starts at 16
/// and reads the snapshot's pages (the history the first request computed, the window
/// before 16), not fresh ones.
#[test]
fn a_follow_up_reuses_the_snapshots_of_its_prefix() {
    let mut s = sched(windowed(64, 64));
    let mut engine = Engine::with_max_new(3);
    submit(&mut s, "r1", tokens(1, 18));
    let first = step(&mut s, &mut engine);
    let (_, fh1) = group(row_groups(&first, "r1").1, 0);
    drain(&mut s, &mut engine, 20);
    let mut prompt = tokens(1, 16);
    prompt.extend(tokens(500, 6));
    submit(&mut s, "r2", prompt);
    let plan = step(&mut s, &mut engine);
    let (row, groups) = row_groups(&plan, "r2");
    assert_eq!((row.kind, row.extend_prefix_len), (RowKind::Prefill, 16));
    let (fh, swa) = (group(groups, 0), group(groups, 1));
    assert_eq!(fh.1[..4], fh1[..4], "the history pages r1 committed");
    assert_eq!(swa.0, 2, "the window of token 16 starts on page 2");
    drain(&mut s, &mut engine, 20);
    quiescent(&mut s);
    assert!(report(&mut s).stats.snapshots_adopted + report(&mut s).stats.snapshots_created > 0);
}

/// Over a long decode a sliding group's table never holds more than the window's pages
/// (plus the page being written), and the pool's pages come back.
#[test]
fn window_pages_leave_a_long_decode() {
    let mut s = sched(windowed(64, 64));
    let mut engine = Engine::with_max_new(150);
    submit(&mut s, "r1", tokens(1, 10));
    let mut peak = 0;
    let mut decodes = 0;
    while !s.is_idle() {
        let plan = step(&mut s, &mut engine);
        if let Some(row) = row(&plan, "r1") {
            peak = peak.max(row_groups(&plan, "r1").1[1].pages.len());
            decodes += usize::from(row.kind == RowKind::Decode);
        }
        assert!(decodes < 1000, "no end");
    }
    assert_eq!(decodes, 149);
    assert_eq!(peak, 3, "8 tokens of window span at most 3 pages of 4");
    quiescent(&mut s);
}

/// An aborted request's tables go back: its own pages are free again.
#[test]
fn an_aborted_request_returns_its_group_pages() {
    let mut s = sched(windowed(64, 64));
    let before: Vec<u32> = report(&mut s).groups.iter().map(|g| g.free_pages).collect();
    submit(&mut s, "r1", tokens(1, 30));
    s.next_plan();
    advance(&mut s, vec![]);
    assert_eq!(report(&mut s).live_tables, 1);
    advance(&mut s, vec![abort("r1")]);
    s.next_plan();
    quiescent(&mut s);
    let r = report(&mut s);
    // Whatever it committed stays with the snapshots; the rest is free.
    for (g, free) in r.groups.iter().zip(before) {
        assert!(g.free_pages <= free, "{g:?}");
    }
    assert_eq!(r.groups.iter().map(|g| g.failed_alloc).sum::<u64>(), 0);
}

/// A group pool too small for two chunks at once: the second request waits for the
/// first to release its window instead of failing an allocation, and both finish.
#[test]
fn a_short_group_pool_makes_requests_wait_not_fail() {
    // swa: 6 usable pages; each 16-token chunk takes 4; the budget fits both chunks.
    let mut s = sched(SchedulerConfig {
        max_scheduled_tokens: 32,
        ..windowed(64, 7)
    });
    let mut engine = Engine::with_max_new(4);
    submit(&mut s, "r1", tokens(1, 16));
    submit(&mut s, "r2", tokens(900, 16));
    let plan = step(&mut s, &mut engine);
    assert_eq!(row_ids(&plan), ["r1"], "r2 waits for group pages");
    drain(&mut s, &mut engine, 50);
    quiescent(&mut s);
    let r = report(&mut s);
    assert_eq!(r.groups.iter().map(|g| g.failed_alloc).sum::<u64>(), 0);
    assert!(r.stats.admission_denied > 0);
}

/// A first chunk the groups refused is not matched again while nothing it depends on
/// changed: a waiting request is refused once per change, not once per step, and is
/// admitted as soon as pages come back.
#[test]
fn a_refused_first_chunk_waits_without_rematching() {
    // One full-history group of 16-token pages (A = 16), 3 usable pages: a decode
    // takes pages but returns none, and commits nothing new before 32 tokens.
    let mut config = with_groups(vec![GroupSpec::full_history("fh", 16, 1, 4)], &["fh"]);
    config.max_scheduled_tokens = 64;
    let mut s = sched(config);
    let mut engine = Engine::with_max_new(10);
    submit(&mut s, "r1", tokens(1, 16));
    submit(&mut s, "r2", tokens(900, 47));
    let first = step(&mut s, &mut engine);
    assert_eq!(row_ids(&first), ["r1"], "r2 needs 3 pages, r1 holds one");
    // r1's prefill is committed into a snapshot: r2 looks again, once.
    step(&mut s, &mut engine);
    let denied = report(&mut s).stats.admission_denied;
    assert_eq!(denied, 2);
    for _ in 0..5 {
        let plan = step(&mut s, &mut engine);
        assert_eq!(row_ids(&plan), ["r1"], "r2 still waits");
    }
    assert_eq!(
        report(&mut s).stats.admission_denied,
        denied,
        "not refused again"
    );
    let plans = drain(&mut s, &mut engine, 50);
    assert!(plans.iter().any(|p| row(p, "r2").is_some()), "r2 ran");
    quiescent(&mut s);
}

/// A request admitted at a shallow hit locks that node and its ancestors, not the
/// snapshots below it: another request that needs their pages prunes them at once
/// instead of waiting for the first to finish. (The reference also counts a lock on an
/// ancestor as a pin; with it, a running request whose next op needs such pages waits
/// forever — found by the property test with paged configs.)
#[test]
fn snapshots_below_a_request_are_not_pinned_by_it() {
    let mut config = with_groups(vec![fh(9)], &["fh"]);
    config.max_scheduled_tokens = 64;
    let mut s = sched(config);
    let mut engine = Engine::with_max_new(1);
    // r1 leaves snapshots at 4, 8, 12 and 16 tokens: 4 of the 8 pages.
    submit(&mut s, "r1", tokens(1, 16));
    drain(&mut s, &mut engine, 10);
    assert_eq!(report(&mut s).snapshots, 4);
    // r2 reuses the first 4 tokens and decodes for a while; r3 shares nothing and needs
    // 4 pages with its decode token, which only r1's deeper snapshots can give.
    let mut r2 = tokens(1, 4);
    r2.extend(tokens(500, 4));
    engine.max_new.insert("r2".into(), 30);
    submit(&mut s, "r2", r2);
    submit(&mut s, "r3", tokens(900, 13));
    let plans = run_until(&mut s, &mut engine, 5, |_, p| row(p, "r3").is_some());
    let last = plans.last().expect("a plan");
    assert!(row(last, "r2").is_some(), "r3 runs beside r2, not after it");
    assert!(report(&mut s).stats.prune_full > 0);
    drain(&mut s, &mut engine, 100);
    quiescent(&mut s);
}

/// Groups for the coverage test: `fh` full history of 4 tokens a page, `swa` a window
/// of 8 over pages of 4, and `c2` a compressed history (entries of 2 tokens, 2 a page).
fn three_groups(pages: u32) -> SchedulerConfig {
    let c2 = GroupSpec::full_history("c2", 2, 2, pages);
    with_groups(vec![fh(pages), swa(pages), c2], &["fh", "swa", "c2"])
}

/// Every row's group tables reach the entries it reads and writes: from where its
/// first token's window starts (0 for a full history) to its last token, whatever mix
/// of first chunks, later chunks and decode rows a step holds (the reference's
/// `MixedPrefillDecodePagedTablesCoverScheduledTokens`); a compressed group counts
/// partial entries (`test_full_history_stride_admission_accounts_partial_entries`).
#[test]
fn mixed_rows_group_tables_cover_their_tokens() {
    let mut config = three_groups(128);
    config.enable_mixed_prefill_decode = true;
    config.max_scheduled_tokens = 12;
    let groups = config.paged.clone().expect("paged").groups;
    let mut s = sched(config);
    let mut engine = Engine::with_max_new(9);
    let mut len: std::collections::BTreeMap<String, u32> = Default::default();
    for (i, n) in [(0, 5), (1, 23), (2, 14), (3, 9)] {
        let id = format!("r{i}");
        submit(&mut s, &id, tokens(100 * i + 1, n));
        len.insert(id, n as u32);
    }
    let mut rows_checked = 0;
    while !s.is_idle() {
        let plan = s.next_plan();
        for (index, row) in plan.forward.rows.iter().enumerate() {
            let id = row.request_id.to_string();
            let (first, end) = match row.kind {
                RowKind::Prefill => (
                    row.extend_prefix_len,
                    row.extend_prefix_len + row.input_length,
                ),
                _ => (len[&id] - 1, len[&id]),
            };
            let mut sorted = groups.clone();
            sorted.sort_by(|a, b| a.id.cmp(&b.id));
            for (g, table) in sorted.iter().zip(plan.forward.groups_of(index)) {
                let lo = g.window().map_or(0, |w| (first + 1).saturating_sub(w));
                let pages = (lo / g.tokens_per_page())..=((end - 1) / g.tokens_per_page());
                for page in pages {
                    assert!(
                        page >= table.base && page - table.base < table.pages.len() as u32,
                        "{id} {:?} [{first}, {end}): group `{}` misses page {page} (base {}, {} pages)",
                        row.kind,
                        g.id,
                        table.base,
                        table.pages.len()
                    );
                }
            }
            rows_checked += 1;
        }
        let events = engine.answer(&plan);
        for e in &events {
            if let kvtier_types::EngineEvent::ExtendResult { request_id, tokens } = e {
                *len.get_mut(request_id.as_str()).expect("known") += tokens.len() as u32;
            }
        }
        advance(&mut s, events);
        check(&mut s);
    }
    assert!(rows_checked >= 36, "{rows_checked}");
    quiescent(&mut s);
}

/// A window pool of 4 usable pages serves a long decode: every op releases what the
/// window left before it acquires (`test_sliding_release_before_admit_prevents_oom`).
/// The window group is transport-only here, so no snapshot holds its pages.
#[test]
fn sliding_release_before_acquire_keeps_a_tiny_pool_enough() {
    let mut s = sched(with_groups(vec![fh(64), swa(5)], &["fh"]));
    let mut engine = Engine::with_max_new(100);
    submit(&mut s, "r1", tokens(1, 10));
    for _ in 0..200 {
        if s.is_idle() {
            break;
        }
        step(&mut s, &mut engine);
    }
    let r = report(&mut s);
    assert!(s.is_idle(), "{r:?} {:?}", s.request_state(&"r1".into()));
    assert_eq!(r.groups.iter().map(|g| g.failed_alloc).sum::<u64>(), 0);
    assert_eq!(r.stats.admission_denied, 0, "{r:?}");
    quiescent(&mut s);
}

/// A running request's decode page crossings publish and commit its prefix: a
/// follow-up with its prompt and the tokens it generated so far reuses them while it
/// still runs (the reference's `ContinuingDecodePublishesWindowedHybridPrefixes`).
#[test]
fn decode_page_crossings_publish_windowed_prefixes() {
    let mut s = sched(windowed(64, 64));
    let mut engine = Engine::with_max_new(40);
    let prompt = tokens(1, 8);
    submit(&mut s, "r1", prompt.clone());
    let first_token = engine.next_token;
    for _ in 0..12 {
        step(&mut s, &mut engine);
    }
    // r1 holds 8 + 12 tokens; its first 19 are computed, 16 of them in full pages.
    let generated: Vec<i32> = (0..12).map(|i| first_token + i).collect();
    let mut r2 = prompt;
    r2.extend(&generated);
    r2.truncate(17);
    r2.extend(tokens(900, 3));
    submit(&mut s, "r2", r2);
    let plan = step(&mut s, &mut engine);
    let (r2_row, _) = row_groups(&plan, "r2");
    assert_eq!(
        r2_row.extend_prefix_len, 16,
        "r1's decoded pages, committed mid-flight"
    );
    assert_eq!(
        state(&s, "r1"),
        kvtier_fsm::StateKind::Decoding,
        "r1 still runs"
    );
    drain(&mut s, &mut engine, 100);
    quiescent(&mut s);
}

/// A required window group of 4 usable pages under a long decode: the request's own
/// snapshots fill the pool, it is retracted (no host tier: it keeps its prefix on
/// device) and recomputed from its deepest snapshot, whose hit reads only the last
/// window, so the state of the ancestors below that window is stripped for the pages
/// it needs. It finishes; nothing waits forever.
#[test]
fn a_tiny_required_window_pool_still_finishes() {
    let mut s = sched(windowed(64, 5));
    let mut engine = Engine::with_max_new(100);
    submit(&mut s, "r1", tokens(1, 10));
    drain(&mut s, &mut engine, 400);
    let r = report(&mut s);
    assert_eq!(r.groups.iter().map(|g| g.failed_alloc).sum::<u64>(), 0);
    assert!(r.stats.prune_state_only > 0, "{r:?}");
    quiescent(&mut s);
}
