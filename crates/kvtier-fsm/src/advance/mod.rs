//! Requests in, events in: `submit`, `advance` and `abort`, and the flows they start
//! (prefetch completion, finish, abort, write-back completion). Each call queues its
//! cache work in the outbox; the caller takes it with `take_mail` (`mail.rs`).

mod decode_publication;
mod finish;
mod load_back;
mod prefetch;
mod submit;
mod write_back;

use std::sync::Arc;

use kvtier_radix::CacheOp;
use kvtier_types::{EngineEvent, RequestId, Token};

use crate::outbox::Target;
use crate::request::{State, StateKind};
use crate::{BatchError, Rejected, SchedError, SchedulerCore};

impl SchedulerCore {
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
}

/// The first negative token, if any. Token ids are non-negative; OR-ing sign bits
/// vectorises, so the common all-valid case costs a fraction of a per-token search.
fn first_negative(tokens: &[Token]) -> Option<Token> {
    if tokens.iter().fold(0, |acc, &t| acc | t) >= 0 {
        return None;
    }
    tokens.iter().copied().find(|&t| t < 0)
}
