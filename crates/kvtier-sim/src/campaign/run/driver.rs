//! The driver of one run: arrivals, plans, events, client aborts and the checks after
//! every call.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};

use kvtier::KvError;
use kvtier_device::NewRequest;
use kvtier_fsm::SchedError;
use kvtier_types::{
    AbortReason, EngineEvent, ExecutionPlan, KvEvent, Medium, OpId, RequestId, RequestSpec, RowKind,
};

use super::*;
use crate::campaign::coverage::{self, Coverage};
use crate::campaign::faults::LateAcks;
use crate::campaign::spec::{AbortPoint, Prefix, RunSpec};
use crate::campaign::{Check, RunKind};

/// Empty plans in a row, with nothing left to submit, after which a run counts as
/// stalled: the next plan would be the same.
const EMPTY_PLANS: u32 = 50;

/// Drives one run to quiescence, checking each plan as it goes.
pub(super) fn drive(
    spec: &RunSpec,
    kind: RunKind,
    sut: &mut dyn Sut,
    aborts: Aborts,
    expected: Option<&[u64]>,
    late: LateAcks,
) -> Result<RunRecord, Stop> {
    let mut d = Driver {
        spec,
        kind,
        sut,
        aborts,
        late,
        held: Vec::new(),
        step: 0,
        lives: vec![
            Life {
                outcome: Outcome::NotSubmitted,
                prompt: Vec::new(),
                tokens: Vec::new(),
                started: false,
                host_pages: 0,
                abort_done: false,
            };
            spec.requests.len()
        ],
        index: spec
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (RequestId::from(r.name.as_str()), i))
            .collect(),
        record: RunRecord {
            lives: Vec::new(),
            digests: Vec::new(),
            fired: Vec::new(),
            kv_events: Vec::new(),
            coverage: Coverage::default(),
        },
        rows: BTreeSet::new(),
        prefetches: BTreeMap::new(),
        ids: spec
            .requests
            .iter()
            .map(|r| RequestId::from(r.name.as_str()))
            .collect(),
        state_aborts_fired: vec![false; spec.first_in_state.len()],
    };
    d.run(expected)?;
    d.record.lives = d.lives;
    Ok(d.record)
}

struct Driver<'a> {
    spec: &'a RunSpec,
    kind: RunKind,
    sut: &'a mut dyn Sut,
    aborts: Aborts<'a>,
    /// Which acknowledgements the engine holds back.
    late: LateAcks,
    /// Acknowledgements held back: the step they are delivered at, in arrival order.
    held: Vec<(u64, EngineEvent)>,
    step: u64,
    lives: Vec<Life>,
    index: BTreeMap<RequestId, usize>,
    record: RunRecord,
    /// Requests with a row in the current plan.
    rows: BTreeSet<usize>,
    /// Prefetches in flight: pages asked for.
    prefetches: BTreeMap<OpId, usize>,
    /// The requests' ids, by index.
    ids: Vec<RequestId>,
    /// Which of the spec's first-in-state aborts were made.
    state_aborts_fired: Vec<bool>,
}

impl Driver<'_> {
    fn fail(&self, check: Check, detail: String) -> Stop {
        fail(check, self.kind, Some(self.step), detail)
    }

    fn system(&self, what: &str, e: KvError) -> Stop {
        self.fail(Check::System, format!("{what}: {e}"))
    }

    /// The invariants after a call, and the KV events it caused.
    fn checked(&mut self, after: &str) -> Result<(), Stop> {
        if let Err(e) = self.sut.check() {
            return Err(self.fail(Check::Invariant, format!("after {after}: {e}")));
        }
        let events = self.sut.kv_events();
        let removed = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    KvEvent::BlockRemoved {
                        medium: Medium::Device,
                        ..
                    }
                )
            })
            .count();
        self.record.coverage.add("device eviction", removed as u64);
        self.record.kv_events.extend(events);
        // Readable host pages leave the tree only by eviction: every page in it holds
        // some request's tokens, so a request's host match shrinks when one goes.
        if self.sut.host_pages(&[]).is_none() {
            return Ok(());
        }
        let mut evicted = false;
        for life in &mut self.lives {
            if matches!(life.outcome, Outcome::NotSubmitted | Outcome::Refused(_)) {
                continue;
            }
            let sequence = [life.prompt.as_slice(), life.tokens.as_slice()].concat();
            if let Some(pages) = self.sut.host_pages(&sequence) {
                evicted |= pages < life.host_pages;
                life.host_pages = pages;
            }
        }
        self.record
            .coverage
            .add("host eviction", u64::from(evicted));
        Ok(())
    }

    /// The request a plan names in `what`, which only a live request may get.
    fn live(&self, id: &RequestId, what: &str) -> Result<usize, Stop> {
        let i = self.request(id)?;
        match &self.lives[i].outcome {
            Outcome::Live => Ok(i),
            other => Err(self.fail(
                Check::Protocol,
                format!("{what} for {id}, which is {other:?}"),
            )),
        }
    }

    fn request(&self, id: &RequestId) -> Result<usize, Stop> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| self.fail(Check::Protocol, format!("{id} was never submitted")))
    }

    fn run(&mut self, expected: Option<&[u64]>) -> Result<(), Stop> {
        let limit = stall_limit(self.spec);
        let mut empty_plans = 0;
        loop {
            let new_requests = self.arrivals()?;
            let plan = self
                .sut
                .next_plan()
                .map_err(|e| self.system("next_plan", e))?;
            self.checked("next_plan")?;
            if plan.is_empty()
                && !self.to_come()
                && self.sut.idle().map_err(|e| self.system("stats", e))?
            {
                let lost: Vec<&str> = self
                    .lives
                    .iter()
                    .zip(&self.spec.requests)
                    .filter(|(l, _)| l.outcome == Outcome::Live)
                    .map(|(_, r)| r.name.as_str())
                    .collect();
                if lost.is_empty() {
                    return Ok(());
                }
                return Err(self.fail(
                    Check::Protocol,
                    format!("the scheduler is idle, but never finished or aborted {lost:?}"),
                ));
            }
            if self.step >= limit {
                return Err(self.fail(
                    Check::Stalled,
                    format!(
                        "no quiescence after {limit} steps; live requests {}",
                        self.live_requests()
                    ),
                ));
            }
            empty_plans = if plan.is_empty() && !self.to_come() {
                empty_plans + 1
            } else {
                0
            };
            if empty_plans >= EMPTY_PLANS {
                return Err(self.fail(
                    Check::Stalled,
                    format!(
                        "{EMPTY_PLANS} empty plans in a row; live requests {}",
                        self.live_requests()
                    ),
                ));
            }
            self.plan(&plan, expected)?;
            let events = self
                .sut
                .execute(plan, new_requests)
                .map_err(|e| self.system("execute", e))?;
            let events = self.hold_back(events);
            self.aborts_at(Moment::BeforeAdvance)?;
            self.events(&events)?;
            self.sut
                .advance(events)
                .map_err(|e| self.system("advance", e))?;
            self.checked("advance")?;
            self.aborts_at(Moment::AfterAdvance)?;
            self.step += 1;
        }
    }

    /// The live requests, with their states (where known) and the pages their history
    /// needs next (its tokens and one to decode) against the device pool.
    fn live_requests(&self) -> String {
        let ps = u64::from(self.spec.page_size);
        let usable = self.spec.device_pages.saturating_sub(1);
        let live: Vec<String> = self
            .lives
            .iter()
            .zip(&self.ids)
            .filter(|(l, _)| l.outcome == Outcome::Live)
            .map(|(l, id)| {
                let history = (l.prompt.len() + l.tokens.len()) as u64;
                let state = self
                    .sut
                    .state(id)
                    .map_or(String::new(), |s| format!("{s:?}, "));
                format!(
                    "{id} ({state}{history} tokens, {} pages)",
                    (history + 1).div_ceil(ps)
                )
            })
            .collect();
        format!("[{}] of a {usable}-page device pool", live.join(", "))
    }

    /// Whether a request is still to be submitted: not yet due, or a follow-up whose
    /// parent may still answer (parents come first, so one pass settles chains).
    fn to_come(&self) -> bool {
        let mut never = vec![false; self.lives.len()];
        let mut to_come = false;
        for i in 0..self.lives.len() {
            if self.lives[i].outcome != Outcome::NotSubmitted {
                continue;
            }
            never[i] = self.parent(i).is_some_and(|p| {
                never[p]
                    || matches!(
                        self.lives[p].outcome,
                        Outcome::Refused(_) | Outcome::ClientAborted | Outcome::SchedulerAborted(_)
                    )
            });
            to_come |= !never[i];
        }
        to_come
    }

    fn parent(&self, i: usize) -> Option<usize> {
        match &self.spec.requests[i].prefix {
            Prefix::Follows(name) => self.index.get(&RequestId::from(name.as_str())).copied(),
            _ => None,
        }
    }

    /// Submits the requests due at this step; returns them for the engine.
    fn arrivals(&mut self) -> Result<Vec<NewRequest>, Stop> {
        let mut specs = Vec::new();
        let mut due = Vec::new();
        for i in 0..self.spec.requests.len() {
            let r = &self.spec.requests[i];
            if self.lives[i].outcome != Outcome::NotSubmitted || u64::from(r.arrival) > self.step {
                continue;
            }
            let mut prompt = Vec::new();
            if let Some(p) = self.parent(i) {
                match self.lives[p].outcome {
                    Outcome::Finished => {
                        prompt.extend_from_slice(&self.lives[p].prompt);
                        prompt.extend_from_slice(&self.lives[p].tokens);
                    }
                    // Not yet answered, or never will be (then it is never submitted).
                    _ => continue,
                }
            }
            prompt.extend(self.spec.own_prompt(i).unwrap_or_default());
            specs.push(RequestSpec::new(r.name.as_str(), prompt.clone()));
            self.lives[i].prompt = prompt;
            due.push(i);
        }
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let mut refused = BTreeMap::new();
        match self.sut.submit(specs) {
            Ok(()) => {}
            Err(KvError::Batch(batch)) => {
                for r in batch.rejected {
                    // A drawn prompt is never empty or a duplicate: only its length can
                    // be refused.
                    if !matches!(r.error, SchedError::PromptTooLong { .. }) {
                        return Err(self.fail(Check::Protocol, format!("submit: {}", r.error)));
                    }
                    refused.insert(r.index, r.error.to_string());
                }
            }
            Err(e) => return Err(self.system("submit", e)),
        }
        self.checked("submit")?;
        let mut new_requests = Vec::new();
        for (k, &i) in due.iter().enumerate() {
            if let Some(reason) = refused.get(&k) {
                self.lives[i].outcome = Outcome::Refused(reason.clone());
                self.record
                    .coverage
                    .add("submit refused (prompt too long)", 1);
                continue;
            }
            self.lives[i].outcome = Outcome::Live;
            new_requests.push(NewRequest {
                id: RequestId::from(self.spec.requests[i].name.as_str()),
                prompt: self.lives[i].prompt.clone(),
                max_new_tokens: self.spec.requests[i].max_new as usize,
            });
        }
        self.aborts_at(Moment::AfterSubmit)?;
        Ok(new_requests)
    }

    /// Checks a plan against the direct run's and the requests' lives, and counts it.
    fn plan(&mut self, plan: &ExecutionPlan, expected: Option<&[u64]>) -> Result<(), Stop> {
        let mut hasher = std::hash::DefaultHasher::new();
        plan.hash(&mut hasher);
        let digest = hasher.finish();
        if let Some(expected) = expected
            && expected.get(self.record.digests.len()) != Some(&digest)
        {
            return Err(self.fail(
                Check::PathDivergence,
                "the actors' plan differs from the direct path's".into(),
            ));
        }
        self.record.digests.push(digest);
        for notice in &plan.aborted {
            let i = self.live(&notice.request_id, "an abort notice")?;
            self.lives[i].outcome = Outcome::SchedulerAborted(notice.reason);
            let metric = match notice.reason {
                AbortReason::ExceedsDevicePool => "scheduler abort: exceeds device pool",
                AbortReason::HostPoolExhausted => "scheduler abort: host pool exhausted",
                AbortReason::StateLost => "scheduler abort: recurrent state lost",
                AbortReason::ExceedsGroupPool => "scheduler abort: exceeds a group pool",
            };
            self.record.coverage.add(metric, 1);
        }
        self.rows.clear();
        for row in &plan.forward.rows {
            let i = self.live(&row.request_id, "a row")?;
            self.rows.insert(i);
            if row.kind == RowKind::Prefill && !self.lives[i].started {
                self.lives[i].started = true;
                self.record
                    .coverage
                    .add("prefix hit", u64::from(row.extend_prefix_len > 0));
            }
        }
        let c = &mut self.record.coverage;
        let load_backs = plan.load_backs.len() as u64;
        if plan.forward.num_prefill_rows > 0 {
            c.add("host hit (load-back)", load_backs);
        }
        let recovery = plan
            .forward
            .rows
            .iter()
            .any(|row| row.kind == RowKind::Recovery);
        c.add("load-back on recovery", load_backs * u64::from(recovery));
        let finish = plan.write_backs.iter().filter(|op| !op.is_retract).count();
        c.add("finish write-back", finish as u64);
        c.add("L3 prefetch", plan.prefetches.len() as u64);
        for op in &plan.prefetches {
            self.prefetches.insert(op.op_id, op.dst_pages.len());
        }
        Ok(())
    }

    /// Holds back the acknowledgements the engine is late with, and hands over those
    /// due now (before this plan's events: they are older).
    fn hold_back(&mut self, events: Vec<EngineEvent>) -> Vec<EngineEvent> {
        if self.held.is_empty() && !self.late.fires() {
            return events;
        }
        let step = self.step;
        let mut now = Vec::with_capacity(events.len());
        let held = std::mem::take(&mut self.held);
        let (due, later): (Vec<_>, Vec<_>) = held.into_iter().partition(|(at, _)| *at <= step);
        self.held = later;
        now.extend(due.into_iter().map(|(_, event)| event));
        for event in events {
            match self.late.delay(&event) {
                Some(steps) => self.held.push((step + steps, event)),
                None => now.push(event),
            }
        }
        now
    }

    /// Takes a plan's events into the requests' lives.
    fn events(&mut self, events: &[EngineEvent]) -> Result<(), Stop> {
        for event in events {
            match event {
                EngineEvent::ExtendResult { request_id, tokens } => {
                    let i = self.request(request_id)?;
                    // Tokens for a request aborted before this advance are stale.
                    if self.lives[i].outcome == Outcome::Live {
                        self.lives[i].tokens.extend_from_slice(tokens);
                    }
                }
                EngineEvent::Finish { request_id } => {
                    let i = self.request(request_id)?;
                    if self.lives[i].outcome == Outcome::Live {
                        self.lives[i].outcome = Outcome::Finished;
                    }
                }
                EngineEvent::PrefetchDone {
                    op_id,
                    success,
                    completed_pages,
                    ..
                } => {
                    let asked = self.prefetches.remove(op_id).unwrap_or(0);
                    let partial = *success && (*completed_pages as usize) < asked;
                    self.record
                        .coverage
                        .add("L3 partial prefetch", u64::from(partial));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Makes the client aborts due at `moment`.
    fn aborts_at(&mut self, moment: Moment) -> Result<(), Stop> {
        let due: Vec<usize> = match &self.aborts {
            Aborts::Decide => self.decide_all(moment),
            Aborts::Replay(fired) => fired
                .iter()
                .filter(|f| f.step == self.step && f.moment == moment)
                .map(|f| f.request)
                .collect(),
            Aborts::Progress(at) => at
                .iter()
                .filter(|&(&i, &at)| {
                    let life = &self.lives[i];
                    life.outcome == Outcome::Live
                        && !life.abort_done
                        && match at {
                            AtProgress::Submit => moment == Moment::AfterSubmit,
                            AtProgress::FirstRow => {
                                moment == Moment::BeforeAdvance && self.rows.contains(&i)
                            }
                            AtProgress::Tokens(n) => {
                                moment == Moment::AfterAdvance && life.tokens.len() >= n
                            }
                        }
                })
                .map(|(&i, _)| i)
                .collect(),
        };
        for i in due {
            self.abort(i, moment)?;
        }
        Ok(())
    }

    /// The requests the direct run aborts now: by their own drawn points, then the first
    /// request in each drawn state.
    fn decide_all(&mut self, moment: Moment) -> Vec<usize> {
        let mut due: Vec<usize> = (0..self.lives.len())
            .filter(|&i| self.decide(i, moment))
            .collect();
        for (k, abort) in self.spec.first_in_state.iter().enumerate() {
            let when = if abort.before_advance {
                Moment::BeforeAdvance
            } else {
                Moment::AfterAdvance
            };
            if self.state_aborts_fired[k] || moment != when {
                continue;
            }
            let first = (0..self.lives.len()).find(|&i| {
                let life = &self.lives[i];
                !life.abort_done
                    && !due.contains(&i)
                    && matches!(life.outcome, Outcome::Live | Outcome::Finished)
                    && self.sut.state(&self.ids[i]) == Some(abort.state)
            });
            if let Some(i) = first {
                self.state_aborts_fired[k] = true;
                due.push(i);
            }
        }
        due
    }

    /// Whether the direct run aborts request `i` now, by its drawn point.
    fn decide(&self, i: usize, moment: Moment) -> bool {
        let (life, r) = (&self.lives[i], &self.spec.requests[i]);
        let Some(abort) = r.abort else { return false };
        if life.abort_done {
            return false;
        }
        let live = life.outcome == Outcome::Live;
        match abort.at {
            AbortPoint::Submitted => live && moment == Moment::AfterSubmit,
            AbortPoint::Generated(n) => {
                live && moment == Moment::AfterAdvance && life.tokens.len() >= n as usize
            }
            AbortPoint::InState(state) => {
                let when = if abort.before_advance {
                    Moment::BeforeAdvance
                } else {
                    Moment::AfterAdvance
                };
                // A finished request the scheduler still knows (draining or writing
                // back) may be aborted too.
                (live || life.outcome == Outcome::Finished)
                    && moment == when
                    && self.sut.state(&self.ids[i]) == Some(state)
            }
        }
    }

    fn abort(&mut self, i: usize, moment: Moment) -> Result<(), Stop> {
        let id = RequestId::from(self.spec.requests[i].name.as_str());
        let state = self.sut.state(&id);
        self.sut
            .abort(id.clone())
            .map_err(|e| self.system(&format!("abort {id}"), e))?;
        self.checked("abort")?;
        let life = &mut self.lives[i];
        life.abort_done = true;
        if life.outcome == Outcome::Live {
            life.outcome = Outcome::ClientAborted;
        }
        if let Some(state) = state {
            self.record.coverage.add(&coverage::client_abort(state), 1);
        }
        self.record.fired.push(Fired {
            step: self.step,
            moment,
            request: i,
            tokens: self.lives[i].tokens.len(),
        });
        Ok(())
    }
}
