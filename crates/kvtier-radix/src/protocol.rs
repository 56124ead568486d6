//! The Radix actor's protocol: what the scheduler sends the cache and what it answers.

use kvtier_types::{ActorCore, ActorName, KvEvent, PageId, Token};

use crate::{CacheBatch, CacheReply, Probe, RadixCore, RadixError, TreeStats};

/// A message to the Radix actor.
#[derive(Debug)]
#[non_exhaustive]
pub enum RadixMsg {
    /// Execute one batch of cache ops in order (`docs/messages.md`, the cache protocol).
    RunBatch(CacheBatch),
    /// The tree's counters.
    CacheStats,
    /// The KV-cache events collected since the last call.
    DrainKvEvents,
    /// Check the tree's invariants with the pages held outside it, per tier.
    CheckPages([Vec<PageId>; 2]),
    /// How much of a prompt's prefix each tier holds now (read-only: no split, no LRU
    /// touch), as a router's index should see it.
    Probe(Vec<Token>),
}

/// The Radix actor's answer, one per message.
#[derive(Debug)]
#[non_exhaustive]
pub enum RadixReply {
    /// One result per op of the batch, in order.
    CacheReply(CacheReply),
    /// The tree's counters.
    TreeStats(TreeStats),
    /// The KV-cache events.
    KvEvents(Vec<KvEvent>),
    /// `Err` names a page neither free nor in the tree, or a broken tree invariant.
    Checked(Result<(), RadixError>),
    /// The prompt's leading pages on each tier.
    Probed(Probe),
}

impl ActorCore for RadixCore {
    const NAME: ActorName = ActorName::RADIX;
    type Msg = RadixMsg;
    type Reply = RadixReply;

    fn handle(&mut self, msg: RadixMsg) -> RadixReply {
        match msg {
            RadixMsg::RunBatch(batch) => RadixReply::CacheReply(self.execute(batch)),
            RadixMsg::CacheStats => RadixReply::TreeStats(self.stats()),
            RadixMsg::DrainKvEvents => RadixReply::KvEvents(self.drain_events()),
            RadixMsg::CheckPages([device, host]) => {
                RadixReply::Checked(self.check_invariants([&device, &host]))
            }
            RadixMsg::Probe(tokens) => RadixReply::Probed(self.probe(&tokens)),
        }
    }

    fn message_name(msg: &RadixMsg) -> &'static str {
        match msg {
            RadixMsg::RunBatch(_) => "RunBatch",
            RadixMsg::CacheStats => "CacheStats",
            RadixMsg::DrainKvEvents => "DrainKvEvents",
            RadixMsg::CheckPages(_) => "CheckPages",
            RadixMsg::Probe(_) => "Probe",
        }
    }

    fn reply_name(reply: &RadixReply) -> &'static str {
        match reply {
            RadixReply::CacheReply(_) => "CacheReply",
            RadixReply::TreeStats(_) => "TreeStats",
            RadixReply::KvEvents(_) => "KvEvents",
            RadixReply::Checked(_) => "Checked",
            RadixReply::Probed(_) => "Probed",
        }
    }
}
