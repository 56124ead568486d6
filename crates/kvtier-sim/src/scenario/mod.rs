//! Scenario workloads (WORKLOADS.md §7) run through the scheduler with the oracle
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

mod cost;
mod device;
mod instance;
mod l3;
mod model;
mod observe;
mod options;
mod report;

pub use cost::{CostModel, StepWork};
pub use device::{hybrid_oracle_device, oracle_device, scenario_geometry};
pub(crate) use instance::{Instance, Step};
pub use kvtier::metrics::MetricsServer;
use l3::l3_core;
pub use l3::{L3Fault, L3Store};
pub(crate) use l3::{l3_core_over, mooncake_cluster, scratch_dir};

pub use model::{SCENARIO_PAGE_SIZE, SCENARIO_STATE, SCENARIO_STATE_CHUNK, scenario_groups};
pub(crate) use observe::refresh_metrics;
pub use observe::{KvEventsSink, METRICS_EVERY, MetricsSink, StatsObserver, TimelinePoint};
use observe::{prefix_residency, publish_kv_events};
pub use options::{ScenarioOptions, TraceWorkload};
pub use report::{PrefixResidency, ScenarioError, ScenarioReport};

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_types::{RequestId, RequestSpec, Token};

use crate::tokens::{gen_tokens, tag};

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

struct Turn {
    conversation: usize,
    user: Vec<Token>,
}

/// Runs a scenario to completion.
pub fn run_scenario(o: &ScenarioOptions) -> Result<ScenarioReport, ScenarioError> {
    run_scenario_with_progress(o, |_, _| {})
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
