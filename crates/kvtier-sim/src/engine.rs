//! The simulated engine of the benchmark workloads (WORKLOADS.md §1) and its counters.
//!
//! Each step: `next_plan` → the engine answers the plan with one event list →
//! `advance`. Engine rules: every write-back op is acknowledged successfully, first;
//! load-backs need no reply; the forward rows are answered under
//! [`kvtier_types::engine_rule`], each request's tokens taken from the stream it was
//! submitted with, `Finish` after its last.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use kvtier::{KvError, LocalSystem};

use kvtier_fsm::{BatchError, SchedError};
use kvtier_types::{
    EngineEvent, ExecutionPlan, RequestId, RequestSpec, RowKind, SchedulerConfig, Token,
    engine_rule,
};
use serde::Serialize;

/// Deterministic counters of a run (identical across runs and runtimes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Plans built.
    pub steps: u64,
    /// Prompt tokens submitted.
    pub prompt_tokens: u64,
    /// Σ extend-prefix length of each request's first prefill chunk.
    pub hit_tokens: u64,
    /// Hit tokens served from device.
    pub hit_tokens_device: u64,
    /// Hit tokens loaded back from host.
    pub hit_tokens_host: u64,
    /// Prefill rows.
    pub prefill_rows: u64,
    /// Prefill rows that were not a request's first chunk.
    pub non_first_chunks: u64,
    /// Decode rows (including recovery rows).
    pub decode_rows: u64,
    /// Write-back ops.
    pub writeback_ops: u64,
    /// Write-back pages.
    pub writeback_pages: u64,
    /// Write-back ops issued because a request finished.
    pub finish_writeback_ops: u64,
    /// Pages of those.
    pub finish_writeback_pages: u64,
    /// Write-back ops issued because a request was retracted.
    pub retract_writeback_ops: u64,
    /// Pages of those.
    pub retract_writeback_pages: u64,
    /// Load-back ops.
    pub loadback_ops: u64,
    /// Load-back pages.
    pub loadback_pages: u64,
    /// Load-back pages in plans without prefill rows (retract recovery).
    pub recovery_loadback_pages: u64,
    /// Retractions (write-backs marked as retract).
    pub retractions: u64,
    /// Requests that disappeared without finishing.
    pub aborts: u64,
    /// In plans without prefill rows: running requests past their first token that got
    /// no decode row.
    pub starved_decode_slots: u64,
    /// Requests that received Finish.
    pub finished: u64,
    /// Device `BlockStored` events (diagnostic runs with KV events on).
    pub kv_blocks_stored: u64,
    /// Device `BlockRemoved` events.
    pub kv_blocks_removed: u64,
}

#[derive(Debug)]
struct Live {
    stream: Vec<Token>,
    produced: usize,
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// The plan held nothing for the engine.
    pub empty: bool,
    /// Requests that received Finish this step.
    pub finished: Vec<RequestId>,
    /// Requests the scheduler aborted this step.
    pub aborted: Vec<RequestId>,
    /// Timed nanoseconds of this step's scheduler calls.
    pub ns: u64,
    /// Whether the plan had prefill rows.
    pub had_prefill: bool,
}

/// Drives a scheduler through steps as the workload engine, counting as it goes.
#[derive(Debug)]
pub struct StepDriver {
    /// The scheduler under test.
    pub scheduler: LocalSystem,
    /// When set, a digest of every plan, in order (for comparing paths step by step).
    pub plan_digests: Option<Vec<u64>>,
    /// Counters so far.
    pub counters: Counters,
    /// Timed nanoseconds so far.
    pub measured_ns: u64,
    live: BTreeMap<RequestId, Live>,
    started: HashSet<RequestId>,
    page_size: u64,
    /// Whether the scheduler emits KV events (else they are never asked for).
    kv_events: bool,
    /// Skip `advance` when the plan holds nothing for the engine (W3's rule).
    pub skip_empty_advance: bool,
    /// Submissions start L3 lookups, settled before the next plan.
    l3_lookups: bool,
    /// Route calls through the `measured_*` functions (callgrind counts only those).
    /// W2 turns this off outside its steady steps.
    pub measure: bool,
    /// An embedder's observability, timed with the step.
    pub observe: Observe,
}

/// Submits, timed. Never inlined so callgrind can toggle on it.
#[inline(never)]
pub fn measured_submit(
    s: &mut LocalSystem,
    specs: Vec<RequestSpec>,
    settle_lookups: bool,
) -> Result<(), KvError> {
    if settle_lookups {
        s.submit_settled(specs)
    } else {
        s.submit(specs)
    }
}

/// Builds the next plan, timed. Never inlined so callgrind can toggle on it.
#[inline(never)]
pub fn measured_next_plan(s: &mut LocalSystem) -> Result<ExecutionPlan, KvError> {
    s.next_plan()
}

/// Applies events, timed. Never inlined so callgrind can toggle on it.
#[inline(never)]
pub fn measured_advance(s: &mut LocalSystem, events: Vec<EngineEvent>) -> Result<(), KvError> {
    s.advance(events)
}

/// Drops a plan outside the timed region.
#[inline(never)]
fn discard(plan: ExecutionPlan) {
    drop(plan);
}

impl StepDriver {
    /// Wraps a scheduler (any path) started with `config`.
    pub fn new(scheduler: LocalSystem, config: &SchedulerConfig) -> Self {
        let page_size = u64::from(config.page_size);
        let kv_events = config.enable_kv_cache_events;
        Self {
            scheduler,
            plan_digests: None,
            counters: Counters::default(),
            measured_ns: 0,
            live: BTreeMap::new(),
            started: HashSet::new(),
            page_size,
            kv_events,
            skip_empty_advance: false,
            l3_lookups: config.l3_prefetch_enabled(),
            measure: true,
            observe: Observe::default(),
        }
    }

    /// Submits requests with the token streams the engine will generate for them.
    pub fn submit(&mut self, batch: Vec<(RequestSpec, Vec<Token>)>) -> Result<u64, KvError> {
        let mut specs = Vec::with_capacity(batch.len());
        for (spec, stream) in batch {
            self.counters.prompt_tokens += spec.tokens.len() as u64;
            self.live.insert(
                spec.id.clone(),
                Live {
                    stream,
                    produced: 0,
                },
            );
            specs.push(spec);
        }
        let t0 = Instant::now();
        // Plans on the virtual clock see every lookup, on every runtime.
        let result = match (self.measure, self.l3_lookups) {
            (true, settle) => measured_submit(&mut self.scheduler, specs, settle),
            (false, true) => self.scheduler.submit_settled(specs),
            (false, false) => self.scheduler.submit(specs),
        };
        let ns = t0.elapsed().as_nanos() as u64;
        self.measured_ns += ns;
        result.map(|()| ns)
    }

    /// Requests submitted and not yet finished or aborted.
    pub fn live(&self) -> usize {
        self.live.len()
    }

    /// Runs one step. A row for a request that is not live fails it.
    pub fn step(&mut self) -> Result<StepOutcome, WorkloadError> {
        let t0 = Instant::now();
        let plan = if self.measure {
            measured_next_plan(&mut self.scheduler)
        } else {
            self.scheduler.next_plan()
        }?;
        let mut ns = t0.elapsed().as_nanos() as u64;
        if let Some(digests) = &mut self.plan_digests {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::hash::DefaultHasher::new();
            plan.hash(&mut hasher);
            digests.push(hasher.finish());
        }
        self.counters.steps += 1;
        self.count_kv_events()?;
        let mut out = StepOutcome {
            empty: plan.is_empty(),
            ..StepOutcome::default()
        };
        let events = self.answer(&plan, &mut out);
        discard(plan);
        let events = events?;
        if !(self.skip_empty_advance && out.empty) {
            let t1 = Instant::now();
            let result = if self.measure {
                measured_advance(&mut self.scheduler, events)
            } else {
                self.scheduler.advance(events)
            };
            ns += t1.elapsed().as_nanos() as u64;
            result?;
            self.count_kv_events()?;
        }
        if self.observe.is_on() {
            let t2 = Instant::now();
            self.observed()?;
            ns += t2.elapsed().as_nanos() as u64;
        }
        self.measured_ns += ns;
        out.ns = ns;
        Ok(out)
    }

    /// What an embedder does after a step: publish the KV events, refresh the metrics.
    fn observed(&mut self) -> Result<(), WorkloadError> {
        let step = self.counters.steps;
        if let Some(sink) = self.observe.kv_events.clone() {
            let events = self.scheduler.take_kv_events()?;
            self.count(&events);
            sink.publish(step as f64, &events);
        }
        if let Some(metrics) = &self.observe.metrics
            && step.is_multiple_of(crate::scenario::METRICS_EVERY)
        {
            crate::scenario::refresh_metrics(&mut self.scheduler, Some(metrics), None, 0.0)
                .map_err(|e| WorkloadError::Options(e.to_string()))?;
        }
        Ok(())
    }

    fn count(&mut self, events: &[kvtier_types::KvEvent]) {
        for event in events {
            match event {
                kvtier_types::KvEvent::BlockStored { .. } => self.counters.kv_blocks_stored += 1,
                kvtier_types::KvEvent::BlockRemoved { .. } => self.counters.kv_blocks_removed += 1,
                // Kinds this engine does not count yet (the enum grows with the wire).
                _ => {}
            }
        }
    }

    /// Drains the scheduler's KV events (outside the timed calls) and counts them; a
    /// run that publishes them drains them in the timed step instead.
    fn count_kv_events(&mut self) -> Result<(), KvError> {
        if !self.kv_events || self.observe.kv_events.is_some() {
            return Ok(());
        }
        let events = self.scheduler.take_kv_events()?;
        self.count(&events);
        Ok(())
    }

    /// Counts the plan and builds the engine's answer.
    fn answer(
        &mut self,
        plan: &ExecutionPlan,
        out: &mut StepOutcome,
    ) -> Result<Vec<EngineEvent>, WorkloadError> {
        let c = &mut self.counters;
        let forward = &plan.forward;
        let has_prefill = forward.num_prefill_rows > 0;
        out.had_prefill = has_prefill;
        let mut events = Vec::with_capacity(plan.write_backs.len() + 2 * forward.rows.len());
        for op in &plan.write_backs {
            let pages = op.pairs.len() as u64;
            c.writeback_ops += 1;
            c.writeback_pages += pages;
            if op.is_retract {
                c.retract_writeback_ops += 1;
                c.retract_writeback_pages += pages;
                c.retractions += 1;
            } else {
                c.finish_writeback_ops += 1;
                c.finish_writeback_pages += pages;
            }
            events.push(EngineEvent::WriteBackDone {
                op_id: op.op_id,
                success: true,
            });
        }
        let lb_pages = plan.load_back_pages() as u64;
        c.loadback_ops += plan.load_backs.len() as u64;
        c.loadback_pages += lb_pages;
        if has_prefill {
            c.hit_tokens_host += lb_pages * self.page_size;
        } else {
            c.recovery_loadback_pages += lb_pages;
        }
        for notice in &plan.aborted {
            if self.live.remove(&notice.request_id).is_some() {
                c.aborts += 1;
                out.aborted.push(notice.request_id.clone());
            }
        }
        if !has_prefill {
            let waiting = self.live.values().filter(|l| l.produced > 0).count() as u64;
            c.starved_decode_slots += waiting.saturating_sub(forward.decode_rows().len() as u64);
        }
        for row in &forward.rows {
            if !self.live.contains_key(&row.request_id) {
                return Err(WorkloadError::UnknownRow(row.request_id.clone()));
            }
            if row.kind == RowKind::Prefill {
                c.prefill_rows += 1;
                if self.started.insert(row.request_id.clone()) {
                    c.hit_tokens += u64::from(row.extend_prefix_len);
                } else {
                    c.non_first_chunks += 1;
                }
            } else {
                c.decode_rows += 1;
            }
            if !engine_rule::yields_token(row) {
                continue;
            }
            let Some(live) = self.live.get_mut(&row.request_id) else {
                return Err(WorkloadError::UnknownRow(row.request_id.clone()));
            };
            let token = live.stream[live.produced];
            live.produced += 1;
            let (generated, max_new) = (live.produced, live.stream.len());
            if engine_rule::push_token(&mut events, &row.request_id, token, generated, max_new) {
                self.live.remove(&row.request_id);
                self.started.remove(&row.request_id);
                c.finished += 1;
                out.finished.push(row.request_id.clone());
            }
        }
        c.hit_tokens_device = c.hit_tokens - c.hit_tokens_host.min(c.hit_tokens);
        Ok(events)
    }
}

/// What a workload run publishes and exports as it goes (see `WorkloadOptions::observe`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observe {
    /// Where the KV events go.
    pub kv_events: Option<crate::scenario::KvEventsSink>,
    /// Where the metrics go.
    pub metrics: Option<crate::scenario::MetricsSink>,
}

impl Observe {
    /// Whether anything is watched.
    pub fn is_on(&self) -> bool {
        self.kv_events.is_some() || self.metrics.is_some()
    }
}

/// Why a workload run failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// The scheduler refused the config.
    #[error(transparent)]
    Config(#[from] SchedError),
    /// The scheduler refused a submit or an event the engine sent.
    #[error(transparent)]
    Refused(#[from] BatchError),
    /// The actor system failed.
    #[error(transparent)]
    System(KvError),
    /// Bad workload options.
    #[error("{0}")]
    Options(String),
    /// The run stopped making progress.
    #[error("workload stalled after {0} steps")]
    Stalled(u64),
    /// The plan ran a row for a request the engine does not know (never submitted,
    /// aborted, or finished).
    #[error("the plan has a row for {0}, which is not live")]
    UnknownRow(RequestId),
}

impl From<KvError> for WorkloadError {
    fn from(e: KvError) -> Self {
        match e {
            KvError::Batch(e) => WorkloadError::Refused(e),
            KvError::Sched(e) => WorkloadError::Config(e),
            other => WorkloadError::System(other),
        }
    }
}
