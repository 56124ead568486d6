//! The Device actor's protocol.

use kvtier_types::{ActorCore, ActorName, EngineEvent, ExecutionPlan, Placement};

use crate::{DeviceCore, DeviceError, DeviceStats, NewRequest};

/// A message to the Device actor.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceMsg {
    /// Run a plan's write-backs and load-backs on the arenas, then its forward rows
    /// through the model runner.
    Execute {
        /// The plan.
        plan: Box<ExecutionPlan>,
        /// Requests submitted since the last plan, for the model runner.
        new_requests: Vec<NewRequest>,
    },
    /// The device's counters.
    DeviceStatsQuery,
}

/// The Device actor's answer, one per message.
#[derive(Debug)]
#[non_exhaustive]
pub enum DeviceReply {
    /// The events to `advance` with, or why the plan's copies were refused.
    Executed(Result<Vec<EngineEvent>, DeviceError>),
    /// The counters.
    DeviceStats(DeviceStats),
}

impl ActorCore for DeviceCore {
    const NAME: ActorName = ActorName::DEVICE;
    // Copies and forward rows take long: the scheduler should not wait behind them.
    const PLACEMENT: Placement = Placement::OwnThreadWhenThreaded;
    type Msg = DeviceMsg;
    type Reply = DeviceReply;

    fn handle(&mut self, msg: DeviceMsg) -> DeviceReply {
        match msg {
            DeviceMsg::Execute { plan, new_requests } => {
                DeviceReply::Executed(self.execute(&plan, &new_requests))
            }
            DeviceMsg::DeviceStatsQuery => DeviceReply::DeviceStats(self.stats()),
        }
    }

    fn message_name(msg: &DeviceMsg) -> &'static str {
        match msg {
            DeviceMsg::Execute { .. } => "Execute",
            DeviceMsg::DeviceStatsQuery => "DeviceStatsQuery",
        }
    }

    fn reply_name(reply: &DeviceReply) -> &'static str {
        match reply {
            DeviceReply::Executed(_) => "Executed",
            DeviceReply::DeviceStats(_) => "DeviceStats",
        }
    }
}
