//! One kvtier system (its actors, device and host tiers, L3 core) and its oracle
//! engine, stepped on its own virtual clock: the engine side of a replay. A scenario
//! drives one ([`super::run_scenario_with`]); a cluster drives several
//! ([`crate::cluster`]), which is why submitting, stepping and reporting are separate.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use kvtier::KvError;
use kvtier_device::{FailEveryNth, NewRequest};
use kvtier_fsm::SchedError;
use kvtier_l3::L3Backend;
use kvtier_types::{EngineEvent, MambaSettings, RequestId, RequestSpec, SchedulerConfig, Token};

use super::{
    CostModel, KvEventsSink, METRICS_EVERY, MetricsSink, SCENARIO_PAGE_SIZE, SCENARIO_STATE_CHUNK,
    Scenario, ScenarioError, ScenarioOptions, ScenarioReport, StepWork, TraceWorkload,
    hybrid_oracle_device, l3_core, output_digest, percentile, prefix_residency, publish_kv_events,
    refresh_metrics, scenario_groups,
};
use crate::api::system_on;
use crate::oracle::OracleEngine;
use crate::trace::{TraceRequest, unbounded_hit_tokens};
use kvtier_model::ModelKind;

/// What one [`Instance::step`] did.
#[derive(Debug)]
pub(crate) enum Step {
    /// Nothing to run and nothing in flight: the instance waits for a submission.
    Idle,
    /// A step ran; the requests the scheduler gave up on in it.
    Ran { aborted: Vec<RequestId> },
}

/// One system and its engine on a virtual clock.
pub(crate) struct Instance {
    // Dropped before the scratch directory below, which its store writes into.
    s: kvtier::LocalSystem,
    r: ScenarioReport,
    trace: bool,
    cost: CostModel,
    kv_events: Option<KvEventsSink>,
    metrics: Option<MetricsSink>,
    timeline: bool,
    lost_hits_tracked: bool,
    /// A step computes at least one token of some request: a run that takes more steps
    /// than its requests have tokens has stopped making progress.
    step_limit: u64,
    /// Requests submitted since the last plan, announced to the engine with the next one.
    new_requests: Vec<NewRequest>,
    /// Tokens generated so far per request, and the finished requests' answers.
    generating: BTreeMap<RequestId, Vec<Token>>,
    outputs: BTreeMap<RequestId, Vec<Token>>,
    /// Pages prefetched from L3 for a request that has not run its first chunk yet.
    prefetched_for: BTreeMap<RequestId, u64>,
    /// Each request's reused prefix (tokens) at its first chunk, and the requests in the
    /// order they started.
    hits: BTreeMap<RequestId, u64>,
    starts: Vec<RequestId>,
    /// Virtual clock (µs) and, per request, its submit, first-token and finish times.
    now: f64,
    submitted_at: BTreeMap<RequestId, f64>,
    first_token: BTreeMap<RequestId, f64>,
    finished_at: BTreeMap<RequestId, f64>,
    _scratch: Option<tempfile::TempDir>,
}

impl Instance {
    /// Starts the system `o` describes. `l3`, when given, is the store it uses instead
    /// of opening the one `o` names (a store shared with other instances).
    pub(crate) fn start(
        o: &ScenarioOptions,
        trace: Option<&Arc<TraceWorkload>>,
        l3: Option<Box<dyn L3Backend>>,
    ) -> Result<Self, ScenarioError> {
        const PAGE: u32 = SCENARIO_PAGE_SIZE;
        let (device_pages, host_pages, batch, budget) = match o.scenario {
            // Working set 16 × 4 × 128 tokens = 512 pages; device holds under a third.
            Scenario::Chat => (161, 641, 16, 2048),
            // 2 prompts × 8 samples × (2048 + 256) tokens.
            Scenario::Rollout => (2400, 2400, 16, 8192),
            // A document is 2,048 pages: the device holds one and a quarter, the host two
            // and a bit, so a document is gone from both by its next question.
            Scenario::Longdoc => (2601, 4401, 16, 8192),
            // A modern GPU's KV for an 8B-class model (about 260,000 tokens), four times
            // that in host DRAM: a production batch of 64 rows.
            Scenario::Trace => (16_385, 65_537, 64, 8192),
        };
        let device_pages = o.device_pages.unwrap_or(device_pages);
        let host_pages = o.host_pages.unwrap_or(host_pages);
        // A hybrid model: two state slots per running request, as many again for cached
        // states; host copies with the host tier.
        let states = (o.model == ModelKind::MambaHybrid).then(|| MambaSettings {
            device_slots: 4 * batch,
            host_slots: if o.cache { 16 * batch } else { 0 },
            chunk: o.state_chunk.unwrap_or(SCENARIO_STATE_CHUNK),
        });
        let groups = o
            .groups
            .clone()
            .or_else(|| o.model.group_templates(SCENARIO_PAGE_SIZE))
            .map(|t| scenario_groups(&t, device_pages, batch, budget));
        let config = SchedulerConfig {
            mamba: states,
            paged: groups.clone(),
            page_size: PAGE,
            device_pages,
            host_pages,
            max_batch_size: batch,
            max_scheduled_tokens: budget,
            disable_prefix_cache: !o.cache,
            disable_l2_cache: !o.cache,
            publish_prefix_mid_flight: o.publish,
            midflight_publish_max_pages: o.publish_cap,
            enable_l3_storage: o.l3_on(),
            enable_kv_cache_events: o.kv_events.is_some(),
            // Watched runs say why hits were lost.
            track_lost_hits: o.metrics.is_some() || o.timeline || o.kv_events.is_some(),
            ..SchedulerConfig::default()
        };
        let mut device = hybrid_oracle_device(
            PAGE,
            device_pages,
            host_pages,
            o.verify,
            states,
            groups.as_ref(),
        )?
        .with_faults(Box::new(
            FailEveryNth::new(o.fail_every_nth_write_back)
                .with_load_backs(o.fail_every_nth_load_back),
        ));
        let mut scratch = None;
        let arenas = device.arenas_mut();
        let (host, host_states) = (arenas.host_arena(), arenas.host_state_arena());
        let l3 = l3_core(o, PAGE, host, host_states, &mut scratch, l3)?;
        let lost_hits_tracked = config.track_lost_hits;
        let s = system_on(o.path, config, Some(device), l3)?;
        let step_limit = match trace {
            Some(t) => t
                .requests
                .iter()
                .map(|q| u64::from(q.input_length) + u64::from(q.output_length.max(1)))
                .sum::<u64>()
                .max(100_000),
            None => 100_000,
        };
        let r = ScenarioReport {
            workload: trace.map_or(o.scenario.name().into(), |t| t.name.clone()),
            cache: o.cache,
            l3: if o.l3_on() { o.l3.name() } else { "off" }.into(),
            hybrid: o.model == ModelKind::MambaHybrid,
            model: o
                .model_label
                .clone()
                .unwrap_or_else(|| o.model.name().into()),
            unbounded_hit_tokens: trace.map_or(0, |t| unbounded_hit_tokens(&t.requests, PAGE)),
            ..ScenarioReport::default()
        };
        Ok(Self {
            s,
            r,
            trace: trace.is_some(),
            cost: o.cost,
            kv_events: o.kv_events.clone(),
            metrics: o.metrics.clone(),
            timeline: o.timeline,
            lost_hits_tracked,
            step_limit,
            new_requests: Vec::new(),
            generating: BTreeMap::new(),
            outputs: BTreeMap::new(),
            prefetched_for: BTreeMap::new(),
            hits: BTreeMap::new(),
            starts: Vec::new(),
            now: 0.0,
            submitted_at: BTreeMap::new(),
            first_token: BTreeMap::new(),
            finished_at: BTreeMap::new(),
            _scratch: scratch,
        })
    }

    /// The virtual clock (µs).
    pub(crate) fn now(&self) -> f64 {
        self.now
    }

    /// Moves the clock on to `t` (an idle instance waiting for a submission).
    pub(crate) fn wait_until(&mut self, t: f64) {
        self.now = self.now.max(t);
    }

    /// The counters so far.
    pub(crate) fn report(&self) -> &ScenarioReport {
        &self.r
    }

    /// The finished requests' answers.
    pub(crate) fn outputs(&self) -> &BTreeMap<RequestId, Vec<Token>> {
        &self.outputs
    }

    /// Each started request's reused prefix (tokens) at its first chunk.
    pub(crate) fn hits(&self) -> &BTreeMap<RequestId, u64> {
        &self.hits
    }

    /// The requests that started, in the order they did.
    pub(crate) fn starts(&self) -> &[RequestId] {
        &self.starts
    }

    /// Submits requests (each with the tokens its answer has) now. A trace's prompt no
    /// pool of this size can take is refused and counted; the others run.
    pub(crate) fn submit(&mut self, batch: Vec<(RequestSpec, usize)>) -> Result<(), ScenarioError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut specs = Vec::with_capacity(batch.len());
        for (spec, max_new) in batch {
            self.new_requests.push(NewRequest {
                id: spec.id.clone(),
                prompt: spec.tokens.clone(),
                max_new_tokens: max_new,
            });
            self.submitted_at.insert(spec.id.clone(), self.now);
            self.r.requests += 1;
            self.r.prompt_tokens += spec.tokens.len() as u64;
            specs.push(spec);
        }
        let ids: Vec<RequestId> = specs.iter().map(|spec| spec.id.clone()).collect();
        let t = Instant::now();
        // Plans on the virtual clock see every lookup, on every runtime.
        let submitted = self.s.submit_settled(specs);
        self.r.scheduler_ns += t.elapsed().as_nanos() as u64;
        match submitted {
            Err(KvError::Batch(refused)) if self.trace => {
                for rejected in &refused.rejected {
                    let id = &ids[rejected.index];
                    self.new_requests.retain(|n| &n.id != id);
                    self.submitted_at.remove(id);
                    self.r.refused += 1;
                    let why = match rejected.error {
                        SchedError::PromptTooLong { .. } => "PromptTooLong".to_string(),
                        ref other => other.to_string(),
                    };
                    *self.r.abort_reasons.entry(why).or_default() += 1;
                }
                Ok(())
            }
            other => Ok(other?),
        }
    }

    /// Plans, executes and advances one step, moving the clock by its cost;
    /// `between_steps(step)` runs once its events are applied.
    pub(crate) fn step(
        &mut self,
        between_steps: &mut dyn FnMut(u64),
    ) -> Result<Step, ScenarioError> {
        const PAGE: u32 = SCENARIO_PAGE_SIZE;
        let r = &mut self.r;
        let t = Instant::now();
        let plan = self.s.next_plan()?;
        r.scheduler_ns += t.elapsed().as_nanos() as u64;
        r.steps += 1;
        if plan.is_empty() && self.new_requests.is_empty() && self.s.stats()?.scheduler.idle {
            return Ok(Step::Idle);
        }
        if r.steps > self.step_limit {
            return Err(ScenarioError::Stalled(r.steps));
        }
        // Counters.
        for op in &plan.write_backs {
            r.writeback_ops += 1;
            r.writeback_pages += op.pairs.len() as u64;
            r.retractions += u64::from(op.is_retract);
        }
        r.loadback_ops += plan.load_backs.len() as u64;
        let lb = plan.load_back_pages() as u64;
        r.loadback_pages += lb;
        // Hits by tier, per request at its first chunk: of the prefix it reuses, the
        // pages this plan loads back came from host, and of those, the ones its own
        // prefetch brought from L3.
        // Only prompt rows are attributed: a decode-only plan builds no set.
        let loaded: HashSet<u32> = if plan.forward.num_prefill_rows == 0 {
            HashSet::new()
        } else {
            plan.load_backs
                .iter()
                .flat_map(|op| op.pairs.iter())
                .filter(|pair| pair.kind == kvtier_types::TransferKind::Kv)
                .map(|pair| pair.dst)
                .collect()
        };
        for row in plan.forward.prefill_rows() {
            if let Entry::Vacant(first) = self.hits.entry(row.request_id.clone()) {
                first.insert(u64::from(row.extend_prefix_len));
                self.starts.push(row.request_id.clone());
                r.hit_tokens += u64::from(row.extend_prefix_len);
                let prefix_pages = (row.extend_prefix_len / PAGE) as usize;
                let table = plan.forward.page_table_of(row);
                let from_host = table[..prefix_pages.min(table.len())]
                    .iter()
                    .filter(|page| loaded.contains(page))
                    .count() as u64;
                let from_l3 = self
                    .prefetched_for
                    .remove(&row.request_id)
                    .unwrap_or(0)
                    .min(from_host);
                r.hit_tokens_host += from_host * u64::from(PAGE);
                r.hit_tokens_l3 += from_l3 * u64::from(PAGE);
            }
        }
        let mut aborted = Vec::new();
        for notice in &plan.aborted {
            r.aborted += 1;
            *r.abort_reasons
                .entry(format!("{:?}", notice.reason))
                .or_default() += 1;
            self.generating.remove(&notice.request_id);
            aborted.push(notice.request_id.clone());
        }
        let prefill_tokens: u64 = plan
            .forward
            .prefill_rows()
            .iter()
            .map(|row| u64::from(row.input_length))
            .sum();
        let decode_rows = plan.forward.decode_rows().len() as u64;
        let events = self
            .s
            .execute(plan, std::mem::take(&mut self.new_requests))?;
        let mut prefetched = 0u64;
        for event in &events {
            if let EngineEvent::PrefetchDone {
                request_id,
                completed_pages,
                success: true,
                ..
            } = event
            {
                prefetched += u64::from(*completed_pages);
                *self.prefetched_for.entry(request_id.clone()).or_default() +=
                    u64::from(*completed_pages);
            }
        }
        self.now += self.cost.step_cost(StepWork {
            prefill_tokens,
            decode_rows,
            loaded_tokens: lb * u64::from(PAGE),
            prefetched_tokens: prefetched * u64::from(PAGE),
        });
        let now = self.now;
        for event in &events {
            match event {
                EngineEvent::ExtendResult { request_id, tokens } => {
                    self.first_token.entry(request_id.clone()).or_insert(now);
                    self.generating
                        .entry(request_id.clone())
                        .or_default()
                        .extend_from_slice(tokens);
                }
                EngineEvent::Finish { request_id } => {
                    self.finished_at.insert(request_id.clone(), now);
                    let answer = self.generating.remove(request_id).unwrap_or_default();
                    self.outputs.insert(request_id.clone(), answer);
                }
                _ => {}
            }
        }
        let t = Instant::now();
        self.s.advance(events)?;
        self.r.scheduler_ns += t.elapsed().as_nanos() as u64;
        between_steps(self.r.steps);
        if let Some(sink) = &self.kv_events {
            publish_kv_events(&mut self.s, sink, now)?;
        }
        if (self.metrics.is_some() || self.timeline) && self.r.steps.is_multiple_of(METRICS_EVERY) {
            let timeline = self.timeline.then_some(&mut self.r.timeline);
            refresh_metrics(&mut self.s, self.metrics.as_ref(), timeline, now)?;
        }
        Ok(Step::Ran { aborted })
    }

    /// Ends the run: the last metrics and KV events, the residency of `residency`'s
    /// prompts, the scheduler's, L3's and the engine's counters, then shutdown (the pools
    /// must balance) and the latency percentiles.
    pub(crate) fn finish(
        mut self,
        residency: &[TraceRequest],
    ) -> Result<ScenarioReport, ScenarioError> {
        const PAGE: u32 = SCENARIO_PAGE_SIZE;
        let now = self.now;
        if self.metrics.is_some() || self.timeline {
            let timeline = self.timeline.then_some(&mut self.r.timeline);
            refresh_metrics(&mut self.s, self.metrics.as_ref(), timeline, now)?;
        }
        if let Some(sink) = &self.kv_events {
            publish_kv_events(&mut self.s, sink, now)?;
        }
        let s = &mut self.s;
        let r = &mut self.r;
        if self.trace {
            r.residency = prefix_residency(s, residency)?;
        }
        let stats = s.stats()?;
        let sched = &stats.scheduler;
        r.scheduler_hit_tokens = [sched.hit_tokens, sched.hit_tokens_host, sched.hit_tokens_l3];
        r.lost_hits_tracked = self.lost_hits_tracked;
        r.lost_hit_tokens = sched.lost_hit_tokens;
        r.evicted_device_pages = stats.scheduler.evicted_device_pages;
        r.evicted_host_pages = stats.scheduler.evicted_host_pages;
        if let Some(l3) = stats.l3 {
            r.l3_lookup_hit_pages = l3.lookup_hit_pages;
            r.l3_prefetch_ops = l3.prefetch_ops;
            r.l3_prefetched_pages = l3.prefetched_pages;
            r.l3_prefetched_bytes = l3.prefetched_bytes;
            r.l3_failed_prefetches = l3.failed_prefetches;
            r.l3_lookup_errors = l3.lookup_errors;
            r.l3_failed_backups = l3.failed_backups;
            r.l3_backup_ops = l3.backup_ops;
            r.l3_backed_up_pages = l3.backed_up_pages;
            r.l3_backed_up_bytes = l3.backed_up_bytes;
            r.l3_backed_up_states = l3.backed_up_states;
            r.l3_prefetched_states = l3.prefetched_states;
            r.l3_corrupt_objects = l3.backend.corrupt_objects;
        }
        let outputs = std::mem::take(&mut self.outputs);
        r.output_digest = output_digest(&outputs);
        // The device actor's counters, and the oracle engine's findings.
        let device = s.take_device()?.ok_or(KvError::NoDevice)?;
        // Every request is done: shutdown lets go of everything, and the pools must
        // balance (a page neither free nor in the tree fails the run).
        let mut r = std::mem::take(&mut self.r);
        let report = self.s.shutdown()?;
        report.conservation.map_err(ScenarioError::System)?;
        let engine = OracleEngine::of(&device).ok_or(KvError::NoDevice)?;
        debug_assert_eq!(engine.outputs, outputs, "answers as the engine saw them");
        let stats = device.stats();
        r.finished = outputs.len() as u64;
        r.generated_tokens = outputs.values().map(|v| v.len() as u64).sum();
        r.ideal_hit_tokens = engine.ideal_hit_pages * u64::from(PAGE);
        r.moved_bytes = stats.moved_bytes;
        r.integrity_errors = engine.errors.len() as u64;
        r.failed_write_backs = stats.failed_write_backs;
        r.failed_load_backs = stats.failed_load_backs;
        r.void_rows = engine.void_rows;
        r.first_errors = engine.errors.iter().take(8).cloned().collect();
        let mut ttft: Vec<f64> = self
            .first_token
            .iter()
            .filter_map(|(id, t)| self.submitted_at.get(id).map(|s| t - s))
            .collect();
        ttft.sort_by(f64::total_cmp);
        if !ttft.is_empty() {
            r.ttft_mean_ms = ttft.iter().sum::<f64>() / ttft.len() as f64 / 1e3;
            r.ttft_p50_ms = percentile(&ttft, 50) / 1e3;
            r.ttft_p90_ms = percentile(&ttft, 90) / 1e3;
            r.ttft_p99_ms = percentile(&ttft, 99) / 1e3;
        }
        r.ttft_ms = ttft.iter().map(|us| us / 1e3).collect();
        let tpot: Vec<f64> = self
            .finished_at
            .iter()
            .filter_map(|(id, end)| {
                let n = outputs.get(id)?.len();
                let first = self.first_token.get(id)?;
                (n > 1).then(|| (end - first) / (n - 1) as f64)
            })
            .collect();
        if !tpot.is_empty() {
            r.tpot_mean_ms = tpot.iter().sum::<f64>() / tpot.len() as f64 / 1e3;
            let mut sorted = tpot;
            sorted.sort_by(f64::total_cmp);
            r.tpot_p50_ms = percentile(&sorted, 50) / 1e3;
            r.tpot_p99_ms = percentile(&sorted, 99) / 1e3;
        }
        r.virtual_s = now / 1e6;
        if now > 0.0 {
            r.throughput_tokens_per_s = r.generated_tokens as f64 / r.virtual_s;
        }
        r.outputs = outputs;
        Ok(r)
    }
}
