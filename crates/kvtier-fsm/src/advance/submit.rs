//! Requests in: validated, queued, and looked up in L3 where a store is attached.

use std::sync::Arc;

use kvtier_types::{LookupAsk, RequestSpec, Token};

use super::*;
use crate::request::{Request, State};
use crate::{BatchError, Rejected, SchedError, SchedulerCore};

impl SchedulerCore {
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
    pub(super) fn queue(&mut self, spec: RequestSpec, state: State) -> Arc<Vec<Token>> {
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
}
