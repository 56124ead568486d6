//! The L3 store actor's protocol.

use kvtier_types::{ActorCore, ActorName, BackupOp, EngineEvent, LookupAsk, Placement, PrefetchOp};

use crate::{L3Core, L3TierStats};

/// A message to the L3 store actor.
#[derive(Debug)]
#[non_exhaustive]
pub enum L3Msg {
    /// Look each prompt up: the reply is each prompt's stored pages (consecutive from
    /// the first), under the same ticket. Sent outside any call: the scheduler goes on
    /// planning while the store answers.
    L3Lookup(LookupAsk),
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
    /// A lookup's answer: its ticket and each prompt's hit pages, in order.
    L3LookedUp {
        /// The lookup's ticket.
        ticket: u64,
        /// Stored pages per prompt.
        hit_pages: Vec<u32>,
    },
    /// One `PrefetchDone` per prefetch, then one `BackupDone` per backup.
    L3Transferred(Vec<EngineEvent>),
    /// The counters.
    L3Stats(Box<L3TierStats>),
}

impl ActorCore for L3Core {
    const NAME: ActorName = ActorName::L3;
    // The backend's calls block (disk, network).
    const PLACEMENT: Placement = Placement::OwnThread;
    type Msg = L3Msg;
    type Reply = L3Reply;

    fn handle(&mut self, msg: L3Msg) -> L3Reply {
        match msg {
            L3Msg::L3Lookup(ask) => {
                let started = std::time::Instant::now();
                let hit_pages = self.answer(&ask);
                self.observe_lookup(started.elapsed());
                L3Reply::L3LookedUp {
                    ticket: ask.ticket,
                    hit_pages,
                }
            }
            L3Msg::L3Transfer {
                prefetches,
                backups,
            } => {
                let started = std::time::Instant::now();
                let events = self.transfer(&prefetches, &backups);
                self.observe_transfer(started.elapsed());
                L3Reply::L3Transferred(events)
            }
            L3Msg::L3StatsQuery => L3Reply::L3Stats(Box::new(self.stats())),
        }
    }

    fn message_name(msg: &L3Msg) -> &'static str {
        match msg {
            L3Msg::L3Lookup(_) => "L3Lookup",
            L3Msg::L3Transfer { .. } => "L3Transfer",
            L3Msg::L3StatsQuery => "L3StatsQuery",
        }
    }

    fn reply_name(reply: &L3Reply) -> &'static str {
        match reply {
            L3Reply::L3LookedUp { .. } => "L3LookedUp",
            L3Reply::L3Transferred(_) => "L3Transferred",
            L3Reply::L3Stats(_) => "L3Stats",
        }
    }
}
