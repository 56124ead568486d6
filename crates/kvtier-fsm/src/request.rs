//! Requests and their states. Each state owns exactly the resources it holds.

use std::sync::Arc;

use kvtier_host::OwnedPages;
use kvtier_mamba::RequestStates;
use kvtier_radix::{
    Attached, FamilyHold, FamilyRelease, GroupTables, NodeLock, Publication, TokenRef, grow,
};
use kvtier_types::{OpId, PageId, Policy, RequestId, Token};

use crate::slots::Slot;

/// The name of a request state (for errors, stats and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StateKind {
    /// Its prompt is being looked up in L3; not scheduled until the answer comes.
    LookingUp,
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
    /// Takes the pages the cache allocated for `tokens` more token slots (see
    /// [`kvtier_radix::grow`], which both sides use).
    pub fn absorb(&mut self, mut fresh: OwnedPages, tokens: u32, page_size: u32) {
        let (pages, tail_free) = grow(self.tail_free, tokens, page_size);
        debug_assert_eq!(
            pages as usize,
            fresh.len(),
            "allocation and accounting disagree"
        );
        if !fresh.is_empty() {
            let appended = self.pages.append(&mut fresh);
            debug_assert!(appended.is_ok(), "pages of another pool");
        }
        self.tail_free = tail_free;
    }
}

/// Where a publication's pages sit in the request's page table: the index of the first
/// published page, and the request's own copies of the published pages (to spot those
/// the tree replaced with another request's).
#[derive(Debug)]
pub(crate) struct Republish {
    pub published_from: u32,
    pub own_pages: Vec<PageId>,
}

/// What a prefilling or decoding request holds.
#[derive(Debug)]
pub(crate) struct Running {
    /// Device lock on the published prefix (the tree part of the page table).
    pub device_lock: NodeLock,
    /// Host lock on a load-back source, kept until the request leaves the running states.
    #[allow(dead_code, reason = "held for its Drop: pins the load-back source")]
    pub host_lock: Option<NodeLock>,
    /// Device pages of the tree path root→`device_lock` (cached: locked pages never move).
    pub prefix_pages: Vec<PageId>,
    pub local_kv: LocalKv,
    pub slot: Slot,
    pub window_begin: u32,
    pub window_size: u32,
    /// Tokens the next schedule acquires.
    pub reserve: u32,
    /// First page-table entry swapped for the tree's copy since the request's last row
    /// (its next row reports the table as new from there).
    pub table_changed_from: Option<u32>,
    /// Pages handed to publications whose replies are not in yet: they follow
    /// `prefix_pages` in the page table. A finish in the same advance as a decode's
    /// publication must not publish them again from the old prefix.
    pub published_ahead: u32,
    /// What it holds of its model's cache family.
    pub family: FamilyHold<RequestStates>,
    /// Hybrid models: the node of the last decode state it cached (a deeper one
    /// retires it).
    pub decode_state: Option<kvtier_radix::NodeId>,
}

impl Running {
    pub fn window_end(&self) -> u32 {
        self.window_begin + self.window_size
    }

    /// A publication of `pages` pages is answered (or taken back).
    pub fn landed(&mut self, pages: usize) {
        debug_assert!(
            pages as u32 <= self.published_ahead,
            "more pages landed than sent"
        );
        self.published_ahead = self.published_ahead.saturating_sub(pages as u32);
    }

    pub fn occupied_len(&self) -> usize {
        self.prefix_pages.len() + self.local_kv.pages.len()
    }

    /// Takes a publication's result: the lock on the published node (it replaces the old
    /// one, released after it, so the path is never unpinned) and the path's device
    /// pages. Pages another request published first replace the request's own copies
    /// (`republish`): its next row reports the table as new from the first one.
    pub fn adopt_published(
        &mut self,
        lock: NodeLock,
        path_pages: Vec<PageId>,
        republish: &Republish,
    ) {
        let Republish {
            published_from,
            own_pages,
        } = republish;
        let published_from = *published_from;
        self.landed(own_pages.len());
        self.device_lock = lock;
        self.prefix_pages = path_pages;
        let first_changed = self.prefix_pages
            [(published_from as usize).min(self.prefix_pages.len())..]
            .iter()
            .zip(own_pages)
            .position(|(tree, mine)| tree != mine)
            .map(|i| published_from + i as u32);
        if let Some(i) = first_changed {
            self.table_changed_from = Some(self.table_changed_from.map_or(i, |c| c.min(i)));
        }
    }

    /// Takes a chunk commit's (or a decode publication's) result: the published prefix,
    /// adopted as [`Self::adopt_published`] does, and the fresh checkpoint slot, which
    /// holds nothing yet.
    pub fn take_commit(
        &mut self,
        published: Option<(NodeLock, Vec<PageId>)>,
        republish: Option<&Republish>,
        checkpoint: Option<kvtier_mamba::Slot>,
    ) {
        match (published, republish) {
            (Some((lock, path_pages)), Some(r)) => self.adopt_published(lock, path_pages, r),
            (None, Some(r)) => self.landed(r.own_pages.len()),
            _ => {}
        }
        if let Some(states) = self.family.states_mut() {
            states.checkpoint = checkpoint;
            states.checkpoint_at = None;
        }
    }

    /// Where the next row's page table is new from: the end of the table, or the first
    /// entry swapped for the tree's copy since the last row. `only_allocated` reports
    /// only the newly allocated pages, as the reference does (`Policy::Reference`): its
    /// `begin` is the table's old length even where a publication swapped earlier
    /// entries, which an engine that updates its page tables incrementally would miss.
    pub fn take_row_begin(&mut self, only_allocated: bool) -> u32 {
        let occupied = self.occupied_len() as u32;
        let changed = self.table_changed_from.take();
        if only_allocated {
            return occupied;
        }
        changed.map_or(occupied, |i| i.min(occupied))
    }
}

/// An L3 prefetch in flight: host pages being filled for pages `start_page..` of the
/// prompt. The host lock pins the host-resident prefix the pages will extend.
#[derive(Debug)]
pub(crate) struct Prefetch {
    pub op: OpId,
    pub host_lock: NodeLock,
    pub pages: OwnedPages,
    pub start_page: u32,
    /// Hybrid models: the host state slot the state after the last page lands in.
    pub state: Option<kvtier_mamba::Slot>,
}

/// A preempted request whose prefix waits on host (or, for a paged model without host
/// room, on device, where its snapshots keep it reusable).
#[derive(Debug)]
pub(crate) struct Retracted {
    /// The lock that keeps its published prefix: on host, or on device as above.
    pub prefix_lock: NodeLock,
    /// Kept when the retract write-back failed: the device copy stays authoritative.
    pub device_lock: Option<NodeLock>,
    pub local_kv: LocalKv,
    /// Pages of the request published in the tree; its tail pages follow them.
    pub published_pages: u32,
    /// Paged models under the reference policies: its group tables, kept until it
    /// resumes from them (kvtier's own policy recomputes from the deepest snapshot).
    pub tables: Option<GroupTables>,
}

#[derive(Debug)]
pub(crate) enum State {
    /// Its L3 lookup (`ticket`) is under way; it holds nothing.
    LookingUp {
        ticket: u64,
    },
    Submitted,
    Prefetching(Prefetch),
    PrefetchDone,
    /// Aborted while its prefetch was in flight: the pages stay until the transfer ends.
    Aborting(Prefetch),
    Prefilling(Running),
    PrefillDone(Running),
    Decoding(Running),
    /// Finished; its write-back is attached (the ticket pins the path on both tiers)
    /// and goes out with the next plan. `None` while the cache's reply to the attach is
    /// due (within one `advance`).
    Draining(Option<Attached>),
    WritingBack {
        op: OpId,
    },
    Retracting {
        op: OpId,
        host_lock: NodeLock,
        local_kv: LocalKv,
        published_pages: u32,
        tables: Option<GroupTables>,
    },
    Retracted(Retracted),
    Finished,
}

impl State {
    /// Its group tables: a running request's, or a retracted one's kept.
    pub fn tables(&self) -> Option<&GroupTables> {
        match self {
            State::Prefilling(run) | State::PrefillDone(run) | State::Decoding(run) => {
                run.family.tables()
            }
            State::Retracting { tables, .. } | State::Retracted(Retracted { tables, .. }) => {
                tables.as_ref()
            }
            _ => None,
        }
    }

    pub fn kind(&self) -> StateKind {
        match self {
            State::LookingUp { .. } => StateKind::LookingUp,
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

    pub fn running_mut(&mut self) -> Option<&mut Running> {
        match self {
            State::Prefilling(r) | State::PrefillDone(r) | State::Decoding(r) => Some(r),
            _ => None,
        }
    }
}

/// What a request that stops running hands on (see [`Request::settle`]).
#[derive(Debug)]
pub(crate) struct Settled {
    /// What it gives back of its model's cache family (a hybrid model's state slots
    /// with the depth its working slot holds, a paged model's tables).
    pub family: FamilyRelease,
    /// Its full pages not yet in the tree.
    pub publication: Publication,
    /// Its device lock on its prefix.
    pub device_lock: NodeLock,
    /// Its host lock on a load-back source, if any.
    pub host_lock: Option<NodeLock>,
    /// Its own pages past the publication.
    pub local_kv: LocalKv,
}

#[derive(Debug)]
pub(crate) struct Request {
    pub id: RequestId,
    /// Prompt and generated tokens; shared with cache ops in flight without copying.
    pub tokens: Arc<Vec<Token>>,
    pub prefill_len: u32,
    pub state: State,
    /// Consecutive prompt pages the engine found in L3 (drives prefetch).
    pub storage_hit_pages: u32,
    /// Paged models: the groups' last refusal of its first chunk.
    pub denied: Option<kvtier_radix::Denial>,
    /// Queued again to compute its whole history (`requeue`): until its first chunk, the
    /// results of its last row (an engine that overlaps steps sends them a step late)
    /// still count.
    pub recomputing: bool,
    /// Its first chunk was counted in the hit counters (a recompute is not a new query).
    pub queried: bool,
    /// Pages its L3 prefetch brought (its host hits of them are L3 hits).
    pub prefetched_pages: u32,
    /// Paged models under the reference policy: a finished request's group tables,
    /// released when the request is forgotten at the next plan, as the reference
    /// releases them.
    pub stopped_tables: Option<GroupTables>,
    /// The request's lifecycle span: opened at submit, closed when it is forgotten.
    pub span: tracing::Span,
    /// The span of the phase of its life it is in, a child of `span`.
    pub phase: tracing::Span,
    /// When it was submitted (wall clock: latency metrics only, never a decision).
    pub submitted: std::time::Instant,
    /// When its first generated token arrived.
    pub first_token: Option<std::time::Instant>,
}

impl Request {
    /// Ends the current phase's span and opens the next one's (`queued`, `looking_up`,
    /// `prefetching`, `prefilling`, `decoding`, `retracted`, `recomputing`, `finished`,
    /// `aborted`). Nothing is made when no subscriber wants the request's span.
    pub fn enter_phase(&mut self, phase: &'static str) {
        self.phase = tracing::Span::none();
        if !self.span.is_disabled() {
            self.phase = tracing::info_span!(parent: &self.span, "phase", otel.name = phase);
        }
    }

    /// Full pages of the token container except the newest token (which has no KV yet).
    pub fn full_pages_except_last(&self, page_size: u32) -> u32 {
        (self.tokens.len().saturating_sub(1) / page_size as usize) as u32
    }

    /// The request stops running (finish or retraction): its full pages except the
    /// newest token's are to go into the tree. Returns that publication (possibly empty),
    /// the locks it held and its remaining own pages; its slot is released.
    ///
    /// A paged model's group tables are committed into snapshots up to the published
    /// node, except where the policy commits chunks only at the next row (the
    /// reference's: what a request computed since its last commit is never cached when
    /// it stops).
    pub fn settle(&self, mut run: Running, page_size: u32, policy: Policy) -> Settled {
        let commit_tables = !policy.commits_chunks_at_the_next_row();
        let full = self.full_pages_except_last(page_size);
        let mut publication = self
            .publication(&mut run, full, page_size)
            .map(|(p, _)| p)
            .unwrap_or_else(|| {
                // Nothing new: the prefix it published, with what is still on its way.
                let prefix = run.prefix_pages.len() as u32 + run.published_ahead;
                Publication {
                    tokens: TokenRef::new(&self.tokens, (prefix * page_size) as usize),
                    prefix,
                    pages: Default::default(),
                    at: None,
                    tables: run.family.tables().map(GroupTables::key),
                }
            });
        if !commit_tables {
            publication.tables = None;
        }
        let Running {
            device_lock,
            host_lock,
            local_kv,
            family,
            ..
        } = run;
        Settled {
            family: family.map_states(|states| self.final_states(states)),
            publication,
            device_lock,
            host_lock,
            local_kv,
        }
    }

    /// A request that stops running hands its state slots to the cache. Its working slot
    /// holds the state after every token its rows computed: the whole prompt before its
    /// first generated token arrives, else every token but the newest (which no row has
    /// read yet).
    fn final_states(&self, states: RequestStates) -> kvtier_radix::FinalStates {
        let len = self.tokens.len() as u32;
        let computed = if len == self.prefill_len {
            len
        } else {
            len - 1
        };
        kvtier_radix::FinalStates {
            states,
            working_at: computed,
        }
    }

    /// Takes the request's computed full pages (up to `pages`, clamped to what it holds)
    /// out of its own pages for publication, with where they sit in its page table.
    /// `None` when there is nothing new.
    pub fn publication(
        &self,
        run: &mut Running,
        pages: u32,
        page_size: u32,
    ) -> Option<(Publication, Republish)> {
        // Pages of publications not answered yet are in the tree by the time this one
        // runs (the cache applies a batch in order): publish after them, and walk from
        // the root, since the locked node is still the old prefix's end.
        let prefix = run.prefix_pages.len() as u32 + run.published_ahead;
        // Overlap scheduling can grow tokens past allocated slots: never take more pages
        // than the request holds.
        let pages = pages.min(prefix + run.local_kv.pages.len() as u32);
        if pages <= prefix {
            return None;
        }
        let taken = run
            .local_kv
            .pages
            .take_first((pages - prefix) as usize)
            .ok()?;
        run.published_ahead += taken.len() as u32;
        let republish = Republish {
            published_from: prefix,
            own_pages: taken.ids().to_vec(),
        };
        let tokens = TokenRef::new(&self.tokens, (pages * page_size) as usize);
        let at = (prefix == run.prefix_pages.len() as u32).then(|| run.device_lock.node());
        Some((
            Publication {
                tokens,
                prefix,
                pages: taken,
                at,
                tables: run.family.tables().map(GroupTables::key),
            },
            republish,
        ))
    }
}
