//! The typed answers of the embedding API, written once: each view ([`crate::Handle`],
//! [`crate::BlockingHandle`], [`crate::LocalSystem`]) turns a method into a
//! [`crate::conversation::Call`] and the [`Outcome`] back into its type here.

use kvtier_types::{ActorCore, ActorName, EngineEvent, ExecutionPlan, KvEvent};

use crate::conversation::Outcome;
use crate::{KvError, ShutdownReport, SystemStats};

fn unexpected(answer: &'static str) -> KvError {
    KvError::UnexpectedAnswer {
        from: ActorName::SCHEDULER,
        answer,
    }
}

impl Outcome {
    pub fn done(self) -> Result<(), KvError> {
        match self {
            Outcome::Done => Ok(()),
            _ => Err(unexpected("not Done")),
        }
    }

    pub fn plan(self) -> Result<ExecutionPlan, KvError> {
        match self {
            Outcome::Plan(plan) => Ok(*plan),
            _ => Err(unexpected("not a plan")),
        }
    }

    pub fn stats(self) -> Result<SystemStats, KvError> {
        match self {
            Outcome::Stats(stats) => Ok(*stats),
            _ => Err(unexpected("not stats")),
        }
    }

    pub fn kv_events(self) -> Result<Vec<KvEvent>, KvError> {
        match self {
            Outcome::KvEvents(events) => Ok(events),
            _ => Err(unexpected("not KV events")),
        }
    }

    pub fn events(self) -> Result<Vec<EngineEvent>, KvError> {
        match self {
            Outcome::Events(events) => Ok(events),
            _ => Err(unexpected("not engine events")),
        }
    }

    pub fn reply<C: ActorCore>(self) -> Result<C::Reply, KvError> {
        match self {
            Outcome::Reply(body) => body
                .downcast::<C::Reply>()
                .map(|b| *b)
                .map_err(|_| unexpected("a reply of another protocol")),
            _ => Err(unexpected("not a reply")),
        }
    }

    pub fn core<C: ActorCore>(self) -> Result<Option<C>, KvError> {
        match self {
            Outcome::Absent => Ok(None),
            Outcome::Reply(body) => body
                .downcast::<Option<C>>()
                .map(|b| *b)
                .map_err(|_| unexpected("another actor's core")),
            _ => Err(unexpected("not a core")),
        }
    }

    pub fn report(self) -> Result<ShutdownReport, KvError> {
        match self {
            Outcome::Report(report) => Ok(*report),
            _ => Err(unexpected("not a report")),
        }
    }
}
