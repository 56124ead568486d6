//! The Scheduler actor's side of every call, written once for every runtime.
//!
//! A call opens a [`Conversation`]; the [`Front`] (the scheduler core and what it knows
//! of the system) answers each step with mail to send, a wait, or the call's outcome.
//! It is sans-IO: the direct path delivers the mail in place, the deterministic bus
//! queues it through the fault hooks, actix sends it to the actors' shells. The order of
//! work (the scheduler's batches, "device, then L3" for a plan, shutdown's steps) lives
//! here and nowhere else.
//!
//! One kind of mail belongs to no call: a submission's L3 lookup. Submit answers once
//! its requests wait, looking up, in the core; the runtime sends the lookup on its own
//! ([`Front::take_detached`]) and hands its answer back whenever it comes
//! ([`Front::arrived`]). Answers are applied as the next call that uses the core opens,
//! so a slow store holds its requests back, never the actor, and the same answers before
//! the same calls give the same plans on every runtime.

mod calls;

use std::any::Any;
use std::collections::BTreeSet;

use calls::{executed, stats_answered};
use kvtier_device::NewRequest;
use kvtier_fsm::{FamilyMail, SchedulerCore, SchedulerStats};
use kvtier_l3::{L3Core, L3Reply};
use kvtier_radix::{RadixCore, RadixMsg, RadixReply};
use kvtier_types::{
    ActorCore, ActorName, EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec,
};

use crate::mail::{Answer, Mail};
use crate::{KvError, ShutdownReport, SystemStats};

/// A call of the embedding API.
#[derive(Debug)]
pub(crate) enum Call {
    Submit(Vec<RequestSpec>),
    Advance(Vec<EngineEvent>),
    Abort(RequestId),
    NextPlan,
    Stats,
    TakeKvEvents,
    /// Wait until every L3 lookup sent so far has answered (answers are applied as the
    /// next call that uses the core opens). Runtimes serve it; it sends no mail.
    SettleLookups,
    /// Run a plan's copies and forward rows on the device, and its L3 work on the L3
    /// store.
    Execute(Box<ExecutionPlan>, Vec<NewRequest>),
    /// Move an actor's core out (`Option<C>` in `Outcome::Reply`).
    TakeCore(ActorName),
    /// One message of an actor's own protocol; its reply in `Outcome::Reply`.
    Ask(Mail),
    Shutdown,
}

impl Call {
    /// One message of `C`'s protocol, under the caller's span.
    pub fn ask<C: ActorCore>(msg: C::Msg) -> Self {
        Call::Ask(Mail::to::<C>(msg, &tracing::Span::current()))
    }

    /// Whether the call uses the scheduler core (so no other such call may interleave
    /// with it). The others only pass mail to other actors.
    pub fn uses_core(&self) -> bool {
        !matches!(
            self,
            Call::Execute(..) | Call::TakeCore(_) | Call::Ask(_) | Call::SettleLookups
        )
    }
}

/// What a call answers.
#[derive(Debug)]
pub(crate) enum Outcome {
    Done,
    Plan(Box<ExecutionPlan>),
    Stats(Box<SystemStats>),
    KvEvents(Vec<KvEvent>),
    Events(Vec<EngineEvent>),
    Reply(Box<dyn Any + Send>),
    /// `TakeCore` of an actor the system does not have.
    Absent,
    Report(Box<ShutdownReport>),
}

/// What the runtime does next for a conversation.
#[derive(Debug)]
pub(crate) enum Step {
    /// Deliver these, in order (they may be handled concurrently).
    Send(Vec<Mail>),
    /// Deliver the answer to some mail sent earlier.
    Wait,
    /// The call's outcome.
    Done(Result<Outcome, KvError>),
}

/// One call in progress.
#[derive(Debug)]
pub(crate) struct Conversation {
    stage: Stage,
    /// How many answers the mail last sent brings.
    waiting: usize,
    /// The answers so far but the last, in arrival order.
    answers: Vec<Answer>,
    span: tracing::Span,
}

/// What a conversation knows while its mail is out; the answers complete it.
#[derive(Debug)]
enum Stage {
    /// The scheduler core's family mail is out; `result` is what the call answers when
    /// the core is done.
    Family(Result<(), KvError>),
    Stats(Box<SchedulerStats>),
    KvEvents,
    Execute,
    /// The answer's body is the outcome.
    Forward,
    /// The answer is the actor's core: the system no longer has that actor.
    TakeCore(ActorName),
    Shutdown(Box<ShutdownReport>, Closing),
    Over,
}

/// Shutdown's steps, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closing {
    /// The radix cache checks conservation with nothing held outside it.
    Check,
    /// Every actor but the host allocator drops its core (the cache's host lease goes
    /// home).
    Stop,
    /// The host allocator reports: every page free unless something leaked.
    Host,
}

/// The scheduler core and what the Scheduler actor knows of its system.
#[derive(Debug)]
pub(crate) struct Front {
    core: Option<SchedulerCore>,
    /// Set when a conversation broke off: only shutdown is served then.
    failed: Option<KvError>,
    /// Every actor of the system but the scheduler.
    actors: BTreeSet<ActorName>,
    shut_down: bool,
    /// L3 lookups to send outside any call, by ticket.
    detached: Vec<(u64, Mail)>,
    /// Lookups sent and not yet answered.
    lookups_in_flight: usize,
    /// Lookup answers not yet applied (`None`: lost), in arrival order.
    arrivals: Vec<(u64, Option<Vec<u32>>)>,
}

impl Front {
    pub fn new(core: SchedulerCore, actors: BTreeSet<ActorName>) -> Self {
        Self {
            core: Some(core),
            failed: None,
            actors,
            shut_down: false,
            detached: Vec::new(),
            lookups_in_flight: 0,
            arrivals: Vec::new(),
        }
    }

    /// The L3 lookups to send now, outside any call, each under its ticket. The
    /// runtime hands each one's answer (or delivery failure) to [`Self::arrived`].
    pub fn take_detached(&mut self) -> Vec<(u64, Mail)> {
        std::mem::take(&mut self.detached)
    }

    /// Lookups sent and not yet answered.
    pub fn lookups_in_flight(&self) -> usize {
        self.lookups_in_flight
    }

    /// A lookup's answer, or why none came: kept until the next call that uses the core.
    /// A lost lookup is a miss, never a failure of the system.
    pub fn arrived(&mut self, ticket: u64, answer: Result<Answer, KvError>) {
        self.lookups_in_flight = self.lookups_in_flight.saturating_sub(1);
        let hits = match answer.and_then(|a| a.reply::<L3Core>()) {
            Ok(L3Reply::L3LookedUp {
                ticket: answered,
                hit_pages,
            }) if answered == ticket => Some(hit_pages),
            _ => None,
        };
        self.arrivals.push((ticket, hits));
    }

    /// Applies the lookup answers that arrived.
    fn apply_arrivals(&mut self) {
        if self.arrivals.is_empty() || self.failed.is_some() {
            return;
        }
        if let Some(core) = self.core.as_mut() {
            for (ticket, hits) in self.arrivals.drain(..) {
                core.looked_up(ticket, hits);
            }
        }
    }

    fn alive(&self) -> Result<(), KvError> {
        if self.shut_down {
            return Err(KvError::ShutDown);
        }
        match &self.failed {
            Some(reason) => Err(KvError::Failed(Box::new(reason.clone()))),
            None => Ok(()),
        }
    }

    fn core(&mut self) -> Result<&mut SchedulerCore, KvError> {
        self.alive()?;
        self.core.as_mut().ok_or(KvError::ShutDown)
    }

    fn has(&self, actor: ActorName) -> bool {
        self.actors.contains(&actor)
    }

    /// Opens a conversation for `call`.
    pub fn open(&mut self, call: Call, span: tracing::Span) -> (Conversation, Step) {
        let mut conv = Conversation {
            stage: Stage::Over,
            waiting: 0,
            answers: Vec::new(),
            span,
        };
        let entered = conv.span.clone();
        let _entered = entered.enter();
        if call.uses_core() {
            self.apply_arrivals();
        }
        let step = match self.start(&mut conv, call) {
            Ok(step) => step,
            Err(error) => self.finish(&mut conv, Err(error)),
        };
        (conv, step)
    }

    /// Hands the conversation one answer to its mail; the last one completes the stage.
    pub fn answer(&mut self, conv: &mut Conversation, answer: Answer) -> Step {
        if conv.answers.len() + 1 < conv.waiting {
            conv.answers.push(answer);
            return Step::Wait;
        }
        let entered = conv.span.clone();
        let _entered = entered.enter();
        let stage = std::mem::replace(&mut conv.stage, Stage::Over);
        // The last answer is not stored: a single answer (most mail) allocates nothing.
        let answers = std::mem::take(&mut conv.answers)
            .into_iter()
            .chain(std::iter::once(answer));
        match self.complete(conv, stage, answers) {
            Ok(step) => step,
            Err(error) => self.fault(conv, error),
        }
    }

    /// A delivery of the conversation failed, or an actor is gone.
    pub fn fault(&mut self, conv: &mut Conversation, error: KvError) -> Step {
        if let Stage::Shutdown(report, closing) = &mut conv.stage {
            // Shutdown goes on: what it could not learn is in the report.
            if *closing == Closing::Check {
                report.conservation = Err(error.clone());
            }
            report.failure.get_or_insert(error);
            let closing = *closing;
            let Stage::Shutdown(report, _) = std::mem::replace(&mut conv.stage, Stage::Over) else {
                unreachable!("matched above")
            };
            return self.close(conv, report, closing);
        }
        self.finish(conv, Err(error))
    }

    fn finish(&mut self, conv: &mut Conversation, result: Result<Outcome, KvError>) -> Step {
        conv.stage = Stage::Over;
        conv.waiting = 0;
        conv.answers.clear();
        if let Err(error) = &result
            && error.is_runtime_fault()
            && self.failed.is_none()
        {
            self.failed = Some(error.clone());
        }
        Step::Done(result)
    }

    fn send(&self, conv: &mut Conversation, stage: Stage, mail: Vec<Mail>) -> Step {
        conv.stage = stage;
        conv.waiting = mail.len();
        conv.answers.clear();
        Step::Send(mail)
    }

    fn start(&mut self, conv: &mut Conversation, call: Call) -> Result<Step, KvError> {
        match call {
            Call::Submit(specs) => self.submit(conv, specs),
            Call::SettleLookups => Ok(self.finish(conv, Ok(Outcome::Done))),
            Call::Advance(events) => {
                let result = self.core()?.advance(events).map_err(KvError::from);
                Ok(self.family(conv, result))
            }
            Call::Abort(id) => {
                let result = self.core()?.abort(&id).map_err(KvError::from);
                Ok(self.family(conv, result))
            }
            Call::NextPlan => {
                let mail = self.core()?.plan()?;
                let mail = family_mail(mail, &conv.span);
                Ok(self.send(conv, Stage::Family(Ok(())), mail))
            }
            Call::Stats => self.stats(conv),
            Call::TakeKvEvents => {
                self.core()?;
                let mail = Mail::to::<RadixCore>(RadixMsg::DrainKvEvents, &conv.span);
                Ok(self.send(conv, Stage::KvEvents, vec![mail]))
            }
            Call::Execute(plan, new_requests) => self.execute(conv, plan, new_requests),
            Call::TakeCore(actor) => self.take_core(conv, actor),
            Call::Ask(mail) => self.ask(conv, mail),
            Call::Shutdown => self.shutdown(conv),
        }
    }

    /// Sends the family work an advance or abort queued, if any.
    fn family(&mut self, conv: &mut Conversation, result: Result<(), KvError>) -> Step {
        let mail = match self.core() {
            Ok(core) => core.take_mail(),
            Err(error) => return self.finish(conv, Err(error)),
        };
        if mail.is_empty() {
            return self.finish(conv, result.map(|()| Outcome::Done));
        }
        let mail = family_mail(mail, &conv.span);
        self.send(conv, Stage::Family(result), mail)
    }

    /// Completes a stage with all the answers to its mail.
    fn complete(
        &mut self,
        conv: &mut Conversation,
        stage: Stage,
        mut answers: impl Iterator<Item = Answer>,
    ) -> Result<Step, KvError> {
        let outcome = match stage {
            Stage::Family(result) => return self.family_answered(conv, result, answers),
            Stage::Stats(scheduler) => stats_answered(*scheduler, answers),
            Stage::KvEvents => {
                let answer = answers.next().ok_or_else(nothing_to_wait_for)?;
                let error = unexpected(&answer);
                match answer.reply::<RadixCore>()? {
                    RadixReply::KvEvents(events) => Ok(Outcome::KvEvents(events)),
                    _ => return Err(error),
                }
            }
            Stage::Execute => executed(answers),
            Stage::Forward => {
                let answer = answers.next().ok_or_else(nothing_to_wait_for)?;
                Ok(Outcome::Reply(answer.body))
            }
            Stage::TakeCore(actor) => {
                let answer = answers.next().ok_or_else(nothing_to_wait_for)?;
                // Later calls treat the system as built without it.
                self.actors.remove(&actor);
                Ok(Outcome::Reply(answer.body))
            }
            Stage::Shutdown(report, closing) => {
                return Ok(self.shutdown_answered(conv, report, closing, answers));
            }
            Stage::Over => return Err(nothing_to_wait_for()),
        };
        Ok(self.finish(conv, outcome))
    }
}

/// The scheduler core's family mail as actor mail.
fn family_mail(mail: Vec<FamilyMail>, span: &tracing::Span) -> Vec<Mail> {
    mail.into_iter()
        .map(|one| match one {
            FamilyMail::Radix(batch) => Mail::to::<RadixCore>(RadixMsg::RunBatch(batch), span),
        })
        .collect()
}

/// The error for an answer a stage does not expect.
fn unexpected(answer: &Answer) -> KvError {
    KvError::UnexpectedAnswer {
        from: answer.from,
        answer: answer.name,
    }
}

/// The error of a conversation that waits with no answer to come (a broken protocol).
pub(crate) fn nothing_to_wait_for() -> KvError {
    debug_assert!(false, "a conversation waits with no mail out");
    KvError::UnexpectedAnswer {
        from: ActorName::SCHEDULER,
        answer: "nothing",
    }
}
