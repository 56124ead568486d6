//! The admission program: candidates as intents, and what the cache did with each.

use kvtier_host::OwnedPages;
use kvtier_mamba::{CheckpointNeed, RequestStates, Slot, SlotId};
use kvtier_types::{GroupTable, PageId, TransferPair};

use super::family::FamilyGrant;
use super::{Publication, TokenRef};
use crate::{NodeId, NodeLock, TablesKey};

/// An admission program: candidates in scheduling order and the limits of the step.
#[derive(Debug)]
pub struct AdmitProgram {
    /// Token budget of the step.
    pub budget: i64,
    /// Maximum forward rows.
    pub max_rows: usize,
    /// Free request-pool slots (first chunks and recoveries take one each).
    pub slots: usize,
    /// Mixed prefill and decode rows in one batch.
    pub mixed: bool,
    /// Decode input tokens per row (`d`).
    pub decode_tokens: u32,
    /// The host tier is on (load-backs allowed).
    pub use_host: bool,
    /// Prefix reuse is on.
    pub reuse: bool,
    /// Requests finished since the last step: device state copies waiting for their
    /// readers to go may be demoted now (hybrid models).
    pub released: bool,
    /// The candidates, in order.
    pub intents: Vec<Intent>,
}

/// What a candidate asks for.
#[derive(Debug)]
pub enum Intent {
    /// A waiting request's first prefill chunk (after an optional L3 prefetch check).
    FirstChunk {
        /// The prompt's full pages except the last token's.
        tokens: TokenRef,
        /// Prompt length.
        prefill_len: u32,
        /// Start an L3 prefetch instead when it pays off.
        prefetch: Option<PrefetchCheck>,
        /// Paged models: the groups refused it before (skipped while nothing changed).
        denied: Option<Box<Denial>>,
    },
    /// The next chunk of a prefilling request.
    NextChunk {
        /// Prompt tokens not yet scheduled.
        remaining: u32,
        /// Free slots in its last page.
        tail_free: u32,
        /// Hybrid and paged models under the reference's order: the last chunk,
        /// committed if this one is admitted.
        commit: Option<Box<ChunkCommit>>,
        /// What the chunk asks of the model's cache family.
        family: FamilyAsk,
    },
    /// A decode row reserving `reserve` token slots.
    Decode {
        /// Slots to reserve.
        reserve: u32,
        /// Free slots in its last page.
        tail_free: u32,
        /// First decode, under the reference's order: the last prefill chunk,
        /// committed if admitted.
        commit: Option<Box<ChunkCommit>>,
        /// What the row asks of the model's cache family.
        family: FamilyAsk,
    },
    /// Resume a retracted request.
    Recovery {
        /// Its published prefix.
        tokens: TokenRef,
        /// Free slots in its last page.
        tail_free: u32,
        /// Its locks and the pages it kept outside the tree, with the intent: they come
        /// back where it stays retracted ([`Outcome::StaysRetracted`]), its pages head
        /// the admitted row's, and the cache frees them where it is given up.
        kept: Box<RetractedHandles>,
        /// The tokens it computed (its row computes the next one). Hybrid models: its
        /// state is restored only from a cached state holding exactly those; otherwise
        /// it is recomputed from the deepest state.
        computed: u32,
        /// What its row asks of the model's cache family: under the reference policies,
        /// a paged model's group tables it kept (`Groups(key, computed)`), from which it
        /// resumes as a decode (without, it is recomputed from its deepest snapshot).
        family: FamilyAsk,
    },
}

/// What a running request's next row asks of its model's cache family: a model has one
/// family, so a row asks one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyAsk {
    /// Full attention: nothing.
    Dense,
    /// Hybrid models: the checkpoint slot the row needs.
    Checkpoint(CheckpointNeed),
    /// Paged models: its group tables and the row's first position.
    Groups(TablesKey, u32),
    /// A registered family: the family's number for the request.
    Lease(u32),
}

impl FamilyAsk {
    /// The checkpoint slot asked for (none but a hybrid row's).
    pub fn checkpoint(self) -> CheckpointNeed {
        match self {
            FamilyAsk::Checkpoint(need) => need,
            FamilyAsk::Dense | FamilyAsk::Groups(..) | FamilyAsk::Lease(_) => CheckpointNeed::None,
        }
    }
}

/// What a retracted request holds while its recovery is tried. They travel with the
/// intent because the reference frees a request it gives up at once, and the next
/// candidate of the same step may need those pages.
#[derive(Debug)]
pub struct RetractedHandles {
    /// Its old locks, released once the new ones are taken.
    pub locks: Vec<NodeLock>,
    /// Its own device pages past the published prefix.
    pub tail: OwnedPages,
}

/// A hybrid request's last chunk, committed when its next row is admitted: the full
/// pages it computed go into the tree, its checkpoint is cached where it holds the state
/// at their end (else freed), and it gets a fresh checkpoint.
#[derive(Debug)]
pub struct ChunkCommit {
    /// The pages to publish; `None` when the chunk completed no new page.
    pub publication: Option<Publication>,
    /// The checkpoint and the depth whose state it holds.
    pub checkpoint: Option<(Slot, Option<u32>)>,
    /// Paged models under the reference's order, when nothing new is published: the
    /// request's tables and its published node, where they are committed again. The
    /// reference commits at every chunk and at the first decode all the same; such a
    /// commit still completes the terminal's window state and (the wheel's #460)
    /// detaches the windows the request's last slide stopped borrowing.
    pub recommit: Option<(TablesKey, NodeId)>,
}

/// What committing a chunk did.
#[derive(Debug)]
pub struct Committed {
    /// Lock on the published node and its path's device pages; `None` when nothing was
    /// published.
    pub published: Option<(NodeLock, Vec<PageId>)>,
    /// The fresh checkpoint slot.
    pub checkpoint: Option<Slot>,
}

/// The states an admitted hybrid request starts with.
#[derive(Debug)]
pub struct StateGrant {
    /// Its working and checkpoint slots.
    pub states: RequestStates,
    /// The cached state copied into the working slot before the row runs.
    pub cow_src: Option<SlotId>,
    /// Where the first chunk should also checkpoint (tokens).
    pub branching: Option<u32>,
}

/// The L3 prefetch check of a first chunk.
#[derive(Debug, Clone)]
pub struct PrefetchCheck {
    /// The prompt up to its consecutive L3 hits.
    pub tokens: TokenRef,
    /// Prefetch only when more than this many pages are missing from host.
    pub threshold: u32,
}

/// Why a first chunk started without the L3 prefetch its lookup asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchSkip {
    /// Host already held every page L3 had.
    NothingMissing = 0,
    /// Some pages were missing from host, but no more than the threshold.
    BelowThreshold = 1,
    /// The host pool could not make room (its pages held by copies in flight or locks).
    NoHostRoom = 2,
    /// A hybrid model had no free host state slot for the prefix's state.
    NoStateSlot = 3,
}

/// What the cache did with one intent.
#[derive(Debug)]
pub enum Outcome {
    /// Not admitted this step (does not fit, no slot, or the step stopped before it);
    /// nothing changed and its handles come back.
    Waits {
        /// The intent's handles, returned.
        held: Vec<NodeLock>,
        /// A hybrid intent's chunk to commit, returned.
        commit: Option<Box<ChunkCommit>>,
    },
    /// A first chunk or a recovery is admitted.
    Admitted(Box<Admission>),
    /// A next chunk or a decode gets its slots.
    Grown {
        /// Tokens scheduled (chunk length, or the reserve of a decode).
        tokens: u32,
        /// Pages allocated for them (`None`: they fit the pages the request holds, as
        /// most decode steps do; boxed, so the outcomes a step moves stay small).
        pages: Option<Box<OwnedPages>>,
        /// A hybrid intent's commit.
        committed: Option<Box<Committed>>,
        /// Paged models: the request's group tables after the op's release and
        /// acquisition (boxed: decode rows of other models move outcomes every step).
        groups: Option<Box<Vec<GroupTable>>>,
    },
    /// An L3 prefetch starts instead of the first chunk (boxed: outcomes are moved
    /// once per row, and this rare one is the largest).
    Prefetch(Box<PrefetchStart>),
    /// A retracted request is not resumed this step; its handles come back.
    StaysRetracted(Box<RetractedHandles>),
    /// A retracted request can never fit the device pool again.
    TooBig,
    /// A retracted hybrid request whose state cannot be restored exactly: recompute its
    /// history from the deepest cached state (its locks are released).
    Recompute,
    /// A retracted hybrid request whose path holds no state at all (the reference
    /// aborts it; `Policy::Reference` only).
    StateLost,
    /// A paged model's first chunk the groups refused (nothing changed); the request
    /// keeps the denial for its next intent.
    Denied(Denial),
}

impl Outcome {
    /// Not admitted, nothing held.
    pub(crate) fn waits() -> Self {
        Outcome::Waits {
            held: Vec::new(),
            commit: None,
        }
    }
}

/// An L3 prefetch that starts instead of a first chunk.
#[derive(Debug)]
pub struct PrefetchStart {
    /// Lock on the host prefix the prefetched pages extend.
    pub host_lock: NodeLock,
    /// Host pages to fill.
    pub pages: OwnedPages,
    /// Host pages already resident (the prefetch starts there).
    pub start_page: u32,
    /// Hybrid models: the host state slot for the state after the last page.
    pub state: Option<Slot>,
}

/// A first chunk or recovery admitted.
#[derive(Debug)]
pub struct Admission {
    /// Tokens of the chunk (0 for a recovery).
    pub tokens: u32,
    /// Prefix pages reused (device or host).
    pub begin_pages: u32,
    /// Device lock on the prefix the request reads.
    pub device_lock: NodeLock,
    /// Host lock on the load-back source.
    pub host_lock: Option<NodeLock>,
    /// Load-back copies (host page → device page), then the state's (host slot → device
    /// slot) when it starts from a host state.
    pub load_back: Vec<TransferPair>,
    /// Device pages allocated for the chunk and the decode reserve.
    pub pages: OwnedPages,
    /// Free slots left in the last of those pages.
    pub tail_free: u32,
    /// Device pages of the locked prefix path.
    pub prefix_pages: Vec<PageId>,
    /// What it is granted of its model's cache family.
    pub family: FamilyGrant,
    /// The view of its group tables the row reads (paged models).
    pub groups: Vec<GroupTable>,
    /// First chunks with `CacheConfig::lost_hits`: the prompt's pages after
    /// `begin_pages` the tree holds but the request does not reuse (a hybrid model's
    /// missing state or window; host pages not loaded back).
    pub capped_pages: u32,
    /// First chunks with `CacheConfig::lost_hits`: the prompt's pages after those, in a
    /// row, that the cache held once and dropped.
    pub dropped_pages: u32,
}

impl Intent {
    /// The intent not admitted: its handles come back.
    pub(super) fn unused(self) -> Outcome {
        match self {
            Intent::Recovery { kept, .. } => Outcome::StaysRetracted(kept),
            Intent::NextChunk { commit, .. } | Intent::Decode { commit, .. } => Outcome::Waits {
                held: Vec::new(),
                commit,
            },
            Intent::FirstChunk { .. } => Outcome::waits(),
        }
    }
}

/// A first chunk the groups refused (default policy): the family's version and the
/// step's budget then. While the version stands and the budget is no smaller, the same
/// request is refused again, so its next intents skip the match and the admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    pub(crate) version: u64,
    pub(crate) budget: u32,
}
