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

use std::time::Instant;

use kvtier_radix::{
    Admission, AdmitProgram, Attached, CacheBatch, CacheOp, CheckpointNeed, ChunkCommit,
    GroupTables, Intent, OpResult, Outcome, PrefetchCheck, RetractOutcome, RetractedHandles,
    TokenRef,
};
use kvtier_types::{
    AbortNotice, AbortReason, ExecutionPlan, LoadBackOp, OpId, Policy, PrefetchOp, RequestId,
    RowKind, StateObject, TransferKind, TransferPair, WriteBackOp,
};

use crate::draft::{Awaiting, Entry, PlanInProgress, Resume, Retraction, Rows, Seen};
use crate::ops::WriteBackInFlight;
use crate::outbox::{FamilyMail, Progress, Target};
use crate::request::{LocalKv, Prefetch, Republish, Retracted, Running, Settled, State, StateKind};
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
        match (&self.config.mamba, self.config.policy) {
            // The reference commits a paged request's chunk when its next op is
            // admitted, as a hybrid one's.
            (None, p) if p.is_reference() && self.config.paged.is_some() => {}
            (None, _) if self.config.publish_prefix_mid_flight || self.config.paged.is_some() => {
                self.publish_computed_prompts()
            }
            // The reference publishes a hybrid request's chunk when its next row is
            // admitted, after this plan's new requests looked for it.
            (Some(_), Policy::Default) => self.commit_computed_chunks(),
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

    fn issue_finish_write_backs(&mut self, plan: &mut ExecutionPlan, seen: &mut Seen) {
        // In the order the finishes came; one aborted since is no longer draining.
        let draining: Vec<usize> = self
            .finishing
            .drain(..)
            .filter(|(key, id)| {
                self.requests.holds(*key, id)
                    && matches!(self.requests[*key].state, State::Draining(_))
            })
            .map(|(key, _)| key)
            .collect();
        debug_assert_eq!(
            draining.len(),
            self.requests
                .keys_where(|r| matches!(r.state, State::Draining(_)))
                .len(),
            "every draining request is in the finish order"
        );
        for key in draining {
            let State::Draining(Some(attached)) =
                std::mem::replace(&mut self.requests[key].state, State::Finished)
            else {
                debug_assert!(false, "a finish reply was not applied before the plan");
                continue;
            };
            if attached.pairs.is_empty() {
                self.outbox.push(
                    CacheOp::WriteBackAck {
                        ticket: attached.ticket,
                        success: true,
                        keep_device: None,
                        backup: false,
                        demote: None,
                    },
                    Target::Ignore,
                );
                continue;
            }
            let id = self.requests[key].id.clone();
            let op = self.issue_write_back(attached, id, false, plan, seen);
            self.requests[key].state = State::WritingBack { op };
        }
    }

    /// Emits a write-back op for attached copies; the op table keeps its ticket (which
    /// pins the copy) until the engine acknowledges it.
    fn issue_write_back(
        &mut self,
        attached: Attached,
        request: RequestId,
        is_retract: bool,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) -> OpId {
        let span = match self.requests.key_of(&request) {
            Some(key) => crate::ops::copy_span(
                &self.requests[key].span,
                if is_retract {
                    "retract_copy"
                } else {
                    "write_back"
                },
                attached.pairs.len(),
            ),
            None => tracing::Span::none(),
        };
        let op_id = self.ops.issue_write_back(WriteBackInFlight {
            request: Some(request),
            ticket: attached.ticket,
            device_node: attached.device_node,
            is_retract,
            depends_on: Vec::new(),
            span,
        });
        let (pairs, carried_by) = seen.new_write_back_pairs(op_id, attached.pairs);
        self.ops.depends_on(op_id, carried_by);
        plan.write_backs.push(WriteBackOp {
            op_id,
            pairs,
            is_retract,
        });
        op_id
    }

    /// Tells the engine the scheduler gave up on a request (already released).
    fn abort_notice(
        &mut self,
        request_id: RequestId,
        reason: AbortReason,
        plan: &mut ExecutionPlan,
    ) {
        self.stats.scheduler_aborts += 1;
        plan.aborted.push(AbortNotice { request_id, reason });
    }

    /// Mid-flight publication: every request still in prefill publishes the full pages of
    /// the chunks it has already computed, before any candidate is probed, so a sibling
    /// with the same prefix admitted in this very plan reuses them.
    fn publish_computed_prompts(&mut self) {
        let ps = self.config.page_size;
        let prefilling: Vec<usize> = self
            .requests
            .keys()
            .filter(|&k| {
                matches!(
                    self.requests[k].state,
                    State::Prefilling(_) | State::PrefillDone(_)
                )
            })
            .collect();
        for key in prefilling {
            let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
            let Some(run) = state.running_mut() else {
                self.requests[key].state = state;
                continue;
            };
            let computed = run.window_end() / ps;
            let cap = match self.config.paged {
                // Snapshots make a paged model's every prefix safe to reuse.
                Some(_) => None,
                None => self.config.midflight_publish_max_pages,
            };
            let computed = cap.map_or(computed, |cap| computed.min(cap));
            let publication = self.requests[key].publication(run, computed, ps);
            self.requests[key].state = state;
            if let Some((publication, republish)) = publication {
                let id = self.requests[key].id.clone();
                self.outbox.push(
                    CacheOp::Publish(publication),
                    Target::Publish { key, id, republish },
                );
            }
        }
    }

    /// Hybrid models: every request in prefill commits the chunks it has computed —
    /// their pages with its checkpoint, cached where it holds the state at their end —
    /// before any candidate is probed, so a sibling admitted in this plan reuses them.
    fn commit_computed_chunks(&mut self) {
        let prefilling = self
            .requests
            .keys_where(|r| matches!(r.state, State::Prefilling(_) | State::PrefillDone(_)));
        for key in prefilling {
            // No new page: the checkpoint holds no state worth caching, and goes.
            let (Some(commit), Some(republish)) = self.chunk_commit(key) else {
                continue;
            };
            let ChunkCommit {
                publication: Some(publication),
                checkpoint,
                ..
            } = *commit
            else {
                continue;
            };
            self.queue_publication(key, (publication, *republish), checkpoint, None, false);
        }
    }

    /// Candidates in scheduling order: priority class, then request id. One buffer
    /// sized once; the stable sort keeps id order within a class and is linear when
    /// one class dominates (a steady decode batch).
    fn candidates(&self) -> Vec<(u8, usize)> {
        let mixed = self.config.enable_mixed_prefill_decode;
        let mut ranked = Vec::with_capacity(self.requests.len());
        for key in self.requests.keys() {
            if let Some(c) = class(self.requests[key].state.kind(), mixed) {
                ranked.push((c, key));
            }
        }
        ranked.sort_by_key(|&(c, _)| c);
        ranked
    }

    /// The step's admission program: one intent per candidate that can run.
    /// `released`: requests finished since the last plan.
    fn admit_program(&mut self, released: bool) -> (AdmitProgram, Vec<usize>, Vec<Entry>) {
        let c = &self.config;
        let ps = c.page_size;
        let prefetch_on = c.l3_prefetch_enabled();
        let threshold = c.prefetch_threshold;
        let hybrid = c.mamba.is_some();
        let paged = c.paged.is_some();
        let reference = c.policy.is_reference();
        let ranked = self.candidates();
        let mut intents = Vec::with_capacity(ranked.len());
        let mut candidates = Vec::with_capacity(ranked.len());
        let mut entries = Vec::with_capacity(ranked.len());
        for (_, key) in ranked {
            let r = &self.requests[key];
            let entry = match &r.state {
                State::Prefilling(run) => {
                    let (remaining, tail_free) =
                        (r.prefill_len - run.window_end(), run.local_kv.tail_free);
                    let tables = run.tables.as_ref().map(|t| (t.key(), run.window_end()));
                    // The reference commits the last chunk when this one is admitted;
                    // kvtier did at the start of the plan.
                    let (commit, republish) = if (hybrid || paged) && reference {
                        self.chunk_commit(key)
                    } else {
                        (None, None)
                    };
                    let checkpoint = if hybrid {
                        CheckpointNeed::Required
                    } else {
                        CheckpointNeed::None
                    };
                    intents.push(Intent::NextChunk {
                        remaining,
                        tail_free,
                        commit,
                        checkpoint,
                        tables,
                    });
                    Entry::NextChunk(republish)
                }
                State::Submitted | State::PrefetchDone => {
                    let full = r.full_pages_except_last(ps);
                    let hit = r.storage_hit_pages.min(full);
                    let prefetch = (prefetch_on && hit > 0 && matches!(r.state, State::Submitted))
                        .then(|| PrefetchCheck {
                            tokens: TokenRef::new(&r.tokens, (hit * ps) as usize),
                            threshold,
                        });
                    intents.push(Intent::FirstChunk {
                        tokens: TokenRef::new(&r.tokens, (full * ps) as usize),
                        prefill_len: r.prefill_len,
                        prefetch,
                        denied: r.denied.map(Box::new),
                    });
                    Entry::FirstChunk
                }
                State::PrefillDone(run) | State::Decoding(run) => {
                    let (reserve, tail_free) = (run.reserve, run.local_kv.tail_free);
                    // A paged decode row computes the newest token's entries (position
                    // `len - 1`); the reference admits and acquires its groups one
                    // position further on, as if the row computed `len`. Under the
                    // reference's order its first decode also commits its last chunk.
                    let len = r.tokens.len() as u32;
                    let (tables, paged_first) = match (paged, &run.tables) {
                        (true, Some(t)) => (
                            Some((t.key(), if reference { len } else { len - 1 })),
                            reference && matches!(r.state, State::PrefillDone(_)),
                        ),
                        _ => (None, false),
                    };
                    let mut checkpoint = CheckpointNeed::None;
                    let (mut commit, mut republish) = (None, None);
                    if let Some(states) = &run.states {
                        let first = matches!(r.state, State::PrefillDone(_));
                        // kvtier gives a decode row a checkpoint slot when its new length
                        // ends a page (its state there is cached with the page); the
                        // reference gives the first decode one, which it never fills.
                        let crossing =
                            kvtier_mamba::decode_checkpoint_depth(r.tokens.len() as u32, ps)
                                .is_some();
                        checkpoint = match reference {
                            true if first => CheckpointNeed::Required,
                            false if crossing && states.checkpoint.is_none() => {
                                CheckpointNeed::Wanted
                            }
                            _ => CheckpointNeed::None,
                        };
                        if first && reference {
                            (commit, republish) = self.chunk_commit(key);
                        }
                    }
                    // A paged request's last chunk, under the reference's order.
                    if paged_first {
                        (commit, republish) = self.chunk_commit(key);
                    }
                    intents.push(Intent::Decode {
                        reserve,
                        tail_free,
                        commit,
                        checkpoint,
                        tables,
                    });
                    Entry::Decode(republish)
                }
                State::Retracted(_) => {
                    let State::Retracted(held) =
                        std::mem::replace(&mut self.requests[key].state, State::Finished)
                    else {
                        unreachable!("matched above");
                    };
                    let Retracted {
                        prefix_lock,
                        device_lock,
                        local_kv,
                        published_pages,
                        tables,
                    } = held;
                    let r = &self.requests[key];
                    // Every token but the last has been computed.
                    let computed = (r.tokens.len() as u32).saturating_sub(1);
                    let LocalKv { pages, tail_free } = local_kv;
                    intents.push(Intent::Recovery {
                        tokens: TokenRef::new(&r.tokens, (published_pages * ps) as usize),
                        tail_free,
                        kept: Box::new(RetractedHandles {
                            locks: std::iter::once(prefix_lock).chain(device_lock).collect(),
                            tail: pages,
                        }),
                        computed,
                        tables: tables.as_ref().map(GroupTables::key),
                    });
                    Entry::Recovery(Box::new(Resume {
                        tail_free,
                        published_pages,
                        tables,
                    }))
                }
                _ => Entry::None,
            };
            candidates.push(key);
            entries.push(entry);
        }
        let program = AdmitProgram {
            budget: i64::from(self.config.max_scheduled_tokens),
            max_rows: self.config.max_batch_size as usize,
            slots: self.slots.available(),
            mixed: self.config.enable_mixed_prefill_decode,
            decode_tokens: self.config.decode_input_tokens,
            use_host: self.config.l2_enabled(),
            reuse: !self.config.disable_prefix_cache,
            released,
            intents,
        };
        (program, candidates, entries)
    }

    /// A hybrid request's last chunk to commit with its next row: its computed full pages
    /// (those of the chunk window, not the generated token's) and its checkpoint.
    fn chunk_commit(&mut self, key: usize) -> (Option<Box<ChunkCommit>>, Option<Box<Republish>>) {
        let ps = self.config.page_size;
        let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let Some(run) = state.running_mut() else {
            self.requests[key].state = state;
            return (None, None);
        };
        let computed = run.window_end() / ps;
        let publication = self.requests[key].publication(run, computed, ps);
        let checkpoint = run.states.as_mut().and_then(|s| s.take_checkpoint());
        // Nothing new to publish: the tables commit again where the request's published
        // prefix ends (not while a publication is still in flight, which committed them
        // further on).
        let recommit = match (&publication, &run.tables) {
            (None, Some(t)) if run.published_ahead == 0 => Some((t.key(), run.device_lock.node())),
            _ => None,
        };
        self.requests[key].state = state;
        let (publication, republish) = match publication {
            Some((p, r)) => (Some(p), Some(Box::new(r))),
            None => (None, None),
        };
        (
            Some(Box::new(ChunkCommit {
                publication,
                checkpoint,
                recommit,
            })),
            republish,
        )
    }

    /// Applies the admission outcomes in candidate order.
    fn apply_admissions(&mut self, draft: &mut PlanInProgress, outcomes: Vec<Outcome>) {
        let mut outcomes = outcomes.into_iter();
        let candidates = std::mem::take(&mut draft.candidates);
        let entries = std::mem::take(&mut draft.entries);
        for (&key, entry) in candidates.iter().zip(entries) {
            if matches!(entry, Entry::None) {
                continue;
            }
            let outcome = outcomes.next().expect("one outcome per intent");
            match (entry, outcome) {
                // Decode apart from the next chunk: it is the hot arm (merged, W2 cost
                // 1.3 % more per step).
                (
                    Entry::Decode(republish),
                    Outcome::Grown {
                        tokens,
                        pages,
                        committed,
                        groups,
                    },
                ) => {
                    if let Some(committed) = committed {
                        self.apply_commit(key, *committed, republish);
                    }
                    let pages = pages.map_or_else(kvtier_host::OwnedPages::empty, |p| *p);
                    self.decode(key, tokens, pages, &mut draft.rows);
                    if let Some(groups) = groups {
                        draft.rows.set_groups(false, *groups);
                    }
                }
                (
                    Entry::NextChunk(republish),
                    Outcome::Grown {
                        tokens,
                        pages,
                        committed,
                        groups,
                    },
                ) => {
                    if let Some(committed) = committed {
                        self.apply_commit(key, *committed, republish);
                    }
                    let pages = pages.map_or_else(kvtier_host::OwnedPages::empty, |p| *p);
                    self.next_chunk(key, tokens, pages, &mut draft.rows);
                    if let Some(groups) = groups {
                        draft.rows.set_groups(true, *groups);
                    }
                }
                (
                    Entry::NextChunk(_) | Entry::Decode(_),
                    Outcome::Waits {
                        commit: Some(commit),
                        ..
                    },
                ) => self.restore_commit(key, *commit),
                (Entry::FirstChunk, Outcome::Prefetch(start)) => {
                    let kvtier_radix::PrefetchStart {
                        host_lock,
                        pages,
                        start_page,
                        state,
                    } = *start;
                    let fetch = Prefetch {
                        op: 0,
                        host_lock,
                        pages,
                        start_page,
                        state,
                    };
                    self.start_prefetch(key, fetch, &mut draft.plan);
                }
                (Entry::FirstChunk, Outcome::Denied(denial)) => {
                    self.requests[key].denied = Some(denial);
                }
                (Entry::FirstChunk, Outcome::Admitted(admission)) => {
                    self.first_chunk(key, *admission, draft);
                }
                (Entry::Recovery(resume), Outcome::Admitted(admission)) => {
                    self.recovery(key, *resume, *admission, draft);
                }
                (Entry::Recovery(resume), Outcome::StaysRetracted(kept)) => {
                    let Resume {
                        tail_free,
                        published_pages,
                        tables,
                    } = *resume;
                    let RetractedHandles { locks, tail } = *kept;
                    let local_kv = LocalKv {
                        pages: tail,
                        tail_free,
                    };
                    let mut held = locks.into_iter();
                    if let Some(prefix_lock) = held.next() {
                        self.requests[key].state = State::Retracted(Retracted {
                            prefix_lock,
                            device_lock: held.next(),
                            local_kv,
                            published_pages,
                            tables,
                        });
                    } else {
                        debug_assert!(false, "a recovery's locks did not come back");
                    }
                }
                (Entry::Recovery(resume), Outcome::TooBig) => {
                    // Even an empty device pool could not hold it again: give up, and say so.
                    drop(resume);
                    let id = self.requests[key].id.clone();
                    self.abort_notice(id, AbortReason::ExceedsDevicePool, &mut draft.plan);
                }
                (Entry::Recovery(resume), Outcome::Recompute) => {
                    // Its state cannot be restored exactly: compute its history again from
                    // the deepest cached state.
                    drop(resume);
                    self.requeue(key, &mut draft.plan);
                }
                (Entry::Recovery(resume), Outcome::StateLost) => {
                    drop(resume);
                    let id = self.requests[key].id.clone();
                    self.abort_notice(id, AbortReason::StateLost, &mut draft.plan);
                }
                (_, Outcome::Waits { .. }) => {}
                (entry, outcome) => {
                    debug_assert!(false, "outcome {outcome:?} for {entry:?}");
                }
            }
        }
        draft.candidates = candidates;
    }

    // ----- hybrid chunk commits ----------------------------------------------------------

    /// Applies a committed chunk to its request: the published prefix (its new lock and
    /// page table) and the fresh checkpoint.
    fn apply_commit(
        &mut self,
        key: usize,
        committed: kvtier_radix::Committed,
        republish: Option<Box<Republish>>,
    ) {
        let kvtier_radix::Committed {
            published,
            checkpoint,
        } = committed;
        let Some(run) = self.requests[key].state.running_mut() else {
            debug_assert!(false, "a commit for a request not running");
            return;
        };
        run.take_commit(published, republish.as_deref(), checkpoint);
    }

    /// Queues the publication of a running request's computed pages with the state at
    /// their end (`CacheOp::PublishDecode`); `retire` is its previous decode state.
    pub(crate) fn queue_publication(
        &mut self,
        key: usize,
        (publication, republish): (kvtier_radix::Publication, Republish),
        checkpoint: Option<(kvtier_mamba::Slot, Option<u32>)>,
        retire: Option<kvtier_radix::NodeId>,
        decode: bool,
    ) {
        let id = self.requests[key].id.clone();
        self.outbox.push(
            CacheOp::PublishDecode {
                publication,
                checkpoint,
                // A decode row that ends the next page gets a slot then.
                renew: false,
                retire,
                stops: None,
            },
            Target::PublishDecode {
                key,
                id,
                republish,
                decode,
            },
        );
    }

    /// A commit that was not admitted comes back: the pages go back in front of the
    /// request's own, the checkpoint back to its pair.
    fn restore_commit(&mut self, key: usize, commit: ChunkCommit) {
        let Some(run) = self.requests[key].state.running_mut() else {
            debug_assert!(false, "a commit for a request not running");
            return;
        };
        let ChunkCommit {
            publication,
            checkpoint,
            ..
        } = commit;
        if let Some(p) = publication {
            run.landed(p.pages.len());
            let mut pages = p.pages;
            let rest = pages.append(&mut run.local_kv.pages);
            debug_assert!(rest.is_ok(), "pages of another pool");
            run.local_kv.pages = pages;
        }
        if let (Some(states), Some((slot, at))) = (run.states.as_mut(), checkpoint) {
            states.checkpoint = Some(slot);
            states.checkpoint_at = at;
        }
    }

    /// Records where the request's current prefill chunk leaves a state in its
    /// checkpoint slot (the checkpoint rule the worker applies).
    fn track_checkpoint(&self, run: &mut Running) {
        let (begin, size) = (run.window_begin, run.window_size);
        let (ps, chunk) = (
            self.config.page_size,
            self.config.mamba.map_or(1, |m| m.chunk),
        );
        if let Some(states) = run.states.as_mut()
            && states.checkpoint.is_some()
        {
            states.checkpoint_at = kvtier_mamba::checkpoint_depth(begin, size, ps, chunk);
        }
    }

    // ----- Prefilling → next chunk -----------------------------------------------------

    fn next_chunk(
        &mut self,
        key: usize,
        tokens: u32,
        pages: kvtier_host::OwnedPages,
        rows: &mut Rows,
    ) {
        let ps = self.config.page_size;
        let reference = self.reference_policy();
        let prefill_len = self.requests[key].prefill_len;
        let State::Prefilling(mut run) =
            std::mem::replace(&mut self.requests[key].state, State::Finished)
        else {
            debug_assert!(false, "next chunk of a request not prefilling");
            return;
        };
        let begin = run.take_row_begin(reference);
        run.local_kv.absorb(pages, tokens, ps);
        run.window_begin = run.window_end();
        run.window_size = tokens;
        run.reserve = self.config.decode_input_tokens;
        self.track_checkpoint(&mut run);
        rows.push_prefill_row(&self.requests[key], &run, begin, None, None);
        let done = run.window_end() == prefill_len;
        self.requests[key].state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
    }

    // ----- Submitted → Prefetching ------------------------------------------------------

    /// An L3 prefetch instead of the first chunk: the op names the pages by hashes
    /// derived from the tokens at the current host boundary, so they align whatever the
    /// engine's own hashes were.
    fn start_prefetch(&mut self, key: usize, mut fetch: Prefetch, plan: &mut ExecutionPlan) {
        let ps = self.config.page_size;
        let n = fetch.pages.len() as u32;
        let end = ((fetch.start_page + n) * ps) as usize;
        let page_hashes = kvtier_types::hash::rolling_page_hashes(
            None,
            &self.requests[key].tokens[..end],
            ps as usize,
        )
        .split_off(fetch.start_page as usize);
        fetch.op = self.ops.next_id();
        // A hybrid prefix's state is the one after its last page.
        let state = fetch.state.as_ref().and_then(|slot| {
            Some(StateObject {
                slot: slot.id(),
                page_hash: *page_hashes.last()?,
            })
        });
        plan.prefetches.push(PrefetchOp {
            op_id: fetch.op,
            request_id: self.requests[key].id.clone(),
            dst_pages: fetch.pages.ids().to_vec(),
            page_hashes,
            state,
        });
        self.requests[key].enter_phase("prefetching");
        self.requests[key].state = State::Prefetching(fetch);
    }

    // ----- Submitted → first chunk -----------------------------------------------------

    fn first_chunk(&mut self, key: usize, admission: Admission, draft: &mut PlanInProgress) {
        let ps = self.config.page_size;
        let Some(slot) = self.slots.allocate() else {
            debug_assert!(false, "the program counted a free slot");
            return;
        };
        let prefill_len = self.requests[key].prefill_len;
        let (states, cow_src, branching) = match admission.states {
            Some(grant) => (Some(grant.states), grant.cow_src, grant.branching),
            None => (None, None, None),
        };
        let mut run = Running {
            device_lock: admission.device_lock,
            host_lock: admission.host_lock,
            prefix_pages: admission.prefix_pages,
            local_kv: LocalKv {
                pages: admission.pages,
                tail_free: admission.tail_free,
            },
            slot,
            window_begin: admission.begin_pages * ps,
            window_size: admission.tokens,
            reserve: self.config.decode_input_tokens,
            table_changed_from: None,
            published_ahead: 0,
            states,
            decode_state: None,
            tables: admission.tables,
        };
        self.track_checkpoint(&mut run);
        if let Some(slot) = cow_src {
            self.ops.record_copy(self.requests[key].id.clone(), slot);
        }
        draft
            .rows
            .push_prefill_row(&self.requests[key], &run, 0, cow_src, branching);
        draft.rows.set_groups(true, admission.groups);
        self.count_hits(
            key,
            run.window_begin,
            &admission.load_back,
            [admission.capped_pages, admission.dropped_pages],
        );
        self.requests[key].enter_phase("prefilling");
        let done = run.window_end() == prefill_len;
        self.requests[key].state = if done {
            State::PrefillDone(run)
        } else {
            State::Prefilling(run)
        };
        self.push_load_back(key, admission.load_back, &mut draft.plan, &mut draft.seen);
    }

    fn push_load_back(
        &mut self,
        key: usize,
        pairs: Vec<TransferPair>,
        plan: &mut ExecutionPlan,
        seen: &mut Seen,
    ) {
        if pairs.is_empty() {
            return;
        }
        let span = crate::ops::copy_span(&self.requests[key].span, "load_back", pairs.len());
        let pairs = seen.new_load_back_pairs(pairs);
        let dsts = |kind: TransferKind| {
            pairs
                .iter()
                .filter(|pair| pair.kind == kind)
                .map(|pair| pair.dst)
                .collect()
        };
        let op_id =
            self.ops
                .issue_load_back(dsts(TransferKind::Kv), dsts(TransferKind::Mamba), span);
        plan.load_backs.push(LoadBackOp { op_id, pairs });
    }

    // ----- decode ----------------------------------------------------------------------

    #[inline]
    fn decode(
        &mut self,
        key: usize,
        reserve: u32,
        pages: kvtier_host::OwnedPages,
        rows: &mut Rows,
    ) {
        let ps = self.config.page_size;
        let reference = self.reference_policy();
        let d = self.config.decode_input_tokens;
        // The row's new length: a state there is copied to the checkpoint.
        let new_len = self.requests[key].tokens.len() as u32;
        // In place: a decoding request's state is large and decodes are the hot path.
        let state = &mut self.requests[key].state;
        let from_prefill_done = matches!(state, State::PrefillDone(_));
        let Some(run) = state.running_mut() else {
            debug_assert!(false, "decode of a request not running");
            return;
        };
        let begin = run.take_row_begin(reference);
        run.local_kv.absorb(pages, reserve, ps);
        run.reserve = d;
        if let Some(states) = run.states.as_mut() {
            states.row_ends_at(new_len, ps);
        }
        let r = &self.requests[key];
        if let Some(run) = r.state.running() {
            rows.push_decode_row(r, run, RowKind::Decode, begin, d, None);
        }
        if from_prefill_done {
            self.requests[key].enter_phase("decoding");
            let state = &mut self.requests[key].state;
            if let State::PrefillDone(run) = std::mem::replace(state, State::Finished) {
                *state = State::Decoding(run);
            }
        }
    }

    // ----- retraction and recovery -----------------------------------------------------

    /// Preempts the running request with the most tokens (ties: scheduling order): the
    /// batch that retracts it. `None` when there is none to preempt (then a retracted
    /// request may be requeued to recompute).
    fn retract_one(&mut self, draft: &mut PlanInProgress) -> Option<CacheBatch> {
        let mut victim: Option<(usize, usize)> = None;
        for &key in &draft.candidates {
            let r = &self.requests[key];
            if matches!(r.state.kind(), StateKind::Decoding | StateKind::PrefillDone)
                && victim.is_none_or(|(_, len)| r.tokens.len() > len)
            {
                victim = Some((key, r.tokens.len()));
            }
        }
        let Some((key, _)) = victim else {
            self.requeue_for_recompute(draft);
            return None;
        };
        let run = match std::mem::replace(&mut self.requests[key].state, State::Finished) {
            State::PrefillDone(run) | State::Decoding(run) => run,
            other => {
                self.requests[key].state = other;
                return None;
            }
        };
        self.stats.retractions += 1;
        self.requests[key].enter_phase("retracted");
        let Settled {
            states,
            publication,
            device_lock,
            host_lock,
            local_kv,
            tables,
        } = self.requests[key].settle(run, self.config.page_size, !self.reference_policy());
        let published_pages = (publication.tokens.len() / self.config.page_size as usize) as u32;
        // The reference keeps a retracted request's group tables and resumes it from
        // them; kvtier's own policy recomputes it from its deepest snapshot.
        let (tables, kept) = if self.reference_policy() {
            (None, tables)
        } else {
            (tables, None)
        };
        draft.retract = Some(Retraction {
            key,
            local_kv,
            published_pages,
            tables: kept,
        });
        Some(CacheBatch {
            ops: vec![CacheOp::Retract {
                publication,
                device_lock,
                host_lock,
                states,
                tables,
            }],
        })
    }

    fn apply_retraction(
        &mut self,
        draft: &mut PlanInProgress,
        retraction: Retraction,
        outcome: RetractOutcome,
    ) {
        let Retraction {
            key,
            local_kv,
            published_pages,
            tables,
        } = retraction;
        let id = self.requests[key].id.clone();
        match outcome {
            RetractOutcome::Kept {
                prefix_lock: host_lock,
                write_back: Some(attached),
            } => {
                let op =
                    self.issue_write_back(attached, id, true, &mut draft.plan, &mut draft.seen);
                self.requests[key].state = State::Retracting {
                    op,
                    host_lock,
                    local_kv,
                    published_pages,
                    tables,
                };
            }
            RetractOutcome::Kept {
                prefix_lock,
                write_back: None,
            } => {
                self.requests[key].state = State::Retracted(Retracted {
                    prefix_lock,
                    device_lock: None,
                    local_kv,
                    published_pages,
                    tables,
                });
            }
            RetractOutcome::HostExhausted => {
                // The host pool cannot take the prefix. The reference gives up on the
                // request (kvtier says so in the plan); by default it computes its
                // history again instead, like the deadlock breaker's victim: its tail
                // pages go, its prefix stays as evictable cache, nothing is lost.
                drop((local_kv, tables));
                if self.reference_policy() {
                    self.abort_notice(id, AbortReason::HostPoolExhausted, &mut draft.plan);
                } else {
                    self.requeue(key, &mut draft.plan);
                }
            }
        }
    }

    /// Breaks a deadlock the reference scheduler can reach: nothing ran, nothing is
    /// running to retract, no write-back is in flight, and retracted requests hold
    /// device pages that the others
    /// need (tail pages, or a prefix a failed retract write-back left locked). The
    /// retracted request holding the most (ties: scheduling order) gives them back and
    /// is requeued to recompute: its whole history becomes its prompt, its
    /// cached prefix is reused, and the last prefill chunk yields its next token. A
    /// history that no longer fits the device pool (with its decode reserve) could never
    /// be computed again: that request is aborted instead (`ExceedsDevicePool`), which
    /// frees its pages just the same.
    fn requeue_for_recompute(&mut self, draft: &mut PlanInProgress) {
        // A write-back in flight is no deadlock: its acknowledgement releases the
        // device copies it read (the reference waits for it, and so does kvtier rather
        // than compute a history again).
        if self.ops.write_backs_in_flight() > 0 {
            return;
        }
        // The reference waits while anything may still change (a new request can run
        // and take the state a retracted one is stuck behind): under its policies the
        // deadlock is broken only at the second empty plan with nothing in between.
        if self.reference_policy() && self.idle_plans == 0 {
            return;
        }
        let mut victim: Option<(usize, usize)> = None;
        for &key in &draft.candidates {
            if let State::Retracted(held) = &self.requests[key].state {
                // Its tail pages, and its prefix when a failed retract write-back left
                // it locked on device.
                let prefix = held
                    .device_lock
                    .as_ref()
                    .map_or(0, |_| held.published_pages);
                let pinned = held.local_kv.pages.len() + prefix as usize;
                if pinned > 0 && victim.is_none_or(|(_, most)| pinned > most) {
                    victim = Some((key, pinned));
                }
            }
        }
        let Some((key, _)) = victim else { return };
        self.requeue(key, &mut draft.plan);
    }

    /// Queues a retracted request to compute its whole history again as its prompt (its
    /// cached prefix is reused; the last prefill chunk yields its next token) — or gives
    /// it up when that prompt, with its decode slot, no longer fits the device pool.
    fn requeue(&mut self, key: usize, plan: &mut ExecutionPlan) {
        let history = self.requests[key].tokens.len() as u64;
        if let Some(reason) = self.cannot_recompute(history) {
            let state = std::mem::replace(&mut self.requests[key].state, State::Finished);
            drop(state);
            let id = self.requests[key].id.clone();
            self.abort_notice(id, reason, plan);
            return;
        }
        let state = std::mem::replace(&mut self.requests[key].state, State::Submitted);
        drop(state);
        let r = &mut self.requests[key];
        r.prefill_len = r.tokens.len() as u32;
        r.recomputing = true;
        self.stats.recomputes += 1;
        self.requests[key].span.record("kvtier.recomputed", true);
        self.requests[key].enter_phase("recomputing");
    }

    /// Counts a request's first chunk in the prefix-cache counters: its prompt queried,
    /// `hit` tokens reused, those `load_back` brings from host, and of those the pages
    /// its own L3 prefetch brought. Once per request: a recompute is not a new query.
    fn count_hits(
        &mut self,
        key: usize,
        hit: u32,
        load_back: &[TransferPair],
        [capped, dropped]: [u32; 2],
    ) {
        let ps = u64::from(self.config.page_size);
        let r = &mut self.requests[key];
        if std::mem::replace(&mut r.queried, true) {
            return;
        }
        // Lost hits, by reason, in prompt order after the hit: pages the tree holds but
        // the admission did not reuse, pages L3 had and no prefetch brought (or a
        // prefetch brought and the host evicted before the first chunk), then pages the
        // cache held once and dropped (those L3 still had count as L3's).
        let hit_pages = hit / self.config.page_size;
        let l3_lost = if self.config.enable_l3_storage {
            r.storage_hit_pages.saturating_sub(hit_pages + capped)
        } else {
            0
        };
        let evicted = dropped.saturating_sub(l3_lost);
        let (l3_lost, prefetch_lost) = if r.prefetched_pages > 0 {
            (0, l3_lost)
        } else {
            (l3_lost, 0)
        };
        let lost = [capped, l3_lost, prefetch_lost, evicted].map(|p| u64::from(p) * ps);
        for (total, tokens) in self.stats.lost_hit_tokens.iter_mut().zip(lost) {
            *total += tokens;
        }
        let all: u64 = lost.iter().sum();
        if !r.span.is_disabled() && all > 0 {
            let reason = crate::LOST_HIT_REASONS
                .into_iter()
                .zip(lost)
                .max_by_key(|&(_, tokens)| tokens)
                .map_or("evicted", |(reason, _)| reason);
            r.span.record("kvtier.lost_hit.reason", reason);
            r.span.record("kvtier.lost_hit.tokens", all as i64);
        }
        let from_host = load_back
            .iter()
            .filter(|pair| pair.kind == TransferKind::Kv)
            .count() as u64;
        let from_l3 = u64::from(r.prefetched_pages).min(from_host);
        self.stats.queue_time.observe(r.submitted.elapsed());
        if !r.span.is_disabled() {
            // Integers as i64: OpenTelemetry has no unsigned attributes.
            let (hit, host, l3) = (
                i64::from(hit),
                (from_host * ps) as i64,
                (from_l3 * ps) as i64,
            );
            r.span.record("gen_ai.usage.cached_tokens", hit);
            r.span
                .record("kvtier.cached_tokens.device", (hit - host).max(0));
            r.span.record("kvtier.cached_tokens.host", host - l3);
            r.span.record("kvtier.cached_tokens.l3", l3);
        }
        self.stats.prompt_query_tokens += u64::from(r.prefill_len);
        self.stats.hit_tokens += u64::from(hit);
        self.stats.hit_tokens_host += from_host * ps;
        self.stats.hit_tokens_l3 += from_l3 * ps;
    }

    /// Requests queued to recompute that a late result grew past what the device pool
    /// can compute are given up (told with this plan).
    fn give_up_regrown(&mut self, plan: &mut ExecutionPlan) {
        for id in std::mem::take(&mut self.regrown) {
            let Some(key) = self.requests.key_of(&id) else {
                continue;
            };
            let r = &self.requests[key];
            if !(r.recomputing && matches!(r.state, State::Submitted)) {
                continue;
            }
            if let Some(reason) = self.cannot_recompute(r.tokens.len() as u64) {
                self.trace_end(key, "aborted");
                self.requests[key].state = State::Finished;
                self.abort_notice(id, reason, plan);
            }
        }
    }

    /// Why a history of `history` tokens could never be computed again as a prompt
    /// (with its decode slot), if it could not.
    pub(crate) fn cannot_recompute(&self, history: u64) -> Option<AbortReason> {
        let ps = u64::from(self.config.page_size);
        let need = (history + u64::from(self.config.decode_input_tokens)).div_ceil(ps);
        if need > u64::from(self.config.usable_device_pages()) {
            Some(AbortReason::ExceedsDevicePool)
        } else {
            self.short_group(history)
                .map(|_| AbortReason::ExceedsGroupPool)
        }
    }

    /// Paged models: the group whose pool can never hold a request of `tokens` tokens
    /// and its decode reserve, with the pages it would need.
    pub(crate) fn short_group(&self, tokens: u64) -> Option<(&kvtier_types::GroupSpec, u32)> {
        let paged = self.config.paged.as_ref()?;
        let total = tokens + u64::from(self.config.decode_input_tokens);
        let total = u32::try_from(total).unwrap_or(u32::MAX);
        paged.short_group(total, self.config.max_scheduled_tokens)
    }

    /// Resumes a retracted request: its prefix reloaded onto device, a new slot, one
    /// decode row covering its whole page table.
    fn recovery(
        &mut self,
        key: usize,
        resume: Resume,
        admission: Admission,
        draft: &mut PlanInProgress,
    ) {
        let ps = self.config.page_size;
        let d = self.config.decode_input_tokens;
        let Some(slot) = self.slots.allocate() else {
            debug_assert!(false, "the program counted a free slot");
            return;
        };
        let Resume {
            tail_free, tables, ..
        } = resume;
        // The cache put its kept pages ahead of those for the decode input.
        let (fresh, tail_free) = kvtier_radix::grow(tail_free, d, ps);
        debug_assert!(
            admission.pages.len() >= fresh as usize && admission.tail_free == tail_free,
            "allocation and accounting disagree"
        );
        let local_kv = LocalKv {
            pages: admission.pages,
            tail_free: admission.tail_free,
        };
        let r = &self.requests[key];
        let (mut states, cow_src) = match admission.states {
            Some(grant) => (Some(grant.states), grant.cow_src),
            None => (None, None),
        };
        // The row computes the history's last token, like a decode row.
        if let Some(states) = states.as_mut() {
            states.row_ends_at(r.tokens.len() as u32, ps);
        }
        let run = Running {
            device_lock: admission.device_lock,
            host_lock: admission.host_lock,
            prefix_pages: admission.prefix_pages,
            local_kv,
            slot,
            window_begin: r.prefill_len,
            window_size: 0,
            reserve: d,
            table_changed_from: None,
            published_ahead: 0,
            states,
            decode_state: None,
            tables,
        };
        if let Some(slot) = cow_src {
            self.ops.record_copy(r.id.clone(), slot);
        }
        draft
            .rows
            .push_decode_row(r, &run, RowKind::Recovery, 0, d, cow_src);
        if run.tables.is_some() {
            draft.rows.set_groups(false, admission.groups);
        }
        self.requests[key].state = State::Decoding(run);
        self.push_load_back(key, admission.load_back, &mut draft.plan, &mut draft.seen);
    }
}
