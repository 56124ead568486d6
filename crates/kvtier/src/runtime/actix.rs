//! The actix runtime: one generic [`Shell`] per actor, and the Scheduler actor
//! ([`FrontActor`]) that drives each call's conversation. Actors placed `Shared` run on
//! the scheduler's arbiter (local delivery, no thread hop); the others get arbiters of
//! their own (see [`kvtier_types::Placement`]).

use std::collections::BTreeMap;
use std::pin::Pin;

use actix::prelude::*;
use kvtier_types::{ActorName, Placement};
use tokio::sync::oneshot;

use super::{Driver, feed};
use crate::KvError;
use crate::conversation::{Call, Conversation, Front, Outcome, Step};
use crate::faults::Post;
use crate::mail::{Answer, Destination, Destinations, Mail};

/// One mail for a shell.
#[derive(Debug)]
pub(crate) struct Deliver(pub Mail);

impl Message for Deliver {
    type Result = Result<Answer, KvError>;
}

/// The shell of any actor: it owns the core (behind its destination) and hands it each
/// mail.
#[derive(Debug)]
pub(crate) struct Shell {
    actor: Box<dyn Destination>,
    /// Runs on an arbiter of its own, which it stops with itself.
    own_thread: bool,
}

impl Actor for Shell {
    type Context = Context<Self>;
}

impl Handler<Deliver> for Shell {
    type Result = Result<Answer, KvError>;
    fn handle(&mut self, msg: Deliver, ctx: &mut Context<Self>) -> Self::Result {
        let stop = matches!(msg.0.body, crate::mail::Body::Stop);
        let answer = self.actor.deliver(msg.0);
        if stop && self.own_thread {
            // The core is dropped by now; the arbiter's thread ends once this answer is
            // out, instead of idling until the process exits.
            ctx.stop();
            Arbiter::current().stop();
        }
        answer
    }
}

impl Shell {
    pub fn new(actor: Box<dyn Destination>) -> Self {
        Self {
            actor,
            own_thread: false,
        }
    }

    /// Starts a shell on the current arbiter, or on a new one, which it returns to be
    /// joined at shutdown.
    pub fn start_for(
        actor: Box<dyn Destination>,
        own_thread: bool,
    ) -> (Addr<Shell>, Option<Arbiter>) {
        let shell = Shell { actor, own_thread };
        if own_thread {
            let arbiter = Arbiter::new();
            let addr = Shell::start_in_arbiter(&arbiter.handle(), move |_| shell);
            (addr, Some(arbiter))
        } else {
            (shell.start(), None)
        }
    }
}

/// A call for the Scheduler actor.
#[derive(Debug)]
pub(crate) struct CallMsg {
    pub call: Call,
    pub span: tracing::Span,
}

impl Message for CallMsg {
    type Result = Result<Outcome, KvError>;
}

/// A call that only passes mail to other actors ([`Call::uses_core`] is false): it may
/// run beside other calls.
#[derive(Debug)]
pub(crate) struct PassMsg(pub CallMsg);

impl Message for PassMsg {
    type Result = Result<Outcome, KvError>;
}

/// Waits until every L3 lookup sent so far has answered.
#[derive(Debug)]
pub(crate) struct SettleMsg;

impl Message for SettleMsg {
    type Result = Result<Outcome, KvError>;
}

/// The Scheduler actor: the front of every call. Calls that use the scheduler core run
/// inside an atomic response, so no other such call interleaves with them. An L3
/// lookup runs beside them: its answer is a future of the actor's own, polled between
/// calls.
#[derive(Debug)]
pub(crate) struct FrontActor {
    front: Front,
    post: Post,
    actors: BTreeMap<ActorName, Addr<Shell>>,
    /// The arbiters of actors on threads of their own.
    arbiters: Vec<Arbiter>,
    /// Callers of `SettleLookups` waiting for the lookups in flight.
    settling: Vec<oneshot::Sender<()>>,
}

impl FrontActor {
    /// Stops the actors' own threads and waits for them to end. Their thread-local
    /// `System` handles must not be the last ones: dropping the last wakes the system's
    /// controller from a thread whose runtime is already gone, which aborts the process.
    fn join_arbiters(&mut self) {
        for arbiter in self.arbiters.drain(..) {
            arbiter.stop();
            // A panic on that thread was already reported there.
            drop(arbiter.join());
        }
    }
}

impl Drop for FrontActor {
    fn drop(&mut self) {
        self.join_arbiters();
    }
}

impl Actor for FrontActor {
    type Context = Context<Self>;
}

type Drive = Pin<Box<dyn ActorFuture<FrontActor, Output = Result<Outcome, KvError>>>>;

impl FrontActor {
    fn open(&mut self, msg: CallMsg, ctx: &mut Context<Self>) -> Drive {
        let (conv, step) = self.front.open(msg.call, msg.span);
        self.send_lookups(ctx);
        self.drive(conv, step)
    }

    /// Sends the lookups the last call left; each answer comes back as a future of the
    /// actor's own.
    fn send_lookups(&mut self, ctx: &mut Context<Self>) {
        for (ticket, mail) in self.front.take_detached() {
            let to = mail.to;
            let request = match self.post.send(ActorName::SCHEDULER, to, mail.name) {
                Ok(_) => self.actors.get(&to).map(|a| a.send(Deliver(mail))),
                Err(error) => {
                    self.lookup_answered(ticket, Err(error));
                    continue;
                }
            };
            let answer = async move {
                match request {
                    Some(request) => request.await.unwrap_or(Err(KvError::ActorGone(to))),
                    None => Err(KvError::ActorGone(to)),
                }
            };
            ctx.spawn(answer.into_actor(self).map(move |answer, act, _| {
                let answer = answer.and_then(|a| {
                    act.post.send(a.from, ActorName::SCHEDULER, a.name)?;
                    Ok(a)
                });
                act.lookup_answered(ticket, answer);
            }));
        }
    }

    fn lookup_answered(&mut self, ticket: u64, answer: Result<Answer, KvError>) {
        self.front.arrived(ticket, answer);
        if self.front.lookups_in_flight() == 0 {
            for waiting in self.settling.drain(..) {
                // A caller that went away no longer waits.
                let _ = waiting.send(());
            }
        }
    }

    /// Sends the step's mail, hands the answers to the conversation, and goes on until
    /// the call is done.
    fn drive(&mut self, mut conv: Conversation, step: Step) -> Drive {
        let mail = match step {
            Step::Done(result) => {
                if matches!(result, Ok(Outcome::Report(_))) {
                    self.join_arbiters();
                    System::current().stop();
                }
                return Box::pin(fut::ready(result));
            }
            Step::Wait => {
                let step = self
                    .front
                    .fault(&mut conv, crate::conversation::nothing_to_wait_for());
                return self.drive(conv, step);
            }
            Step::Send(mail) => mail,
        };
        // The hooks see every mail before any is sent: a failed one means none is.
        for one in &mail {
            if let Err(error) = self.post.send(ActorName::SCHEDULER, one.to, one.name) {
                let step = self.front.fault(&mut conv, error);
                return self.drive(conv, step);
            }
        }
        let pending: Vec<_> = mail
            .into_iter()
            .map(|one| {
                let to = one.to;
                (to, self.actors.get(&to).map(|a| a.send(Deliver(one))))
            })
            .collect();
        let answers = async move {
            let mut answers = Vec::with_capacity(pending.len());
            for (to, request) in pending {
                answers.push(match request {
                    Some(request) => request.await.unwrap_or(Err(KvError::ActorGone(to))),
                    None => Err(KvError::ActorGone(to)),
                });
            }
            answers
        };
        Box::pin(answers.into_actor(self).then(move |answers, act, _| {
            let step = feed(&mut act.front, &mut act.post, &mut conv, answers);
            act.drive(conv, step)
        }))
    }
}

impl Handler<CallMsg> for FrontActor {
    type Result = AtomicResponse<Self, Result<Outcome, KvError>>;
    fn handle(&mut self, msg: CallMsg, ctx: &mut Context<Self>) -> Self::Result {
        AtomicResponse::new(self.open(msg, ctx))
    }
}

impl Handler<PassMsg> for FrontActor {
    type Result = ResponseActFuture<Self, Result<Outcome, KvError>>;
    fn handle(&mut self, msg: PassMsg, ctx: &mut Context<Self>) -> Self::Result {
        self.open(msg.0, ctx)
    }
}

impl Handler<SettleMsg> for FrontActor {
    type Result = ResponseFuture<Result<Outcome, KvError>>;
    fn handle(&mut self, _: SettleMsg, _: &mut Context<Self>) -> Self::Result {
        if self.front.lookups_in_flight() == 0 {
            return Box::pin(std::future::ready(Ok(Outcome::Done)));
        }
        let (tx, rx) = oneshot::channel();
        self.settling.push(tx);
        Box::pin(async move {
            rx.await.map_err(|_| KvError::ShutDown)?;
            Ok(Outcome::Done)
        })
    }
}

/// Starts every actor on the current actix system. `threaded`: the system has a thread
/// of its own, so `OwnThreadWhenThreaded` actors get arbiters of their own too.
pub(crate) fn start(
    front: Front,
    actors: Destinations,
    post: Post,
    threaded: bool,
) -> Addr<FrontActor> {
    let mut arbiters = Vec::new();
    let actors = actors
        .into_iter()
        .map(|(name, actor)| {
            let own_thread = match actor.placement() {
                Placement::Shared => false,
                Placement::OwnThreadWhenThreaded => threaded,
                Placement::OwnThread => true,
            };
            let (addr, arbiter) = Shell::start_for(actor, own_thread);
            arbiters.extend(arbiter);
            (name, addr)
        })
        .collect();
    FrontActor {
        front,
        post,
        actors,
        arbiters,
        settling: Vec::new(),
    }
    .start()
}

/// Sends a call to the Scheduler actor: atomically when it uses the core.
pub(crate) async fn call(
    addr: Addr<FrontActor>,
    call: Call,
    span: tracing::Span,
) -> Result<Outcome, KvError> {
    if matches!(call, Call::SettleLookups) {
        return addr.send(SettleMsg).await.map_err(|_| KvError::ShutDown)?;
    }
    let msg = CallMsg { call, span };
    let answer = if msg.call.uses_core() {
        addr.send(msg).await
    } else {
        addr.send(PassMsg(msg)).await
    };
    answer.map_err(|_| KvError::ShutDown)?
}

/// Actix on the caller's thread: each call runs the system until it is answered.
pub(crate) struct ActixLocal {
    /// Keeps the system's command channel open until the runner is gone. The caller's
    /// thread-local handle is replaced when it starts another system; without this one,
    /// the last handle could be an actor thread's, dropped as that thread ends, which
    /// wakes the system's controller from a thread whose runtime is gone and aborts.
    _system: System,
    runner: SystemRunner,
    front: Addr<FrontActor>,
}

impl std::fmt::Debug for ActixLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActixLocal").finish_non_exhaustive()
    }
}

impl ActixLocal {
    pub fn new(front: Front, actors: Destinations, post: Post) -> Self {
        let runner = System::new();
        let (system, front) =
            runner.block_on(async move { (System::current(), start(front, actors, post, false)) });
        Self {
            _system: system,
            runner,
            front,
        }
    }
}

impl Driver for ActixLocal {
    fn call(&mut self, call: Call, span: tracing::Span) -> Result<Outcome, KvError> {
        self.runner
            .block_on(self::call(self.front.clone(), call, span))
    }
}

impl Drop for ActixLocal {
    /// A system dropped without `shutdown` is shut down here, so the cores of actors on
    /// threads of their own (the L3 store's client, for one) are dropped and their
    /// threads end, rather than outliving the system. Not while unwinding: a panic in a
    /// drop would abort.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            drop(self.call(Call::Shutdown, tracing::Span::none()));
        }
    }
}
