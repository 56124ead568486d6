//! The core's side of its conversation with the cache families: the mail that `advance`
//! and `abort` queued, and applying each answer to the requests it concerns.

use kvtier_radix::OpResult;

use crate::draft::Awaiting;
use crate::outbox::{FamilyMail, FamilyReply, Progress, Target};
use crate::request::State;
use crate::{SchedError, SchedulerCore};

impl SchedulerCore {
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
        let mut results = reply.results.into_iter();
        match std::mem::take(&mut self.awaiting) {
            Awaiting::Nothing => Err(SchedError::UnexpectedReply),
            Awaiting::Ops(targets) => {
                self.deliver_all(targets, &mut results)?;
                Ok(Progress::Done)
            }
            Awaiting::Plan(mut draft) => {
                // The queued ops' results come first, the step's own op's (admission or
                // retraction) last.
                self.deliver_all(std::mem::take(&mut draft.targets), &mut results)?;
                let step = results.next().ok_or(SchedError::UnexpectedReply)?;
                self.resume_plan(*draft, step)
            }
        }
    }

    /// Applies the results of queued ops, one per target, in order.
    fn deliver_all(
        &mut self,
        targets: Vec<Target>,
        results: &mut impl Iterator<Item = OpResult>,
    ) -> Result<(), SchedError> {
        for target in targets {
            let result = results.next().ok_or(SchedError::UnexpectedReply)?;
            self.deliver(target, result);
        }
        Ok(())
    }

    /// Applies one op's result. A result for a request that has moved on is dropped,
    /// which releases its handles; an attached write-back nobody wants is rolled back
    /// in the next batch.
    fn deliver(&mut self, target: Target, result: OpResult) {
        match (target, result) {
            (Target::Backup(span), OpResult::Acked { kept, backup }) => {
                drop(kept);
                self.ops.queue_backups(backup, &span);
            }
            (Target::KeepDevice { key, id }, OpResult::Acked { kept, backup }) => {
                self.ops.queue_backups(backup, &tracing::Span::none());
                if self.requests.holds(key, &id)
                    && let State::Retracted(held) = &mut self.requests[key].state
                    && held.device_lock.is_none()
                {
                    held.device_lock = kept;
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
            (Target::Publish { key, id, republish }, OpResult::Published { lock, path_pages }) => {
                if !self.requests.holds(key, &id) {
                    return;
                }
                let Some(run) = self.requests[key].state.running_mut() else {
                    return;
                };
                run.adopt_published(lock, path_pages, &republish);
            }
            (
                Target::PublishDecode {
                    key,
                    id,
                    republish,
                    decode,
                },
                OpResult::PublishedDecode {
                    published,
                    checkpoint,
                },
            ) => {
                if !self.requests.holds(key, &id) {
                    return;
                }
                let Some(run) = self.requests[key].state.running_mut() else {
                    return;
                };
                if decode && let Some((lock, _)) = &published {
                    run.decode_state = Some(lock.node());
                }
                run.take_commit(published, Some(&republish), checkpoint);
            }
            (_, OpResult::Inserted) | (Target::Ignore, _) => {}
            (target, result) => {
                debug_assert!(false, "result {result:?} for {target:?}");
            }
        }
    }
}
