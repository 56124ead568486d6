//! Many kvtier instances replaying one trace together on one virtual clock, behind a
//! router, with or without one L3 store shared by all (docs/cluster.md).
//!
//! Each instance is a complete system (its actors, device and host tiers, L3 core and
//! oracle engine) stepped on its own clock; the cluster is a discrete-event loop that
//! always does the earliest thing next: route the next arrival, or step the instance
//! whose clock is behind (ties to the lower index). An instance with nothing to do
//! waits for its next request.
//!
//! The router knows the instances only through their KV events: every instance
//! publishes them (vLLM's wire over ZeroMQ on loopback) after each step, stamped with
//! the step's end, and the router's [`kvtier_router::Feed`] applies a batch only once
//! the clock has passed it. Its view therefore lags by the steps still running. The
//! report counts how often what the index promised was not what the instance reused.

pub mod member;
mod sweep;

pub use member::{Member, Remote, serve};
pub use sweep::{ClusterPoint, ClusterSweep, ClusterSweepOptions, run_cluster_sweep};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use kvtier::kv_publisher::{KvEventPublisher, PublisherConfig};
use kvtier_l3::{L3Backend, LocalStore, LocalStoreConfig, MooncakeConfig, SharedStore};
use kvtier_router::{Feed, Policy, Router, RouterError};
use kvtier_types::RequestId;
use serde::Serialize;

use member::Local;

use crate::api::Path;
use crate::scenario::{
    Instance, KvEventsSink, L3Store, SCENARIO_PAGE_SIZE, ScenarioError, ScenarioOptions,
    ScenarioReport, percentile, scratch_dir,
};
use crate::trace::unbounded_hit_tokens;

/// The segment each instance's Mooncake client contributes, at least.
pub const MOONCAKE_SEGMENT_BYTES: u64 = 256 << 20;

/// Batches each instance's publisher keeps for replay.
const REPLAY_BATCHES: usize = 4096;

/// How the instances' L3 tier is arranged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum L3Scope {
    /// No L3 tier: each instance has its device and host tiers only.
    Off,
    /// An L3 store per instance (a Mooncake namespace per instance).
    Private,
    /// One store for all: the embedded store behind a lock, or every instance a client
    /// of one Mooncake master under one namespace.
    Shared,
}

impl L3Scope {
    pub fn name(self) -> &'static str {
        match self {
            L3Scope::Off => "off",
            L3Scope::Private => "private",
            L3Scope::Shared => "shared",
        }
    }
}

/// Knobs of a cluster replay.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Each instance's run: a trace replay ([`ScenarioOptions::trace`]); its L3 store
    /// kind (`Local` or `Mooncake`) is the one used, its `kv_events` is ignored (each
    /// instance gets a publisher of its own).
    pub base: ScenarioOptions,
    pub instances: usize,
    pub policy: Policy,
    pub l3: L3Scope,
    /// Extra delay (µs of virtual time) before the router sees an event.
    pub router_lag_us: f64,
    /// `Prefix`: how many requests busier than the least-loaded instance it still
    /// sends work to.
    pub max_imbalance: u64,
}

impl ClusterOptions {
    /// `instances` instances replaying `base`'s trace behind `policy`, with `l3`.
    pub fn new(base: ScenarioOptions, instances: usize, policy: Policy, l3: L3Scope) -> Self {
        Self {
            base,
            instances,
            policy,
            l3,
            router_lag_us: 0.0,
            max_imbalance: 64,
        }
    }
}

/// What the router did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RouterReport {
    pub policy: String,
    /// Requests placed on each instance.
    pub routed: Vec<u64>,
    /// Requests that reused less than the index showed on their instance (the view was
    /// stale: the blocks were evicted, or are still being written), and more.
    pub overestimated: u64,
    pub underestimated: u64,
    /// Tokens the index showed on the chosen instances, and the tokens they reused.
    pub predicted_hit_tokens: u64,
    /// Event batches and events received, replays asked for, wire bytes.
    pub batches: u64,
    pub events: u64,
    pub replays: u64,
    pub wire_bytes: u64,
    /// Blocks indexed at the end, the most at once, and the index's memory then.
    pub index_blocks: u64,
    pub index_peak_blocks: u64,
    pub index_peak_bytes: u64,
    /// Wall time spent routing (receiving events, indexing, deciding).
    pub route_ns: u64,
}

/// The result of a cluster replay.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClusterReport {
    pub workload: String,
    pub instances: usize,
    pub l3: String,
    pub requests: u64,
    pub finished: u64,
    pub aborted: u64,
    pub refused: u64,
    pub prompt_tokens: u64,
    /// Reused prompt tokens over all instances, and those loaded from host and from L3.
    pub hit_tokens: u64,
    pub hit_tokens_host: u64,
    pub hit_tokens_l3: u64,
    /// The trace's bound: an unbounded cache every request could read.
    pub unbounded_hit_tokens: u64,
    /// `hit_tokens / unbounded_hit_tokens`.
    pub hit_ratio_of_ideal: f64,
    pub ttft_mean_ms: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p90_ms: f64,
    pub ttft_p99_ms: f64,
    /// The last instance's clock at the end.
    pub virtual_s: f64,
    /// L3 bytes each instance read (prefetches) and wrote (backups).
    pub l3_prefetched_bytes: Vec<u64>,
    pub l3_backed_up_bytes: Vec<u64>,
    /// Prefetches and lookups that failed (a dead store: misses, nothing else).
    pub l3_failed_prefetches: u64,
    pub l3_lookup_errors: u64,
    pub integrity_errors: u64,
    pub router: RouterReport,
    /// Each instance's own report (answers left out).
    pub per_instance: Vec<ScenarioReport>,
}

/// The instances' L3 stores: one shared handle, or what each opens itself.
fn shared_store(
    o: &ClusterOptions,
    scratch: &mut Option<tempfile::TempDir>,
) -> Result<Option<SharedStore>, ScenarioError> {
    if o.l3 != L3Scope::Shared || o.base.l3 != L3Store::Local {
        return Ok(None);
    }
    let dir = match &o.base.l3_dir {
        Some(dir) => dir.clone(),
        None => scratch
            .insert(scratch_dir("cluster-l3")?)
            .path()
            .to_path_buf(),
    };
    let store = LocalStore::open(LocalStoreConfig::new(
        dir,
        o.base.l3_memory_bytes * o.instances as u64,
        1 << 30,
    ))?;
    Ok(Some(SharedStore::new(Box::new(store))))
}

/// Instance `i`'s options: its L3 arrangement and its KV event publisher.
fn instance_options(
    o: &ClusterOptions,
    i: usize,
    publisher: &Arc<KvEventPublisher>,
) -> ScenarioOptions {
    let mut opts = o.base.clone();
    opts.kv_events = Some(KvEventsSink(Arc::clone(publisher)));
    // Each instance's actix system runs on a thread of its own, as separate engines'
    // would: several systems sharing the caller's thread lose their L3 actors (whose
    // arbiters belong to the thread's current system).
    if opts.path == Path::Actors {
        opts.path = Path::ActorsThreaded;
    }
    // Each Mooncake client contributes a segment to the master's pool: room for its
    // share of the trace's pages (the default 64 MiB would have the master evicting).
    if opts.l3 == L3Store::Mooncake
        && let Some(config) = opts.mooncake.clone().or_else(MooncakeConfig::from_env)
    {
        opts.mooncake = Some(MooncakeConfig {
            global_segment_bytes: config.global_segment_bytes.max(MOONCAKE_SEGMENT_BYTES),
            ..config
        });
    }
    match o.l3 {
        L3Scope::Off => opts.l3 = L3Store::Off,
        // Mooncake: one master, a namespace each; the embedded store: a directory each.
        L3Scope::Private => {
            opts.l3_model = format!("{}-i{i}", o.base.l3_model);
            opts.l3_dir = o.base.l3_dir.as_ref().map(|d| d.join(format!("i{i}")));
        }
        L3Scope::Shared => {}
    }
    opts
}

/// Replays the trace of `o.base` on `o.instances` instances behind the router.
pub fn run_cluster(o: &ClusterOptions) -> Result<ClusterReport, ScenarioError> {
    run_cluster_with(o, |_, _| {})
}

/// Instance `i` of the cluster `o` in this process: its system and its KV event
/// publisher. `shared`: the store the instances share, when it is this process's (a
/// member in a process of its own passes `None`).
pub fn local_member(
    o: &ClusterOptions,
    i: usize,
    shared: Option<&SharedStore>,
) -> Result<Box<dyn Member>, ScenarioError> {
    let trace = o.base.trace.clone().ok_or(ScenarioError::NoTrace)?;
    if o.l3 == L3Scope::Shared && o.base.l3_on() && o.base.l3 == L3Store::Local && shared.is_none()
    {
        return Err(ScenarioError::L3(
            "instances in processes of their own cannot share the embedded store: use \
             --l3 mooncake, or --l3-scope private"
                .into(),
        ));
    }
    let publisher = Arc::new(KvEventPublisher::start(PublisherConfig {
        replay_endpoint: Some("tcp://127.0.0.1:0".into()),
        data_parallel_rank: Some(i as u32),
        // The router asks for replays only while it joins and for rare gaps; a
        // production trace's batches would hold gigabytes.
        keep: REPLAY_BATCHES,
        ..PublisherConfig::new("tcp://127.0.0.1:0", "kv-events")
    })?);
    let opts = instance_options(o, i, &publisher);
    let store = shared.map(|s| Box::new(s.clone()) as Box<dyn L3Backend>);
    let instance = Instance::start(&opts, Some(&trace), store)?;
    Ok(Box::new(Local {
        instance,
        publisher,
        trace,
    }))
}

/// [`run_cluster`], calling `between_steps(instance, step)` after each instance step
/// (tests inject faults there, such as killing the Mooncake master).
pub fn run_cluster_with(
    o: &ClusterOptions,
    between_steps: impl FnMut(usize, u64),
) -> Result<ClusterReport, ScenarioError> {
    if !(1..=kvtier_router::MAX_WORKERS).contains(&o.instances) {
        return Err(ScenarioError::Router(
            RouterError::Workers(o.instances).to_string(),
        ));
    }
    // Declared before the instances: the shared store's directory outlives them.
    let mut scratch = None;
    let shared = shared_store(o, &mut scratch)?;
    let members = (0..o.instances)
        .map(|i| local_member(o, i, shared.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    run_members(o, members, between_steps)
}

/// The cluster loop over `members` (in this process or others), instance `i` being the
/// `i`-th.
pub fn run_members(
    o: &ClusterOptions,
    mut members: Vec<Box<dyn Member>>,
    mut between_steps: impl FnMut(usize, u64),
) -> Result<ClusterReport, ScenarioError> {
    let trace = o.base.trace.clone().ok_or(ScenarioError::NoTrace)?;
    let n = members.len();
    let router_error = |e: RouterError| ScenarioError::Router(e.to_string());
    let shared_disk = o.l3 == L3Scope::Shared && o.base.l3_on();
    let mut router = Router::new(o.policy, n, SCENARIO_PAGE_SIZE as usize, shared_disk)
        .map_err(router_error)?
        .with_max_imbalance(o.max_imbalance);
    let endpoints: Vec<(String, Option<String>)> = members.iter().map(|m| m.endpoints()).collect();
    let mut feed = Feed::connect(&endpoints).map_err(router_error)?;
    let mut report = RouterReport {
        policy: o.policy.name().into(),
        routed: vec![0; n],
        ..RouterReport::default()
    };
    // Routed, not yet submitted (an instance submits at its next step).
    let mut pending: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut busy = vec![false; n];
    let mut predicted: BTreeMap<RequestId, (usize, u64)> = BTreeMap::new();
    let requests = &trace.requests;
    let mut next_arrival = 0usize;
    loop {
        let arrival = requests
            .get(next_arrival)
            .map(|q| q.arrival_us(trace.time_scale));
        let stepper = (0..n).filter(|&i| busy[i]).min_by(|&a, &b| {
            members[a]
                .now()
                .total_cmp(&members[b].now())
                .then(a.cmp(&b))
        });
        let route_at = arrival.filter(|&t| stepper.is_none_or(|i| t <= members[i].now()));
        match (route_at, stepper) {
            (Some(t), _) => {
                let started = Instant::now();
                let published: Vec<u64> = members.iter().map(|m| m.published()).collect();
                feed.receive(&published).map_err(router_error)?;
                feed.apply_until((t - o.router_lag_us) / 1e6, router.index_mut());
                let loads: Vec<u64> = (0..n)
                    .map(|i| members[i].outstanding() + pending[i].len() as u64)
                    .collect();
                let (spec, _) = requests[next_arrival].spec();
                let decision = router.route(&spec.tokens, &loads).map_err(router_error)?;
                report.route_ns += started.elapsed().as_nanos() as u64;
                let index = router.index();
                if index.len() as u64 > report.index_peak_blocks {
                    report.index_peak_blocks = index.len() as u64;
                    report.index_peak_bytes = index.memory_bytes() as u64;
                }
                let w = decision.worker;
                // An instance reuses whole pages short of the prompt's last token.
                let reusable =
                    (spec.tokens.len().saturating_sub(1) / SCENARIO_PAGE_SIZE as usize) as u64;
                let promised = u64::from(decision.predicted_blocks).min(reusable)
                    * u64::from(SCENARIO_PAGE_SIZE);
                predicted.insert(spec.id, (w, promised));
                report.routed[w] += 1;
                if !busy[w] {
                    members[w].wait_until(t);
                    busy[w] = true;
                }
                pending[w].push(next_arrival);
                next_arrival += 1;
            }
            (None, Some(i)) => {
                let submit = std::mem::take(&mut pending[i]);
                let mut hook = |step| between_steps(i, step);
                if members[i].step(&submit, &mut hook)? {
                    busy[i] = false;
                }
            }
            (None, None) => break,
        }
    }
    // What each instance reused against what the router saw there.
    for (id, &(w, promised)) in &predicted {
        let Some(&reused) = members[w].hits().get(id) else {
            continue;
        };
        report.predicted_hit_tokens += promised;
        report.overestimated += u64::from(reused < promised);
        report.underestimated += u64::from(reused > promised);
    }
    let stats = feed.stats();
    report.batches = stats.batches;
    report.events = stats.events;
    report.replays = stats.replays;
    report.wire_bytes = stats.bytes;
    report.index_blocks = router.index().len() as u64;
    let per_instance = members
        .into_iter()
        .map(|m| m.finish())
        .collect::<Result<Vec<_>, _>>()?;
    Ok(summarize(
        o,
        &trace.name,
        unbounded_hit_tokens(requests, SCENARIO_PAGE_SIZE),
        per_instance,
        report,
    ))
}

fn summarize(
    o: &ClusterOptions,
    workload: &str,
    unbounded: u64,
    per_instance: Vec<ScenarioReport>,
    router: RouterReport,
) -> ClusterReport {
    let sum = |f: fn(&ScenarioReport) -> u64| per_instance.iter().map(f).sum::<u64>();
    let mut ttft: Vec<f64> = per_instance
        .iter()
        .flat_map(|r| r.ttft_ms.iter().copied())
        .collect();
    ttft.sort_by(f64::total_cmp);
    let hit_tokens = sum(|r| r.hit_tokens);
    let mean = |v: &[f64]| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().sum::<f64>() / v.len() as f64
        }
    };
    ClusterReport {
        workload: workload.to_owned(),
        instances: o.instances,
        l3: match o.l3 {
            L3Scope::Off => "off".into(),
            scope => format!("{} {}", scope.name(), o.base.l3.name()),
        },
        requests: sum(|r| r.requests),
        finished: sum(|r| r.finished),
        aborted: sum(|r| r.aborted),
        refused: sum(|r| r.refused),
        prompt_tokens: sum(|r| r.prompt_tokens),
        hit_tokens,
        hit_tokens_host: sum(|r| r.hit_tokens_host),
        hit_tokens_l3: sum(|r| r.hit_tokens_l3),
        unbounded_hit_tokens: unbounded,
        hit_ratio_of_ideal: if unbounded == 0 {
            0.0
        } else {
            hit_tokens as f64 / unbounded as f64
        },
        ttft_mean_ms: mean(&ttft),
        ttft_p50_ms: if ttft.is_empty() {
            0.0
        } else {
            percentile(&ttft, 50)
        },
        ttft_p90_ms: if ttft.is_empty() {
            0.0
        } else {
            percentile(&ttft, 90)
        },
        ttft_p99_ms: if ttft.is_empty() {
            0.0
        } else {
            percentile(&ttft, 99)
        },
        virtual_s: per_instance.iter().map(|r| r.virtual_s).fold(0.0, f64::max),
        l3_prefetched_bytes: per_instance.iter().map(|r| r.l3_prefetched_bytes).collect(),
        l3_backed_up_bytes: per_instance.iter().map(|r| r.l3_backed_up_bytes).collect(),
        l3_failed_prefetches: sum(|r| r.l3_failed_prefetches),
        l3_lookup_errors: sum(|r| r.l3_lookup_errors),
        integrity_errors: sum(|r| r.integrity_errors),
        router,
        per_instance,
    }
}
