//! A minimal engine for the facade tests: answers plans under
//! `kvtier_types::engine_rule` (finishing requests after a set number of tokens), and
//! acknowledges write-backs.

use std::collections::BTreeMap;

use kvtier::{BlockingHandle, Delivery, Fault, FaultHooks, KvError, Runtime, System};
use kvtier_fsm::Scheduler;
use kvtier_types::{
    EngineEvent, ExecutionPlan, OpId, RequestId, RequestSpec, SchedulerConfig, Token, engine_rule,
};

pub const RUNTIMES: [Runtime; 3] = [Runtime::Actix, Runtime::Deterministic, Runtime::Direct];

/// Small pools, so prefixes are shared, written back, evicted and retracted.
pub fn config() -> SchedulerConfig {
    SchedulerConfig {
        page_size: 4,
        device_pages: 28,
        host_pages: 96,
        max_batch_size: 8,
        max_scheduled_tokens: 48,
        ..SchedulerConfig::default()
    }
}

pub fn start(runtime: Runtime) -> BlockingHandle {
    start_with(runtime, config())
}

pub fn start_with(runtime: Runtime, config: SchedulerConfig) -> BlockingHandle {
    BlockingHandle::new(
        System::builder(config)
            .runtime(runtime)
            .start()
            .expect("system starts"),
    )
}

/// `n` requests `r00..`: a shared 12-token prefix (one of two) and a unique suffix.
pub fn requests(n: usize) -> Vec<RequestSpec> {
    (0..n)
        .map(|i| {
            let mut tokens: Vec<Token> = (0..12).map(|t| 100 + (i % 2) as Token * 50 + t).collect();
            tokens.extend((0..6).map(|t| 1000 + 10 * i as Token + t));
            RequestSpec::new(format!("r{i:02}"), tokens)
        })
        .collect()
}

/// The engine side of the loop.
#[derive(Debug, Default)]
pub struct Engine {
    produced: BTreeMap<RequestId, usize>,
    /// Tokens each request generates before it finishes.
    pub target: usize,
    /// Acknowledge write-backs in the same step (else they are kept in `unacked`).
    pub hold_write_backs: bool,
    pub unacked: Vec<OpId>,
    pub finished: Vec<RequestId>,
}

impl Engine {
    pub fn new(target: usize) -> Self {
        Self {
            target,
            ..Self::default()
        }
    }

    pub fn answer(&mut self, plan: &ExecutionPlan) -> Vec<EngineEvent> {
        let mut events = Vec::new();
        for op in &plan.write_backs {
            if self.hold_write_backs {
                self.unacked.push(op.op_id);
            } else {
                events.push(EngineEvent::WriteBackDone {
                    op_id: op.op_id,
                    success: true,
                });
            }
        }
        for notice in &plan.aborted {
            self.produced.remove(&notice.request_id);
        }
        for row in plan
            .forward
            .rows
            .iter()
            .filter(|r| engine_rule::yields_token(r))
        {
            let produced = self.produced.entry(row.request_id.clone()).or_default();
            *produced += 1;
            let token = 7 + *produced as Token;
            if engine_rule::push_token(&mut events, &row.request_id, token, *produced, self.target)
            {
                self.produced.remove(&row.request_id);
                self.finished.push(row.request_id.clone());
            }
        }
        events
    }

    /// Forgets a request that ended outside `answer` (aborted, or finished by the test).
    pub fn forget(&mut self, id: &RequestId) {
        self.produced.remove(id);
    }

    /// Acks for the write-backs held back.
    pub fn release_acks(&mut self) -> Vec<EngineEvent> {
        self.unacked
            .drain(..)
            .map(|op_id| EngineEvent::WriteBackDone {
                op_id,
                success: true,
            })
            .collect()
    }
}

/// Runs `steps` steps (or until the plan is empty and nothing is live).
pub fn run(handle: &BlockingHandle, engine: &mut Engine, steps: usize) {
    for _ in 0..steps {
        let plan = handle.next_plan().expect("plan");
        let events = engine.answer(&plan);
        if plan.is_empty() && events.is_empty() {
            break;
        }
        handle.advance(events).expect("events accepted");
    }
}

/// A system and the direct-path scheduler (`kvtier_fsm::Scheduler`, same cores without
/// actors) driven in lockstep: every call must give the same answer on both, and the
/// shadow tells the test each request's state, which the API does not expose.
pub struct Lockstep {
    pub handle: BlockingHandle,
    pub shadow: Scheduler,
}

impl Lockstep {
    pub fn new(runtime: Runtime) -> Self {
        Self::with_config(runtime, config())
    }

    pub fn with_config(runtime: Runtime, config: SchedulerConfig) -> Self {
        Self {
            handle: start_with(runtime, config.clone()),
            shadow: Scheduler::new(config).expect("valid config"),
        }
    }

    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let expected = self.shadow.submit(specs.clone()).map_err(KvError::from);
        let got = self.handle.submit(specs);
        assert_eq!(
            got, expected,
            "submit: the system and the direct path differ"
        );
        got
    }

    pub fn next_plan(&mut self) -> ExecutionPlan {
        let expected = self.shadow.next_plan();
        let got = self.handle.next_plan().expect("plan");
        assert_eq!(got, expected, "plan: the system and the direct path differ");
        got
    }

    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        let expected = self.shadow.advance(events.clone()).map_err(KvError::from);
        let got = self.handle.advance(events);
        assert_eq!(
            got, expected,
            "advance: the system and the direct path differ"
        );
        got
    }

    pub fn abort(&mut self, id: &RequestId) -> Result<(), KvError> {
        let expected = self.shadow.abort(id).map_err(KvError::from);
        let got = self.handle.abort(id.clone());
        assert_eq!(
            got, expected,
            "abort {id}: the system and the direct path differ"
        );
        got
    }

    /// The system's scheduler stats, checked against the direct path's, and the
    /// direct path's exact page conservation.
    pub fn stats(&mut self) -> kvtier_fsm::SchedulerStats {
        let got = self.handle.stats().expect("stats").scheduler;
        assert_eq!(
            got,
            self.shadow.stats(),
            "stats differ from the direct path"
        );
        self.shadow
            .check_invariants()
            .expect("the direct path conserves pages");
        got
    }
}

/// Fails the `n`-th delivery of `message`.
#[derive(Debug)]
pub struct FailNth {
    pub message: &'static str,
    pub n: usize,
    pub seen: usize,
}

impl FaultHooks for FailNth {
    fn on_send(&mut self, d: &Delivery) -> Fault {
        if d.message != self.message {
            return Fault::Deliver;
        }
        self.seen += 1;
        if self.seen == self.n {
            Fault::Fail
        } else {
            Fault::Deliver
        }
    }
}

pub use kvtier_tests::tool_from_env;
