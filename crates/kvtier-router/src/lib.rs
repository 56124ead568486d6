//! A KV-aware router for many kvtier instances (or any engines that publish vLLM's KV
//! events): it places each request on the instance that holds the longest prefix of its
//! prompt, from an index fed only by the instances' KV events, as Dynamo's and llm-d's
//! routers do.
//!
//! * [`wire`]: reading vLLM's `KVEventBatch` (msgpack);
//! * [`index`]: which instance holds which block, on which medium;
//! * [`policy`]: round-robin, least-loaded and prefix routing;
//! * [`feed`]: the events over ZeroMQ (SUB, and replay for what a late subscriber
//!   missed), held back until the virtual clock passes them.
//!
//! `kvtier replay --instances N --router prefix` drives it (docs/cluster.md).

pub mod feed;
pub mod index;
pub mod policy;
pub mod wire;

pub use feed::{Feed, FeedStats};
pub use index::{KvIndex, MAX_WORKERS};
pub use policy::{Decision, Policy, Router};
pub use wire::{Batch, Event, Medium, decode_batch};

/// What the router refuses or cannot do.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("a router serves 1 to {MAX_WORKERS} instances, not {0}")]
    Workers(usize),
    #[error("page size 0")]
    PageSize,
    #[error("{got} loads for {workers} instances")]
    Loads { got: usize, workers: usize },
    #[error("unknown routing policy {0:?} (round-robin, least-loaded or prefix)")]
    Policy(String),
    #[error("KV event wire: {0}")]
    Wire(String),
    #[error("ZeroMQ: {0}")]
    Zmq(String),
    #[error("endpoint {0} is not on loopback")]
    NotLoopback(String),
    #[error("instance {worker}'s events stopped at batch {next} of {target}")]
    Behind {
        worker: usize,
        next: u64,
        target: u64,
    },
}
