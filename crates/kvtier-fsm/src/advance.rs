//! Requests in, events in: `submit`, `advance` and `abort`, and the flows they start
//! (prefetch completion, finish, abort, write-back completion). Each call queues its
//! cache work in the outbox; the caller takes it with `take_mail` (`mail.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use kvtier_radix::{CacheOp, GroupTables, StopLock, TokenRef};
use kvtier_types::{
    AbortNotice, AbortReason, EngineEvent, LookupAsk, OpId, PageId, RequestId, RequestSpec, Token,
};

use crate::ops::{FailedLoad, WriteBackInFlight};
use crate::outbox::Target;
use crate::request::{Prefetch, Request, Retracted, Running, Settled, State, StateKind};
use crate::{BatchError, Rejected, SchedError, SchedulerCore};

impl SchedulerCore {
    // ----- submit ------------------------------------------------------------------

    /// Submits requests. Each spec is checked on its own: valid ones are queued, invalid
    /// ones are returned in the error with their index and reason.
    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), BatchError> {
        let mut rejected = Vec::new();
        for (index, spec) in specs.into_iter().enumerate() {
            match self.check_spec(&spec) {
                Ok(()) => {
                    self.queue(spec, State::Submitted);
                }
                Err(error) => rejected.push(Rejected { index, error }),
            }
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(BatchError { rejected })
        }
    }

    /// Submits requests whose prompts the L3 store is to look up, checked as by
    /// [`Self::submit`]. Prompts long enough to be prefetched
    /// ([`SchedulerConfig::wants_l3_lookup`](kvtier_types::SchedulerConfig::wants_l3_lookup))
    /// wait, looking up, until [`Self::looked_up`] brings the answer to the returned ask;
    /// the others are queued at once. Nothing else waits: plans go on meanwhile.
    pub fn submit_with_lookup(
        &mut self,
        specs: Vec<RequestSpec>,
    ) -> (Option<LookupAsk>, Result<(), BatchError>) {
        let ticket = self.next_lookup;
        let (mut ids, mut prompts) = (Vec::new(), Vec::new());
        let mut rejected = Vec::new();
        for (index, mut spec) in specs.into_iter().enumerate() {
            // The system's own store answers for L3, not the engine.
            spec.storage_hit_pages = 0;
            if let Err(error) = self.check_spec(&spec) {
                rejected.push(Rejected { index, error });
            } else if self.config.wants_l3_lookup(spec.tokens.len()) {
                ids.push(spec.id.clone());
                prompts.push(self.queue(spec, State::LookingUp { ticket }));
            } else {
                self.queue(spec, State::Submitted);
            }
        }
        let ask = (!prompts.is_empty()).then(|| {
            self.next_lookup += 1;
            self.lookups.insert(ticket, ids);
            LookupAsk { ticket, prompts }
        });
        let result = if rejected.is_empty() {
            Ok(())
        } else {
            Err(BatchError { rejected })
        };
        (ask, result)
    }

    /// The answer to the lookup `ticket`: each of its prompts' hit pages, in order, or
    /// `None` when the lookup was lost (no hits, counted). Its requests that are still
    /// looking up are queued with their hits; those aborted meanwhile are gone.
    pub fn looked_up(&mut self, ticket: u64, hit_pages: Option<Vec<u32>>) {
        let Some(ids) = self.lookups.remove(&ticket) else {
            return;
        };
        if hit_pages.is_none() {
            self.stats.lost_lookups += 1;
        }
        let ps = self.config.page_size;
        for (i, id) in ids.iter().enumerate() {
            let Some(key) = self.requests.key_of(id) else {
                continue;
            };
            let r = &mut self.requests[key];
            if !matches!(r.state, State::LookingUp { ticket: t } if t == ticket) {
                // Aborted meanwhile (and perhaps submitted again under the same id).
                continue;
            }
            let hits = hit_pages.as_ref().and_then(|h| h.get(i).copied());
            // A store's answer is never trusted past the prompt's full pages.
            r.storage_hit_pages = hits.unwrap_or(0).min(r.full_pages_except_last(ps));
            r.state = State::Submitted;
            r.span
                .record("kvtier.l3.hit_pages", i64::from(r.storage_hit_pages));
            r.enter_phase("queued");
        }
    }

    fn check_spec(&self, spec: &RequestSpec) -> Result<(), SchedError> {
        let id = &spec.id;
        if self.requests.contains(id) {
            return Err(SchedError::DuplicateRequest(id.clone()));
        }
        if spec.tokens.is_empty() {
            return Err(SchedError::EmptyPrompt(id.clone()));
        }
        if let Some(token) = first_negative(&spec.tokens) {
            return Err(SchedError::InvalidToken {
                id: id.clone(),
                token,
            });
        }
        let ps = u64::from(self.config.page_size);
        let need =
            (spec.tokens.len() as u64 + u64::from(self.config.decode_input_tokens)).div_ceil(ps);
        let usable = self.config.usable_device_pages();
        if need > u64::from(usable) || spec.tokens.len() >= u32::MAX as usize {
            return Err(SchedError::PromptTooLong {
                id: id.clone(),
                tokens: spec.tokens.len(),
                pages: need,
                usable,
            });
        }
        if let Some((group, pages)) = self.short_group(spec.tokens.len() as u64) {
            return Err(SchedError::PromptTooLongForGroup {
                id: id.clone(),
                tokens: spec.tokens.len(),
                group: group.id.clone(),
                pages,
                usable: group.total_pages.saturating_sub(1),
            });
        }
        let full_pages = (spec.tokens.len() - 1) as u64 / ps;
        if u64::from(spec.storage_hit_pages) > full_pages {
            return Err(SchedError::InvalidStorageInfo {
                id: id.clone(),
                problem: format!(
                    "storage_hit_pages {} exceeds the prompt's {full_pages} full pages",
                    spec.storage_hit_pages
                ),
            });
        }
        Ok(())
    }

    /// Adds a request in `state` (Submitted or LookingUp); returns its prompt.
    fn queue(&mut self, spec: RequestSpec, state: State) -> Arc<Vec<Token>> {
        self.idle_plans = 0;
        let prefill_len = spec.tokens.len() as u32;
        let empty = tracing::field::Empty;
        let span = tracing::info_span!(
            "request",
            gen_ai.request.id = %spec.id,
            gen_ai.usage.prompt_tokens = i64::from(prefill_len),
            gen_ai.usage.cached_tokens = empty,
            gen_ai.usage.completion_tokens = empty,
            kvtier.cached_tokens.device = empty,
            kvtier.cached_tokens.host = empty,
            kvtier.cached_tokens.l3 = empty,
            kvtier.l3.hit_pages = empty,
            kvtier.recomputed = empty,
            kvtier.lost_hit.reason = empty,
            kvtier.lost_hit.tokens = empty,
            kvtier.outcome = empty,
        );
        let phase = if matches!(state, State::LookingUp { .. }) {
            "looking_up"
        } else {
            "queued"
        };
        let tokens = Arc::new(spec.tokens);
        let mut request = Request {
            id: spec.id,
            tokens: Arc::clone(&tokens),
            prefill_len,
            state,
            storage_hit_pages: spec.storage_hit_pages,
            denied: None,
            recomputing: false,
            queried: false,
            prefetched_pages: 0,
            stopped_tables: None,
            span,
            phase: tracing::Span::none(),
            submitted: std::time::Instant::now(),
            first_token: None,
        };
        request.enter_phase(phase);
        self.requests.insert(request);
        tokens
    }

    // ----- advance -----------------------------------------------------------------

    /// Applies engine events in order, load-back failures first (the rows that read
    /// their pages are void, wherever the engine reported their results). Each event is
    /// applied or refused on its own; a refused event changes nothing and is reported
    /// with its index. The cache work the events need is queued: take it with
    /// [`Self::take_mail`].
    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), BatchError> {
        let mut rejected = Vec::new();
        // Without load-backs in the last plan a failure can only be refused, in order.
        let early = self.ops.has_load_backs();
        if early {
            for (index, event) in events.iter().enumerate() {
                if let EngineEvent::LoadBackFailed { op_id } = event
                    && let Err(error) = self.load_back_failed(*op_id)
                {
                    rejected.push(Rejected { index, error });
                }
            }
        }
        for (index, event) in events.into_iter().enumerate() {
            if early && matches!(event, EngineEvent::LoadBackFailed { .. }) {
                continue;
            }
            if let Err(error) = self.apply(event) {
                rejected.push(Rejected { index, error });
            }
        }
        rejected.sort_by_key(|r| r.index);
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(BatchError { rejected })
        }
    }

    /// Aborts one request, whatever its state (cache work queued as for `advance`).
    pub fn abort(&mut self, id: &RequestId) -> Result<(), SchedError> {
        self.apply(EngineEvent::Abort {
            request_id: id.clone(),
        })
    }

    /// Looks up the request an event names. `Ok(None)`: a recently finished request, so
    /// the event is stale and ignored.
    fn lookup(&mut self, id: &RequestId) -> Result<Option<usize>, SchedError> {
        if let Some(key) = self.requests.key_of(id) {
            if matches!(self.requests[key].state, State::Finished) {
                // Finished but not yet erased: late results are stale like after erasure.
                self.stats.stale_events += 1;
                return Ok(None);
            }
            return Ok(Some(key));
        }
        if self.requests.recently_finished(id) {
            self.stats.stale_events += 1;
            return Ok(None);
        }
        Err(SchedError::UnknownRequest(id.clone()))
    }

    fn invalid(&self, key: usize, event: &'static str) -> SchedError {
        let r = &self.requests[key];
        SchedError::InvalidTransition {
            id: r.id.clone(),
            event,
            state: r.state.kind(),
        }
    }

    fn apply(&mut self, event: EngineEvent) -> Result<(), SchedError> {
        self.idle_plans = 0;
        let name = event.name();
        if !self.voided.is_empty()
            && let EngineEvent::ExtendResult { request_id, .. }
            | EngineEvent::Finish { request_id }
            | EngineEvent::UpdateReserve { request_id, .. } = &event
            && self.voided.contains(request_id)
        {
            // The result of a row that read a failed load-back: void.
            self.stats.stale_events += 1;
            return Ok(());
        }
        match event {
            EngineEvent::ExtendResult { request_id, tokens } => {
                // A malformed payload is refused whatever the request's state.
                if let Some(token) = first_negative(&tokens) {
                    return Err(SchedError::InvalidToken {
                        id: request_id,
                        token,
                    });
                }
                let Some(key) = self.lookup(&request_id)? else {
                    return Ok(());
                };
                match self.requests[key].state.kind() {
                    kind @ (StateKind::PrefillDone
                    | StateKind::Decoding
                    | StateKind::Retracting
                    | StateKind::Retracted) => {
                        let r = &mut self.requests[key];
                        // The first token arrives for its last prefill chunk.
                        if kind == StateKind::PrefillDone && r.first_token.is_none() {
                            let now = std::time::Instant::now();
                            self.stats.time_to_first_token.observe(now - r.submitted);
                            r.first_token = Some(now);
                        }
                        let before = r.tokens.len();
                        Arc::make_mut(&mut r.tokens).extend_from_slice(&tokens);
                        // Hybrid models publish at every decode page crossing; so do
                        // plain window models, up to their cap (PR #381).
                        let window_capped = self.config.publish_prefix_mid_flight
                            && self.config.midflight_publish_max_pages.is_some();
                        let families = self.config.mamba.is_some() || self.config.paged.is_some();
                        if kind == StateKind::Decoding && (families || window_capped) {
                            self.publish_decoded(key, before);
                        }
                        // Only paged models hold tables (a branch per decode row, not a
                        // state lookup: W2's hot path). A retracted request's kept tables
                        // rewind too (its last row's results, a step late).
                        if kind != StateKind::PrefillDone && self.config.paged.is_some() {
                            self.rewind_tables(key);
                        }
                        Ok(())
                    }
                    // Its last row's token, a step late: the history it will compute
                    // grows by it.
                    StateKind::Submitted if self.requests[key].recomputing => {
                        let r = &mut self.requests[key];
                        Arc::make_mut(&mut r.tokens).extend_from_slice(&tokens);
                        r.prefill_len = r.tokens.len() as u32;
                        // The next plan checks that it still fits (a `Finish` may follow).
                        self.regrown.push(request_id);
                        Ok(())
                    }
                    _ => Err(self.invalid(key, name)),
                }
            }
            EngineEvent::Finish { request_id } => {
                let Some(key) = self.lookup(&request_id)? else {
                    return Ok(());
                };
                self.finish(key, name)
            }
            EngineEvent::Abort { request_id } => {
                let Some(key) = self.lookup(&request_id)? else {
                    return Ok(());
                };
                self.abort_key(key);
                Ok(())
            }
            EngineEvent::UpdateReserve { request_id, tokens } => {
                let Some(key) = self.lookup(&request_id)? else {
                    return Ok(());
                };
                let r = &mut self.requests[key];
                match &mut r.state {
                    State::Decoding(run) => {
                        run.reserve = tokens;
                        Ok(())
                    }
                    State::Retracting { .. } | State::Retracted(_) | State::Finished => Ok(()),
                    State::Submitted if r.recomputing => Ok(()),
                    _ => Err(self.invalid(key, name)),
                }
            }
            EngineEvent::WriteBackDone { op_id, success } => self.write_back_done(op_id, success),
            // Taken first by `advance` when the last plan had load-backs.
            EngineEvent::LoadBackFailed { op_id } => self.load_back_failed(op_id),
            EngineEvent::PrefetchDone {
                op_id,
                request_id,
                success,
                completed_pages,
            } => self.prefetch_done(op_id, &request_id, success, completed_pages),
            EngineEvent::BackupDone { op_id, success } => match self.ops.backup_done(op_id) {
                // Routers learn what L3 holds from KV events: the pages it stored are
                // published before the pin goes.
                Some(backup) if success && self.config.enable_kv_cache_events => {
                    let crate::ops::Backup {
                        pin,
                        page_hashes,
                        span,
                    } = backup;
                    self.outbox
                        .push(CacheOp::BackedUp { pin, page_hashes }, Target::Ignore);
                    // The backup's span ends with it.
                    drop(span);
                    Ok(())
                }
                Some(_) => Ok(()),
                None => self.stale_or_unknown_op(op_id),
            },
            EngineEvent::Bootstrapped { .. } | EngineEvent::RemotePrefillDone { .. } => {
                Err(SchedError::Unsupported("prefill/decode disaggregation"))
            }
        }
    }

    // ----- load-back failure ----------------------------------------------------------

    /// A load-back of the last plan failed: its device pages hold no valid KV. Every
    /// running request whose page table includes one of them read garbage in that plan:
    /// its results are void, it lets go of everything it held, and it is scheduled
    /// again with its whole history as the prompt (its host copy is still cached, so
    /// that is a cache miss on device, not lost work). Then the cache takes the failed
    /// device copies back, leaving those nodes with their host copies.
    fn load_back_failed(&mut self, op_id: OpId) -> Result<(), SchedError> {
        let FailedLoad { pages, states } = match self.ops.load_back_failed(op_id) {
            Ok(load) => load,
            Err(true) => {
                self.stats.stale_events += 1;
                return Ok(());
            }
            Err(false) if self.ops.was_issued(op_id) => {
                return Err(SchedError::LateLoadBackFailure(op_id));
            }
            Err(false) => return Err(SchedError::UnknownOp(op_id)),
        };
        self.stats.failed_load_backs += 1;
        let failed: BTreeSet<PageId> = pages.iter().copied().collect();
        // A hybrid row that copied a failed state read garbage as well.
        let copied: BTreeSet<RequestId> = self.ops.copied_from(&states).into_iter().collect();
        let readers = self.requests.keys_where(|r| {
            copied.contains(&r.id)
                || r.state
                    .running()
                    .is_some_and(|run| run.prefix_pages.iter().any(|p| failed.contains(p)))
        });
        let ps = u64::from(self.config.page_size);
        let usable = u64::from(self.config.usable_device_pages());
        for key in readers {
            let state = std::mem::replace(&mut self.requests[key].state, State::Submitted);
            drop(state);
            let r = &mut self.requests[key];
            self.voided.insert(r.id.clone());
            self.stats.load_back_requeues += 1;
            let history = r.tokens.len() as u64;
            if (history + u64::from(self.config.decode_input_tokens)).div_ceil(ps) > usable {
                // A retracted request resuming from host whose history cannot be
                // computed again in the device pool (as the deadlock breaker does).
                self.trace_end(key, "aborted");
                let r = &mut self.requests[key];
                r.state = State::Finished;
                self.stats.scheduler_aborts += 1;
                self.notices.push(AbortNotice {
                    request_id: r.id.clone(),
                    reason: AbortReason::ExceedsDevicePool,
                });
                continue;
            }
            r.prefill_len = history as u32;
            r.span.record("kvtier.recomputed", true);
            r.enter_phase("queued");
        }
        self.outbox
            .push(CacheOp::DiscardLoadBack { pages, states }, Target::Ignore);
        Ok(())
    }

    // ----- hybrid decode publication ----------------------------------------------------

    /// A decoding hybrid request (or a plain window model's, up to its cap) whose tokens
    /// crossed a page boundary (it had `before` tokens) publishes its new full pages with its checkpoint, which holds the state at
    /// their end when the decode row that reached it copied it there. kvtier then gives
    /// it a fresh checkpoint for the next boundary; the reference frees the checkpoint
    /// and caches no state past the prompt (HYBRID-WORKLOADS.md §4.2).
    fn publish_decoded(&mut self, key: usize, before: usize) {
        let ps = self.config.page_size;
        // A family's cache makes every published prefix safe to reuse.
        let cap = match (&self.config.mamba, &self.config.paged) {
            (None, None) => self.config.midflight_publish_max_pages.unwrap_or(u32::MAX),
            _ => u32::MAX,
        };
        let publishable = |n: usize| ((n.saturating_sub(1) / ps as usize) as u32).min(cap);
        let now = publishable(self.requests[key].tokens.len());
        if now <= publishable(before) {
            return;
        }
        let mut state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let Some(run) = state.running_mut() else {
            self.requests[key].state = state;
            return;
        };
        let retire = run.decode_state.take();
        let publication = self.requests[key].publication(run, now, ps);
        let checkpoint = publication
            .is_some()
            .then(|| run.states.as_mut().and_then(|s| s.take_checkpoint()))
            .flatten();
        self.requests[key].state = state;
        let Some(publication) = publication else {
            return;
        };
        // The reference publishes a decode's checkpoint only where its prefill-chunk rule
        // says so for the result's tokens (with pages of one token: every decode), and
        // frees it otherwise (C.2 in docs/notes/mamba-reference.md).
        let reference = self.reference_policy();
        let reference_frees = || {
            let (n, chunk) = (
                self.requests[key].tokens.len() as u32,
                self.config.mamba.map_or(1, |m| m.chunk),
            );
            kvtier_mamba::checkpoint_depth(before as u32, n - before as u32, ps, chunk).is_none()
        };
        let checkpoint = checkpoint.map(|(slot, at)| {
            let kept = !(reference && reference_frees());
            (slot, at.filter(|_| kept))
        });
        let retire = if reference { None } else { retire };
        self.queue_publication(key, publication, checkpoint, retire, true);
    }

    /// Paged models: a decoding (or retracted) request's group tables give back the
    /// pages its row reserved past the tokens it now has (after the publication above),
    /// as the reference rewinds them at each result; the next decode takes what it needs.
    fn rewind_tables(&mut self, key: usize) {
        let r = &self.requests[key];
        let Some(tables) = r.state.tables() else {
            return;
        };
        let op = CacheOp::RewindTables {
            key: tables.key(),
            tokens: r.tokens.len() as u32,
        };
        self.outbox.push(op, Target::Ignore);
    }

    // ----- prefetch -------------------------------------------------------------------

    /// An L3 prefetch finished. The first `completed_pages` pages (none on failure) enter
    /// the tree at their absolute offsets after the locked host prefix, with the
    /// request's own pages; the rest go back to the pool.
    fn prefetch_done(
        &mut self,
        op_id: OpId,
        id: &RequestId,
        success: bool,
        completed: u32,
    ) -> Result<(), SchedError> {
        let Some(key) = self.lookup(id)? else {
            return Ok(());
        };
        let (State::Prefetching(p) | State::Aborting(p)) = &self.requests[key].state else {
            return self.stale_or_unknown_op(op_id);
        };
        if p.op != op_id {
            return self.stale_or_unknown_op(op_id);
        }
        if completed as usize > p.pages.len() {
            return Err(SchedError::InvalidStorageInfo {
                id: id.clone(),
                problem: format!(
                    "completed_pages {completed} exceeds the {} pages prefetched",
                    p.pages.len()
                ),
            });
        }
        let state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let next = match state {
            State::Prefetching(Prefetch {
                host_lock,
                mut pages,
                start_page,
                state,
                ..
            }) => {
                // A hybrid prefetch's state slot holds the state after exactly its
                // completed pages (the L3 actor's contract).
                let done = if success { completed } else { 0 };
                self.requests[key].prefetched_pages = done;
                match (done > 0, pages.take_first(done as usize)) {
                    (true, Ok(taken)) => {
                        let end = ((start_page + done) * self.config.page_size) as usize;
                        let tokens = TokenRef::new(&self.requests[key].tokens, end);
                        self.outbox.push(
                            CacheOp::InsertPrefetched {
                                tokens,
                                start_page,
                                pages: taken,
                                host_lock,
                                state,
                            },
                            Target::Ignore,
                        );
                    }
                    _ => drop(host_lock),
                }
                drop(pages);
                State::PrefetchDone
            }
            // The transfer has ended: an aborted request's pages can go now.
            State::Aborting(held) => {
                drop(held);
                State::Finished
            }
            other => other,
        };
        self.requests[key].state = next;
        Ok(())
    }

    /// An answer for an op not in flight: stale if it was issued, else unknown.
    fn stale_or_unknown_op(&mut self, op_id: OpId) -> Result<(), SchedError> {
        if self.ops.was_issued(op_id) {
            self.stats.stale_events += 1;
            return Ok(());
        }
        Err(SchedError::UnknownOp(op_id))
    }

    // ----- finish -------------------------------------------------------------------

    /// Records the end of a request's life (`finished` or `aborted`) in its span.
    pub(crate) fn trace_end(&mut self, key: usize, outcome: &'static str) {
        let r = &mut self.requests[key];
        let generated = r.tokens.len().saturating_sub(r.prefill_len as usize);
        r.span
            .record("gen_ai.usage.completion_tokens", generated as i64);
        r.span.record("kvtier.outcome", outcome);
        if let (Some(first), true) = (r.first_token, generated > 1) {
            let per_token = first.elapsed() / (generated - 1) as u32;
            self.stats.time_per_output_token.observe(per_token);
        }
        r.enter_phase(outcome);
    }

    fn finish(&mut self, key: usize, name: &'static str) -> Result<(), SchedError> {
        let state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let next = match state {
            State::PrefillDone(run) | State::Decoding(run) => {
                self.trace_end(key, "finished");
                self.finish_running(key, run)
            }
            // The copy in flight completes on its own; the tail pages go now.
            State::Retracting {
                op,
                host_lock,
                local_kv,
                tables,
                ..
            } => {
                drop((host_lock, local_kv));
                self.keep_stopped_tables(key, tables);
                State::WritingBack { op }
            }
            State::Retracted(mut held) => {
                self.keep_stopped_tables(key, held.tables.take());
                drop(held);
                State::Finished
            }
            // Its last row finished it, a step late: there is nothing to compute.
            State::Submitted if self.requests[key].recomputing => {
                self.trace_end(key, "finished");
                State::Finished
            }
            other => {
                self.requests[key].state = other;
                return Err(self.invalid(key, name));
            }
        };
        self.requests[key].state = next;
        Ok(())
    }

    /// A stopped request's group tables: under the reference policies they stay until
    /// the request is forgotten at the next plan, as the reference frees them.
    fn keep_stopped_tables(&mut self, key: usize, tables: Option<GroupTables>) {
        if self.reference_policy() {
            self.requests[key].stopped_tables = tables;
        }
    }

    /// Publishes a finished request's full pages and, with L2 on, asks the cache to
    /// attach host pages for the write-back of whatever is not on host yet. With a
    /// write-back possible the request is `Draining` until the reply says whether one
    /// was attached.
    fn finish_running(&mut self, key: usize, run: Running) -> State {
        let Settled {
            states,
            publication,
            device_lock,
            host_lock,
            local_kv,
            tables,
        } = self.requests[key].settle(run, self.config.page_size, !self.reference_policy());
        let tables = if self.reference_policy() {
            self.keep_stopped_tables(key, tables);
            None
        } else {
            tables
        };
        let write_back = self.config.l2_enabled()
            && !self.config.disable_prefix_cache
            && !publication.tokens.is_empty();
        let id = self.requests[key].id.clone();
        let device_lock = if self.reference_policy() {
            self.outbox.hand_over(key, &id, device_lock)
        } else {
            StopLock::Held(device_lock)
        };
        self.outbox.push(
            CacheOp::Finish {
                publication,
                device_lock,
                host_lock,
                write_back,
                reuse: !self.config.disable_prefix_cache,
                leftover: local_kv.pages,
                states,
                tables,
            },
            Target::Finish { key, id },
        );
        if write_back {
            self.finishing.push((key, self.requests[key].id.clone()));
            State::Draining(None)
        } else {
            State::Finished
        }
    }

    // ----- abort ---------------------------------------------------------------------

    pub(crate) fn abort_key(&mut self, key: usize) {
        if !matches!(self.requests[key].state, State::Finished) {
            self.trace_end(key, "aborted");
        }
        let state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        match state {
            // The L3 transfer may still write these host pages: keep them until it ends.
            State::Prefetching(p) | State::Aborting(p) => {
                self.requests[key].state = State::Aborting(p);
            }
            // Host pages attached for a write-back that was never issued: roll them back.
            State::Draining(None) => {}
            State::Draining(Some(attached)) => self.outbox.roll_back(attached.ticket),
            // The in-flight copy stays pinned by its ticket in the op table until acknowledged.
            State::WritingBack { op } => self.ops.detach_request(op),
            // Its tail pages and host lock go in event order too (below).
            State::Retracting {
                op,
                host_lock,
                local_kv,
                ..
            } => {
                self.ops.detach_request(op);
                self.outbox.push(
                    CacheOp::Release(kvtier_radix::Released::new((host_lock, local_kv))),
                    Target::Ignore,
                );
            }
            // Its pages go back where the abort comes among the step's events (after
            // those a finish queued before it frees), as in the reference.
            held @ (State::Prefilling(_)
            | State::PrefillDone(_)
            | State::Decoding(_)
            | State::Retracted(_)) => self.outbox.push(
                CacheOp::Release(kvtier_radix::Released::new(held)),
                Target::Ignore,
            ),
            other => drop(other),
        }
    }

    // ----- write-back completion ---------------------------------------------------

    fn write_back_done(&mut self, op_id: OpId, success: bool) -> Result<(), SchedError> {
        let Some(resolved) = self.ops.acknowledge_write_back(op_id, success) else {
            return self.stale_or_unknown_op(op_id);
        };
        if !success {
            self.stats.failed_write_backs += 1;
        }
        for (op, outcome) in resolved {
            self.write_back_resolved(op, outcome);
        }
        Ok(())
    }

    /// A write-back whose outcome is known: its own copy and those it relied on.
    fn write_back_resolved(&mut self, op: WriteBackInFlight, success: bool) {
        let WriteBackInFlight {
            request,
            ticket,
            device_node,
            is_retract,
            depends_on: _,
            span,
        } = op;
        let key = request.and_then(|id| self.requests.key_of(&id));
        // After a failed retract copy the device copy is the only one: the cache pins it
        // for the retracted request before the ticket lets go of it.
        let keep = !success && is_retract && key.is_some();
        let target = match key {
            Some(key) if keep => Target::KeepDevice {
                key,
                id: self.requests[key].id.clone(),
            },
            _ => Target::Backup(span),
        };
        self.outbox.push(
            CacheOp::WriteBackAck {
                ticket,
                success,
                keep_device: keep.then_some(device_node),
                backup: self.config.enable_l3_storage,
                demote: success.then_some(device_node),
            },
            target,
        );
        let Some(key) = key else {
            return;
        };
        let state = std::mem::replace(&mut self.requests[key].state, State::Finished);
        let next = match state {
            State::WritingBack { .. } => State::Finished,
            State::Retracting {
                host_lock,
                local_kv,
                published_pages,
                tables,
                ..
            } => State::Retracted(Retracted {
                prefix_lock: host_lock,
                device_lock: None,
                local_kv,
                published_pages,
                tables,
            }),
            other => other,
        };
        self.requests[key].state = next;
    }
}

/// The first negative token, if any. Token ids are non-negative; OR-ing sign bits
/// vectorises, so the common all-valid case costs a fraction of a per-token search.
fn first_negative(tokens: &[Token]) -> Option<Token> {
    if tokens.iter().fold(0, |acc, &t| acc | t) >= 0 {
        return None;
    }
    tokens.iter().copied().find(|&t| t < 0)
}
