//! The L3 store actor's protocol.

use kvtier_types::{
    ActorCore, ActorName, BackupOp, EngineEvent, Placement, PrefetchOp, RequestSpec,
};

use crate::{L3Core, L3TierStats};

/// A message to the L3 store actor.
#[derive(Debug)]
#[non_exhaustive]
pub enum L3Msg {
    /// Look each prompt up: the reply is the same specs with `storage_hit_pages` set
    /// (consecutive stored pages from the first). Prompts with no more than `threshold`
    /// full pages are not looked up.
    L3Lookup {
        /// The requests being submitted.
        specs: Vec<RequestSpec>,
        /// The prefetch threshold, in pages.
        threshold: u32,
    },
    /// Run a plan's prefetches and backups.
    L3Transfer {
        /// L3 → host fills.
        prefetches: Vec<PrefetchOp>,
        /// Host → L3 copies.
        backups: Vec<BackupOp>,
    },
    /// The actor's counters.
    L3StatsQuery,
}

/// The L3 store actor's answer, one per message.
#[derive(Debug)]
#[non_exhaustive]
pub enum L3Reply {
    /// The specs, looked up.
    L3LookedUp(Vec<RequestSpec>),
    /// One `PrefetchDone` per prefetch, then one `BackupDone` per backup.
    L3Transferred(Vec<EngineEvent>),
    /// The counters.
    L3Stats(L3TierStats),
}

impl ActorCore for L3Core {
    const NAME: ActorName = ActorName::L3;
    // The backend's calls block (disk, network).
    const PLACEMENT: Placement = Placement::OwnThread;
    type Msg = L3Msg;
    type Reply = L3Reply;

    fn handle(&mut self, msg: L3Msg) -> L3Reply {
        match msg {
            L3Msg::L3Lookup {
                mut specs,
                threshold,
            } => {
                self.lookup(&mut specs, threshold);
                L3Reply::L3LookedUp(specs)
            }
            L3Msg::L3Transfer {
                prefetches,
                backups,
            } => L3Reply::L3Transferred(self.transfer(&prefetches, &backups)),
            L3Msg::L3StatsQuery => L3Reply::L3Stats(self.stats()),
        }
    }

    fn message_name(msg: &L3Msg) -> &'static str {
        match msg {
            L3Msg::L3Lookup { .. } => "L3Lookup",
            L3Msg::L3Transfer { .. } => "L3Transfer",
            L3Msg::L3StatsQuery => "L3StatsQuery",
        }
    }

    fn reply_name(reply: &L3Reply) -> &'static str {
        match reply {
            L3Reply::L3LookedUp(_) => "L3LookedUp",
            L3Reply::L3Transferred(_) => "L3Transferred",
            L3Reply::L3Stats(_) => "L3Stats",
        }
    }
}
