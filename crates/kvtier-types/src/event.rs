//! What the engine reports back, and the KV-cache events the scheduler publishes.

use crate::{OpId, RequestId, Tier, Token};

/// One engine event. A step's events are applied strictly in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// Tokens whose KV is now stable history (the first generated token after the
    /// last prefill chunk, then one or more per decode step).
    ExtendResult {
        /// The request.
        request_id: RequestId,
        /// Appended tokens.
        tokens: Vec<Token>,
    },
    /// The request is done: publish its pages and write them back.
    Finish {
        /// The request.
        request_id: RequestId,
    },
    /// The client gave up on the request: release everything it holds.
    Abort {
        /// The request.
        request_id: RequestId,
    },
    /// Slots the next decode schedule acquires (accepted tokens with speculation).
    UpdateReserve {
        /// The request.
        request_id: RequestId,
        /// Tokens to reserve at the next schedule.
        tokens: u32,
    },
    /// A write-back op finished. A failed copy leaves the device copy authoritative.
    WriteBackDone {
        /// The op.
        op_id: OpId,
        /// Whether every page was copied.
        success: bool,
    },
    /// A load-back copy failed: its device pages hold no valid KV. Rows whose page
    /// tables include them are void (an engine need not run them; the scheduler ignores
    /// their results) and their requests are scheduled again, as cache misses. Only
    /// failures are reported: a load-back that is not named here landed.
    LoadBackFailed {
        /// The op.
        op_id: OpId,
    },
    /// An L3 prefetch finished (L3 tier).
    PrefetchDone {
        /// The op.
        op_id: OpId,
        /// The request it was for.
        request_id: RequestId,
        /// Whether the fetch succeeded.
        success: bool,
        /// Leading pages fully written.
        completed_pages: u32,
    },
    /// An L3 backup finished (L3 tier).
    BackupDone {
        /// The op.
        op_id: OpId,
        /// Whether every page was stored.
        success: bool,
    },
    /// Disaggregation: the peer is ready (role P or D; not served yet).
    Bootstrapped {
        /// The request.
        request_id: RequestId,
    },
    /// Disaggregation: the remote prefill finished with this first token (role D).
    RemotePrefillDone {
        /// The request.
        request_id: RequestId,
        /// The bootstrap token.
        token: Token,
    },
}

impl EngineEvent {
    /// A short name for messages and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            EngineEvent::ExtendResult { .. } => "ExtendResult",
            EngineEvent::Finish { .. } => "Finish",
            EngineEvent::Abort { .. } => "Abort",
            EngineEvent::UpdateReserve { .. } => "UpdateReserve",
            EngineEvent::WriteBackDone { .. } => "WriteBackDone",
            EngineEvent::LoadBackFailed { .. } => "LoadBackFailed",
            EngineEvent::PrefetchDone { .. } => "PrefetchDone",
            EngineEvent::BackupDone { .. } => "BackupDone",
            EngineEvent::Bootstrapped { .. } => "Bootstrapped",
            EngineEvent::RemotePrefillDone { .. } => "RemotePrefillDone",
        }
    }

    /// The request the event names, if any.
    pub fn request_id(&self) -> Option<&RequestId> {
        match self {
            EngineEvent::ExtendResult { request_id, .. }
            | EngineEvent::Finish { request_id }
            | EngineEvent::Abort { request_id }
            | EngineEvent::UpdateReserve { request_id, .. }
            | EngineEvent::PrefetchDone { request_id, .. }
            | EngineEvent::Bootstrapped { request_id }
            | EngineEvent::RemotePrefillDone { request_id, .. } => Some(request_id),
            EngineEvent::WriteBackDone { .. }
            | EngineEvent::LoadBackFailed { .. }
            | EngineEvent::BackupDone { .. } => None,
        }
    }
}

/// Where a KV event's pages are: the two tiers of the radix cache, or the L3 store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Medium {
    /// L1: accelerator memory.
    Device,
    /// L2: host DRAM.
    Host,
    /// L3: the storage tier (Mooncake or the embedded local store).
    Storage,
}

impl Medium {
    /// Every medium, device first.
    pub const ALL: [Medium; 3] = [Medium::Device, Medium::Host, Medium::Storage];

    /// Its position in [`Self::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl From<Tier> for Medium {
    fn from(tier: Tier) -> Self {
        match tier {
            Tier::Device => Medium::Device,
            Tier::Host => Medium::Host,
        }
    }
}

/// A KV-cache event (vLLM-compatible content plus the tier it concerns).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvEvent {
    /// A page became resident.
    BlockStored {
        /// The page's block hash (one per event).
        block_hashes: Vec<u64>,
        /// The previous page's block hash; `None` for the first page.
        parent_block_hash: Option<u64>,
        /// The page's tokens.
        token_ids: Vec<Token>,
        /// Tokens per page.
        block_size: u32,
        /// Where it became resident.
        medium: Medium,
    },
    /// Pages left a tier (one event per tree node).
    BlockRemoved {
        /// The removed pages' block hashes.
        block_hashes: Vec<u64>,
        /// The tier they left.
        medium: Medium,
    },
}
