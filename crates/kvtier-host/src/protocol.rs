//! The Host allocator actor's protocol.

use kvtier_types::{ActorCore, ActorName};

use crate::{HostCore, HostError, HostStats, OwnedPages};

/// A message to the Host allocator actor.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostMsg {
    /// Lease this many host pages.
    Lease(u32),
    /// The allocator's counters.
    HostStatsQuery,
}

/// The Host allocator's answer, one per message.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostReply {
    /// Exactly the pages asked for, or nothing.
    Leased(Result<OwnedPages, HostError>),
    /// The counters (`leased_pages` is 0 once every lease came back).
    HostStats(HostStats),
}

impl ActorCore for HostCore {
    const NAME: ActorName = ActorName::HOST;
    type Msg = HostMsg;
    type Reply = HostReply;

    fn handle(&mut self, msg: HostMsg) -> HostReply {
        match msg {
            HostMsg::Lease(pages) => HostReply::Leased(self.lease(pages)),
            HostMsg::HostStatsQuery => HostReply::HostStats(self.stats()),
        }
    }

    fn message_name(msg: &HostMsg) -> &'static str {
        match msg {
            HostMsg::Lease(_) => "Lease",
            HostMsg::HostStatsQuery => "HostStatsQuery",
        }
    }

    fn reply_name(reply: &HostReply) -> &'static str {
        match reply {
            HostReply::Leased(_) => "Leased",
            HostReply::HostStats(_) => "HostStats",
        }
    }
}
