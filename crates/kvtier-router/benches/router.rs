//! Criterion benchmarks of the router's per-request and per-event costs, the inputs of
//! the 64-instance projection in docs/cluster.md.
//!
//! Workload (deterministic): 64 instances, pages of 16 tokens. The index holds 4,096
//! conversations of 512 blocks (8,192-token prompts, the conversation trace's mean is
//! about 12,000), each cached on one instance's device and another's host, 2.1 M blocks
//! in all.
//!
//! * `route/prefix/{hit,miss}`: hashing an 8,192-token prompt into its 512 block hashes,
//!   matching it against the index, and choosing, for a prompt cached to its end or not
//!   at all;
//! * `route/round-robin`: the same prompt hashed and matched (the report still counts
//!   what the index showed), without the prefix choice;
//! * `apply/stored-32`: indexing one `BlockStored` event of 32 blocks (a step's worth of
//!   one request's new pages);
//! * `decode/batch-32`: reading one KV event batch of 32 blocks off vLLM's wire.
//!
//! The index's memory per block is printed after the runs. `cargo test --benches` runs
//! each benchmark once in a debug build.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group};
use kvtier::vllm_events::{WireEvent, encode_batch};
use kvtier_router::{Event, KvIndex, Medium, Policy, Router, decode_batch};
use kvtier_types::{KvEvent, Token};

const WORKERS: usize = 64;
const PAGE: usize = 16;
const CONVERSATIONS: u64 = 4096;
const PROMPT_TOKENS: usize = 8192;

/// The prompt of conversation `c`: its own tokens, a xorshift stream.
fn prompt(c: u64) -> Vec<Token> {
    let mut x = c.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..PROMPT_TOKENS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 32_000) as Token + 1
        })
        .collect()
}

/// A router whose index holds every conversation on two instances.
fn populated(policy: Policy) -> Router {
    let mut router = Router::new(policy, WORKERS, PAGE, false).expect("a valid router");
    for c in 0..CONVERSATIONS {
        let hashes = router.block_hashes(&prompt(c));
        let w = (c as usize) % WORKERS;
        router.index_mut().apply(
            w,
            &Event::Stored {
                hashes: hashes.clone(),
                medium: Medium::Gpu,
            },
        );
        router.index_mut().apply(
            (w + 1) % WORKERS,
            &Event::Stored {
                hashes,
                medium: Medium::Cpu,
            },
        );
    }
    router
}

fn benches(c: &mut Criterion) {
    let loads = vec![8u64; WORKERS];
    let hit = prompt(17);
    let miss = prompt(CONVERSATIONS + 1);
    let mut prefix = populated(Policy::Prefix);
    let decision = prefix.route(&hit, &loads).expect("route");
    assert_eq!(decision.predicted_blocks as usize, PROMPT_TOKENS / PAGE);
    let mut group = c.benchmark_group("route");
    group.bench_function("prefix/hit", |b| {
        b.iter(|| prefix.route(black_box(&hit), &loads).expect("route"))
    });
    group.bench_function("prefix/miss", |b| {
        b.iter(|| prefix.route(black_box(&miss), &loads).expect("route"))
    });
    let mut rr = populated(Policy::RoundRobin);
    group.bench_function("round-robin", |b| {
        b.iter(|| rr.route(black_box(&hit), &loads).expect("route"))
    });
    group.finish();

    let fresh: Vec<u64> = (0..32u64).map(|i| 0xdead_0000 + i).collect();
    c.bench_function("apply/stored-32", |b| {
        b.iter_batched(
            || Event::Stored {
                hashes: fresh.clone(),
                medium: Medium::Gpu,
            },
            |event| prefix.index_mut().apply(3, black_box(&event)),
            BatchSize::SmallInput,
        )
    });

    let stored = KvEvent::BlockStored {
        block_hashes: fresh.clone(),
        parent_block_hash: Some(1),
        token_ids: vec![7; 32 * PAGE],
        block_size: PAGE as u32,
        medium: kvtier_types::Medium::Device,
    };
    let bytes = encode_batch(1.0, &[WireEvent::Cache(&stored)], Some(0));
    c.bench_function("decode/batch-32", |b| {
        b.iter(|| decode_batch(black_box(&bytes)).expect("a valid batch"))
    });

    let index: &KvIndex = prefix.index();
    eprintln!(
        "index: {} blocks on {} instances, {:.1} MiB, {:.1} bytes per block; one 32-block batch is {} wire bytes",
        index.len(),
        WORKERS,
        index.memory_bytes() as f64 / (1 << 20) as f64,
        index.memory_bytes() as f64 / index.len() as f64,
        bytes.len()
    );
}

criterion_group!(router, benches);

fn main() {
    router();
    Criterion::default().configure_from_args().final_summary();
}
