//! A member of a cluster: an instance in this process, or one in a process of its own
//! (`replay --instances N --processes`) driven over its stdin and stdout, one JSON
//! object per line. Both ends of that protocol are here: [`Remote`] in the router's
//! process, [`serve`] in the member's.
//!
//! The protocol: the member first says `Ready` with its KV event endpoints; then each
//! `Step` order (the trace requests routed to it since its last step, and the time an
//! idle member waits until) is answered with `Stepped` (whether it went idle, its clock,
//! its outstanding requests, the KV event batches it has published, and the hits of the
//! requests that started); `Finish` with the run's counters.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;

use kvtier::kv_publisher::KvEventPublisher;
use kvtier_types::RequestId;
use serde::{Deserialize, Serialize};

use crate::scenario::{Instance, ScenarioError, ScenarioReport, Step, TraceWorkload};

/// What the cluster loop needs of a member.
pub trait Member {
    /// Its clock (µs of virtual time).
    fn now(&self) -> f64;
    /// An idle member waits until `t` for its next request.
    fn wait_until(&mut self, t: f64);
    /// Requests it holds that are not done.
    fn outstanding(&self) -> u64;
    /// KV event batches it has published (its publisher's sequence numbers `0..`).
    fn published(&self) -> u64;
    /// Steps it has run (idle ones included).
    fn steps(&self) -> u64;
    /// Its publisher's endpoint and replay endpoint.
    fn endpoints(&self) -> (String, Option<String>);
    /// Submits the trace's requests `submit` (indices) and runs one step; whether it
    /// found nothing to do and went idle. `between_steps(step)` runs once the step's
    /// events are applied (in another process: once its answer is in).
    fn step(
        &mut self,
        submit: &[usize],
        between_steps: &mut dyn FnMut(u64),
    ) -> Result<bool, ScenarioError>;
    /// The reused prefix (tokens) of each request that started.
    fn hits(&self) -> &BTreeMap<RequestId, u64>;
    /// The requests that started, in the order they did.
    fn starts(&self) -> &[RequestId];
    /// Ends the run: its counters.
    fn finish(self: Box<Self>) -> Result<ScenarioReport, ScenarioError>;
}

/// An instance in this process, with its KV event publisher.
pub(crate) struct Local {
    pub instance: Instance,
    pub publisher: Arc<KvEventPublisher>,
    pub trace: Arc<TraceWorkload>,
}

impl Member for Local {
    fn now(&self) -> f64 {
        self.instance.now()
    }

    fn wait_until(&mut self, t: f64) {
        self.instance.wait_until(t);
    }

    fn outstanding(&self) -> u64 {
        let r = self.instance.report();
        r.requests - r.refused - r.aborted - self.instance.outputs().len() as u64
    }

    fn published(&self) -> u64 {
        self.publisher.published()
    }

    fn steps(&self) -> u64 {
        self.instance.report().steps
    }

    fn endpoints(&self) -> (String, Option<String>) {
        (
            self.publisher.endpoint().to_owned(),
            self.publisher.replay_endpoint().map(str::to_owned),
        )
    }

    fn step(
        &mut self,
        submit: &[usize],
        between_steps: &mut dyn FnMut(u64),
    ) -> Result<bool, ScenarioError> {
        let batch = submit
            .iter()
            .map(|&i| self.trace.requests[i].spec())
            .collect();
        self.instance.submit(batch)?;
        Ok(matches!(self.instance.step(between_steps)?, Step::Idle))
    }

    fn hits(&self) -> &BTreeMap<RequestId, u64> {
        self.instance.hits()
    }

    fn starts(&self) -> &[RequestId] {
        self.instance.starts()
    }

    fn finish(self: Box<Self>) -> Result<ScenarioReport, ScenarioError> {
        let mut r = self.instance.finish(&[])?;
        r.outputs.clear();
        Ok(r)
    }
}

/// An order to a member process.
#[derive(Debug, Serialize, Deserialize)]
enum Order {
    Step {
        wait_until: Option<f64>,
        submit: Vec<usize>,
    },
    Finish,
}

/// A member process's answer.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Ready {
        endpoint: String,
        replay: Option<String>,
    },
    Stepped {
        idle: bool,
        steps: u64,
        now: f64,
        outstanding: u64,
        published: u64,
        started: Vec<(String, u64)>,
    },
    Finished(Box<Summary>),
    Failed(String),
}

/// The counters a member process sends back (a cluster report reads these).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Summary {
    steps: u64,
    requests: u64,
    finished: u64,
    aborted: u64,
    refused: u64,
    prompt_tokens: u64,
    generated_tokens: u64,
    hit_tokens: u64,
    hit_tokens_host: u64,
    hit_tokens_l3: u64,
    l3_prefetched_bytes: u64,
    l3_backed_up_bytes: u64,
    l3_failed_prefetches: u64,
    l3_lookup_errors: u64,
    l3_failed_backups: u64,
    integrity_errors: u64,
    virtual_s: f64,
    ttft_ms: Vec<f64>,
    ttft_p50_ms: f64,
    ttft_p90_ms: f64,
    output_digest: String,
}

impl Summary {
    fn of(r: &ScenarioReport) -> Self {
        Self {
            steps: r.steps,
            requests: r.requests,
            finished: r.finished,
            aborted: r.aborted,
            refused: r.refused,
            prompt_tokens: r.prompt_tokens,
            generated_tokens: r.generated_tokens,
            hit_tokens: r.hit_tokens,
            hit_tokens_host: r.hit_tokens_host,
            hit_tokens_l3: r.hit_tokens_l3,
            l3_prefetched_bytes: r.l3_prefetched_bytes,
            l3_backed_up_bytes: r.l3_backed_up_bytes,
            l3_failed_prefetches: r.l3_failed_prefetches,
            l3_lookup_errors: r.l3_lookup_errors,
            l3_failed_backups: r.l3_failed_backups,
            integrity_errors: r.integrity_errors,
            virtual_s: r.virtual_s,
            ttft_ms: r.ttft_ms.clone(),
            ttft_p50_ms: r.ttft_p50_ms,
            ttft_p90_ms: r.ttft_p90_ms,
            output_digest: r.output_digest.clone(),
        }
    }

    fn report(self) -> ScenarioReport {
        ScenarioReport {
            steps: self.steps,
            requests: self.requests,
            finished: self.finished,
            aborted: self.aborted,
            refused: self.refused,
            prompt_tokens: self.prompt_tokens,
            generated_tokens: self.generated_tokens,
            hit_tokens: self.hit_tokens,
            hit_tokens_host: self.hit_tokens_host,
            hit_tokens_l3: self.hit_tokens_l3,
            l3_prefetched_bytes: self.l3_prefetched_bytes,
            l3_backed_up_bytes: self.l3_backed_up_bytes,
            l3_failed_prefetches: self.l3_failed_prefetches,
            l3_lookup_errors: self.l3_lookup_errors,
            l3_failed_backups: self.l3_failed_backups,
            integrity_errors: self.integrity_errors,
            virtual_s: self.virtual_s,
            ttft_ms: self.ttft_ms,
            ttft_p50_ms: self.ttft_p50_ms,
            ttft_p90_ms: self.ttft_p90_ms,
            output_digest: self.output_digest,
            ..ScenarioReport::default()
        }
    }
}

fn protocol(what: impl std::fmt::Display) -> ScenarioError {
    ScenarioError::Member(what.to_string())
}

/// A member in a process of its own.
#[derive(Debug)]
pub struct Remote {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
    endpoints: (String, Option<String>),
    now: f64,
    wait: Option<f64>,
    outstanding: u64,
    published: u64,
    steps: u64,
    hits: BTreeMap<RequestId, u64>,
    starts: Vec<RequestId>,
}

impl Remote {
    /// Starts `command` (a process that calls [`serve`]) and waits until it is ready.
    pub fn spawn(mut command: Command) -> Result<Self, ScenarioError> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| protocol(format!("starting a member process: {e}")))?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(protocol("a member process without pipes"));
        };
        let mut member = Self {
            child,
            to,
            from: BufReader::new(from),
            endpoints: (String::new(), None),
            now: 0.0,
            wait: None,
            outstanding: 0,
            published: 0,
            steps: 0,
            hits: BTreeMap::new(),
            starts: Vec::new(),
        };
        match member.read()? {
            Answer::Ready { endpoint, replay } => member.endpoints = (endpoint, replay),
            other => return Err(protocol(format!("a member's first answer was {other:?}"))),
        }
        Ok(member)
    }

    fn send(&mut self, order: &Order) -> Result<(), ScenarioError> {
        let line = serde_json::to_string(order).map_err(protocol)?;
        writeln!(self.to, "{line}")
            .and_then(|()| self.to.flush())
            .map_err(|e| protocol(format!("a member process is gone: {e}")))
    }

    fn read(&mut self) -> Result<Answer, ScenarioError> {
        let mut line = String::new();
        let n = self
            .from
            .read_line(&mut line)
            .map_err(|e| protocol(format!("reading a member: {e}")))?;
        if n == 0 {
            return Err(protocol("a member process ended without answering"));
        }
        match serde_json::from_str(&line).map_err(protocol)? {
            Answer::Failed(why) => Err(protocol(why)),
            answer => Ok(answer),
        }
    }
}

impl Member for Remote {
    fn now(&self) -> f64 {
        self.now
    }

    fn wait_until(&mut self, t: f64) {
        self.now = self.now.max(t);
        self.wait = Some(self.now);
    }

    fn outstanding(&self) -> u64 {
        self.outstanding
    }

    fn published(&self) -> u64 {
        self.published
    }

    fn steps(&self) -> u64 {
        self.steps
    }

    fn endpoints(&self) -> (String, Option<String>) {
        self.endpoints.clone()
    }

    fn step(
        &mut self,
        submit: &[usize],
        between_steps: &mut dyn FnMut(u64),
    ) -> Result<bool, ScenarioError> {
        let order = Order::Step {
            wait_until: self.wait.take(),
            submit: submit.to_vec(),
        };
        self.send(&order)?;
        match self.read()? {
            Answer::Stepped {
                idle,
                steps,
                now,
                outstanding,
                published,
                started,
            } => {
                self.now = now;
                self.steps = steps;
                self.outstanding = outstanding;
                self.published = published;
                for (id, tokens) in started {
                    let id = RequestId::from(id);
                    self.hits.insert(id.clone(), tokens);
                    self.starts.push(id);
                }
                between_steps(steps);
                Ok(idle)
            }
            other => Err(protocol(format!("a member answered a step with {other:?}"))),
        }
    }

    fn hits(&self) -> &BTreeMap<RequestId, u64> {
        &self.hits
    }

    fn starts(&self) -> &[RequestId] {
        &self.starts
    }

    fn finish(mut self: Box<Self>) -> Result<ScenarioReport, ScenarioError> {
        self.send(&Order::Finish)?;
        let answer = self.read()?;
        let _ = self.child.wait();
        match answer {
            Answer::Finished(summary) => Ok(summary.report()),
            other => Err(protocol(format!("a member answered finish with {other:?}"))),
        }
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // A member left behind (the run failed) is stopped, not orphaned.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The member process's side: serves `member` (an instance of this process) to the
/// router's process over `input` and `output` until told to finish.
pub fn serve(
    member: Box<dyn Member>,
    input: impl BufRead,
    mut output: impl Write,
) -> Result<(), ScenarioError> {
    let mut say = |answer: &Answer| -> Result<(), ScenarioError> {
        let line = serde_json::to_string(answer).map_err(protocol)?;
        writeln!(output, "{line}")
            .and_then(|()| output.flush())
            .map_err(|e| protocol(format!("the router's process is gone: {e}")))
    };
    let (endpoint, replay) = member.endpoints();
    say(&Answer::Ready { endpoint, replay })?;
    let mut member = member;
    // How many of the member's starts were answered already.
    let mut reported = 0;
    for line in input.lines() {
        let line = line.map_err(|e| protocol(format!("reading an order: {e}")))?;
        let order: Order = serde_json::from_str(&line).map_err(protocol)?;
        let answer = match order {
            Order::Step { wait_until, submit } => {
                if let Some(t) = wait_until {
                    member.wait_until(t);
                }
                match member.step(&submit, &mut |_| {}) {
                    Ok(idle) => {
                        // The hits of requests that started since the last answer.
                        let new = &member.starts()[reported..];
                        reported += new.len();
                        let started = new
                            .iter()
                            .map(|id| (id.to_string(), member.hits()[id]))
                            .collect();
                        Answer::Stepped {
                            idle,
                            steps: member.steps(),
                            now: member.now(),
                            outstanding: member.outstanding(),
                            published: member.published(),
                            started,
                        }
                    }
                    Err(e) => Answer::Failed(e.to_string()),
                }
            }
            Order::Finish => {
                let answer = match member.finish() {
                    Ok(r) => Answer::Finished(Box::new(Summary::of(&r))),
                    Err(e) => Answer::Failed(e.to_string()),
                };
                return say(&answer);
            }
        };
        say(&answer)?;
    }
    Err(protocol(
        "the router's process closed the orders without finishing",
    ))
}
