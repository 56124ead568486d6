//! Helpers shared by the cache-core integration tests (port of the reference
//! scheduler's `unit_test_helper.h`, mapped onto our API).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use kvtier_radix::{CacheConfig, InsertResult, RadixCore};
use kvtier_types::{PageId, Tier, Token};

/// `count` consecutive tokens starting at `start`.
pub fn make_tokens(count: usize, start: Token) -> Vec<Token> {
    (0..count).map(|i| start + i as Token).collect()
}

/// `pages` whole pages of consecutive tokens starting at `start`.
pub fn make_aligned_tokens(pages: usize, page_size: u32, start: Token) -> Vec<Token> {
    make_tokens(pages * page_size as usize, start)
}

/// `a` followed by `b`.
pub fn concat(a: &[Token], b: &[Token]) -> Vec<Token> {
    let mut out = a.to_vec();
    out.extend_from_slice(b);
    out
}

/// A cache without KV events or page hashes.
pub fn new_cache(page_size: u32, device_pages: u32, host_pages: u32) -> RadixCore {
    RadixCore::new(&CacheConfig {
        page_size,
        device_pages,
        host_pages,
        kv_events: false,
        page_hashes: false,
        policy: Default::default(),
        mamba: None,
        paged: None,
        lost_hits: false,
    })
}

/// A cache that records device-tier KV events.
pub fn new_cache_with_events(page_size: u32, device_pages: u32, host_pages: u32) -> RadixCore {
    RadixCore::new(&CacheConfig {
        page_size,
        device_pages,
        host_pages,
        kv_events: true,
        page_hashes: false,
        policy: Default::default(),
        mamba: None,
        paged: None,
        lost_hits: false,
    })
}

/// Inserts `tokens` on `tier` from the root, allocating one fresh page per page of
/// tokens (the reference tests' `Insert<T>(tokens, {}, alloc.Allocate(n))`).
pub fn insert_fresh(cache: &mut RadixCore, tier: Tier, tokens: &[Token]) -> InsertResult {
    insert_after_prefix(cache, tier, tokens, 0)
}

/// Inserts `tokens` on `tier` whose first `prefix_pages` pages are already resident on
/// that tier, allocating fresh pages for the rest (the reference tests' insert under a
/// start node).
pub fn insert_after_prefix(
    cache: &mut RadixCore,
    tier: Tier,
    tokens: &[Token],
    prefix_pages: u32,
) -> InsertResult {
    let total = tokens.len() / cache.page_size() as usize;
    let pages = cache
        .allocate(tier, total - prefix_pages as usize)
        .expect("test pool too small for the insert");
    cache
        .insert(tier, tokens, prefix_pages, pages)
        .expect("insert failed")
}

/// Device page ids of the path root→`node` (every node on it must be on device).
pub fn device_path(cache: &RadixCore, node: kvtier_radix::NodeId) -> Vec<PageId> {
    let mut out = Vec::new();
    cache.device_path_pages(node, &mut out);
    out
}

/// Page conservation and structural invariants with nothing held outside the tree.
pub fn assert_invariants(cache: &mut RadixCore) {
    assert_invariants_outside(cache, &[], &[]);
}

/// Page conservation and structural invariants with `device` / `host` page ids held
/// outside the tree by the test.
pub fn assert_invariants_outside(cache: &mut RadixCore, device: &[PageId], host: &[PageId]) {
    if let Err(e) = cache.check_invariants([device, host]) {
        panic!("cache invariants violated: {e}");
    }
}
