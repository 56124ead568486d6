//! The scheduler core: its state, construction and queries. What it does is split by
//! concern: `advance/` (submit and events), `step/` (plans), `mail.rs` (the cache's
//! replies).

use std::collections::{BTreeMap, BTreeSet};

use kvtier_radix::CacheConfig;
use kvtier_types::{AbortNotice, PageId, RequestId, SchedulerConfig, Token};

use crate::SchedError;
use crate::draft::Awaiting;
use crate::ops::OpTable;
use crate::outbox::Outbox;
use crate::request::{Retracted, State, StateKind};
use crate::requests::Requests;
use crate::slots::SlotPool;

/// Counters and gauges of the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Requests whose L3 lookup is under way (not scheduled until it answers).
    pub looking_up: usize,
    /// Requests waiting for their first chunk.
    pub waiting: usize,
    /// Requests in prefill (Prefilling and PrefillDone).
    pub prefilling: usize,
    /// Requests decoding.
    pub decoding: usize,
    /// Requests retracting or retracted.
    pub retracted: usize,
    /// Free device pages.
    pub available_device_pages: u32,
    /// Free host pages.
    pub available_host_pages: u32,
    /// Device pages in the prefix cache.
    pub cached_device_pages: u64,
    /// Host pages in the prefix cache.
    pub cached_host_pages: u64,
    /// Device pages evicted from the prefix cache so far.
    pub evicted_device_pages: u64,
    /// Host pages evicted from the prefix cache so far.
    pub evicted_host_pages: u64,
    /// Plans built.
    pub plans: u64,
    /// Retractions performed.
    pub retractions: u64,
    /// Retracted requests requeued to recompute their history (deadlock breaker).
    pub recomputes: u64,
    /// Requests the scheduler aborted on its own.
    pub scheduler_aborts: u64,
    /// Events for recently finished requests or completed ops, ignored.
    pub stale_events: u64,
    /// Write-backs acknowledged as failed.
    pub failed_write_backs: u64,
    /// Load-backs reported failed.
    pub failed_load_backs: u64,
    /// Requests scheduled again because a row of theirs read a failed load-back.
    pub load_back_requeues: u64,
    /// L3 lookups that never answered (a failed delivery): their requests went on with
    /// no L3 hits.
    pub lost_lookups: u64,
    /// Prompt tokens of the requests admitted so far (each counted at its first chunk
    /// only: `prefix_cache_queries`).
    pub prompt_query_tokens: u64,
    /// Of those, the tokens its first chunk reused from the cache, any tier
    /// (`prefix_cache_hits`).
    pub hit_tokens: u64,
    /// Of the hits, the tokens loaded back from host (L3's included).
    pub hit_tokens_host: u64,
    /// Of the host hits, the tokens the request's own prefetch brought from L3.
    pub hit_tokens_l3: u64,
    /// With `track_lost_hits`: prompt tokens after each first chunk's hit that were
    /// cached once, by [`LOST_HIT_REASONS`]: the tree held them but the admission did
    /// not reuse them (a hybrid model's missing state or window, host pages not loaded
    /// back); L3 had them and no prefetch brought them; a prefetch brought them and the
    /// host evicted them before the first chunk; the cache dropped them from every tier.
    pub lost_hit_tokens: [u64; 4],
    /// First chunks admitted without an L3 prefetch although their lookup found pages:
    /// nothing missing from host, below the threshold, no host room, no host state slot
    /// (`kvtier_radix::PrefetchSkip`).
    pub prefetch_skipped: [u64; 4],
    /// Cache batches sent (one per `advance` with cache work, one or two per plan).
    pub cache_batches: u64,
    /// Hybrid models: the recurrent-state slots and their counters.
    pub states: Option<kvtier_mamba::MambaStats>,
    /// Paged models: the group pools and the family's counters.
    pub groups: Option<Box<kvtier_paged::PagedReport>>,
    /// A registered cache family's counters, by name (`Scheduler::hosting`).
    pub registered: Vec<(&'static str, u64)>,
    /// Nothing running, queued or in flight.
    pub idle: bool,
    /// Wall-clock duration of each scheduling step (`next_plan`). The latency
    /// histograms compare equal whatever they hold (`WallClock`).
    pub step_duration: kvtier_types::WallClock<kvtier_types::Histogram>,
    /// Submit to first chunk, per request (a recompute is not counted again).
    pub queue_time: kvtier_types::WallClock<kvtier_types::Histogram>,
    /// Submit to the first generated token's arrival, per request.
    pub time_to_first_token: kvtier_types::WallClock<kvtier_types::Histogram>,
    /// First token to finish over the tokens after the first, per finished request
    /// with more than one.
    pub time_per_output_token: kvtier_types::WallClock<kvtier_types::Histogram>,
}

/// The reasons of [`SchedulerStats::lost_hit_tokens`], in its order.
pub const LOST_HIT_REASONS: [&str; 4] = [
    "not_reused",
    "l3_not_prefetched",
    "prefetched_then_evicted",
    "evicted",
];

/// The cache settings a scheduler config implies (the radix actor is built with them).
pub fn cache_config(config: &SchedulerConfig) -> CacheConfig {
    CacheConfig {
        page_size: config.page_size,
        device_pages: config.device_pages,
        host_pages: config.host_pages,
        kv_events: config.enable_kv_cache_events,
        page_hashes: config.enable_l3_storage,
        policy: config.policy,
        mamba: config.mamba.map(|m| kvtier_mamba::MambaConfig {
            page_size: config.page_size,
            device_slots: m.device_slots,
            host_slots: m.host_slots,
            chunk: m.chunk,
            policy: config.policy,
        }),
        paged: config.paged.as_ref().and_then(|p| {
            let required: Vec<&str> = p.required.iter().map(String::as_str).collect();
            let adjunct = kvtier_paged::Adjunct::new(p.groups.clone(), &required);
            debug_assert!(adjunct.is_ok(), "an invalid paged config: {adjunct:?}");
            adjunct.ok()
        }),
        lost_hits: config.track_lost_hits,
    }
}

/// The request state machine and scheduling policy: the Scheduler actor's core.
///
/// It owns the requests and never touches the cache: every cache effect of a call is an
/// op in one [`kvtier_radix::CacheBatch`], whose reply the caller hands back with
/// [`SchedulerCore::resume`] before the next call. [`crate::Scheduler`] drives it over
/// a cache it owns; the actor runtimes drive it over the radix actor.
#[derive(Debug)]
pub struct SchedulerCore {
    pub(crate) config: SchedulerConfig,
    pub(crate) slots: SlotPool,
    /// Live requests and the ids of recently finished ones.
    pub(crate) requests: Requests,
    /// Write-backs and backups in flight, and the op id counter.
    pub(crate) ops: OpTable,
    pub(crate) stats: SchedulerStats,
    /// Page-table length of the last plan: the next one is usually about as long.
    pub(crate) page_table_hint: usize,
    /// Cache ops queued for the next batch, with where their results go.
    pub(crate) outbox: Outbox,
    /// The reply the core waits for, if any (no call may start meanwhile).
    pub(crate) awaiting: Awaiting,
    /// Requests whose rows in the last plan read a failed load-back: their results in
    /// this `advance` are void. Cleared by the next plan.
    pub(crate) voided: BTreeSet<RequestId>,
    /// Requests the scheduler gave up on between plans: told with the next plan.
    pub(crate) notices: Vec<AbortNotice>,
    /// Requests queued to recompute whose history a late result grew since the last
    /// plan: it checks they still fit the device pool.
    pub(crate) regrown: Vec<RequestId>,
    /// Finished requests that wait for their write-back, in the order their finishes
    /// came: the next plan issues them in it, so the first claims the copy of a prefix
    /// they share, as the reference's first finish does.
    pub(crate) finishing: Vec<(usize, RequestId)>,
    /// Plans in a row that had nothing for the engine, with no submission or event
    /// since the first: a state nothing but a new request can change.
    pub(crate) idle_plans: u32,
    /// The ticket of the next L3 lookup.
    pub(crate) next_lookup: u64,
    /// L3 lookups under way: their requests, in the order of the ask's prompts.
    pub(crate) lookups: BTreeMap<u64, Vec<RequestId>>,
}

impl SchedulerCore {
    /// A scheduler core. Fails on an invalid config.
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedError> {
        config.validate()?;
        // The paged family's own checks (required groups, alignment), which the
        // vocabulary crate cannot run: a typed error here, never a cache without it.
        if let Some(p) = &config.paged {
            let required: Vec<&str> = p.required.iter().map(String::as_str).collect();
            kvtier_paged::Adjunct::new(p.groups.clone(), &required).map_err(|e| {
                kvtier_types::TypesError::InvalidConfig {
                    field: "paged.required",
                    problem: e.to_string(),
                }
            })?;
        }
        Ok(Self {
            slots: SlotPool::new(config.max_batch_size),
            config,
            requests: Requests::default(),
            ops: OpTable::default(),
            stats: SchedulerStats::default(),
            page_table_hint: 0,
            outbox: Outbox::default(),
            finishing: Vec::new(),
            awaiting: Awaiting::Nothing,
            voided: BTreeSet::new(),
            notices: Vec::new(),
            regrown: Vec::new(),
            idle_plans: 0,
            next_lookup: 0,
            lookups: BTreeMap::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    // ----- queries -----------------------------------------------------------------

    /// Token count of a live request (prompt plus generated), if known.
    pub fn request_tokens(&self, id: &RequestId) -> Option<usize> {
        self.requests
            .key_of(id)
            .map(|k| self.requests[k].tokens.len())
    }

    /// Live requests in one of `kinds` (a size query, without the stats' copy).
    pub fn count_in(&self, kinds: &[StateKind]) -> usize {
        self.requests
            .iter()
            .filter(|r| kinds.contains(&r.state.kind()))
            .count()
    }

    /// State of a live request, if known.
    pub fn request_state(&self, id: &RequestId) -> Option<StateKind> {
        self.requests
            .key_of(id)
            .map(|k| self.requests[k].state.kind())
    }

    /// Live request ids in id order.
    pub fn request_ids(&self) -> Vec<RequestId> {
        self.requests.ids().cloned().collect()
    }

    /// The device page table (tree prefix, then request-local pages) of a running request.
    pub fn occupied_pages(&self, id: &RequestId) -> Option<Vec<PageId>> {
        let run = self
            .requests
            .key_of(id)
            .and_then(|k| self.requests[k].state.running())?;
        let mut pages = run.prefix_pages.clone();
        pages.extend_from_slice(run.local_kv.pages.ids());
        Some(pages)
    }

    /// Pages held outside the tree, per tier: requests' own device pages, and host pages
    /// of prefetches in flight. For invariant checks.
    pub fn outside_pages(&self) -> [Vec<PageId>; 2] {
        let mut device = Vec::new();
        let mut host = Vec::new();
        for r in self.requests.iter() {
            match &r.state {
                State::Prefilling(run) | State::PrefillDone(run) | State::Decoding(run) => {
                    device.extend_from_slice(run.local_kv.pages.ids())
                }
                State::Retracting { local_kv, .. }
                | State::Retracted(Retracted { local_kv, .. }) => {
                    device.extend_from_slice(local_kv.pages.ids())
                }
                State::Prefetching(p) | State::Aborting(p) => host.extend_from_slice(p.pages.ids()),
                _ => {}
            }
        }
        [device, host]
    }

    /// Recurrent-state slots held by requests, per tier (hybrid models): running
    /// requests' working and checkpoint slots on device, prefetches' state slots on host.
    /// For invariant checks.
    pub fn held_state_slots(&self) -> [Vec<kvtier_mamba::SlotId>; 2] {
        let mut device = Vec::new();
        let mut host = Vec::new();
        for r in self.requests.iter() {
            match &r.state {
                State::Prefilling(run) | State::PrefillDone(run) | State::Decoding(run) => {
                    if let Some(states) = run.family.states() {
                        device.push(states.working.id());
                        device.extend(states.checkpoint.as_ref().map(|s| s.id()));
                    }
                }
                State::Prefetching(p) | State::Aborting(p) => {
                    host.extend(p.state.as_ref().map(|s| s.id()));
                }
                _ => {}
            }
        }
        [device, host]
    }

    /// Counters and the request gauges (the cache's gauges come from the cache).
    pub fn stats(&self) -> SchedulerStats {
        let mut s = self.stats.clone();
        s.idle = self.is_idle();
        for r in self.requests.iter() {
            match r.state.kind() {
                StateKind::LookingUp => s.looking_up += 1,
                StateKind::Submitted => s.waiting += 1,
                StateKind::Prefilling | StateKind::PrefillDone => s.prefilling += 1,
                StateKind::Decoding => s.decoding += 1,
                StateKind::Retracting | StateKind::Retracted => s.retracted += 1,
                _ => {}
            }
        }
        s
    }

    /// Write-backs and L3 backups issued and not yet acknowledged.
    pub fn ops_in_flight(&self) -> usize {
        self.ops.in_flight()
    }

    /// Whether a batch is out and its reply not yet resumed.
    pub fn is_awaiting(&self) -> bool {
        !matches!(self.awaiting, Awaiting::Nothing)
    }

    /// Whether nothing is running, queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty() && self.ops.is_empty() && self.outbox.is_empty()
    }

    /// Rolling page hashes of the full pages of `tokens`, chained from the root.
    pub fn rolling_hashes(&self, tokens: &[Token]) -> Vec<kvtier_types::hash::PageHash> {
        kvtier_types::hash::rolling_page_hashes(None, tokens, self.config.page_size as usize)
    }
}
