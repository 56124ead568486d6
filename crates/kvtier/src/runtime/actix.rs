//! The actix runtime: one generic [`Shell`] per actor, and the Scheduler actor
//! ([`FrontActor`]) that drives each call's conversation. Actors placed `Shared` run on
//! the scheduler's arbiter (local delivery, no thread hop); the others get arbiters of
//! their own (see [`kvtier_types::Placement`]).

use std::collections::BTreeMap;
use std::pin::Pin;

use actix::prelude::*;
use kvtier_types::{ActorName, Placement};

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

/// The Scheduler actor: the front of every call. Calls that use the scheduler core run
/// inside an atomic response, so no other such call interleaves with them.
#[derive(Debug)]
pub(crate) struct FrontActor {
    front: Front,
    post: Post,
    actors: BTreeMap<ActorName, Addr<Shell>>,
    /// The arbiters of actors on threads of their own.
    arbiters: Vec<Arbiter>,
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
    fn open(&mut self, msg: CallMsg) -> Drive {
        let (conv, step) = self.front.open(msg.call, msg.span);
        self.drive(conv, step)
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
                let step = self.front.fault(&mut conv, super::nothing_to_wait_for());
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
    fn handle(&mut self, msg: CallMsg, _: &mut Context<Self>) -> Self::Result {
        AtomicResponse::new(self.open(msg))
    }
}

impl Handler<PassMsg> for FrontActor {
    type Result = ResponseActFuture<Self, Result<Outcome, KvError>>;
    fn handle(&mut self, msg: PassMsg, _: &mut Context<Self>) -> Self::Result {
        self.open(msg.0)
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
    }
    .start()
}

/// Sends a call to the Scheduler actor: atomically when it uses the core.
pub(crate) async fn call(
    addr: Addr<FrontActor>,
    call: Call,
    span: tracing::Span,
) -> Result<Outcome, KvError> {
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
