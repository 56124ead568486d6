//! Mail between actors, whatever carries it: a message addressed to an actor by name,
//! its answer tagged by the sender, and the erased destination that hosts any
//! [`ActorCore`]. The runtimes move mail; they never look inside.

use std::any::Any;
use std::collections::BTreeMap;

use kvtier_types::{ActorCore, ActorName, Placement};

use crate::KvError;

/// What a mail asks of its actor: one of its protocol's messages, or a lifecycle step
/// every actor understands.
#[derive(Debug)]
pub(crate) enum Body {
    /// A message of the actor's protocol (its `ActorCore::Msg`, boxed).
    Message(Box<dyn Any + Send>),
    /// Drop the core (its handles go home); the answer is `()`.
    Stop,
    /// Move the core out; the answer is `Option<C>`.
    TakeCore,
}

/// A message on its way to an actor.
#[derive(Debug)]
pub(crate) struct Mail {
    pub to: ActorName,
    /// The message's name, for fault hooks.
    pub name: &'static str,
    pub body: Body,
    /// The caller's span, entered while the actor handles the mail.
    pub span: tracing::Span,
}

impl Mail {
    /// A message of `C`'s protocol.
    pub fn to<C: ActorCore>(msg: C::Msg, span: &tracing::Span) -> Self {
        Self {
            to: C::NAME,
            name: C::message_name(&msg),
            body: Body::Message(Box::new(msg)),
            span: span.clone(),
        }
    }

    /// Drop the core of the actor `to`.
    pub fn stop(to: ActorName, span: &tracing::Span) -> Self {
        Self {
            to,
            name: "Stop",
            body: Body::Stop,
            span: span.clone(),
        }
    }

    /// Move the core of the actor `to` out.
    pub fn take_core(to: ActorName, span: &tracing::Span) -> Self {
        Self {
            to,
            name: "TakeCore",
            body: Body::TakeCore,
            span: span.clone(),
        }
    }
}

/// An actor's answer to one mail, tagged by its sender.
#[derive(Debug)]
pub(crate) struct Answer {
    pub from: ActorName,
    /// The reply's name, for fault hooks.
    pub name: &'static str,
    pub body: Box<dyn Any + Send>,
}

impl Answer {
    /// The reply of `C`'s protocol, or the typed error naming what came instead.
    pub fn reply<C: ActorCore>(self) -> Result<C::Reply, KvError> {
        self.typed::<C::Reply>()
    }

    /// The body as `T`.
    pub fn typed<T: 'static>(self) -> Result<T, KvError> {
        let (from, name) = (self.from, self.name);
        self.body
            .downcast::<T>()
            .map(|b| *b)
            .map_err(|_| KvError::UnexpectedAnswer { from, answer: name })
    }
}

/// An actor's core behind its name: what a runtime delivers mail to.
pub(crate) trait Destination: Send + std::fmt::Debug {
    fn name(&self) -> ActorName;
    fn placement(&self) -> Placement;
    /// Handles one mail inside its span; the answer, or why there is none.
    fn deliver(&mut self, mail: Mail) -> Result<Answer, KvError>;
}

/// The one destination type: any core, until it is stopped or taken out.
#[derive(Debug)]
pub(crate) struct Slot<C>(Option<C>);

impl<C: ActorCore + std::fmt::Debug> Slot<C> {
    pub fn boxed(core: C) -> Box<dyn Destination> {
        Box::new(Self(Some(core)))
    }
}

impl<C: ActorCore + std::fmt::Debug> Destination for Slot<C> {
    fn name(&self) -> ActorName {
        C::NAME
    }

    fn placement(&self) -> Placement {
        C::PLACEMENT
    }

    fn deliver(&mut self, mail: Mail) -> Result<Answer, KvError> {
        let _entered = mail.span.enter();
        let answer = |name, body: Box<dyn Any + Send>| Answer {
            from: C::NAME,
            name,
            body,
        };
        match mail.body {
            Body::Message(msg) => {
                let msg = msg
                    .downcast::<C::Msg>()
                    .map_err(|_| KvError::UnexpectedMessage {
                        to: C::NAME,
                        message: mail.name,
                    })?;
                let core = self.0.as_mut().ok_or(KvError::ActorGone(C::NAME))?;
                let reply = core.handle(*msg);
                Ok(answer(C::reply_name(&reply), Box::new(reply)))
            }
            Body::Stop => {
                self.0 = None;
                Ok(answer("Stopped", Box::new(())))
            }
            Body::TakeCore => Ok(answer("Core", Box::new(self.0.take()))),
        }
    }
}

/// Every actor of a system but the scheduler, by name (sorted: shutdown stops them in
/// a fixed order).
pub(crate) type Destinations = BTreeMap<ActorName, Box<dyn Destination>>;
