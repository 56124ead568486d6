//! Retraction when nothing could run, and the recovery of retracted requests.

use kvtier_radix::{Admission, CacheBatch, CacheOp, FamilyHold, RetractOutcome};
use kvtier_types::{AbortReason, ExecutionPlan, RowKind, TransferKind, TransferPair};

use crate::SchedulerCore;
use crate::draft::{PlanInProgress, Resume, Retraction};
use crate::request::{LocalKv, Retracted, Running, Settled, State, StateKind};

impl SchedulerCore {
    /// Preempts the running request with the most tokens (ties: scheduling order): the
    /// batch that retracts it. `None` when there is none to preempt (then a retracted
    /// request may be requeued to recompute).
    pub(super) fn retract_one(&mut self, draft: &mut PlanInProgress) -> Option<CacheBatch> {
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
            mut family,
            publication,
            device_lock,
            host_lock,
            local_kv,
        } = self.requests[key].settle(run, self.config.page_size, self.config.policy);
        let published_pages = (publication.tokens.len() / self.config.page_size as usize) as u32;
        // The reference keeps a retracted request's group tables and resumes it from
        // them; kvtier's own policy recomputes it from its deepest snapshot.
        let kept = if self
            .config
            .policy
            .resumes_a_retracted_request_from_its_tables()
        {
            family.take_tables()
        } else {
            None
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
                family,
            }],
        })
    }

    pub(super) fn apply_retraction(
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
                if self.config.policy.aborts_a_retraction_without_host_room() {
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
        if self.config.policy.breaks_deadlocks_at_a_fixed_point() && self.idle_plans == 0 {
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
    pub(super) fn requeue(&mut self, key: usize, plan: &mut ExecutionPlan) {
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
    pub(super) fn count_hits(
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
    pub(super) fn give_up_regrown(&mut self, plan: &mut ExecutionPlan) {
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
    pub(super) fn recovery(
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
        let mut cow_src = None;
        let mut family = admission.family.map_states(|grant| {
            cow_src = grant.cow_src;
            grant.states
        });
        // The row computes the history's last token, like a decode row.
        if let Some(states) = family.states_mut() {
            states.row_ends_at(r.tokens.len() as u32, ps);
        }
        // A paged request resumes from the tables it kept (its grant is none).
        if let Some(tables) = tables {
            debug_assert!(matches!(family, FamilyHold::Dense), "{family:?}");
            family = FamilyHold::Tables(tables);
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
            family,
            decode_state: None,
        };
        if let Some(slot) = cow_src {
            self.ops.record_copy(r.id.clone(), slot);
        }
        draft
            .rows
            .push_decode_row(r, &run, RowKind::Recovery, 0, d, cow_src);
        if run.family.tables().is_some() {
            draft.rows.set_groups(false, admission.groups);
        }
        self.requests[key].state = State::Decoding(run);
        self.push_load_back(key, admission.load_back, &mut draft.plan, &mut draft.seen);
    }
}
