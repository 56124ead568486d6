//! The scheduler's side of the cache protocol: ops queued for the next batch, where
//! each result goes, and how a reply is applied.

use kvtier_radix::{CacheBatch, CacheOp, CacheReply, OpResult};
use kvtier_types::{ActorName, ExecutionPlan, PageId, RequestId};

use crate::request::State;
use crate::scheduler::Awaiting;
use crate::{SchedError, SchedulerCore};

/// Where the result of one op goes.
#[derive(Debug)]
pub(crate) enum Target {
    /// Nothing to do with it.
    Ignore,
    /// A write-back ack: queue its backup source, if any.
    Backup,
    /// A failed retract copy: the device lock goes to the retracted request.
    KeepDevice { key: usize, id: RequestId },
    /// A finish: the attached write-back makes the request `Draining`.
    Finish { key: usize, id: RequestId },
    /// A mid-flight publication: the new prefix lock and page table.
    Publish {
        key: usize,
        id: RequestId,
        prefix: u32,
        own: Vec<PageId>,
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

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn take(&mut self) -> (CacheBatch, Vec<Target>) {
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
    /// [`SchedulerCore::resume`].
    Send(Vec<FamilyMail>),
    /// The plan is ready.
    Plan(ExecutionPlan),
}

impl SchedulerCore {
    /// Whether a batch is out and its reply not yet resumed.
    pub fn is_awaiting(&self) -> bool {
        !matches!(self.awaiting, Awaiting::Nothing)
    }

    /// The family work queued by `advance` and `abort`; empty when there is none. The
    /// answers go to [`Self::resume`] before the next call.
    pub fn take_mail(&mut self) -> Vec<FamilyMail> {
        if self.outbox.is_empty() || self.is_awaiting() {
            return Vec::new();
        }
        let (batch, targets) = self.outbox.take();
        self.stats.cache_batches += 1;
        self.awaiting = Awaiting::Ops(targets);
        vec![FamilyMail::Radix(batch)]
    }

    /// Applies a family's answer to the mail last handed out.
    pub fn resume(&mut self, reply: FamilyReply) -> Result<Progress, SchedError> {
        let FamilyReply::Radix(reply) = reply;
        match std::mem::take(&mut self.awaiting) {
            Awaiting::Nothing => Err(SchedError::UnexpectedReply),
            Awaiting::Ops(targets) => {
                let mut results = reply.results.into_iter();
                for target in targets {
                    let Some(result) = results.next() else {
                        return Err(SchedError::UnexpectedReply);
                    };
                    self.deliver(target, result);
                }
                Ok(Progress::Done)
            }
            Awaiting::Plan(progress) => self.resume_plan(*progress, reply),
        }
    }

    /// Applies one op's result. A result for a request that has moved on is dropped,
    /// which releases its handles; an attached write-back nobody wants is rolled back
    /// in the next batch.
    pub(crate) fn deliver(&mut self, target: Target, result: OpResult) {
        match (target, result) {
            (Target::Backup, OpResult::Acked { kept, backup }) => {
                drop(kept);
                self.ops.queue_backups(backup);
            }
            (Target::KeepDevice { key, id }, OpResult::Acked { kept, backup }) => {
                self.ops.queue_backups(backup);
                if self.requests.holds(key, &id)
                    && let State::Retracted(held) = &mut self.requests[key].state
                    && held.dref.is_none()
                {
                    held.dref = kept;
                }
            }
            (Target::Finish { key, id }, OpResult::Finished { write_back }) => {
                let waiting = self.requests.holds(key, &id)
                    && matches!(self.requests[key].state, State::Draining(None));
                if waiting {
                    self.requests[key].state = match write_back {
                        Some(attached) => State::Draining(Some(attached)),
                        None => State::Finished,
                    };
                } else if let Some(attached) = write_back {
                    self.outbox.roll_back(attached.ticket);
                }
            }
            (
                Target::Publish {
                    key,
                    id,
                    prefix,
                    own,
                },
                OpResult::Published { lock, path_pages },
            ) => {
                if !self.requests.holds(key, &id) {
                    return;
                }
                let Some(run) = self.requests[key].state.running_mut() else {
                    return;
                };
                // The new lock replaces the old one, which is released after it: the
                // path is never unpinned.
                run.dref = lock;
                run.prefix_pages = path_pages;
                // Pages another request published first replace the request's own copies.
                let first_changed = run.prefix_pages[prefix as usize..]
                    .iter()
                    .zip(&own)
                    .position(|(tree, mine)| tree != mine)
                    .map(|i| prefix + i as u32);
                if let Some(i) = first_changed {
                    run.table_changed_from = Some(run.table_changed_from.map_or(i, |c| c.min(i)));
                }
            }
            (_, OpResult::Inserted) | (Target::Ignore, _) => {}
            (target, result) => {
                debug_assert!(false, "result {result:?} for {target:?}");
            }
        }
    }
}
