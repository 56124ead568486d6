//! Requests and their states. Each state owns exactly the resources it holds.

use kvtier_host::OwnedPages;
use kvtier_radix::{NodeId, NodeLock, RadixCache, WriteBackTicket};
use kvtier_types::{OpId, PageId, RequestId, Tier, Token, TransferPair};

use crate::slots::Slot;

/// The name of a request state (for errors, stats and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StateKind {
    /// Waiting for its first prefill chunk.
    Submitted,
    /// Host pages being filled from L3 (L3 tier).
    Prefetching,
    /// L3 pages landed in the host tier; waiting for the first chunk (L3 tier).
    PrefetchDone,
    /// Aborted while a prefetch was in flight (L3 tier).
    Aborting,
    /// Some prompt chunks scheduled, more to come.
    Prefilling,
    /// Whole prompt scheduled; the first decode comes next.
    PrefillDone,
    /// Decoding.
    Decoding,
    /// Finished; its write-back goes out with the next plan.
    Draining,
    /// Finished; its write-back is in flight.
    WritingBack,
    /// Preempted; its write-back is in flight.
    Retracting,
    /// Preempted; its prefix lives on host, waiting to resume.
    Retracted,
    /// Done; forgotten at the next plan.
    Finished,
}

/// Device pages a request holds outside the tree, plus the free token slots left in its
/// last page.
#[derive(Debug, Default)]
pub(crate) struct LocalKv {
    pub pages: OwnedPages,
    pub tail_free: u32,
}

impl LocalKv {
    /// Reserves slots for `n` more tokens, allocating pages when the tail is full.
    /// All-or-nothing; `false` when the pool is short.
    pub fn acquire(&mut self, cache: &mut RadixCache, n: u32) -> bool {
        if n <= self.tail_free {
            self.tail_free -= n;
            return true;
        }
        let ps = cache.page_size();
        let need = n - self.tail_free;
        let Some(mut fresh) = cache.allocate(Tier::Device, need.div_ceil(ps) as usize) else {
            return false;
        };
        if self.pages.append(&mut fresh).is_err() {
            return false;
        }
        let used = need % ps;
        self.tail_free = if used == 0 { 0 } else { ps - used };
        true
    }

    /// Pages needed to acquire `n` more tokens.
    pub fn pages_for(&self, n: u32, page_size: u32) -> u32 {
        n.saturating_sub(self.tail_free).div_ceil(page_size)
    }
}

/// What a prefilling or decoding request holds.
#[derive(Debug)]
pub(crate) struct Running {
    /// Device lock on the published prefix (the tree part of the page table).
    pub dref: NodeLock,
    /// Host lock on a load-back source, kept until the request leaves the running states.
    #[allow(dead_code, reason = "held for its Drop: pins the load-back source")]
    pub href: Option<NodeLock>,
    /// Device pages of the tree path root→`dref` (cached: locked pages never move).
    pub prefix_pages: Vec<PageId>,
    pub lka: LocalKv,
    pub slot: Slot,
    pub window_begin: u32,
    pub window_size: u32,
    /// Tokens the next schedule acquires.
    pub reserve: u32,
    /// First page-table entry swapped for the tree's copy since the request's last row
    /// (its next row reports the table as new from there).
    pub table_changed_from: Option<u32>,
}

impl Running {
    pub fn window_end(&self) -> u32 {
        self.window_begin + self.window_size
    }

    pub fn occupied_len(&self) -> usize {
        self.prefix_pages.len() + self.lka.pages.len()
    }
}

/// A finished request whose write-back is attached but not yet issued. The ticket pins
/// the path on both tiers until it is acknowledged.
#[derive(Debug)]
pub(crate) struct Draining {
    pub ticket: WriteBackTicket,
    pub pairs: Vec<TransferPair>,
    /// Deepest node of the written path (where demotion starts after the ack).
    pub device_node: NodeId,
}

/// An L3 prefetch in flight: host pages being filled for pages `start_page..` of the
/// prompt. The host lock pins the host-resident prefix the pages will extend.
#[derive(Debug)]
pub(crate) struct Prefetch {
    pub op: OpId,
    pub href: NodeLock,
    pub pages: OwnedPages,
    pub start_page: u32,
}

/// A preempted request whose prefix waits on host.
#[derive(Debug)]
pub(crate) struct Retracted {
    pub href: NodeLock,
    /// Kept when the retract write-back failed: the device copy stays authoritative.
    pub dref: Option<NodeLock>,
    pub lka: LocalKv,
    /// Pages of the request published in the tree; its tail pages follow them.
    pub pages: u32,
}

#[derive(Debug)]
pub(crate) enum State {
    Submitted,
    Prefetching(Prefetch),
    PrefetchDone,
    /// Aborted while its prefetch was in flight: the pages stay until the transfer ends.
    Aborting(Prefetch),
    Prefilling(Running),
    PrefillDone(Running),
    Decoding(Running),
    Draining(Draining),
    WritingBack {
        op: OpId,
    },
    Retracting {
        op: OpId,
        href: NodeLock,
        lka: LocalKv,
        pages: u32,
    },
    Retracted(Retracted),
    Finished,
}

impl State {
    pub fn kind(&self) -> StateKind {
        match self {
            State::Submitted => StateKind::Submitted,
            State::Prefetching(_) => StateKind::Prefetching,
            State::PrefetchDone => StateKind::PrefetchDone,
            State::Aborting(_) => StateKind::Aborting,
            State::Prefilling(_) => StateKind::Prefilling,
            State::PrefillDone(_) => StateKind::PrefillDone,
            State::Decoding(_) => StateKind::Decoding,
            State::Draining(_) => StateKind::Draining,
            State::WritingBack { .. } => StateKind::WritingBack,
            State::Retracting { .. } => StateKind::Retracting,
            State::Retracted(_) => StateKind::Retracted,
            State::Finished => StateKind::Finished,
        }
    }

    pub fn running(&self) -> Option<&Running> {
        match self {
            State::Prefilling(r) | State::PrefillDone(r) | State::Decoding(r) => Some(r),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Request {
    pub id: RequestId,
    pub tokens: Vec<Token>,
    pub prefill_len: u32,
    pub state: State,
    /// Consecutive prompt pages the engine found in L3 (drives prefetch).
    pub storage_hit_pages: u32,
    /// The request's lifecycle span: opened at submit, closed when it is forgotten.
    pub span: tracing::Span,
}

impl Request {
    /// Full pages of the token container except the newest token (which has no KV yet).
    pub fn full_pages_except_last(&self, page_size: u32) -> u32 {
        (self.tokens.len().saturating_sub(1) / page_size as usize) as u32
    }
}
