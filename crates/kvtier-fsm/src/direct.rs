//! The direct path: the scheduler core over a radix cache it owns, batches executed in
//! place. Same decisions as the actor runtimes, which carry the same batches as messages.

use kvtier_radix::{CacheFamily, RadixCore};
use kvtier_types::{
    EngineEvent, ExecutionPlan, KvEvent, LookupAsk, PageId, RequestId, RequestSpec,
    SchedulerConfig, Token,
};

use crate::{
    BatchError, FamilyMail, FamilyReply, Progress, SchedError, SchedulerCore, SchedulerStats,
    StateKind, cache_config,
};

/// The request state machine and scheduling policy over a radix cache, in one value.
#[derive(Debug)]
pub struct Scheduler {
    core: SchedulerCore,
    cache: RadixCore,
}

impl SchedulerStats {
    /// Fills the cache gauges from the tree's counters.
    pub fn with_tree(mut self, tree: kvtier_radix::TreeStats) -> Self {
        self.available_device_pages = tree.free_pages[0];
        self.available_host_pages = tree.free_pages[1];
        self.cached_device_pages = tree.cached_pages[0];
        self.cached_host_pages = tree.cached_pages[1];
        self.evicted_device_pages = tree.evicted_pages[0];
        self.evicted_host_pages = tree.evicted_pages[1];
        self.prefetch_skipped = tree.prefetch_skipped;
        self.states = tree.states;
        self.groups = tree.groups;
        self.registered = tree.registered;
        self
    }
}

impl Scheduler {
    /// A scheduler over fresh pools. Fails on an invalid config.
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedError> {
        let core = SchedulerCore::new(config)?;
        let cache = RadixCore::new(&cache_config(core.config()));
        Ok(Self { core, cache })
    }

    /// A scheduler whose cache hosts `family`, a cache family its user registered,
    /// beside the KV of a full-attention model. Fails on an invalid config, or one that
    /// names a built-in family too.
    pub fn hosting(
        config: SchedulerConfig,
        family: Box<dyn CacheFamily>,
    ) -> Result<Self, SchedError> {
        let core = SchedulerCore::new(config)?;
        let cache = RadixCore::new(&cache_config(core.config())).hosting(family)?;
        Ok(Self { core, cache })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        self.core.config()
    }

    /// The prefix cache (read access for inspection and tests).
    pub fn cache(&self) -> &RadixCore {
        &self.cache
    }

    /// The request state machine.
    pub fn core(&self) -> &SchedulerCore {
        &self.core
    }

    /// Executes family mail on the cache in place: its answer.
    fn deliver(&mut self, mail: FamilyMail) -> FamilyReply {
        match mail {
            FamilyMail::Radix(batch) => FamilyReply::Radix(self.cache.execute(batch)),
        }
    }

    /// Runs the core's queued cache work.
    fn flush(&mut self) {
        for mail in self.core.take_mail() {
            let reply = self.deliver(mail);
            let resumed = self.core.resume(reply);
            debug_assert!(matches!(resumed, Ok(Progress::Done)), "{resumed:?}");
        }
    }

    /// Submits requests (see [`SchedulerCore::submit`]).
    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), BatchError> {
        self.core.submit(specs)
    }

    /// Submits requests whose long prompts wait for an L3 lookup (see
    /// [`SchedulerCore::submit_with_lookup`]).
    pub fn submit_with_lookup(
        &mut self,
        specs: Vec<RequestSpec>,
    ) -> (Option<LookupAsk>, Result<(), BatchError>) {
        self.core.submit_with_lookup(specs)
    }

    /// A lookup's answer (see [`SchedulerCore::looked_up`]).
    pub fn looked_up(&mut self, ticket: u64, hit_pages: Option<Vec<u32>>) {
        self.core.looked_up(ticket, hit_pages);
    }

    /// Applies engine events in order (see [`SchedulerCore::advance`]).
    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), BatchError> {
        let result = self.core.advance(events);
        self.flush();
        result
    }

    /// Aborts one request, whatever its state.
    pub fn abort(&mut self, id: &RequestId) -> Result<(), SchedError> {
        let result = self.core.abort(id);
        self.flush();
        result
    }

    /// Builds the next execution plan.
    pub fn next_plan(&mut self) -> ExecutionPlan {
        self.flush();
        let plan = self.core.plan().and_then(|mut mail| {
            loop {
                let mut progress = Progress::Done;
                for one in mail {
                    let reply = self.deliver(one);
                    progress = self.core.resume(reply)?;
                }
                match progress {
                    Progress::Plan(plan) => return Ok(*plan),
                    Progress::Send(more) => mail = more,
                    Progress::Done => return Err(SchedError::UnexpectedReply),
                }
            }
        });
        let plan = match plan {
            Ok(plan) => plan,
            Err(error) => {
                // Cannot happen: the cache answers every batch in place.
                debug_assert!(false, "direct plan failed: {error}");
                ExecutionPlan::default()
            }
        };
        #[cfg(debug_assertions)]
        if std::env::var_os("KVTIER_DEBUG_MEM").is_some() {
            let checked = self.check_invariants();
            debug_assert!(
                checked.is_ok(),
                "after plan {}: {checked:?}",
                self.core.stats().plans
            );
        }
        plan
    }

    /// Token count of a live request (prompt plus generated), if known.
    pub fn request_tokens(&self, id: &RequestId) -> Option<usize> {
        self.core.request_tokens(id)
    }

    /// State of a live request, if known.
    pub fn request_state(&self, id: &RequestId) -> Option<StateKind> {
        self.core.request_state(id)
    }

    /// Live request ids in id order.
    pub fn request_ids(&self) -> Vec<RequestId> {
        self.core.request_ids()
    }

    /// The device page table (tree prefix, then request-local pages) of a running request.
    pub fn occupied_pages(&self, id: &RequestId) -> Option<Vec<PageId>> {
        self.core.occupied_pages(id)
    }

    /// Pages held outside the tree, per tier. For invariant checks.
    pub fn outside_pages(&self) -> [Vec<PageId>; 2] {
        self.core.outside_pages()
    }

    /// Checks cache invariants and exact page conservation against every request; for a
    /// hybrid model, that every state slot out of its pool is held by exactly one request.
    pub fn check_invariants(&mut self) -> Result<(), kvtier_radix::RadixError> {
        let [device, host] = self.core.outside_pages();
        self.cache.check_invariants([&device, &host])?;
        let held = self.core.held_state_slots();
        let Some(out) = self.cache.with_states(|family, _| family.held_slots()) else {
            return Ok(());
        };
        for ((mut ids, out), tier) in held.into_iter().zip(out).zip(["device", "host"]) {
            ids.sort_unstable();
            let before = ids.len();
            ids.dedup();
            if ids.len() != before || ids.len() as u32 != out {
                let what = format!(
                    "{out} {tier} state slots out of the pool, requests hold {before} \
                     ({} distinct)",
                    ids.len()
                );
                return Err(kvtier_radix::RadixError::Invariant(
                    kvtier_radix::Violation::States(what),
                ));
            }
        }
        Ok(())
    }

    /// Free pages of a tier (a gauge of [`Self::stats`], without its copy).
    pub fn available_pages(&mut self, tier: kvtier_types::Tier) -> u32 {
        self.cache.available(tier)
    }

    /// Counters and gauges.
    pub fn stats(&mut self) -> SchedulerStats {
        self.core.stats().with_tree(self.cache.stats())
    }

    /// Takes the KV-cache events collected since the last call.
    pub fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.cache.drain_events()
    }

    /// Evicts every unlocked cached page of both tiers.
    pub fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Whether nothing is running, queued or in flight.
    pub fn is_idle(&self) -> bool {
        self.core.is_idle()
    }

    /// Rolling page hashes of the full pages of `tokens`, chained from the root.
    pub fn rolling_hashes(&self, tokens: &[Token]) -> Vec<kvtier_types::hash::PageHash> {
        self.core.rolling_hashes(tokens)
    }
}
