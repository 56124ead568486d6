//! One scheduling step: [`SchedulerCore::plan`], and `resume_plan` when its batch is
//! answered.
//!
//! Order of work (spec/fsm-scheduler.md §5):
//! 1. issue the write-backs of requests that finished since the last plan;
//! 2. forget finished requests;
//! 3. order candidates by (priority class, request id) and admit them one by one under
//!    the token budget and the batch limit;
//! 4. if nothing could run, retract the longest running request.
//!
//! The cache side of admission runs in the radix core as an [`AdmitProgram`]: the
//! candidates in order with the step's limits. There each candidate is first *probed*
//! (read-only) and its page need checked against free plus evictable pages; only then
//! is the match committed, cache evicted and pages allocated. A candidate that cannot
//! run changes nothing. The scheduler then applies the outcomes in the same order:
//! state transitions, rows, load-back and prefetch ops.
//!
//! A plan is one batch: the queued ops, the mid-flight publications and the admission
//! program. Only when nothing could run does a second batch retract a request.

mod admission;
mod commits;
mod retraction;
mod rows;
mod write_backs;

use std::time::Instant;

use kvtier_radix::{CacheOp, OpResult};
use kvtier_types::ExecutionPlan;

use crate::draft::{Awaiting, Entry, PlanInProgress, Rows, Seen};
use crate::outbox::{FamilyMail, Progress};
use crate::request::StateKind;
use crate::{SchedError, SchedulerCore};

/// Priority class of a state (lower runs first).
fn class(kind: StateKind, mixed: bool) -> Option<u8> {
    Some(match kind {
        StateKind::Decoding | StateKind::PrefillDone => {
            if mixed {
                0
            } else {
                3
            }
        }
        StateKind::Prefilling => 1,
        // A request whose prefetch landed runs like a new one (reference PR #293).
        StateKind::Submitted | StateKind::PrefetchDone => 2,
        StateKind::Retracted => 4,
        StateKind::Aborting => 9,
        StateKind::LookingUp
        | StateKind::Draining
        | StateKind::Prefetching
        | StateKind::Retracting
        | StateKind::WritingBack
        | StateKind::Finished => return None,
    })
}

impl SchedulerCore {
    /// Starts the next execution plan: the mail to send to the cache families. Their
    /// answers go to [`Self::resume`], which answers with the plan or, rarely, more mail.
    pub fn plan(&mut self) -> Result<Vec<FamilyMail>, SchedError> {
        if self.is_awaiting() {
            return Err(SchedError::Busy);
        }
        let started = Instant::now();
        self.stats.plans += 1;
        self.ops.forget_load_backs();
        self.voided.clear();
        let mut plan = ExecutionPlan {
            aborted: std::mem::take(&mut self.notices),
            ..ExecutionPlan::default()
        };
        let mut seen = Seen::default();
        self.issue_finish_write_backs(&mut plan, &mut seen);
        self.ops
            .issue_backups(&mut plan.backups, self.config.enable_kv_cache_events);
        let released = self.requests.erase_finished(self.stats.plans) > 0;
        self.give_up_regrown(&mut plan);
        let at_next_row = self.config.policy.commits_chunks_at_the_next_row();
        match &self.config.mamba {
            // The reference commits a paged request's chunk when its next op is
            // admitted, as a hybrid one's.
            None if at_next_row && self.config.paged.is_some() => {}
            None if self.config.publish_prefix_mid_flight || self.config.paged.is_some() => {
                self.publish_computed_prompts()
            }
            // The reference publishes a hybrid request's chunk when its next row is
            // admitted, after this plan's new requests looked for it.
            Some(_) if !at_next_row => self.commit_computed_chunks(),
            _ => {}
        }
        let (program, candidates, entries) = self.admit_program(released);
        let (mut batch, targets) = self.outbox.take();
        batch.ops.push(CacheOp::Admit(program));
        self.stats.cache_batches += 1;
        self.awaiting = Awaiting::Plan(Box::new(PlanInProgress {
            plan,
            seen,
            rows: Rows {
                // Sized once: growing these row by row cost more than filling them.
                decode: Vec::with_capacity(
                    candidates.len().min(self.config.max_batch_size as usize),
                ),
                page_table: Vec::with_capacity(self.page_table_hint),
                ..Rows::default()
            },
            candidates,
            entries,
            targets,
            retract: None,
            started,
        }));
        Ok(vec![FamilyMail::Radix(batch)])
    }

    /// Goes on with a plan once its batch is answered: `step` is the result of the
    /// batch's last op (the admission program, or the retraction); the other results
    /// are already delivered.
    pub(crate) fn resume_plan(
        &mut self,
        mut draft: PlanInProgress,
        step: OpResult,
    ) -> Result<Progress, SchedError> {
        match (draft.retract.take(), step) {
            (None, OpResult::Admitted(outcomes)) => {
                if outcomes.len()
                    != draft
                        .entries
                        .iter()
                        .filter(|e| !matches!(e, Entry::None))
                        .count()
                {
                    return Err(SchedError::UnexpectedReply);
                }
                self.apply_admissions(&mut draft, outcomes);
                let nothing_ran = draft.rows.prefill.is_empty() && draft.rows.decode.is_empty();
                if nothing_ran
                    && !draft.candidates.is_empty()
                    && let Some(batch) = self.retract_one(&mut draft)
                {
                    self.stats.cache_batches += 1;
                    self.awaiting = Awaiting::Plan(Box::new(draft));
                    return Ok(Progress::Send(vec![FamilyMail::Radix(batch)]));
                }
            }
            (Some(retraction), OpResult::Retracted(outcome)) => {
                self.apply_retraction(&mut draft, retraction, outcome);
            }
            _ => return Err(SchedError::UnexpectedReply),
        }
        Ok(Progress::Plan(Box::new(self.finish_plan(draft))))
    }

    fn finish_plan(&mut self, draft: PlanInProgress) -> ExecutionPlan {
        let PlanInProgress {
            mut plan,
            mut rows,
            started,
            ..
        } = draft;
        let forward = &mut plan.forward;
        forward.num_prefill_rows = rows.prefill.len();
        // Prefill rows come first; a decode-only step (most steps) moves its rows in
        // without copying them.
        forward.rows = if rows.prefill.is_empty() {
            rows.decode
        } else {
            rows.prefill.append(&mut rows.decode);
            rows.prefill
        };
        self.page_table_hint = rows.page_table.len();
        forward.page_table = rows.page_table;
        forward.input_ids = rows.input_ids;
        forward.shifted_input_ids = rows.shifted_input_ids;
        if !rows.decode_groups.is_empty() || !rows.prefill_groups.is_empty() {
            rows.prefill_groups.append(&mut rows.decode_groups);
            forward.group_tables = rows.prefill_groups;
            debug_assert!(
                forward
                    .group_tables
                    .len()
                    .is_multiple_of(forward.rows.len().max(1)),
                "every row of a paged model carries every group"
            );
        }
        self.idle_plans = if plan.is_empty() {
            self.idle_plans + 1
        } else {
            0
        };
        let elapsed = started.elapsed();
        self.stats.step_duration.observe(elapsed);
        if let Some(threshold) = self.config.slow_step_threshold
            && elapsed >= threshold
        {
            tracing::info!(
                target: "kvtier::step",
                plan = self.stats.plans,
                elapsed_us = elapsed.as_micros() as u64,
                rows = plan.forward.rows.len(),
                prefill_rows = plan.forward.num_prefill_rows,
                write_backs = plan.write_backs.len(),
                load_backs = plan.load_backs.len(),
                "slow_step"
            );
        }
        plan
    }
}
