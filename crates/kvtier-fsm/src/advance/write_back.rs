//! A write-back's acknowledgement, success or failure.

use kvtier_radix::CacheOp;
use kvtier_types::OpId;

use crate::ops::WriteBackInFlight;
use crate::outbox::Target;
use crate::request::{Retracted, State};
use crate::{SchedError, SchedulerCore};

impl SchedulerCore {
    pub(super) fn write_back_done(&mut self, op_id: OpId, success: bool) -> Result<(), SchedError> {
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
