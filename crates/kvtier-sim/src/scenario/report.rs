//! What a scenario reports, and how it fails.

use std::collections::BTreeMap;

use kvtier::KvError;
use kvtier_device::DeviceError;
use kvtier_fsm::{BatchError, SchedError};
use kvtier_l3::L3Error;
use kvtier_types::{RequestId, Token};
use serde::Serialize;

use super::*;
use crate::oracle::IntegrityError;

/// The result of a scenario run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScenarioReport {
    /// Scenario name.
    pub workload: String,
    /// Prefix cache and host tier on.
    pub cache: bool,
    /// Requests submitted.
    pub requests: u64,
    /// Requests finished.
    pub finished: u64,
    /// Requests the scheduler aborted.
    pub aborted: u64,
    /// Plans built.
    pub steps: u64,
    /// Prompt tokens submitted.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// Prompt tokens served from the cache (first chunks).
    pub hit_tokens: u64,
    /// Of those, loaded back from host.
    pub hit_tokens_host: u64,
    /// The best any prefix cache could have reused: full prompt pages already computed
    /// by some request in an earlier step, in tokens.
    pub ideal_hit_tokens: u64,
    /// Write-backs: ops, pages, bytes.
    pub writeback_ops: u64,
    /// Write-back pages.
    pub writeback_pages: u64,
    /// Load-backs: ops.
    pub loadback_ops: u64,
    /// Load-back pages.
    pub loadback_pages: u64,
    /// Bytes moved by write-backs and load-backs.
    pub moved_bytes: u64,
    /// Retractions.
    pub retractions: u64,
    /// Write-back copies that failed (fault injection).
    pub failed_write_backs: u64,
    /// Load-back copies that failed (fault injection).
    pub failed_load_backs: u64,
    /// Rows the engine skipped because they read a failed load-back.
    pub void_rows: u64,
    /// The L3 store: `off`, `local` or `mooncake`.
    pub l3: String,
    /// Prompt tokens served from pages prefetched from L3 (part of `hit_tokens_host`:
    /// they reach the device by load-back).
    pub hit_tokens_l3: u64,
    /// The scheduler's own hit counters at the end (`SchedulerStats`: all, from host,
    /// from L3), which must equal the three above that the replay counts from the plans.
    pub scheduler_hit_tokens: [u64; 3],
    /// Pages the submit-time L3 lookups found.
    pub l3_lookup_hit_pages: u64,
    /// Prefetch ops (L3 → host).
    pub l3_prefetch_ops: u64,
    /// Pages prefetched whole.
    pub l3_prefetched_pages: u64,
    /// Bytes prefetched.
    pub l3_prefetched_bytes: u64,
    /// Prefetches that failed outright (a miss: the request computed its pages).
    pub l3_failed_prefetches: u64,
    /// Submit-time lookups whose existence query failed (counted as no hits).
    pub l3_lookup_errors: u64,
    /// Backups that failed (none of their objects is kept).
    pub l3_failed_backups: u64,
    /// Backup ops (host → L3).
    pub l3_backup_ops: u64,
    /// Pages stored by backups.
    pub l3_backed_up_pages: u64,
    /// Bytes stored by backups.
    pub l3_backed_up_bytes: u64,
    /// Recurrent states stored beside the pages (hybrid model).
    pub l3_backed_up_states: u64,
    /// Recurrent states prefetched with their pages (hybrid model).
    pub l3_prefetched_states: u64,
    /// Objects the store found corrupt and dropped (read as misses).
    pub l3_corrupt_objects: u64,
    /// Integrity errors found by the oracle.
    pub integrity_errors: u64,
    /// The model served (`dense`, `mamba-hybrid`, or a preset's name).
    pub model: String,
    /// Whether the model keeps recurrent states (a Mamba hybrid).
    pub hybrid: bool,
    /// FNV-1a over every finished request's id and generated tokens, in id order: two
    /// runs answered alike exactly when these are equal.
    pub output_digest: String,
    /// Scheduler time (submit, plan, advance), ns.
    pub scheduler_ns: u64,
    /// Virtual time of the whole run, s.
    pub virtual_s: f64,
    /// Time to first token, mean and median, ms (virtual clock).
    pub ttft_mean_ms: f64,
    /// Median time to first token, ms.
    pub ttft_p50_ms: f64,
    /// Device pages evicted from the prefix cache.
    pub evicted_device_pages: u64,
    /// Host pages evicted from the prefix cache.
    pub evicted_host_pages: u64,
    /// Requests refused at submit (traces only: a prompt no pool of this size takes).
    pub refused: u64,
    /// Requests the scheduler gave up on or refused, by reason.
    pub abort_reasons: BTreeMap<String, u64>,
    /// 90th percentile of the TTFT, ms.
    pub ttft_p90_ms: f64,
    /// 99th percentile of the TTFT, ms.
    pub ttft_p99_ms: f64,
    /// 50th and 99th percentiles of the time per output token, ms.
    pub tpot_p50_ms: f64,
    /// 99th percentile of the time per output token, ms.
    pub tpot_p99_ms: f64,
    /// Traces: the hit tokens of an unbounded cache over the prompts in arrival order,
    /// whatever the timing (`trace::unbounded_hit_tokens`); 0 for the other scenarios.
    pub unbounded_hit_tokens: u64,
    /// Time per output token after the first, mean over requests, ms.
    pub tpot_mean_ms: f64,
    /// Generated tokens per virtual second.
    pub throughput_tokens_per_s: f64,
    /// Generated tokens per request (not serialized).
    #[serde(skip)]
    pub outputs: BTreeMap<RequestId, Vec<Token>>,
    /// The first integrity errors (not serialized).
    #[serde(skip)]
    pub first_errors: Vec<IntegrityError>,
    /// Traces with `ScenarioOptions::residency`: each probed prompt's cached prefix per
    /// tier at the end of the run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub residency: Vec<PrefixResidency>,
    /// Whether the run said why hits were lost (`SchedulerConfig::track_lost_hits`; on
    /// when the run is watched: metrics, KV events or a report).
    pub lost_hits_tracked: bool,
    /// Then: prompt tokens computed again although cached once, by
    /// `kvtier_fsm::LOST_HIT_REASONS`.
    pub lost_hit_tokens: [u64; 4],
    /// With `ScenarioOptions::timeline`: the counters every [`METRICS_EVERY`] steps and
    /// at the end.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelinePoint>,
    /// Each finished request's time to first token on the virtual clock, ms (not
    /// serialized).
    #[serde(skip)]
    pub ttft_ms: Vec<f64>,
}

/// How much of one prompt's prefix each tier holds: the leading tokens (whole pages)
/// on device, readable on host, and stored in L3, each counted from the prompt's start.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PrefixResidency {
    /// The trace request the prompt is of.
    pub request_id: String,
    /// The prompt.
    pub token_ids: Vec<Token>,
    /// Leading tokens on device.
    pub device_tokens: u64,
    /// Leading tokens readable on host.
    pub host_tokens: u64,
    /// Leading tokens stored in L3 (0 without one).
    pub storage_tokens: u64,
}

/// Why a scenario run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The scheduler refused the config.
    #[error(transparent)]
    Config(#[from] SchedError),
    /// The scheduler refused a submit or an event.
    #[error(transparent)]
    Refused(#[from] BatchError),
    /// The arenas refused an operation.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// The actor system failed.
    #[error(transparent)]
    System(KvError),
    /// The run stopped making progress.
    #[error("scenario stalled after {0} steps")]
    Stalled(u64),
    /// `Scenario::Trace` without a trace.
    #[error("a trace replay needs a trace (`ScenarioOptions::trace`)")]
    NoTrace,
    /// The L3 store could not be set up.
    #[error("L3 store: {0}")]
    L3(String),
    /// A cluster's router failed (its events stopped coming, say).
    #[error("router: {0}")]
    Router(String),
    /// A cluster member in a process of its own failed or broke the protocol.
    #[error("cluster member: {0}")]
    Member(String),
}

impl From<L3Error> for ScenarioError {
    fn from(e: L3Error) -> Self {
        ScenarioError::L3(e.to_string())
    }
}

impl From<KvError> for ScenarioError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Batch(e) => ScenarioError::Refused(e),
            KvError::Sched(e) => ScenarioError::Config(e),
            KvError::Device(e) => ScenarioError::Device(e),
            other => ScenarioError::System(other),
        }
    }
}
