//! An L3 prefetch's completion.

use kvtier_radix::{CacheOp, TokenRef};
use kvtier_types::{OpId, RequestId};

use crate::outbox::Target;
use crate::request::{Prefetch, State};
use crate::{SchedError, SchedulerCore};

impl SchedulerCore {
    /// An L3 prefetch finished. The first `completed_pages` pages (none on failure) enter
    /// the tree at their absolute offsets after the locked host prefix, with the
    /// request's own pages; the rest go back to the pool.
    pub(super) fn prefetch_done(
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
    pub(super) fn stale_or_unknown_op(&mut self, op_id: OpId) -> Result<(), SchedError> {
        if self.ops.was_issued(op_id) {
            self.stats.stale_events += 1;
            return Ok(());
        }
        Err(SchedError::UnknownOp(op_id))
    }
}
