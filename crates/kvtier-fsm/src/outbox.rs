//! The scheduler's side of the cache protocol: ops queued for the next batch and where
//! each result goes, and the mail and replies exchanged with the cache families. The
//! replies are applied by the core (`mail.rs`).

use kvtier_radix::{CacheBatch, CacheOp, CacheReply, NodeLock, StopLock};
use kvtier_types::{ActorName, ExecutionPlan, RequestId};

use crate::request::Republish;

/// Where the result of one op goes.
#[derive(Debug)]
pub(crate) enum Target {
    /// Nothing to do with it.
    Ignore,
    /// A write-back ack: queue its backup source, if any, under this span (the
    /// write-back's).
    Backup(tracing::Span),
    /// A failed retract copy: the device lock goes to the retracted request.
    KeepDevice { key: usize, id: RequestId },
    /// A finish: the attached write-back makes the request `Draining`.
    Finish { key: usize, id: RequestId },
    /// A hybrid decode publication: the new prefix lock and page table, and a fresh
    /// checkpoint.
    PublishDecode {
        key: usize,
        id: RequestId,
        /// Where the published pages sit in the request's page table.
        republish: Republish,
        /// Published by a decode (its state retires at the next one), not a prefill
        /// chunk (whose state may be a shared prompt's).
        decode: bool,
    },
    /// A mid-flight publication: the new prefix lock and page table.
    Publish {
        key: usize,
        id: RequestId,
        /// Where the published pages sit in the request's page table.
        republish: Republish,
    },
}

/// Ops queued for the next batch and their targets, in order.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    ops: Vec<CacheOp>,
    targets: Vec<Target>,
}

impl Outbox {
    pub fn push(&mut self, op: CacheOp, target: Target) {
        self.ops.push(op);
        self.targets.push(target);
    }

    /// Queues the rollback of an attached write-back that will never be issued: its
    /// host pages go back to the pool.
    pub fn roll_back(&mut self, ticket: kvtier_radix::WriteBackTicket) {
        let op = CacheOp::WriteBackAck {
            ticket,
            success: false,
            keep_device: None,
            backup: false,
            demote: None,
        };
        self.push(op, Target::Ignore);
    }

    /// A stopping request's device lock, moved into its decode publication queued in
    /// this batch if there is one: the cache releases it once that publication's lock is
    /// taken and keeps the new lock for the stop op, as the reference moves a request's
    /// lock to each node it publishes (so another request's commit in between counts
    /// this one's lock once, and none once it stopped).
    pub fn hand_over(&mut self, key: usize, id: &RequestId, lock: NodeLock) -> StopLock {
        let queued = self.targets.iter().rposition(
            |t| matches!(t, Target::PublishDecode { key: k, id: i, .. } if *k == key && i == id),
        );
        match queued.map(|at| &mut self.ops[at]) {
            Some(CacheOp::PublishDecode {
                stops: stops @ None,
                ..
            }) => {
                let ticket = key as u64;
                *stops = Some((lock, ticket));
                StopLock::HandedOver(ticket)
            }
            _ => StopLock::Held(lock),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The queued ops as a batch, and their targets: the reply's results match them by
    /// position.
    pub fn take(&mut self) -> (CacheBatch, Vec<Target>) {
        debug_assert_eq!(self.ops.len(), self.targets.len(), "one target per op");
        let ops = std::mem::take(&mut self.ops);
        (CacheBatch { ops }, std::mem::take(&mut self.targets))
    }
}

/// Work for one cache-family actor. A call sends at most one per family: a step's whole
/// work for that actor is one batch.
#[derive(Debug)]
pub enum FamilyMail {
    /// A batch of cache ops for the Radix actor.
    Radix(CacheBatch),
}

impl FamilyMail {
    /// The actor it is addressed to.
    pub fn to(&self) -> ActorName {
        match self {
            FamilyMail::Radix(_) => ActorName::RADIX,
        }
    }
}

/// A family actor's answer to its [`FamilyMail`], tagged by its sender.
#[derive(Debug)]
pub enum FamilyReply {
    /// The Radix actor's results, one per op.
    Radix(CacheReply),
}

/// What a core call needs next.
#[derive(Debug)]
pub enum Progress {
    /// The call is complete.
    Done,
    /// Send this mail (at most one per family actor) and hand each answer to
    /// [`crate::SchedulerCore::resume`].
    Send(Vec<FamilyMail>),
    /// The plan is ready.
    Plan(Box<ExecutionPlan>),
}
