//! The cache protocol's ops and their results.

use kvtier_host::OwnedPages;
use kvtier_mamba::{RequestStates, Slot, SlotId};
use kvtier_types::{PageId, StateObject, TransferPair, hash::PageHash};

use super::family::FamilyRelease;
use super::program::{AdmitProgram, Outcome};
use super::{Publication, TokenRef};
use crate::{NodeId, NodeLock, WriteBackTicket};

/// A finished request's write-back, attached but not yet issued: the ticket pins the
/// path on both tiers until acknowledged.
#[derive(Debug)]
pub struct Attached {
    /// The ticket to acknowledge.
    pub ticket: WriteBackTicket,
    /// (device page → host page) copies to make.
    pub pairs: Vec<TransferPair>,
    /// Deepest node of the written path (demotion starts there after the ack).
    pub device_node: NodeId,
}

/// Host pages a write-back made readable, pinned for their L3 backup.
#[derive(Debug)]
pub struct BackupSource {
    /// Pins the pages until the backup has read them.
    pub pin: NodeLock,
    /// The host pages, root first.
    pub pages: Vec<PageId>,
    /// Their rolling page hashes.
    pub hashes: Vec<PageHash>,
    /// Hybrid models: the host states the write-back made valid on those pages (the
    /// pin keeps them too).
    pub states: Vec<StateObject>,
}

/// A stopping request's device lock, as its stop op finds it.
#[derive(Debug)]
pub enum StopLock {
    /// The lock it holds.
    Held(NodeLock),
    /// Handed to its publication earlier in the same batch (`CacheOp::PublishDecode`'s
    /// `stops`), which left the lock on the published node under this ticket.
    HandedOver(u64),
}

/// Handles a request let go of (pages, locks, state slots, tables), carried to the
/// cache so that they are released in event order: the reference frees an aborted
/// request's pages where the abort comes among the step's events, after the pages an
/// earlier finish of the same step freed.
pub struct Released {
    /// Only dropped.
    _handles: Box<dyn std::any::Any + Send + Sync>,
}

impl Released {
    /// Wraps whatever holds the handles; they are released when the op runs.
    pub fn new(handles: impl std::any::Any + Send + Sync) -> Self {
        Self {
            _handles: Box::new(handles),
        }
    }
}

impl std::fmt::Debug for Released {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Released(..)")
    }
}

/// One cache operation.
#[derive(Debug)]
pub enum CacheOp {
    /// Drop these handles now, between the ops before and after (see [`Released`]).
    Release(Released),
    /// Paged models: a decoding request's results came in; its tables give back the
    /// owned tail pages past `tokens` (the reservation its row did not use, like
    /// rejected draft tokens), as the reference rewinds them at each result.
    RewindTables {
        /// The request's tables.
        key: crate::TablesKey,
        /// Its tokens now.
        tokens: u32,
    },
    /// Acknowledges a write-back ticket.
    WriteBackAck {
        /// The ticket.
        ticket: WriteBackTicket,
        /// Whether the copy succeeded.
        success: bool,
        /// Lock this node on device before the ticket lets go of it (a failed retract
        /// copy: the device copy stays the only one).
        keep_device: Option<NodeId>,
        /// Pin the written host pages for an L3 backup.
        backup: bool,
        /// Demote device copies from this node after a successful copy.
        demote: Option<NodeId>,
    },
    /// Mid-flight publication of a running request's computed pages.
    Publish(Publication),
    /// Hybrid models: a decoding request's new full pages, with its checkpoint (cached
    /// where it holds the state at the published depth) and whether it wants a fresh
    /// one.
    PublishDecode {
        /// The pages.
        publication: Publication,
        /// The checkpoint and the depth whose state it holds.
        checkpoint: Option<(Slot, Option<u32>)>,
        /// Hand out a fresh checkpoint slot (evicting a state if it must).
        renew: bool,
        /// The node of the request's previous decode state: the new, deeper one makes it
        /// redundant (a later turn resumes from the deepest), so it goes.
        retire: Option<NodeId>,
        /// The request stops later in this batch: its previous lock, released as soon as
        /// the new one is taken (the reference moves a request's lock to each node it
        /// publishes), and the ticket its stop op takes the new lock by (not returned).
        stops: Option<(NodeLock, u64)>,
    },
    /// A request finished: publish its pages, release its locks and, when
    /// `write_back` is set, attach host pages for whatever is not on host yet.
    Finish {
        /// What to publish (may be empty).
        publication: Publication,
        /// The request's device lock on its prefix.
        device_lock: StopLock,
        /// The request's host lock on a load-back source.
        host_lock: Option<NodeLock>,
        /// Attach a write-back for the device-only part.
        write_back: bool,
        /// Whether prefixes are reused: with reuse off the reference's finish matches
        /// nothing (its prefix match answers the root), so it touches nothing.
        reuse: bool,
        /// The request's own pages left after the publication (its last, partial page):
        /// freed once the publication is in, in the order the reference frees them.
        leftover: OwnedPages,
        /// What the request gives back of its model's cache family.
        family: FamilyRelease,
    },
    /// A request is preempted: publish its pages, keep its prefix on host, and attach a
    /// write-back for the device-only part or demote it.
    Retract {
        /// What to publish (may be empty).
        publication: Publication,
        /// The request's device lock on its prefix.
        device_lock: NodeLock,
        /// The request's host lock on a load-back source.
        host_lock: Option<NodeLock>,
        /// What the request gives back of its model's cache family, as for `Finish`:
        /// under kvtier's own policy a paged request's tables too (a retracted request
        /// recomputes from its deepest snapshot); the reference policies keep them with
        /// the request, which resumes from them.
        family: FamilyRelease,
    },
    /// Prefetched host pages land: insert them after the locked host prefix.
    InsertPrefetched {
        /// The prompt up to the last prefetched page.
        tokens: TokenRef,
        /// Absolute page index of the first prefetched page.
        start_page: u32,
        /// The filled pages.
        pages: OwnedPages,
        /// Lock on the host prefix they extend (released after the insert).
        host_lock: NodeLock,
        /// Hybrid models: the host state slot holding the state after the last page,
        /// attached to the node that ends there.
        state: Option<Slot>,
    },
    /// One scheduling step's admissions.
    Admit(AdmitProgram),
    /// A load-back failed: the device copies it attached hold no valid KV. Every node
    /// whose device pages are among these goes back to its host copy, and so does every
    /// node whose device state is among its state slots (hybrid models).
    DiscardLoadBack {
        /// The load-back's device pages.
        pages: Vec<PageId>,
        /// The load-back's device state slots.
        states: Vec<SlotId>,
    },
    /// An L3 backup stored these pages: they are published as stored in L3 (KV events),
    /// then the backup's pin goes.
    BackedUp {
        /// The backup's pin on its host pages.
        pin: NodeLock,
        /// The rolling hashes of the pages it stored.
        page_hashes: Vec<PageHash>,
    },
}

/// The result of one [`CacheOp`].
#[derive(Debug)]
pub enum OpResult {
    /// A write-back ack: the device lock asked for, and the pinned backup source.
    Acked {
        /// The device lock (`keep_device`).
        kept: Option<NodeLock>,
        /// The backup source (`backup`, on success).
        backup: Option<BackupSource>,
    },
    /// A publication: the new device lock on the published path and its device pages.
    Published {
        /// Lock on the node ending at the published length.
        lock: NodeLock,
        /// Device pages of the path root → that node.
        path_pages: Vec<PageId>,
    },
    /// A decode publication (hybrid): as `Published`, and the fresh checkpoint asked for.
    PublishedDecode {
        /// The new lock and path pages; `None` when nothing new was published.
        published: Option<(NodeLock, Vec<PageId>)>,
        /// The fresh checkpoint slot, if one was asked for and could be had.
        checkpoint: Option<Slot>,
    },
    /// A finish: the write-back attached, if any.
    Finished {
        /// `None`: nothing to write, or the host pool could not make room.
        write_back: Option<Attached>,
    },
    /// A retraction.
    Retracted(RetractOutcome),
    /// Prefetched pages inserted.
    Inserted,
    /// The admissions, one per intent.
    Admitted(Vec<Outcome>),
    /// Device copies of a failed load-back taken back: the pages freed.
    Discarded(u32),
    /// A backup's pages published as stored in L3.
    BackedUp,
    /// Handles released.
    Released,
}

/// A finishing or retracted request's state slots (hybrid models).
#[derive(Debug)]
pub struct FinalStates {
    /// The slots.
    pub states: RequestStates,
    /// Tokens whose state the working slot holds (the request's computed tokens).
    pub working_at: u32,
}

/// What a retraction did.
#[derive(Debug)]
pub enum RetractOutcome {
    /// The prefix is kept (`prefix_lock`): on host, where `write_back` copies its
    /// device-only part; or, for a paged model without host room, on device, where its
    /// snapshots make it reusable and from where the request is recomputed.
    Kept {
        /// The lock on the published prefix: on host, or on device as above.
        prefix_lock: NodeLock,
        /// The copy to issue, if the prefix was not fully on host.
        write_back: Option<Attached>,
    },
    /// The host pool could not take the prefix: the request must be given up.
    HostExhausted,
}
