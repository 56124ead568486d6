//! A request's end: finish, abort, and what each releases.

use kvtier_radix::{CacheOp, GroupTables, StopLock};

use crate::outbox::Target;
use crate::request::{Running, Settled, State};
use crate::{SchedError, SchedulerCore};

impl SchedulerCore {
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

    pub(super) fn finish(&mut self, key: usize, name: &'static str) -> Result<(), SchedError> {
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
        if self.config.policy.keeps_stopped_tables_to_the_next_plan() {
            self.requests[key].stopped_tables = tables;
        }
    }

    /// Publishes a finished request's full pages and, with L2 on, asks the cache to
    /// attach host pages for the write-back of whatever is not on host yet. With a
    /// write-back possible the request is `Draining` until the reply says whether one
    /// was attached.
    fn finish_running(&mut self, key: usize, run: Running) -> State {
        let Settled {
            mut family,
            publication,
            device_lock,
            host_lock,
            local_kv,
        } = self.requests[key].settle(run, self.config.page_size, self.config.policy);
        if self.config.policy.keeps_stopped_tables_to_the_next_plan() {
            self.keep_stopped_tables(key, family.take_tables());
        }
        let write_back = self.config.l2_enabled()
            && !self.config.disable_prefix_cache
            && !publication.tokens.is_empty();
        let id = self.requests[key].id.clone();
        let device_lock = if self.config.policy.hands_a_finish_lock_to_its_publication() {
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
                family,
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
}
