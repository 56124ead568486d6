//! The oracle engine: plays the model runner against real KV arenas and proves, slot by
//! slot, that every row reads the KV its tokens would have produced.
//!
//! * The KV of the token at position `i` of a sequence is a pure function of the token
//!   prefix `0..=i` (a rolling hash) and of the layer and plane. A computed token writes
//!   it into the slot the plan's page table gives: page `table[i / page_size]`, offset
//!   `i % page_size`.
//! * Each row verifies the slots it reads (all of them, or every layer and plane of a
//!   sample of positions) and records the first wrong one with the request, position,
//!   page, tier, layer, plane and where that page's bytes came from ([`Provenance`]:
//!   computed by this request or published by another, loaded back from a host page a
//!   write-back filled, or prefetched from L3). A row for a request the engine does not
//!   know (never admitted, aborted, finished) is an error too, never skipped.
//! * The next token is a digest of every word the row read (all positions, layers,
//!   planes and slots), so misplaced, stale or corrupted KV anywhere changes the output:
//!   a run with cache reuse must produce exactly the tokens of a run without it. Which rows yield a token, and when a request
//!   finishes, is [`kvtier_types::engine_rule`].
//!
//! * A hybrid model ([`OracleEngine::with_states`]) also keeps a recurrent state per
//!   request: the state after `tokens[0, L)` is a pure function of that prefix and `L`.
//!   Each row reads the state its working slot holds (after the device copied the
//!   row's copy-on-write source there), checks it is the state after exactly the
//!   tokens before the row, mixes it into the next token, and writes the state after
//!   the row to the working slot — and to the checkpoint slot at the positions the
//!   checkpoint rule names (`kvtier_mamba::checkpoint_depth`). A wrong or stale state
//!   is reported with the request, slot and position ([`WrongState`]).
//!
//! It is a [`ModelRunner`](kvtier_device::ModelRunner): the device actor runs each
//! plan's load-backs and write-backs on the arenas through the kernel library, then
//! hands the forward rows to it.

mod engine;

pub use engine::{OracleEngine, corrupt};

use kvtier_types::{PageId, RequestId, Tier};

use crate::groups::WrongGroupEntry;

/// How much of what a row reads is checked against its tokens. The next token depends
/// on every byte read; every mode but `Sparse` reads the whole history, as attention
/// does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Every slot of every layer and plane.
    Full,
    /// Every layer and plane of every `n`-th position and of the last few.
    Sampled(u32),
    /// Reads — and checks — only every `n`-th position and the last few: a decode row
    /// of a 12,000-token history then reads 1/`n` of it. For production traces, where
    /// reading every history at every step would take hours; a wrong byte elsewhere
    /// goes unseen.
    Sparse(u32),
    /// Nothing (the output still depends on the bytes read).
    Off,
}

impl Verify {
    /// `Sampled` at the interval a bare `sampled` means (the command line's): every 16th
    /// position.
    pub const SAMPLED: Verify = Verify::Sampled(16);
    /// `Sparse` at the interval a bare `sparse` means: every 64th position.
    pub const SPARSE: Verify = Verify::Sparse(64);
}

/// `full`, `sampled` ([`Verify::SAMPLED`]) or `off`. Written out because `Sampled`
/// carries its interval, which the derive cannot.
#[cfg(feature = "clap")]
impl clap::ValueEnum for Verify {
    fn value_variants<'a>() -> &'a [Self] {
        &[Verify::Full, Verify::SAMPLED, Verify::SPARSE, Verify::Off]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let name = match self {
            Verify::Full => "full",
            Verify::Sampled(_) => "sampled",
            Verify::Sparse(_) => "sparse",
            Verify::Off => "off",
        };
        Some(clap::builder::PossibleValue::new(name))
    }
}

/// Where the bytes of a page a row read came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Provenance {
    /// Never written since the engine started.
    Fresh,
    /// Computed by a forward of the reading request.
    Computed,
    /// Computed by another request's forward (reused through the prefix cache).
    PublishedBy(RequestId),
    /// Loaded back from this host page, which a write-back filled (or nothing did).
    LoadedBack {
        /// The host page.
        host_page: PageId,
    },
    /// Loaded back from this host page, which an L3 prefetch filled.
    Prefetched {
        /// The host page.
        host_page: PageId,
    },
}

/// What the oracle found wrong in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntegrityError {
    /// A slot the row read holds KV other than its tokens'.
    WrongKv(WrongKv),
    /// The row's page table does not reach a position it reads.
    ShortPageTable {
        /// The request.
        request: RequestId,
        /// The first position without a page.
        position: u32,
    },
    /// A row for a request the engine does not know: never admitted, aborted, or
    /// finished.
    UnknownRequest {
        /// The request the row names.
        request: RequestId,
    },
    /// A hybrid model's row read a recurrent state other than the one after its
    /// tokens (or named no state slot).
    WrongState(WrongState),
    /// A paged model's row read a group entry other than its tokens', or its group
    /// table did not reach one it reads or writes.
    WrongGroup(WrongGroupEntry),
}

/// A wrong recurrent state a row read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongState {
    /// The request whose row read it.
    pub request: RequestId,
    /// The device state slot (`None`: the row named no working slot).
    pub slot: Option<u32>,
    /// The prefix length whose state the row needed.
    pub position: u32,
    /// The prefix length the slot's state claims to follow (garbage claims anything).
    pub found: u64,
}

impl IntegrityError {
    /// The request whose row went wrong.
    pub fn request(&self) -> &RequestId {
        match self {
            IntegrityError::WrongKv(wrong) => &wrong.request,
            IntegrityError::ShortPageTable { request, .. }
            | IntegrityError::UnknownRequest { request } => request,
            IntegrityError::WrongState(wrong) => &wrong.request,
            IntegrityError::WrongGroup(wrong) => &wrong.request,
        }
    }

    /// The wrong slot, if that is what went wrong.
    pub fn wrong_kv(&self) -> Option<&WrongKv> {
        match self {
            IntegrityError::WrongKv(wrong) => Some(wrong),
            _ => None,
        }
    }
}

/// The first wrong KV slot a row read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongKv {
    /// The request whose row read it.
    pub request: RequestId,
    /// Token position.
    pub position: u32,
    /// The page read.
    pub page: PageId,
    /// Its tier (rows read device pages).
    pub tier: Tier,
    /// Layer.
    pub layer: u32,
    /// Plane (K or V).
    pub plane: u32,
    /// Where the page's bytes came from.
    pub provenance: Provenance,
}
