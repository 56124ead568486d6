//! Write-backs of finished requests and abort notices, issued at the start of a plan.

use kvtier_radix::{Attached, CacheOp};
use kvtier_types::{AbortNotice, AbortReason, ExecutionPlan, OpId, RequestId, WriteBackOp};

use crate::SchedulerCore;
use crate::draft::Seen;
use crate::ops::WriteBackInFlight;
use crate::outbox::Target;
use crate::request::State;

impl SchedulerCore {
    pub(super) fn issue_finish_write_backs(&mut self, plan: &mut ExecutionPlan, seen: &mut Seen) {
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
    pub(super) fn issue_write_back(
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
    pub(super) fn abort_notice(
        &mut self,
        request_id: RequestId,
        reason: AbortReason,
        plan: &mut ExecutionPlan,
    ) {
        self.stats.scheduler_aborts += 1;
        plan.aborted.push(AbortNotice { request_id, reason });
    }
}
