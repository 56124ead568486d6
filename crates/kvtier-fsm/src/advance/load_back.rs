//! A failed load-back: the request reads nothing the copy did not land.

use std::collections::BTreeSet;

use kvtier_radix::CacheOp;
use kvtier_types::{AbortNotice, AbortReason, OpId, PageId, RequestId};

use crate::ops::FailedLoad;
use crate::outbox::Target;
use crate::request::State;
use crate::{SchedError, SchedulerCore};

impl SchedulerCore {
    /// A load-back of the last plan failed: its device pages hold no valid KV. Every
    /// running request whose page table includes one of them read garbage in that plan:
    /// its results are void, it lets go of everything it held, and it is scheduled
    /// again with its whole history as the prompt (its host copy is still cached, so
    /// that is a cache miss on device, not lost work). Then the cache takes the failed
    /// device copies back, leaving those nodes with their host copies.
    pub(super) fn load_back_failed(&mut self, op_id: OpId) -> Result<(), SchedError> {
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
}
