//! Shared helpers of the kvtier-fsm integration tests (ports of the reference
//! scheduler's FSM and scheduling tests; see docs/test-inventory/fsm.md).
//!
//! * [`fixture`] is the C++ `integration_test_helper.h` fixture (ps 2, device 32,
//!   host 32, budget 64, batch 8, d 1) with L3 off; tests adjust fields with struct
//!   update syntax.
//! * [`tokens`] is the C++ token helper: `start..start+n`.
//! * [`Engine`] answers a plan per the engine rules of WORKLOADS.md §1.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;

use kvtier_fsm::{BatchError, SchedError, Scheduler, StateKind};
use kvtier_types::{
    EngineEvent, ExecutionPlan, ForwardRow, OpId, RequestId, RequestSpec, RowKind, SchedulerConfig,
    Tier, Token, engine_rule,
};

/// The C++ fixture: ps 2, device 32, host 32, budget 64, batch 8, threshold 2, d 1.
/// L3 is off (no test here exercises it; the L3 tier is a separate issue).
pub fn fixture() -> SchedulerConfig {
    SchedulerConfig {
        page_size: 2,
        device_pages: 32,
        host_pages: 32,
        max_scheduled_tokens: 64,
        max_batch_size: 8,
        prefetch_threshold: 2,
        decode_input_tokens: 1,
        ..SchedulerConfig::default()
    }
}

/// The fixture of `python/tests/test_fsm_and_scheduling.py`: ps 16, device 1024, host 0
/// (so the L2 cache is disabled), budget 64, batch 8, d 1.
pub fn python_fixture() -> SchedulerConfig {
    SchedulerConfig {
        page_size: 16,
        device_pages: 1024,
        host_pages: 0,
        disable_l2_cache: true,
        max_scheduled_tokens: 64,
        max_batch_size: 8,
        decode_input_tokens: 1,
        ..SchedulerConfig::default()
    }
}

/// A scheduler over `config` (which must be valid).
pub fn sched(config: SchedulerConfig) -> Scheduler {
    Scheduler::new(config).expect("valid test config")
}

/// Tokens `start, start+1, …` (`n` of them).
pub fn tokens(start: Token, n: usize) -> Vec<Token> {
    (0..n as Token).map(|i| start + i).collect()
}

/// A request id.
pub fn rid(id: &str) -> RequestId {
    RequestId::new(id)
}

/// Submits one request and expects it to be accepted.
pub fn submit(s: &mut Scheduler, id: &str, prompt: Vec<Token>) {
    s.submit(vec![RequestSpec::new(id, prompt)])
        .expect("request accepted");
}

/// Applies events and expects every one to be accepted.
pub fn advance(s: &mut Scheduler, events: Vec<EngineEvent>) {
    s.advance(events).expect("events accepted");
}

/// The single error of a one-item batch.
pub fn single_error(result: Result<(), BatchError>) -> SchedError {
    let err = result.expect_err("the item is refused");
    assert_eq!(err.rejected.len(), 1, "{err:?}");
    err.rejected[0].error.clone()
}

pub fn extend(id: &str, toks: &[Token]) -> EngineEvent {
    EngineEvent::ExtendResult {
        request_id: rid(id),
        tokens: toks.to_vec(),
    }
}

pub fn finish(id: &str) -> EngineEvent {
    EngineEvent::Finish {
        request_id: rid(id),
    }
}

pub fn abort(id: &str) -> EngineEvent {
    EngineEvent::Abort {
        request_id: rid(id),
    }
}

pub fn reserve(id: &str, tokens: u32) -> EngineEvent {
    EngineEvent::UpdateReserve {
        request_id: rid(id),
        tokens,
    }
}

pub fn wb_done(op_id: OpId, success: bool) -> EngineEvent {
    EngineEvent::WriteBackDone { op_id, success }
}

/// Acknowledges every write-back of `plan` with `success`.
pub fn ack_write_backs(s: &mut Scheduler, plan: &ExecutionPlan, success: bool) {
    let events = plan
        .write_backs
        .iter()
        .map(|op| wb_done(op.op_id, success))
        .collect();
    advance(s, events);
}

/// The row of `id` in `plan`, if any.
pub fn row<'a>(plan: &'a ExecutionPlan, id: &str) -> Option<&'a ForwardRow> {
    plan.forward
        .rows
        .iter()
        .find(|r| r.request_id.as_str() == id)
}

/// The row of `id`, which must be present.
pub fn row_of<'a>(plan: &'a ExecutionPlan, id: &str) -> &'a ForwardRow {
    row(plan, id).unwrap_or_else(|| panic!("no row for {id} in {:?}", plan.forward.rows))
}

/// Request ids of the rows, in row order.
pub fn row_ids(plan: &ExecutionPlan) -> Vec<String> {
    plan.forward
        .rows
        .iter()
        .map(|r| r.request_id.to_string())
        .collect()
}

/// Row kinds, in row order.
pub fn row_kinds(plan: &ExecutionPlan) -> Vec<RowKind> {
    plan.forward.rows.iter().map(|r| r.kind).collect()
}

/// The state of `id` (panics if unknown).
pub fn state(s: &Scheduler, id: &str) -> StateKind {
    s.request_state(&rid(id))
        .unwrap_or_else(|| panic!("request {id} is unknown"))
}

/// Free device pages.
pub fn free_device(s: &mut Scheduler) -> u32 {
    s.stats().available_device_pages
}

/// Free host pages.
pub fn free_host(s: &mut Scheduler) -> u32 {
    s.stats().available_host_pages
}

/// Free pages of each paged-cache group, by group id (panics without groups).
pub fn group_free(s: &mut Scheduler) -> BTreeMap<String, u32> {
    let report = s.stats().groups.expect("a paged scheduler");
    report
        .groups
        .iter()
        .map(|g| (g.id.clone(), g.free_pages))
        .collect()
}

/// Pages of `tier` held by the tree and locked by someone.
pub fn locked_pages(s: &mut Scheduler, tier: Tier) -> u64 {
    let stats = s.stats(); // applies pending lock releases first
    let cached = match tier {
        Tier::Device => stats.cached_device_pages,
        Tier::Host => stats.cached_host_pages,
    };
    cached - s.cache().evictable(tier)
}

/// Exact page conservation and tree invariants.
pub fn check(s: &mut Scheduler) {
    if let Err(e) = s.check_invariants() {
        panic!("invariant violated: {e}");
    }
}

/// Builds a plan, answers it with `engine` and applies the answer.
pub fn step(s: &mut Scheduler, engine: &mut Engine) -> ExecutionPlan {
    let plan = s.next_plan();
    let events = engine.answer(&plan);
    advance(s, events);
    plan
}

/// The simulated engine of WORKLOADS.md §1:
/// 1. every write-back op is acknowledged (`success = true` unless configured), first;
/// 2. load-backs need no reply;
/// 3. the forward rows are answered under `kvtier_types::engine_rule` (one token on a
///    last-chunk prefill row and on every decode/recovery row, `Finish` with the
///    request's `max_new`-th), tokens counting up from `next_token`;
/// 4. no `UpdateReserve`.
#[derive(Debug)]
pub struct Engine {
    /// The next generated token id (incremented after each).
    pub next_token: Token,
    /// Tokens each request generates before `Finish` (default for unlisted ids).
    pub default_max_new: usize,
    /// Per-request overrides of `default_max_new`.
    pub max_new: BTreeMap<String, usize>,
    /// Generated tokens per request so far.
    pub produced: BTreeMap<String, usize>,
    /// Requests that received `Finish`.
    pub finished: Vec<String>,
    /// Whether write-backs are acknowledged at all.
    pub ack_write_backs: bool,
    /// The `success` flag of acknowledgements.
    pub write_back_success: bool,
}

impl Default for Engine {
    fn default() -> Self {
        Self {
            next_token: 1000,
            default_max_new: usize::MAX,
            max_new: BTreeMap::new(),
            produced: BTreeMap::new(),
            finished: Vec::new(),
            ack_write_backs: true,
            write_back_success: true,
        }
    }
}

impl Engine {
    /// An engine whose requests generate `max_new` tokens each.
    pub fn with_max_new(max_new: usize) -> Self {
        Self {
            default_max_new: max_new,
            ..Self::default()
        }
    }

    /// The events answering `plan`.
    pub fn answer(&mut self, plan: &ExecutionPlan) -> Vec<EngineEvent> {
        let mut events = Vec::new();
        if self.ack_write_backs {
            for op in &plan.write_backs {
                events.push(wb_done(op.op_id, self.write_back_success));
            }
        }
        for op in &plan.backups {
            events.push(EngineEvent::BackupDone {
                op_id: op.op_id,
                success: true,
            });
        }
        for r in plan
            .forward
            .rows
            .iter()
            .filter(|r| engine_rule::yields_token(r))
        {
            let id = r.request_id.to_string();
            let token = self.next_token;
            self.next_token += 1;
            let produced = self.produced.entry(id.clone()).or_insert(0);
            *produced += 1;
            let limit = self
                .max_new
                .get(&id)
                .copied()
                .unwrap_or(self.default_max_new);
            if engine_rule::push_token(&mut events, &r.request_id, token, *produced, limit) {
                self.finished.push(id);
            }
        }
        events
    }
}

/// Steps until `done` holds, at most `limit` steps; returns the plans seen.
pub fn run_until(
    s: &mut Scheduler,
    engine: &mut Engine,
    limit: usize,
    mut done: impl FnMut(&mut Scheduler, &ExecutionPlan) -> bool,
) -> Vec<ExecutionPlan> {
    let mut plans = Vec::new();
    for _ in 0..limit {
        let plan = step(s, engine);
        let stop = done(s, &plan);
        plans.push(plan);
        if stop {
            return plans;
        }
    }
    panic!("condition not reached within {limit} steps");
}

/// Steps until the scheduler is idle (nothing live, nothing in flight).
pub fn drain(s: &mut Scheduler, engine: &mut Engine, limit: usize) -> Vec<ExecutionPlan> {
    if s.is_idle() {
        return Vec::new();
    }
    run_until(s, engine, limit, |s, _| s.is_idle())
}

/// d 0, device 3 (2 usable pages), host 32.
pub fn d0_device3() -> SchedulerConfig {
    SchedulerConfig {
        decode_input_tokens: 0,
        device_pages: 3,
        ..fixture()
    }
}

/// r1 (prompt 1..4) decodes with 6 tokens and asks for 3 reserved slots: its next
/// decode needs 2 pages while the 2 usable pages are its own. Returns the plan that
/// retracts it.
pub fn retract_r1(s: &mut Scheduler) -> ExecutionPlan {
    submit(s, "r1", tokens(1, 4));
    s.next_plan();
    advance(s, vec![extend("r1", &[5])]);
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").kind, RowKind::Decode);
    advance(s, vec![extend("r1", &[6]), reserve("r1", 3)]);
    s.next_plan()
}
