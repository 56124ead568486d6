//! What a scenario runs: its options and a trace's workload.

use std::path::PathBuf;
use std::sync::Arc;

use kvtier_l3::MooncakeConfig;
use kvtier_model::ModelKind;
use kvtier_types::PagedSettings;

use super::*;
use crate::api::Path;
use crate::oracle::Verify;
use crate::trace::TraceRequest;

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
    pub model: ModelKind,
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
    /// them); default: the model kind's ([`ModelKind::group_templates`]).
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
            model: ModelKind::Dense,
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
