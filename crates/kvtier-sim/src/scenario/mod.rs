//! Scenario workloads (WORKLOADS.md §7) run through the scheduler with the reference
//! engine: every KV slot a row reads is checked, and the generated tokens depend on it.
//!
//! * `chat` (w = 4): multi-turn conversations; each turn's prompt is the history plus new
//!   user tokens, and the history grows by the engine's own answers. The device pool is
//!   smaller than the working set, so the host tier is exercised.
//! * `rollout` (w = 5): RL rollouts; each prompt is sampled G times, all G submitted in the
//!   same step. Mid-flight publication lets siblings reuse the first samples' prefix.
//! * `longdoc` (w = 6): long documents, each asked several questions one after another,
//!   round-robin over the documents, with device and host pools too small to keep more
//!   than about two documents: documents are written back, backed up to L3, evicted, and
//!   prefetched from L3 when their next question comes.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use kvtier::KvError;
use kvtier_device::{DeviceCore, DeviceError, KvGeometry, StateGeometry};
use kvtier_fsm::{BatchError, SchedError};
use kvtier_l3::{
    L3Backend, L3Core, L3Error, L3Faults, L3Key, LocalStore, LocalStoreConfig, MooncakeConfig,
    MooncakeStore, Namespace,
};
use kvtier_types::{GroupSpec, MambaSettings, PagedSettings, RequestId, RequestSpec, Token};
use serde::Serialize;

use crate::api::Path;
use crate::oracle::{IntegrityError, OracleEngine, Verify};
use crate::tokens::{gen_tokens, tag};
use crate::trace::TraceRequest;

/// The model a scenario serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Model {
    /// Full attention: KV only.
    #[default]
    Dense,
    /// Attention layers beside Mamba layers (Qwen3-Next, Nemotron-H style): KV and a
    /// recurrent state per request, checkpointed at page boundaries.
    MambaHybrid,
    /// Full-attention KV beside sliding-window layers (gpt-oss style): the window
    /// layers' KV in a sliding group of 128 tokens.
    SlidingWindow,
    /// DeepSeek-V4 style: a sliding window of 128 tokens, KV compressed by 4 and by 128
    /// and their compressor states, all in paged-cache groups.
    CompressedState,
}

impl Model {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Model::Dense => "dense",
            Model::MambaHybrid => "mamba-hybrid",
            Model::SlidingWindow => "sliding-window",
            Model::CompressedState => "compressed-state",
        }
    }

    /// A window or compressed-state model's groups, from the built-in presets it stands
    /// for (`gpt-oss-20b`, `deepseek-v4-flash`), pools unsized ([`scenario_groups`]
    /// sizes them per run).
    pub fn group_templates(self) -> Option<PagedSettings> {
        let preset = match self {
            Model::Dense | Model::MambaHybrid => return None,
            Model::SlidingWindow => "gpt-oss-20b",
            Model::CompressedState => "deepseek-v4-flash",
        };
        let spec = kvtier_model::ModelSpec::preset(preset);
        debug_assert!(spec.is_ok(), "a built-in preset: {spec:?}");
        spec.ok()?.paged_templates(SCENARIO_PAGE_SIZE)
    }
}

/// Sizes a paged model's group pools for a run: room for as many tokens as the device
/// KV pool holds (snapshots go with their node's device KV, so they never hold more),
/// plus, per running request, a chunk, its window and a page of slack each.
pub fn scenario_groups(
    templates: &PagedSettings,
    device_pages: u32,
    batch: u32,
    budget: u32,
) -> PagedSettings {
    let tokens = device_pages * SCENARIO_PAGE_SIZE;
    let groups = templates
        .groups
        .iter()
        .map(|g| {
            let window = g.pages_for(g.window().unwrap_or(0));
            let per_request = g.pages_for(budget) + window + 2;
            GroupSpec {
                total_pages: g.pages_for(tokens) + batch * per_request + 1,
                ..g.clone()
            }
        })
        .collect();
    PagedSettings {
        groups,
        required: templates.required.clone(),
    }
}

/// The recurrent state of the scenarios' hybrid model: 2 Mamba layers of 32 bytes.
pub const SCENARIO_STATE: StateGeometry = StateGeometry {
    layers: 2,
    bytes_per_layer: 32,
};

/// Tokens per KV page in every scenario.
pub const SCENARIO_PAGE_SIZE: u32 = 16;

/// The scan kernel's chunk of the scenarios' hybrid model.
pub const SCENARIO_STATE_CHUNK: u32 = 64;

/// Which scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Scenario {
    /// Multi-turn conversations under device pressure.
    Chat,
    /// Sibling samples of shared prompts.
    Rollout,
    /// Questions about long documents that leave device and host between questions.
    Longdoc,
    /// A production request trace ([`ScenarioOptions::trace`]; `kvtier replay --trace`).
    #[cfg_attr(feature = "clap", value(skip))]
    Trace,
}

impl Scenario {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Chat => "chat",
            Scenario::Rollout => "rollout",
            Scenario::Longdoc => "longdoc",
            Scenario::Trace => "trace",
        }
    }
}

/// The L3 store a scenario runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum L3Store {
    /// No L3 tier.
    Off,
    /// The embedded `LocalStore`, in a fresh directory (or `ScenarioOptions::l3_dir`).
    Local,
    /// A Mooncake cluster described by the environment (`cargo xtask mooncake run`).
    Mooncake,
}

impl L3Store {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            L3Store::Off => "off",
            L3Store::Local => "local",
            L3Store::Mooncake => "mooncake",
        }
    }
}

/// Faults injected at the L3 actor (on top of whatever the real store does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3Fault {
    /// None.
    None,
    /// Every `n`-th prefetch finds the store down: the get fails outright.
    FailEveryNthGet(u64),
    /// Every `n`-th prefetch finds the second half of its objects gone (evicted between
    /// the lookup and the get, as Mooncake does silently): they are removed from the
    /// store just before the get.
    LoseHalfOfEveryNthGet(u64),
    /// Every `n`-th prefetch of two or more objects finds its first key holding the
    /// bytes of its second (a store that maps a key to the wrong object, with its own
    /// checks passing): only the integrity oracle can catch it.
    ServeWrongObjectOnEveryNthGet(u64),
    /// Every `n`-th backup finds the store down: nothing is stored.
    FailEveryNthPut(u64),
    /// Every `n`-th backup stores the first half of its objects, then fails (the L3
    /// actor takes that half back: a backup is all or nothing).
    StoreHalfOfEveryNthPut(u64),
    /// Every `n`-th submit-time lookup finds the store down (no hits).
    FailEveryNthLookup(u64),
}

/// The error an injected outage gives.
fn store_down() -> L3Error {
    L3Error::Io {
        path: "injected".into(),
        source: std::io::Error::other("the L3 store is down"),
    }
}

/// The L3 fault hooks of a scenario run.
#[derive(Debug)]
struct ScenarioFaults {
    fault: L3Fault,
    gets: u64,
    puts: u64,
    lookups: u64,
    /// Bytes of one object (one page).
    page_bytes: usize,
}

impl L3Faults for ScenarioFaults {
    fn before_get(&mut self, keys: &[L3Key], backend: &mut dyn L3Backend) -> Result<(), L3Error> {
        self.gets += 1;
        match self.fault {
            L3Fault::FailEveryNthGet(n) if n > 0 && self.gets.is_multiple_of(n) => {
                Err(store_down())
            }
            L3Fault::LoseHalfOfEveryNthGet(n) if n > 0 && self.gets.is_multiple_of(n) => {
                backend.remove(&keys[keys.len() / 2..])?;
                Ok(())
            }
            L3Fault::ServeWrongObjectOnEveryNthGet(n)
                if n > 0 && self.gets.is_multiple_of(n) && keys.len() >= 2 =>
            {
                let mut other = vec![0u8; self.page_bytes];
                if backend.get(&keys[1..2], &mut [&mut other[..]])? == [true] {
                    backend.remove(&keys[..1])?;
                    backend.put(&keys[..1], &[&other[..]])?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn before_put(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        self.puts += 1;
        match self.fault {
            L3Fault::FailEveryNthPut(n) if n > 0 && self.puts.is_multiple_of(n) => {
                Err(store_down())
            }
            L3Fault::StoreHalfOfEveryNthPut(n) if n > 0 && self.puts.is_multiple_of(n) => {
                Ok(keys.len() / 2)
            }
            _ => Ok(keys.len()),
        }
    }

    fn before_exists(&mut self, _keys: &[L3Key]) -> Result<(), L3Error> {
        self.lookups += 1;
        match self.fault {
            L3Fault::FailEveryNthLookup(n) if n > 0 && self.lookups.is_multiple_of(n) => {
                Err(store_down())
            }
            _ => Ok(()),
        }
    }
}

/// The virtual clock: what one engine step costs. Defaults model a Llama-3-8B-class model
/// (bf16 KV, 128 KiB per token) on one modern GPU; every field can be changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Fixed cost of a step (launch, sampling), µs.
    pub step_us: f64,
    /// Prefill cost per computed prompt token, µs.
    pub prefill_us_per_token: f64,
    /// Decode cost per row, µs.
    pub decode_us_per_row: f64,
    /// KV bytes of one token across all layers of the modelled model.
    pub kv_bytes_per_token: f64,
    /// Host→device bandwidth, GB/s. Load-backs are on the critical path: the forward
    /// waits for them. Write-backs overlap with compute and cost nothing here.
    pub h2d_gbps: f64,
    /// L3→host bandwidth, GB/s. A prefetch holds its request back for its transfer
    /// time; backups overlap with compute and cost nothing here.
    pub l3_gbps: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            step_us: 4000.0,
            prefill_us_per_token: 40.0,
            decode_us_per_row: 60.0,
            kv_bytes_per_token: 131_072.0,
            h2d_gbps: 25.0,
            l3_gbps: 10.0,
        }
    }
}

/// The work of one step that the cost model prices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Prompt tokens computed.
    pub prefill_tokens: u64,
    /// Decode rows.
    pub decode_rows: u64,
    /// Tokens whose KV is loaded back from host to device.
    pub loaded_tokens: u64,
    /// Tokens whose KV is prefetched from L3 into host.
    pub prefetched_tokens: u64,
}

impl CostModel {
    /// Virtual µs of one step.
    pub fn step_cost(&self, work: StepWork) -> f64 {
        let transfer_us =
            |tokens: u64, gbps: f64| tokens as f64 * self.kv_bytes_per_token / (gbps * 1e3);
        self.step_us
            + work.prefill_tokens as f64 * self.prefill_us_per_token
            + work.decode_rows as f64 * self.decode_us_per_row
            + transfer_us(work.loaded_tokens, self.h2d_gbps)
            + transfer_us(work.prefetched_tokens, self.l3_gbps)
    }
}

/// Knobs of a scenario run.
#[derive(Debug, Clone, PartialEq)]
pub struct ScenarioOptions {
    /// Which scenario.
    pub scenario: Scenario,
    /// Where to keep the system's metrics text during the run (refreshed every
    /// [`METRICS_EVERY`] steps and at the end), for a `/metrics` endpoint.
    pub metrics: Option<MetricsSink>,
    /// Where to publish the system's KV events (vLLM's wire over ZeroMQ) as the run
    /// goes: every tier's, after each step, stamped with the virtual clock.
    pub kv_events: Option<KvEventsSink>,
    /// Traces: at the end, report how much of the first `residency` prompts each tier
    /// holds ([`ScenarioReport::residency`]), as a router's index should see it.
    pub residency: usize,
    /// Keep the counters every [`METRICS_EVERY`] steps ([`ScenarioReport::timeline`]).
    pub timeline: bool,
    /// The model served.
    pub model: Model,
    /// Prefix cache and host tier on (off: every request computes its whole prompt).
    pub cache: bool,
    /// Mid-flight prefix publication.
    pub publish: bool,
    /// How much KV the oracle checks.
    pub verify: Verify,
    /// Fault injection: fail every `n`-th write-back copy (0: none).
    pub fail_every_nth_write_back: u64,
    /// Fault injection: fail every `n`-th load-back copy, half copied (0: none).
    pub fail_every_nth_load_back: u64,
    /// The virtual clock's cost model.
    pub cost: CostModel,
    /// The path the run drives: the actor system by default (actix on this thread).
    pub path: Path,
    /// The L3 store (used only with the cache on): `Local` for `longdoc`, else `Off`.
    pub l3: L3Store,
    /// `Local`: the store's directory, kept after the run (default: a fresh directory,
    /// removed after the run).
    pub l3_dir: Option<PathBuf>,
    /// `Local`: bytes of the store's memory tier (the rest is read from disk).
    pub l3_memory_bytes: u64,
    /// Faults injected at the L3 actor.
    pub l3_fault: L3Fault,
    /// The model id in the L3 key namespace. The oracle engine's KV is a pure
    /// function of the tokens, so runs under one id share their objects (a second run
    /// over a kept store finds the first run's documents); tests against a long-lived
    /// Mooncake master give each run its own.
    pub l3_model: String,
    /// `Mooncake`: the cluster (default: the one the environment describes,
    /// `cargo xtask mooncake run`).
    pub mooncake: Option<MooncakeConfig>,
    /// The requests of [`Scenario::Trace`].
    pub trace: Option<Arc<TraceWorkload>>,
    /// Device pages (page 0 included) instead of the scenario's own.
    pub device_pages: Option<u32>,
    /// Host pages (page 0 included) instead of the scenario's own.
    pub host_pages: Option<u32>,
    /// A plain window model's mid-flight cap in pages (`SchedulerConfig::
    /// midflight_publish_max_pages`, from a model preset's gate).
    pub publish_cap: Option<u32>,
    /// What the report calls the model (a preset's name); default: the model kind's.
    pub model_label: Option<String>,
    /// The hybrid model's scan-kernel chunk (default: the scenarios' 64).
    pub state_chunk: Option<u32>,
    /// A window or compressed-state model's groups (pool sizes ignored: a run sizes
    /// them); default: the model kind's ([`Model::group_templates`]).
    pub groups: Option<PagedSettings>,
}

/// A trace to replay: its requests, and how much faster than real time they arrive.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceWorkload {
    /// What the report calls it (the file's name).
    pub name: String,
    /// The requests, in arrival order.
    pub requests: Vec<TraceRequest>,
    /// Arrival times are divided by this (1: real time).
    pub time_scale: f64,
}

impl ScenarioOptions {
    /// The default run of a scenario: cache on, publication on, full verification, and
    /// the embedded L3 store for `longdoc`.
    pub fn new(scenario: Scenario) -> Self {
        Self {
            scenario,
            model: Model::Dense,
            cache: true,
            publish: true,
            verify: Verify::Full,
            fail_every_nth_write_back: 0,
            fail_every_nth_load_back: 0,
            cost: CostModel::default(),
            path: Path::Actors,
            l3: if scenario == Scenario::Longdoc {
                L3Store::Local
            } else {
                L3Store::Off
            },
            l3_dir: None,
            l3_memory_bytes: 2 << 20,
            l3_fault: L3Fault::None,
            l3_model: "kvtier-reference".into(),
            mooncake: None,
            trace: None,
            device_pages: None,
            host_pages: None,
            publish_cap: None,
            model_label: None,
            state_chunk: None,
            groups: None,
            metrics: None,
            kv_events: None,
            residency: 0,
            timeline: false,
        }
    }

    /// The replay of a trace: cache on, the embedded L3 store, sparse verification
    /// (reading every history at every step of a production trace would take hours).
    pub fn trace(trace: TraceWorkload) -> Self {
        Self::shared_trace(Arc::new(trace))
    }

    /// [`Self::trace`] over a trace other runs share.
    pub fn shared_trace(trace: Arc<TraceWorkload>) -> Self {
        Self {
            verify: Verify::SPARSE,
            l3: L3Store::Local,
            l3_memory_bytes: 64 << 20,
            trace: Some(trace),
            ..Self::new(Scenario::Trace)
        }
    }

    /// Whether this run has an L3 tier.
    pub fn l3_on(&self) -> bool {
        self.cache && self.l3 != L3Store::Off
    }
}

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

/// KV geometry of the scenarios: small, so full verification stays cheap.
pub fn scenario_geometry(page_size: u32) -> KvGeometry {
    KvGeometry {
        layers: 2,
        planes: 2,
        heads: 1,
        head_dim: 4,
        dtype_bytes: 2,
        page_size,
    }
}

/// Rollout: prompts, and samples of each.
const PROMPTS: u64 = 2;
const SAMPLES: u64 = 8;
/// Longdoc: documents, their length, questions per document, question length, answer
/// length.
const DOCS: usize = 4;
const DOC_TOKENS: usize = 32_768;
const QUESTIONS: usize = 3;
const QUESTION_TOKENS: usize = 64;
const ANSWER_TOKENS: usize = 16;

/// A fresh directory under the temporary directory, removed when dropped (the default
/// home of a run's `LocalStore`).
pub(crate) fn scratch_dir(what: &str) -> Result<tempfile::TempDir, ScenarioError> {
    tempfile::Builder::new()
        .prefix(&format!("kvtier-{what}-"))
        .tempdir()
        .map_err(|e| ScenarioError::L3(format!("cannot make a temporary directory: {e}")))
}

/// The Mooncake cluster to use: the one given, else the one the environment describes
/// (`cargo xtask mooncake run`).
pub(crate) fn mooncake_cluster(
    given: Option<&MooncakeConfig>,
) -> Result<MooncakeConfig, ScenarioError> {
    given
        .cloned()
        .or_else(MooncakeConfig::from_env)
        .ok_or_else(|| {
            ScenarioError::L3(
                "no Mooncake cluster in the environment: run this under `cargo xtask \
                 mooncake run -- ...`"
                    .into(),
            )
        })
}

/// A device core over fresh arenas of the scenario geometry, with the oracle engine as
/// its model runner (pools include page 0).
pub fn reference_device(
    page_size: u32,
    device_pages: u32,
    host_pages: u32,
    verify: Verify,
) -> Result<DeviceCore, DeviceError> {
    hybrid_reference_device(page_size, device_pages, host_pages, verify, None, None)
}

/// [`reference_device`] for a hybrid model with these state pools, when `states` says
/// so, and for a paged model with these groups, when `groups` says so.
pub fn hybrid_reference_device(
    page_size: u32,
    device_pages: u32,
    host_pages: u32,
    verify: Verify,
    states: Option<MambaSettings>,
    groups: Option<&PagedSettings>,
) -> Result<DeviceCore, DeviceError> {
    let mut engine = OracleEngine::new(scenario_geometry(page_size), device_pages, verify)?;
    if let Some(m) = states {
        engine = engine.with_states(SCENARIO_STATE, m.chunk, m.device_slots, m.host_slots)?;
    }
    if let Some(p) = groups {
        engine = engine.with_groups(p.groups.clone());
    }
    engine.into_device(host_pages)
}

/// The L3 actor's core over `backend`, keyed under `model` (the oracle engine's KV
/// layout), moving pages of `arena`.
pub(crate) fn l3_core_over(
    backend: Box<dyn L3Backend>,
    model: &str,
    page_size: u32,
    arena: std::sync::Arc<kvtier_host::HostArena>,
) -> Result<L3Core, ScenarioError> {
    let namespace = Namespace::new(model, "u16", "page-first", page_size, 1, 0)?;
    Ok(L3Core::new(backend, namespace, page_size, arena)?)
}

/// The L3 actor's core for a run: the store the options name, over the device's host
/// arena (and host state arena, for a hybrid model). The scratch directory, if one was
/// made, must outlive the core.
fn l3_core(
    o: &ScenarioOptions,
    page_size: u32,
    arena: std::sync::Arc<kvtier_host::HostArena>,
    states: Option<std::sync::Arc<kvtier_host::HostArena>>,
    scratch: &mut Option<tempfile::TempDir>,
    shared: Option<Box<dyn L3Backend>>,
) -> Result<Option<L3Core>, ScenarioError> {
    if !o.l3_on() {
        return Ok(None);
    }
    let backend: Box<dyn L3Backend> = match (o.l3, shared) {
        (L3Store::Off, _) => return Ok(None),
        (_, Some(shared)) => shared,
        (L3Store::Local, None) => {
            let dir = match &o.l3_dir {
                Some(dir) => dir.clone(),
                None => scratch
                    .insert(scratch_dir(&format!("{}-l3", o.scenario.name()))?)
                    .path()
                    .to_path_buf(),
            };
            Box::new(LocalStore::open(LocalStoreConfig::new(
                dir,
                o.l3_memory_bytes,
                1 << 30,
            ))?)
        }
        (L3Store::Mooncake, None) => {
            let config = mooncake_cluster(o.mooncake.as_ref())?;
            let mut store = MooncakeStore::connect(&config)?;
            store.register_arena(&arena)?;
            if let Some(states) = &states {
                store.register_arena(states)?;
            }
            Box::new(store)
        }
    };
    let page_bytes = arena.page_bytes();
    let mut core = l3_core_over(backend, &o.l3_model, page_size, arena)?;
    if let Some(states) = states {
        core = core.with_states(states);
    }
    Ok(Some(core.with_faults(Box::new(ScenarioFaults {
        fault: o.l3_fault,
        gets: 0,
        puts: 0,
        lookups: 0,
        page_bytes,
    }))))
}

mod instance;
pub(crate) use instance::{Instance, Step};

struct Turn {
    conversation: usize,
    user: Vec<Token>,
}

/// Runs a scenario to completion.
pub fn run_scenario(o: &ScenarioOptions) -> Result<ScenarioReport, ScenarioError> {
    run_scenario_with_progress(o, |_, _| {})
}

/// Steps between refreshes of a run's metrics text.
pub const METRICS_EVERY: u64 = 64;

pub use kvtier::metrics::MetricsServer;

/// Something told the system's stats at every refresh, with the virtual clock (s).
pub type StatsObserver = Arc<dyn Fn(f64, &kvtier::SystemStats) + Send + Sync>;

/// What a run does with its system's stats every [`METRICS_EVERY`] steps and at the end:
/// keeps them as Prometheus text, and tells each observer (an OpenTelemetry export,
/// say). Options compare it by identity.
#[derive(Clone, Default)]
pub struct MetricsSink {
    /// The latest Prometheus text.
    pub text: kvtier::metrics::MetricsText,
    /// Told the stats after the text is written.
    pub observers: Vec<StatsObserver>,
}

impl std::fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSink")
            .field("observers", &self.observers.len())
            .finish_non_exhaustive()
    }
}

impl PartialEq for MetricsSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }
}

impl Eq for MetricsSink {}

impl MetricsSink {
    /// Also exports the stats as OpenTelemetry metrics through `telemetry`'s meter.
    pub fn exporting(mut self, telemetry: &kvtier::telemetry::Telemetry) -> Self {
        let export = std::sync::Mutex::new(kvtier::telemetry::MetricsExport::new(telemetry));
        self.observers.push(Arc::new(move |_, stats| {
            if let Ok(mut export) = export.lock() {
                export.update(stats);
            }
        }));
        self
    }
}

/// The run's counters at one moment of the virtual clock (`--report`'s plots).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// The virtual clock, s.
    pub virtual_s: f64,
    /// Prompt tokens queried so far (each request's at its first chunk).
    pub queried_tokens: u64,
    /// Of those, the tokens each tier supplied: device, host, L3.
    pub hit_tokens: [u64; 3],
    /// Pages the prefix cache holds: device, host.
    pub cached_pages: [u64; 2],
    /// Free pages: device, host.
    pub free_pages: [u64; 2],
    /// Requests running and waiting.
    pub requests: [u64; 2],
    /// Bytes prefetched from and backed up to L3 so far.
    pub l3_prefetched_bytes: u64,
    /// Bytes backed up to L3 so far.
    pub l3_backed_up_bytes: u64,
}

impl TimelinePoint {
    fn of(virtual_s: f64, stats: &kvtier::SystemStats) -> Self {
        let s = &stats.scheduler;
        Self {
            virtual_s,
            queried_tokens: s.prompt_query_tokens,
            hit_tokens: [
                s.hit_tokens.saturating_sub(s.hit_tokens_host),
                s.hit_tokens_host.saturating_sub(s.hit_tokens_l3),
                s.hit_tokens_l3,
            ],
            cached_pages: [s.cached_device_pages, s.cached_host_pages],
            free_pages: [
                u64::from(s.available_device_pages),
                u64::from(s.available_host_pages),
            ],
            requests: [
                (s.prefilling + s.decoding) as u64,
                (s.waiting + s.looking_up + s.retracted) as u64,
            ],
            l3_prefetched_bytes: stats.l3.map_or(0, |l3| l3.prefetched_bytes),
            l3_backed_up_bytes: stats.l3.map_or(0, |l3| l3.backed_up_bytes),
        }
    }
}

/// Where a run publishes its KV events (options compare it by identity).
#[derive(Debug, Clone)]
pub struct KvEventsSink(pub Arc<kvtier::kv_publisher::KvEventPublisher>);

impl PartialEq for KvEventsSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for KvEventsSink {}

/// Publishes the KV events of the system since the last call as one batch stamped
/// `now_us` on the virtual clock.
fn publish_kv_events(
    s: &mut kvtier::LocalSystem,
    sink: &KvEventsSink,
    now_us: f64,
) -> Result<(), ScenarioError> {
    let events = s.take_kv_events()?;
    sink.publish(now_us / 1e6, &events);
    Ok(())
}

impl KvEventsSink {
    /// Publishes `events` as one batch stamped `ts` (nothing when there are none).
    pub fn publish(&self, ts: f64, events: &[kvtier_types::KvEvent]) {
        if !events.is_empty() {
            let wired: Vec<_> = events
                .iter()
                .map(kvtier::vllm_events::WireEvent::Cache)
                .collect();
            self.0.publish(ts, &wired);
        }
    }
}

/// Each of `requests`' prompts' cached prefix per tier now: the radix cache's probe
/// (read-only) and, with an L3 store, its lookup.
fn prefix_residency(
    s: &mut kvtier::LocalSystem,
    requests: &[crate::trace::TraceRequest],
) -> Result<Vec<PrefixResidency>, ScenarioError> {
    let prompts: Vec<Arc<Vec<Token>>> = requests.iter().map(|q| Arc::new(q.prompt())).collect();
    let stored =
        match s.ask::<kvtier_l3::L3Core>(kvtier_l3::L3Msg::L3Lookup(kvtier_types::LookupAsk {
            ticket: 0,
            prompts: prompts.clone(),
        })) {
            Ok(kvtier_l3::L3Reply::L3LookedUp { hit_pages, .. }) => hit_pages,
            Ok(_) | Err(KvError::NoActor(_)) => vec![0; prompts.len()],
            Err(e) => return Err(e.into()),
        };
    let page = u64::from(SCENARIO_PAGE_SIZE);
    let mut out = Vec::with_capacity(prompts.len());
    for ((request, prompt), stored) in requests.iter().zip(prompts).zip(stored) {
        let probe = match s
            .ask::<kvtier_radix::RadixCore>(kvtier_radix::RadixMsg::Probe(prompt.to_vec()))?
        {
            kvtier_radix::RadixReply::Probed(probe) => probe,
            _ => kvtier_radix::Probe::default(),
        };
        out.push(PrefixResidency {
            request_id: format!("t{:06}", request.line),
            token_ids: prompt.to_vec(),
            device_tokens: u64::from(probe.device_pages) * page,
            host_tokens: u64::from(probe.host_pages) * page,
            storage_tokens: u64::from(stored) * page,
        });
    }
    Ok(out)
}

/// Reads the system's stats at `now_us` on the virtual clock into `metrics` (its text
/// and observers) and, when one is kept, the timeline.
pub(crate) fn refresh_metrics(
    s: &mut kvtier::LocalSystem,
    metrics: Option<&MetricsSink>,
    timeline: Option<&mut Vec<TimelinePoint>>,
    now_us: f64,
) -> Result<(), ScenarioError> {
    let stats = s.stats()?;
    if let Some(metrics) = metrics {
        let text = kvtier::metrics::prometheus_text(&stats);
        if let Ok(mut shared) = metrics.text.lock() {
            *shared = text;
        }
        for observer in &metrics.observers {
            observer(now_us / 1e6, &stats);
        }
    }
    if let Some(timeline) = timeline {
        timeline.push(TimelinePoint::of(now_us / 1e6, &stats));
    }
    Ok(())
}

/// Runs a scenario to completion, reporting (requests finished, requests in all) after
/// every step.
pub fn run_scenario_with_progress(
    o: &ScenarioOptions,
    progress: impl FnMut(u64, u64),
) -> Result<ScenarioReport, ScenarioError> {
    run_scenario_with(o, progress, |_| {})
}

/// Runs a scenario to completion, reporting progress after every step and calling
/// `between_steps(step)` once a step's events are applied (tests inject faults there,
/// such as corrupting the L3 store's files).
pub fn run_scenario_with(
    o: &ScenarioOptions,
    mut progress: impl FnMut(u64, u64),
    mut between_steps: impl FnMut(u64),
) -> Result<ScenarioReport, ScenarioError> {
    let trace = match (o.scenario, &o.trace) {
        (Scenario::Trace, Some(trace)) => Some(Arc::clone(trace)),
        (Scenario::Trace, None) => return Err(ScenarioError::NoTrace),
        _ => None,
    };
    let mut instance = Instance::start(o, trace.as_ref(), None)?;
    // Chat state: per conversation, history, next turn, whether a turn is live.
    const CONVERSATIONS: usize = 16;
    const TURNS: usize = 4;
    let mut history: Vec<Vec<Token>> = vec![Vec::new(); CONVERSATIONS];
    let mut next_turn = [0usize; CONVERSATIONS];
    let mut live: BTreeMap<RequestId, Turn> = BTreeMap::new();
    let mut pending_rollout = true;
    // Longdoc: the next question in round-robin order (document, then question).
    let mut next_question = 0usize;
    let documents: Vec<Vec<Token>> = match o.scenario {
        Scenario::Longdoc => (0..DOCS)
            .map(|d| gen_tokens(tag(6, 1, d as u64), DOC_TOKENS))
            .collect(),
        _ => Vec::new(),
    };
    // Trace: the next request to arrive.
    let mut next_arrival = 0usize;
    let total = match o.scenario {
        Scenario::Chat => (CONVERSATIONS * TURNS) as u64,
        Scenario::Rollout => PROMPTS * SAMPLES,
        Scenario::Longdoc => (DOCS * QUESTIONS) as u64,
        Scenario::Trace => trace.as_ref().map_or(0, |t| t.requests.len() as u64),
    };
    loop {
        // Arrivals.
        let now = instance.now();
        let mut batch_specs: Vec<(RequestSpec, usize)> = Vec::new();
        match o.scenario {
            Scenario::Chat => {
                for c in 0..CONVERSATIONS {
                    let busy = live.values().any(|t| t.conversation == c);
                    if busy || next_turn[c] >= TURNS {
                        continue;
                    }
                    let t = next_turn[c];
                    let user = gen_tokens(tag(4, 1, (c * TURNS + t) as u64), 96);
                    let mut prompt = history[c].clone();
                    prompt.extend_from_slice(&user);
                    let id = RequestId::from(format!("c{c:02}t{}", t + 1));
                    live.insert(
                        id.clone(),
                        Turn {
                            conversation: c,
                            user,
                        },
                    );
                    batch_specs.push((RequestSpec::new(id, prompt), 32));
                    next_turn[c] += 1;
                }
            }
            Scenario::Longdoc => {
                // One question at a time: the next comes once every earlier one is
                // answered (or aborted).
                let r = instance.report();
                let settled = instance.outputs().len() as u64 + r.aborted == r.requests;
                if settled && next_question < DOCS * QUESTIONS {
                    let (d, q) = (next_question % DOCS, next_question / DOCS);
                    let question =
                        gen_tokens(tag(6, 2, (d * QUESTIONS + q) as u64), QUESTION_TOKENS);
                    let mut prompt = documents[d].clone();
                    prompt.extend_from_slice(&question);
                    let id = RequestId::from(format!("d{d}q{q}"));
                    batch_specs.push((RequestSpec::new(id, prompt), ANSWER_TOKENS));
                    next_question += 1;
                }
            }
            Scenario::Trace => {
                let requests = trace.as_ref().map_or(&[][..], |t| &t.requests[..]);
                let scale = trace.as_ref().map_or(1.0, |t| t.time_scale);
                while let Some(request) = requests.get(next_arrival)
                    && request.arrival_us(scale) <= now
                {
                    batch_specs.push(request.spec());
                    next_arrival += 1;
                }
            }
            Scenario::Rollout => {
                if pending_rollout {
                    for p in 0..PROMPTS {
                        let prompt = gen_tokens(tag(5, 1, p), 2048);
                        for g in 0..SAMPLES {
                            let id = RequestId::from(format!("p{p}g{g}"));
                            batch_specs.push((RequestSpec::new(id, prompt.clone()), 256));
                        }
                    }
                    pending_rollout = false;
                }
            }
        }
        instance.submit(batch_specs)?;
        let aborted = match instance.step(&mut between_steps)? {
            Step::Ran { aborted } => aborted,
            // Idle until the trace's next arrival, if one is to come.
            Step::Idle => match trace
                .as_ref()
                .and_then(|t| t.requests.get(next_arrival).map(|q| (t, q)))
            {
                Some((t, next)) => {
                    instance.wait_until(next.arrival_us(t.time_scale));
                    continue;
                }
                None => break,
            },
        };
        for id in aborted {
            if let Some(turn) = live.remove(&id) {
                history[turn.conversation].extend_from_slice(&turn.user);
            }
        }
        let outputs = instance.outputs();
        progress(outputs.len() as u64 + instance.report().aborted, total);
        // Finished turns extend their conversation with the engine's own answer.
        let done: Vec<RequestId> = live
            .keys()
            .filter(|id| outputs.contains_key(*id))
            .cloned()
            .collect();
        for id in done {
            if let Some(turn) = live.remove(&id) {
                let h = &mut history[turn.conversation];
                h.extend_from_slice(&turn.user);
                h.extend_from_slice(&outputs[&id]);
            }
        }
    }
    let residency = trace.as_ref().map_or(&[][..], |t| {
        &t.requests[..o.residency.min(t.requests.len())]
    });
    instance.finish(residency)
}

/// FNV-1a 64 over each request's id (length, bytes) and its tokens (count, each as a
/// little-endian i64), in id order.
pub fn output_digest(outputs: &BTreeMap<RequestId, Vec<Token>>) -> String {
    let mut h = crate::digest::Fnv::new();
    for (id, tokens) in outputs {
        h.s(id.as_str());
        h.i(tokens.len() as i64);
        for &t in tokens {
            h.i(i64::from(t));
        }
    }
    format!("{:016x}", h.0)
}

/// The `p`-th percentile of sorted values (nearest rank).
pub(crate) fn percentile(sorted: &[f64], p: usize) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}
