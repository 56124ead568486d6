//! Criterion benchmarks of the radix cache's hot operations: probe, admit, insert, evict.
//!
//! Workload (deterministic, xorshift tokens): page size 64; 200 shared 16-page prefixes;
//! 1000 sequences of 24 pages, sequence `i` being prefix `i % 200` followed by its own
//! 8-page suffix. The populated tree holds 11 200 device pages in 1 200 nodes (200 prefix
//! nodes with 5 leaves each); no host tier, no KV events, no page hashes.
//!
//! * `probe_hit/{24,16,0}`: read-only probe of a 24-page prompt matching 24, 16 or 0 pages.
//! * `admit/{hit,miss}`: `match_prefix` + `lock` + `allocate` of the uncached pages (8 for
//!   `hit`, 24 for `miss`), then unlock and free, so every iteration sees the same tree.
//! * `insert/{new,duplicate}`: insert of a 24-page sequence after its locked 16-page
//!   prefix, with 8 fresh pages: a new suffix (one node attached) or an existing one (the
//!   8 pages go back to the pool). The tree is rebuilt for every iteration, untimed.
//! * `evict/{1,64,1024}`: `ensure_free` of that many device pages on a full pool (1, 8 or
//!   128 LRU leaves evicted). The tree is rebuilt for every iteration, untimed.
//!
//! `cargo test --benches` runs each benchmark once in a debug build, where the setup also
//! checks the cache invariants and the expected match lengths.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, criterion_group,
    criterion_main, measurement::WallTime,
};
use kvtier_radix::{CacheConfig, RadixCore};
use kvtier_types::{Tier, Token};

/// Tokens per page.
const PAGE_SIZE: usize = 64;
/// Shared prefixes in the populated tree.
const PREFIXES: usize = 200;
/// Pages of each shared prefix.
const PREFIX_PAGES: usize = 16;
/// Sequences in the populated tree.
const SEQUENCES: usize = 1000;
/// Pages of each sequence's unique suffix.
const SUFFIX_PAGES: usize = 8;
/// Pages of a prompt (prefix + suffix).
const PROMPT_PAGES: usize = PREFIX_PAGES + SUFFIX_PAGES;
/// Device pages held by the populated tree.
const POPULATED_PAGES: u32 = (PREFIXES * PREFIX_PAGES + SEQUENCES * SUFFIX_PAGES) as u32;
/// Free device pages left next to the populated tree where a benchmark allocates.
const SPARE_PAGES: u32 = 64;
/// Vocabulary size of the generated tokens.
const VOCAB: u64 = 32_000;

/// Token streams: each (stream, index) pair seeds its own generator.
const STREAM_PREFIX: u64 = 1;
const STREAM_SUFFIX: u64 = 2;
const STREAM_FRESH_SUFFIX: u64 = 3;
const STREAM_MISS: u64 = 4;

/// A xorshift64 generator seeded through splitmix64 (no `rand` dependency).
struct XorShift(u64);

impl XorShift {
    fn new(stream: u64, index: u64) -> Self {
        let mut z = ((stream << 32) | index).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self(z.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// `pages` whole pages of tokens from stream (`stream`, `index`).
fn tokens(stream: u64, index: usize, pages: usize) -> Vec<Token> {
    let mut rng = XorShift::new(stream, index as u64);
    (0..pages * PAGE_SIZE)
        .map(|_| (rng.next() % VOCAB) as Token)
        .collect()
}

fn concat(a: &[Token], b: &[Token]) -> Vec<Token> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// The token sequences of the populated tree and the prompts run against it.
struct Workload {
    /// The cached sequences: `seqs[i]` = prefix `i % PREFIXES` + suffix `i`.
    seqs: Vec<Vec<Token>>,
    /// One uncached sequence per prefix: prefix `j` + a suffix found nowhere in the tree.
    prefix_only: Vec<Vec<Token>>,
    /// Prompts sharing no page with the tree.
    misses: Vec<Vec<Token>>,
}

impl Workload {
    fn new() -> Self {
        let prefixes: Vec<Vec<Token>> = (0..PREFIXES)
            .map(|j| tokens(STREAM_PREFIX, j, PREFIX_PAGES))
            .collect();
        let seqs = (0..SEQUENCES)
            .map(|i| {
                let suffix = tokens(STREAM_SUFFIX, i, SUFFIX_PAGES);
                concat(&prefixes[i % PREFIXES], &suffix)
            })
            .collect();
        let prefix_only = prefixes
            .iter()
            .enumerate()
            .map(|(j, prefix)| concat(prefix, &tokens(STREAM_FRESH_SUFFIX, j, SUFFIX_PAGES)))
            .collect();
        let misses = (0..PREFIXES)
            .map(|j| tokens(STREAM_MISS, j, PROMPT_PAGES))
            .collect();
        Self {
            seqs,
            prefix_only,
            misses,
        }
    }

    /// A cache holding every sequence of the workload, with `spare` device pages free.
    fn populated(&self, spare: u32) -> RadixCore {
        let mut cache = RadixCore::new(&CacheConfig {
            page_size: PAGE_SIZE as u32,
            device_pages: POPULATED_PAGES + spare + 1,
            host_pages: 0,
            kv_events: false,
            page_hashes: false,
            policy: Default::default(),
            mamba: None,
            paged: None,
            lost_hits: false,
        });
        for seq in &self.seqs {
            admit_and_insert(&mut cache, seq);
        }
        if cfg!(debug_assertions) {
            let stats = cache.stats();
            assert_eq!(stats.nodes, PREFIXES + SEQUENCES);
            assert_eq!(stats.cached_pages[0], u64::from(POPULATED_PAGES));
            assert_eq!(stats.free_pages[0], spare);
            cache
                .check_invariants([&[], &[]])
                .expect("populated cache breaks an invariant");
        }
        cache
    }
}

/// What a scheduler does for a new request: commits the match, locks it, allocates the
/// rest and inserts the whole prompt.
fn admit_and_insert(cache: &mut RadixCore, tokens: &[Token]) {
    let m = cache.match_prefix(tokens);
    let lock = cache.lock(m.device, Tier::Device);
    let new = tokens.len() / PAGE_SIZE - m.device_pages as usize;
    let pages = cache
        .allocate(Tier::Device, new)
        .expect("device pool too small for the workload");
    cache
        .insert(Tier::Device, tokens, m.device_pages, pages)
        .expect("insert failed");
    cache.unlock(lock);
}

fn bench_probe(c: &mut Criterion) {
    let w = Workload::new();
    let cache = w.populated(0);
    let mut group = c.benchmark_group("probe_hit");
    let cases: [(u32, &[Vec<Token>]); 3] = [
        (PROMPT_PAGES as u32, &w.seqs[..PREFIXES]),
        (PREFIX_PAGES as u32, &w.prefix_only),
        (0, &w.misses),
    ];
    for (hit_pages, prompts) in cases {
        for prompt in prompts {
            assert_eq!(cache.probe(prompt).device_pages, hit_pages);
        }
        group.bench_function(BenchmarkId::from_parameter(hit_pages), |b| {
            let mut next = prompts.iter().cycle();
            b.iter(|| {
                let prompt = next.next().expect("cycle of a non-empty list");
                cache.probe(black_box(prompt))
            });
        });
    }
    group.finish();
}

fn bench_admit(c: &mut Criterion) {
    let w = Workload::new();
    let mut cache = w.populated(SPARE_PAGES);
    let mut group = c.benchmark_group("admit");
    for (name, prompts, hit_pages) in [
        ("hit", &w.prefix_only, PREFIX_PAGES as u32),
        ("miss", &w.misses, 0),
    ] {
        for prompt in prompts {
            assert_eq!(cache.probe(prompt).device_pages, hit_pages);
        }
        group.bench_function(name, |b| {
            let mut next = prompts.iter().cycle();
            b.iter(|| {
                let prompt = next.next().expect("cycle of a non-empty list");
                let m = cache.match_prefix(black_box(prompt));
                let lock = cache.lock(m.device, Tier::Device);
                let new = PROMPT_PAGES - m.device_pages as usize;
                let pages = cache
                    .allocate(Tier::Device, new)
                    .expect("spare pages cover one prompt");
                black_box((&m, &lock, &pages));
                cache.unlock(lock);
                cache
                    .free(Tier::Device, pages)
                    .expect("pages of this cache's pool");
            });
        });
    }
    group.finish();
    if cfg!(debug_assertions) {
        assert_eq!(cache.stats().free_pages[0], SPARE_PAGES);
        cache
            .check_invariants([&[], &[]])
            .expect("admit left the cache inconsistent");
    }
}

fn bench_insert(c: &mut Criterion) {
    let w = Workload::new();
    let mut group = c.benchmark_group("insert");
    rebuild_per_iteration(&mut group);
    // Both after prefix 100: an uncached 8-page suffix, and cached sequence 100.
    let new_seq = &w.prefix_only[100];
    let cached_seq = &w.seqs[100];
    for (name, seq, inserted) in [
        ("new", new_seq, SUFFIX_PAGES as u32),
        ("duplicate", cached_seq, 0),
    ] {
        group.bench_function(name, |b| {
            b.iter_batched(
                || {
                    let mut cache = w.populated(SPARE_PAGES);
                    let m = cache.match_prefix(&seq[..PREFIX_PAGES * PAGE_SIZE]);
                    assert_eq!(m.device_pages, PREFIX_PAGES as u32);
                    let lock = cache.lock(m.device, Tier::Device);
                    let pages = cache
                        .allocate(Tier::Device, SUFFIX_PAGES)
                        .expect("spare pages cover one suffix");
                    (cache, lock, pages)
                },
                |(mut cache, lock, pages)| {
                    let r = cache
                        .insert(Tier::Device, black_box(seq), PREFIX_PAGES as u32, pages)
                        .expect("insert failed");
                    debug_assert_eq!(r.inserted_pages, inserted);
                    // Returned so that dropping the cache stays out of the timing.
                    (cache, lock, r)
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

fn bench_evict(c: &mut Criterion) {
    let w = Workload::new();
    let mut group = c.benchmark_group("evict");
    rebuild_per_iteration(&mut group);
    for need in [1u32, 64, 1024] {
        group.bench_function(BenchmarkId::from_parameter(need), |b| {
            b.iter_batched(
                || w.populated(0),
                |mut cache| {
                    let ok = cache.ensure_free(Tier::Device, black_box(need));
                    debug_assert!(ok);
                    debug_assert_eq!(
                        cache.stats().free_pages[0],
                        need.next_multiple_of(SUFFIX_PAGES as u32)
                    );
                    // Returned so that dropping the cache stays out of the timing.
                    cache
                },
                BatchSize::PerIteration,
            );
        });
    }
    group.finish();
}

/// Groups whose setup rebuilds the populated tree (about 4 ms, untimed) for every
/// timed iteration of a few microseconds: few iterations fit in the measurement time, so
/// every sample runs the same number of them.
fn rebuild_per_iteration(group: &mut BenchmarkGroup<'_, WallTime>) {
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
}

/// Short runs: the whole suite stays under a minute on two cores.
fn config() -> Criterion {
    Criterion::default()
        .without_plots()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_probe, bench_admit, bench_insert, bench_evict
}
criterion_main!(benches);
