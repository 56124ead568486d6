//! The radix cache's message protocol: one [`CacheBatch`] per scheduler call.
//!
//! The scheduler (request FSM) never calls the cache directly. Each `advance` and each
//! `next_plan` sends one batch of [`CacheOp`]s; the cache executes them in order and
//! answers one [`CacheReply`] with a [`OpResult`] per op, in the same order. Handles
//! (locks, page sets) travel inside ops and results by move.
//!
//! Admission is an [`AdmitProgram`]: the scheduler orders the candidates and sets the
//! token budget, the row and slot limits; the cache decides, candidate by candidate,
//! what fits, because every fit decision depends on the cache as the earlier candidates
//! left it (evictions, locks on shared prefixes, load-backs). Executing the program
//! where the cache lives gives exactly the decisions of a sequential loop, in one
//! message.

use std::ops::Deref;
use std::sync::Arc;

use kvtier_host::OwnedPages;
use kvtier_mamba::{RequestStates, Slot, SlotId};
use kvtier_types::{GroupTable, PageId, StateObject, Tier, Token, TransferPair, hash::PageHash};

use crate::{Denial, GroupTables, Match, NodeId, NodeLock, RadixCore, TablesKey, WriteBackTicket};

/// The first `len` tokens of a request, shared without copying.
#[derive(Debug, Clone)]
pub struct TokenRef {
    tokens: Arc<Vec<Token>>,
    len: usize,
}

impl TokenRef {
    /// The whole token vector it is a prefix of (one allocation per request's tokens).
    pub(crate) fn whole(&self) -> &Arc<Vec<Token>> {
        &self.tokens
    }

    /// The first `len` tokens of `tokens` (clamped to its length).
    pub fn new(tokens: &Arc<Vec<Token>>, len: usize) -> Self {
        Self {
            tokens: Arc::clone(tokens),
            len: len.min(tokens.len()),
        }
    }
}

impl Deref for TokenRef {
    type Target = [Token];

    fn deref(&self) -> &[Token] {
        &self.tokens[..self.len]
    }
}

/// Pages to allocate for `n` more token slots when the last page has `tail_free` free
/// slots, and the free slots left afterwards. The scheduler's page accounting and the
/// cache's allocations both use it, so they agree.
pub fn grow(tail_free: u32, n: u32, page_size: u32) -> (u32, u32) {
    if n <= tail_free {
        return (0, tail_free - n);
    }
    let need = n - tail_free;
    let used = need % page_size;
    (
        need.div_ceil(page_size),
        if used == 0 { 0 } else { page_size - used },
    )
}

/// One batch of cache operations, executed in order.
#[derive(Debug, Default)]
pub struct CacheBatch {
    /// The operations.
    pub ops: Vec<CacheOp>,
}

/// The answer to a [`CacheBatch`]: one result per op, same order.
#[derive(Debug, Default)]
pub struct CacheReply {
    /// The results.
    pub results: Vec<OpResult>,
}

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

/// A publication into the tree: a request's computed full pages `prefix..` of `tokens`.
#[derive(Debug)]
pub struct Publication {
    /// The request's tokens up to the last published page.
    pub tokens: TokenRef,
    /// Pages of the request already in the tree.
    pub prefix: u32,
    /// The request's own pages for pages `prefix..` (duplicates go back to the pool).
    pub pages: OwnedPages,
    /// The node its published prefix ends at, which it holds locked on device (the
    /// insert walks on from there instead of from the root); `None`: the root.
    pub at: Option<NodeId>,
    /// Paged models: the request's group tables, committed into snapshots up to the
    /// published node.
    pub tables: Option<TablesKey>,
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
        /// Hybrid models: the request's state slots; one holding the state at the
        /// published depth is cached there, the rest freed.
        states: Option<FinalStates>,
        /// Paged models: the request's group tables, released once the publication
        /// committed them.
        tables: Option<GroupTables>,
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
        /// Hybrid models: the request's state slots, as for `Finish`.
        states: Option<FinalStates>,
        /// Paged models under kvtier's own policy: the request's group tables, as for
        /// `Finish` (a retracted request recomputes from its deepest snapshot). The
        /// reference policies keep them with the request, which resumes from them.
        tables: Option<GroupTables>,
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
        /// Hybrid models: the last chunk, committed if this one is admitted.
        commit: Option<Box<ChunkCommit>>,
        /// Hybrid models: the checkpoint slot the chunk needs.
        checkpoint: CheckpointNeed,
        /// Paged models: its group tables and the chunk's first position.
        tables: Option<(TablesKey, u32)>,
    },
    /// A decode row reserving `reserve` token slots.
    Decode {
        /// Slots to reserve.
        reserve: u32,
        /// Free slots in its last page.
        tail_free: u32,
        /// Hybrid models, first decode: the last prefill chunk, committed if admitted.
        commit: Option<Box<ChunkCommit>>,
        /// Hybrid models: the checkpoint slot the row needs.
        checkpoint: CheckpointNeed,
        /// Paged models: its group tables and the row's first position.
        tables: Option<(TablesKey, u32)>,
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
        /// Paged models under the reference policies: the group tables it kept; it
        /// resumes as a decode from them, its row's groups from position `computed`
        /// (without, it is recomputed from its deepest snapshot).
        tables: Option<TablesKey>,
    },
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

/// Whether a hybrid row needs a fresh checkpoint slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointNeed {
    /// No.
    None,
    /// Yes: the row waits until one can be had (the reference's rule for every chunk
    /// and for the first decode).
    Required,
    /// If one can be had (evicting a cached state if it must): the row crosses a page
    /// boundary, and its state there is worth caching.
    Wanted,
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
    /// Hybrid models: its state slots.
    pub states: Option<Box<StateGrant>>,
    /// Paged models: its group tables (`None` otherwise).
    pub tables: Option<GroupTables>,
    /// The view of `tables` the row reads.
    pub groups: Vec<GroupTable>,
    /// First chunks with `CacheConfig::lost_hits`: the prompt's pages after
    /// `begin_pages` the tree holds but the request does not reuse (a hybrid model's
    /// missing state or window; host pages not loaded back).
    pub capped_pages: u32,
    /// First chunks with `CacheConfig::lost_hits`: the prompt's pages after those, in a
    /// row, that the cache held once and dropped.
    pub dropped_pages: u32,
}

impl RadixCore {
    /// Executes a batch in order.
    pub fn execute(&mut self, batch: CacheBatch) -> CacheReply {
        self.drain_releases();
        let mut handed_over = Vec::new();
        let results = batch
            .ops
            .into_iter()
            .map(|op| self.execute_op(op, &mut handed_over))
            .collect();
        // A lock nobody took is released by its drop all the same.
        debug_assert!(
            handed_over.is_empty(),
            "handed over, not taken: {handed_over:?}"
        );
        CacheReply { results }
    }

    /// `handed_over`: locks publications of this batch left for their requests' stop
    /// ops, by ticket.
    fn execute_op(&mut self, op: CacheOp, handed_over: &mut Vec<(u64, NodeLock)>) -> OpResult {
        match op {
            CacheOp::Release(handles) => {
                drop(handles);
                self.drain_releases();
                OpResult::Released
            }
            CacheOp::RewindTables { key, tokens } => {
                self.rewind_tables(key, tokens);
                OpResult::Released
            }
            CacheOp::WriteBackAck {
                ticket,
                success,
                keep_device,
                backup,
                demote,
            } => {
                let kept = keep_device.map(|node| self.lock(node, Tier::Device));
                let written = self.write_back_done(ticket, success);
                let backup = (success && backup)
                    .then(|| self.pin_backup(written))
                    .flatten();
                if let (true, Some(node)) = (success, demote) {
                    self.demote(node);
                }
                self.with_states(|states, tree| states.demote_idle(tree));
                OpResult::Acked { kept, backup }
            }
            CacheOp::Publish(publication) => {
                let (lock, _) = self.publish(publication, None);
                let mut path_pages = Vec::new();
                if let Some(lock) = &lock {
                    self.device_path_pages(lock.node(), &mut path_pages);
                }
                match lock {
                    Some(lock) => OpResult::Published { lock, path_pages },
                    // Nothing new to publish: callers only send non-empty publications.
                    None => OpResult::Published {
                        lock: self.lock(self.root(), Tier::Device),
                        path_pages,
                    },
                }
            }
            CacheOp::Finish {
                publication,
                device_lock,
                host_lock,
                write_back,
                reuse,
                leftover,
                states,
                tables,
            } => {
                let device_lock = match device_lock {
                    StopLock::Held(lock) => Some(lock),
                    StopLock::HandedOver(ticket) => {
                        let at = handed_over.iter().position(|&(t, _)| t == ticket);
                        debug_assert!(at.is_some(), "no lock handed over under {ticket}");
                        at.map(|i| handed_over.swap_remove(i).1)
                    }
                };
                let tokens = publication.tokens.clone();
                let inserted = !publication.pages.is_empty();
                let (lock, pages) = self.publish(publication, None);
                if let Some(states) = states {
                    // The reference caches a finishing request's state only when it
                    // published pages at the end. Without new pages the terminal is
                    // where its last publication ended, which may be one of this batch
                    // (a decode's, the same step) its lock does not know yet.
                    // With prefix reuse off, the reference looks the terminal up with a
                    // reuse match, which ends at the root: the state goes there (C.9).
                    let terminal = match &lock {
                        _ if self.is_reference() && !reuse => self.root(),
                        Some(lock) => lock.node(),
                        None => {
                            let ps = self.page_size() as usize;
                            let held = device_lock.as_ref().map_or(self.root(), NodeLock::node);
                            let published = &tokens[..pages as usize * ps];
                            if self.depth_pages(held) == pages {
                                held
                            } else {
                                self.node_ending(published).unwrap_or(held)
                            }
                        }
                    };
                    let publish = inserted || !self.is_reference();
                    self.settle_states(terminal, states, publish);
                }
                // The reference matches the finished prefix (touching it) even when it
                // writes nothing back.
                let matched = write_back || (self.is_reference() && reuse);
                let write_back = if matched && pages > 0 {
                    let m =
                        self.match_prefix(&tokens[..pages as usize * self.page_size() as usize]);
                    (write_back && m.device_pages > m.host_pages)
                        .then(|| self.attach_write_back(m.device, m.host))
                        .flatten()
                } else {
                    None
                };
                // The request lets go of its prefix only now, after the match above
                // used it, as the reference does (its unlock re-keys the LRU order).
                // The reference never locks the publication's terminal, so releasing
                // that lock moves nothing in the LRU order under its policies.
                if let Some(lock) = lock {
                    self.release_published(lock, self.is_reference());
                }
                for lock in device_lock.into_iter().chain(host_lock) {
                    self.unlock(lock);
                }
                let freed = self.free(Tier::Device, leftover);
                debug_assert!(freed.is_ok(), "leftover pages of another pool: {freed:?}");
                // Committed by the publication; the lease goes back now.
                drop(tables);
                self.drain_releases();
                OpResult::Finished { write_back }
            }
            CacheOp::Retract {
                publication,
                device_lock,
                host_lock: old_host_lock,
                states,
                tables,
            } => {
                let tokens = publication.tokens.clone();
                let held = device_lock.node();
                let (lock, pages) = self.publish(publication, Some(device_lock));
                let device_lock = lock.expect("publish with a lock returns one");
                // The reference locks the published path only to copy it: a retraction
                // with nothing to copy, or no host room, lets go of the lock on it as
                // one the reference never takes (the request's own it does release).
                let transient = self.is_reference() && device_lock.node() != held;
                let m = self.match_prefix(&tokens[..pages as usize * self.page_size() as usize]);
                debug_assert_eq!(m.device_pages, pages, "the retracted prefix is locked");
                // kvtier caches the request's state before the write-back, so the copy
                // takes it along; the reference caches it after, and the state has no
                // host copy.
                let mut states = states;
                if !self.is_reference()
                    && let Some(states) = states.take()
                {
                    self.settle_states(m.device, states, true);
                }
                let nothing_to_copy = m.device_pages <= m.host_pages;
                let outcome = if !nothing_to_copy {
                    match self.attach_write_back(m.device, m.host) {
                        Some(attached) => {
                            let host_lock = self.lock(m.device, Tier::Host);
                            self.unlock(device_lock);
                            RetractOutcome::Kept {
                                prefix_lock: host_lock,
                                write_back: Some(attached),
                            }
                        }
                        // A paged model keeps its published prefix on device, where its
                        // snapshots make it reusable: the request recomputes from there
                        // (its recovery is a recompute) instead of being given up (the
                        // reference aborts it; DeepSeek-V4 has no host tier at all).
                        None if self.has_snapshots() && !self.is_reference() => {
                            RetractOutcome::Kept {
                                prefix_lock: device_lock,
                                write_back: None,
                            }
                        }
                        None => {
                            self.release_published(device_lock, transient);
                            RetractOutcome::HostExhausted
                        }
                    }
                } else {
                    let host_lock = self.lock(m.device, Tier::Host);
                    self.release_published(device_lock, transient);
                    // The whole prefix is on host already: kvtier frees its device copy
                    // now; the reference leaves it cached, for eviction to take.
                    if !self.is_reference() {
                        self.demote(m.device);
                    }
                    RetractOutcome::Kept {
                        prefix_lock: host_lock,
                        write_back: None,
                    }
                };
                if let Some(states) = states {
                    // Under the reference policy a retraction that finds no host room
                    // aborts the request before anything is cached: both slots are
                    // freed (its pages are published all the same).
                    let publish =
                        !(self.is_reference() && matches!(outcome, RetractOutcome::HostExhausted));
                    self.settle_states(m.device, states, publish);
                }
                if nothing_to_copy && self.is_reference() {
                    // The reference completes such a retraction as if its copy were
                    // acknowledged at once: device copies of states that have host
                    // copies, and that nothing holds any more, go (its KV stays).
                    self.with_states(|states, tree| states.demote_idle(tree));
                }
                if let Some(lock) = old_host_lock {
                    self.unlock(lock);
                }
                drop(tables);
                self.drain_releases();
                OpResult::Retracted(outcome)
            }
            CacheOp::InsertPrefetched {
                tokens,
                start_page,
                pages,
                host_lock,
                state,
            } => {
                let inserted = self.insert(Tier::Host, &tokens, start_page, pages);
                debug_assert!(inserted.is_ok(), "prefetch insert: {inserted:?}");
                if let (Ok(result), Some(slot)) = (&inserted, state) {
                    let node = result.last_node;
                    self.with_states(|states, tree| states.attach_host(tree, node, slot));
                }
                self.unlock(host_lock);
                OpResult::Inserted
            }
            CacheOp::PublishDecode {
                publication,
                checkpoint,
                renew,
                retire,
                stops,
            } => {
                let (old, ticket) = stops.map_or((None, None), |(old, t)| (Some(old), Some(t)));
                let (mut published, checkpoint) =
                    self.publish_decode(publication, checkpoint, renew, retire, old);
                if let Some(ticket) = ticket
                    && let Some((lock, _)) = published.take()
                {
                    handed_over.push((ticket, lock));
                }
                OpResult::PublishedDecode {
                    published,
                    checkpoint,
                }
            }
            CacheOp::Admit(program) => OpResult::Admitted(self.admit(program)),
            CacheOp::DiscardLoadBack { pages, states } => {
                if !states.is_empty() {
                    self.with_states(|family, tree| family.discard_slots(tree, &states));
                }
                OpResult::Discarded(self.discard_load_back(&pages))
            }
            CacheOp::BackedUp { pin, page_hashes } => {
                self.emit_backed_up(pin.node(), &page_hashes);
                self.unlock(pin);
                OpResult::BackedUp
            }
        }
    }

    /// Publishes a request's pages; `old` is the request's previous device lock,
    /// released once the new one is taken (so the path is never unpinned). Returns the
    /// lock on the published path (`old` itself when nothing new was published) and its
    /// depth in pages.
    pub(crate) fn publish(
        &mut self,
        p: Publication,
        old: Option<NodeLock>,
    ) -> (Option<NodeLock>, u32) {
        let ps = self.page_size() as usize;
        let total = (p.tokens.len() / ps) as u32;
        if p.pages.is_empty() {
            return (old, p.prefix.min(total));
        }
        let Ok(result) = self.insert_at(
            Tier::Device,
            &p.tokens[..total as usize * ps],
            p.prefix,
            p.pages,
            p.at,
        ) else {
            debug_assert!(false, "publish contract violated");
            return (old, p.prefix);
        };
        let lock = self.lock(result.last_node, Tier::Device);
        // A caller that passed its previous lock gives it up here; otherwise the
        // request still holds it on `at` until the reply is in.
        let still_held = if old.is_some() { None } else { p.at };
        if let Some(old) = old {
            self.unlock(old);
        }
        if let Some(key) = p.tables {
            self.commit_tables(key, result.last_node, still_held);
        }
        (Some(lock), total)
    }

    /// Locks freshly written host pages for their L3 backup.
    fn pin_backup(&mut self, written: crate::WrittenBack) -> Option<BackupSource> {
        let node = written.deepest?;
        if written.host_pages.is_empty() {
            return None;
        }
        if written.page_hashes.len() != written.host_pages.len() {
            debug_assert!(false, "written-back nodes without page hashes");
            return None;
        }
        Some(BackupSource {
            pin: self.lock(node, Tier::Host),
            pages: written.host_pages,
            hashes: written.page_hashes,
            states: written.states,
        })
    }

    /// Attaches host pages to the nodes on `device`'s path that lack a readable host
    /// copy, evicting host cache if needed, and pins the path on both tiers; a hybrid
    /// model's device states on them are copied too. `None` (nothing changed) when the
    /// host pool cannot make room.
    fn attach_write_back(&mut self, device: NodeId, host: NodeId) -> Option<Attached> {
        let nodes = self.nodes_without(Tier::Host, device);
        let need = self.pages_needed(Tier::Host, &nodes);
        let guard = self.lock(host, Tier::Host);
        let attached = if self.ensure_free(Tier::Host, need) {
            self.attach_for_write_back(&nodes)
        } else {
            None
        };
        self.unlock(guard);
        let (ticket, mut pairs) = attached?;
        pairs.extend(self.attach_state_write_back(ticket, &nodes));
        Some(Attached {
            ticket,
            pairs,
            device_node: device,
        })
    }

    // ----- admission ------------------------------------------------------------------

    /// Runs an admission program: the sequential admission loop of one step.
    fn admit(&mut self, program: AdmitProgram) -> Vec<Outcome> {
        let AdmitProgram {
            mut budget,
            max_rows,
            mut slots,
            mixed,
            decode_tokens: d,
            use_host,
            reuse,
            released,
            intents,
        } = program;
        self.with_states(|states, tree| {
            states.begin_plan();
            if released {
                states.demote_idle(tree);
            }
        });
        self.begin_group_budget();
        let ps = self.page_size();
        let mut rows = 0usize;
        let mut prefill_rows = 0usize;
        let mut stopped = false;
        let mut outcomes = Vec::with_capacity(intents.len());
        for intent in intents {
            if !stopped && (budget <= 0 || rows == max_rows) {
                stopped = true;
            }
            let decode_like = matches!(intent, Intent::Decode { .. } | Intent::Recovery { .. });
            if !stopped && decode_like && !mixed && prefill_rows > 0 {
                stopped = true;
            }
            if stopped {
                outcomes.push(intent.unused());
                continue;
            }
            let remaining = budget as u32;
            let outcome = match intent {
                Intent::FirstChunk {
                    tokens,
                    prefill_len,
                    prefetch,
                    denied,
                } => {
                    let prefetched = prefetch.map(|check| self.try_prefetch(&check));
                    let skipped = match prefetched {
                        Some(Err(why)) => Some(why),
                        _ => None,
                    };
                    match prefetched.and_then(Result::ok) {
                        Some(outcome) => outcome,
                        None if slots == 0 => Outcome::waits(),
                        None if denied
                            .as_deref()
                            .is_some_and(|&d| self.still_denied(d, remaining)) =>
                        {
                            Outcome::Denied(*denied.expect("checked"))
                        }
                        None => {
                            let ask = FirstChunkAsk {
                                tokens: &tokens,
                                prefill_len,
                                remaining,
                                d,
                                use_host,
                                reuse,
                            };
                            let mut outcome = if self.has_snapshots() {
                                self.first_chunk_paged(ask)
                            } else if self.has_states() {
                                self.first_chunk_hybrid(ask)
                            } else {
                                self.first_chunk(ask)
                            };
                            if let Outcome::Admitted(a) = &mut outcome {
                                self.lost_hits(&tokens, a);
                                if let Some(why) = skipped {
                                    self.prefetch_skipped[why as usize] += 1;
                                }
                            }
                            outcome
                        }
                    }
                }
                Intent::NextChunk {
                    remaining: left,
                    tail_free,
                    commit,
                    checkpoint,
                    tables,
                } => {
                    let t = remaining.min(left);
                    // The reference makes room for whole fresh pages, ignoring the tail.
                    let room = if self.is_reference() {
                        t.div_ceil(ps)
                    } else {
                        grow(tail_free, t, ps).0
                    };
                    match tables {
                        None => self.grow_running(t, tail_free, room, commit, checkpoint),
                        Some((key, first)) => self.grow_with_groups(
                            t,
                            tail_free,
                            room,
                            commit,
                            checkpoint,
                            (key, first, t),
                        ),
                    }
                }
                Intent::Decode {
                    reserve,
                    tail_free,
                    commit,
                    checkpoint,
                    tables,
                } => {
                    let room = grow(tail_free, reserve, ps).0;
                    match tables {
                        None => self.grow_running(reserve, tail_free, room, commit, checkpoint),
                        Some((key, first)) => {
                            // The KV reserve covers what the engine asked for; the
                            // reference's group tables only the row's own input (#583).
                            let span = if self.is_reference() { d } else { reserve };
                            self.grow_with_groups(
                                reserve,
                                tail_free,
                                room,
                                commit,
                                checkpoint,
                                (key, first, span),
                            )
                        }
                    }
                }
                Intent::Recovery {
                    tokens,
                    tail_free,
                    mut kept,
                    computed,
                    tables,
                } => {
                    let held = std::mem::take(&mut kept.locks);
                    let tail_pages = kept.tail.len() as u32;
                    let outcome = if slots == 0 {
                        Outcome::Waits { held, commit: None }
                    } else if self.has_snapshots() {
                        match tables {
                            // The reference resumes it as a decode from its kept tables.
                            Some(key) => {
                                let groups = Some((key, computed));
                                self.recovery(&tokens, tail_pages, tail_free, held, d, groups)
                            }
                            // Its group tables went at retraction: it computes its
                            // history again from the deepest snapshot.
                            None => {
                                drop(held);
                                Outcome::Recompute
                            }
                        }
                    } else if self.has_states() {
                        self.recovery_hybrid(&tokens, tail_pages, tail_free, held, d, computed)
                    } else {
                        self.recovery(&tokens, tail_pages, tail_free, held, d, None)
                    };
                    self.settle_recovery(outcome, kept)
                }
            };
            match &outcome {
                Outcome::Admitted(a) => {
                    rows += 1;
                    slots -= 1;
                    if a.tokens > 0 {
                        prefill_rows += 1;
                        budget -= i64::from(a.tokens);
                    } else {
                        budget -= i64::from(d);
                    }
                }
                Outcome::Grown { tokens, .. } => {
                    rows += 1;
                    if decode_like {
                        // A decode row costs `d` tokens of budget whatever it reserves.
                        budget -= i64::from(d);
                    } else {
                        prefill_rows += 1;
                        budget -= i64::from(*tokens);
                    }
                }
                Outcome::Waits { .. }
                | Outcome::StaysRetracted(_)
                | Outcome::Prefetch(_)
                | Outcome::TooBig
                | Outcome::Recompute
                | Outcome::StateLost
                | Outcome::Denied(_) => {}
            }
            outcomes.push(outcome);
        }
        outcomes
    }

    /// Slots for `n` more tokens of a running request after making `room` pages free,
    /// or `Waits`. A hybrid intent's last chunk is committed first, and the request gets
    /// the checkpoint slot it asks for. Inlined: it runs for every decode row, and most
    /// take the fast path.
    #[inline(always)]
    fn grow_running(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        checkpoint: CheckpointNeed,
    ) -> Outcome {
        if n <= tail_free && room == 0 && commit.is_none() && checkpoint == CheckpointNeed::None {
            // The common decode step: its tokens fit the pages it holds.
            return Outcome::Grown {
                tokens: n,
                pages: None,
                committed: None,
                groups: None,
            };
        }
        self.grow_into_new_pages(n, tail_free, room, commit, checkpoint)
    }

    /// [`Self::grow_running`] past its fast path.
    fn grow_into_new_pages(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        checkpoint: CheckpointNeed,
    ) -> Outcome {
        let (need, _) = grow(tail_free, n, self.page_size());
        if room > 0 && !self.ensure_free(Tier::Device, room) {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let room_for_checkpoint = match checkpoint {
            CheckpointNeed::None => true,
            need => {
                let made = self.with_states(|states, tree| states.ensure_device(tree, 1, None));
                made == Some(true) || need == CheckpointNeed::Wanted
            }
        };
        if !room_for_checkpoint {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let asked = commit.is_some() || checkpoint != CheckpointNeed::None;
        let published = commit.and_then(|c| self.commit_chunk(*c, None));
        let Some(pages) = self.allocate(Tier::Device, need as usize) else {
            debug_assert!(false, "pages were made free");
            return Outcome::waits();
        };
        let checkpoint = match checkpoint {
            CheckpointNeed::None => None,
            _ => self.with_states(|states, _| states.allocate()).flatten(),
        };
        Outcome::Grown {
            tokens: n,
            pages: Some(Box::new(pages)),
            committed: asked.then(|| {
                Box::new(Committed {
                    published,
                    checkpoint,
                })
            }),
            groups: None,
        }
    }

    /// [`Self::grow_running`] for a request with group tables (their key and the op's
    /// first position): the groups are admitted first, and the grown row carries their
    /// view. Kept out of line: the dense decode loop never calls it.
    #[inline(never)]
    /// Grows a running request by `n` KV slots and its group tables by `span`
    /// positions from `first`.
    fn grow_with_groups(
        &mut self,
        n: u32,
        tail_free: u32,
        room: u32,
        commit: Option<Box<ChunkCommit>>,
        checkpoint: CheckpointNeed,
        (key, first, span): (TablesKey, u32, u32),
    ) -> Outcome {
        // The reference's order: room for the KV (its eviction stays even when the
        // groups then refuse), the groups' admission, then the op's commit (the
        // request's last chunk, under `Policy::Reference`), then the release and the
        // acquisition.
        if self.is_reference() && room > 0 && !self.ensure_free(Tier::Device, room) {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let publication = commit.as_deref().and_then(|c| c.publication.as_ref());
        if !self.admit_groups(key, first, first + span, publication) {
            return Outcome::Waits {
                held: Vec::new(),
                commit,
            };
        }
        let mut grown = self.grow_running(n, tail_free, room, commit, checkpoint);
        if let Outcome::Grown { groups, .. } = &mut grown {
            self.acquire_groups(key, first, first + span);
            *groups = Some(Box::new(self.group_view(key)));
        }
        grown
    }

    /// Starts an L3 prefetch when the consecutive L3 hits run more than the threshold
    /// past what the host holds. The host prefix is locked before any host eviction.
    fn try_prefetch(&mut self, check: &PrefetchCheck) -> Result<Outcome, PrefetchSkip> {
        let ps = self.page_size();
        let hit = (check.tokens.len() / ps as usize) as u32;
        let (probe, reached) = self.probe_marked(&check.tokens);
        let host = probe.host_pages;
        let n = hit.saturating_sub(host);
        if n <= check.threshold {
            self.mark(&check.tokens, reached);
            return Err(if n == 0 {
                PrefetchSkip::NothingMissing
            } else {
                PrefetchSkip::BelowThreshold
            });
        }
        let m = self.match_prefix(&check.tokens);
        debug_assert_eq!(m.host_pages, host);
        let host_lock = self.lock(m.host, Tier::Host);
        if !self.ensure_free(Tier::Host, n) {
            self.unlock(host_lock);
            return Err(PrefetchSkip::NoHostRoom);
        }
        let Some(pages) = self.allocate(Tier::Host, n as usize) else {
            self.unlock(host_lock);
            return Err(PrefetchSkip::NoHostRoom);
        };
        // A hybrid prefix comes with the state at its end, into a host state slot.
        let state = match self.with_states(|states, tree| states.allocate_host(tree)) {
            None => None,
            Some(Some(slot)) => Some(slot),
            Some(None) => {
                self.unlock(host_lock);
                let freed = self.free(Tier::Host, pages);
                debug_assert!(freed.is_ok(), "{freed:?}");
                return Err(PrefetchSkip::NoStateSlot);
            }
        };
        Ok(Outcome::Prefetch(Box::new(PrefetchStart {
            host_lock,
            pages,
            start_page: host,
            state,
        })))
    }

    fn first_chunk(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        let FirstChunkAsk {
            tokens,
            use_host,
            reuse,
            ..
        } = ask;
        let ps = self.page_size();
        if self.is_reference() {
            // The reference commits the match (split, touch) before it knows whether
            // the request fits.
            let m = self.committed_match(tokens, reuse);
            let host = if use_host { m.host_pages } else { 0 };
            let shape = ask.shape(m.device_pages, host, ps);
            return self.admit_first_chunk(m, shape, use_host);
        }
        let (probe, reached) = if reuse {
            self.probe_marked(tokens)
        } else {
            (crate::Probe::default(), self.root())
        };
        let host = if use_host { probe.host_pages } else { 0 };
        let shape = ask.shape(probe.device_pages, host, ps);
        if !self.can_free(Tier::Device, shape.need, probe.device_unlocked_pages) {
            self.mark(tokens, reached);
            return Outcome::waits();
        }
        self.unmark(tokens);
        let m = self.committed_match(tokens, reuse);
        debug_assert_eq!(
            (m.device_pages, if use_host { m.host_pages } else { 0 }),
            (probe.device_pages, host)
        );
        self.admit_first_chunk(m, shape, use_host)
    }

    /// The committing match of a first chunk (the root when reuse is off).
    pub(crate) fn committed_match(&mut self, tokens: &[Token], reuse: bool) -> Match {
        if reuse {
            return self.match_prefix(tokens);
        }
        let root = self.root();
        Match {
            device: root,
            device_pages: 0,
            host: root,
            host_pages: 0,
        }
    }

    /// Pins the matched prefix, makes room and allocates the chunk's pages.
    fn admit_first_chunk(&mut self, m: Match, shape: ChunkShape, use_host: bool) -> Outcome {
        let Some(pinned) = self.pin_prefix(m, shape.need, use_host) else {
            return Outcome::waits();
        };
        self.admitted(pinned, &shape, None)
    }

    /// The end of every admission, its path pinned and room made: the request's own
    /// pages and its page table (the locked path's device pages).
    pub(crate) fn admitted(
        &mut self,
        (device_lock, host_lock, load_back): Pinned,
        shape: &ChunkShape,
        states: Option<Box<StateGrant>>,
    ) -> Outcome {
        let Some(pages) = self.allocate(Tier::Device, shape.own_pages as usize) else {
            debug_assert!(false, "admission reserved the pages");
            return Outcome::waits();
        };
        let ps = self.page_size();
        let mut prefix_pages =
            Vec::with_capacity((shape.begin_pages + shape.tokens.div_ceil(ps)) as usize);
        self.device_path_pages(device_lock.node(), &mut prefix_pages);
        Outcome::Admitted(Box::new(Admission {
            tokens: shape.tokens,
            begin_pages: shape.begin_pages,
            device_lock,
            host_lock,
            load_back,
            pages,
            tail_free: shape.tail_free,
            prefix_pages,
            states,
            tables: None,
            groups: Vec::new(),
            capped_pages: 0,
            dropped_pages: 0,
        }))
    }

    /// A recovery's handles after its outcome: back with a request that stays
    /// retracted; its kept pages ahead of the admitted row's fresh ones; freed at once
    /// where the request is given up or recomputed, as the reference frees a request it
    /// gives up before it tries the next candidate.
    fn settle_recovery(&mut self, outcome: Outcome, mut kept: Box<RetractedHandles>) -> Outcome {
        match outcome {
            Outcome::Waits { held, commit } => {
                debug_assert!(commit.is_none(), "a recovery commits no chunk");
                kept.locks = held;
                Outcome::StaysRetracted(kept)
            }
            Outcome::Admitted(mut admission) => {
                let mut fresh = std::mem::replace(&mut admission.pages, kept.tail);
                let appended = admission.pages.append(&mut fresh);
                debug_assert!(appended.is_ok(), "kept pages of another pool");
                Outcome::Admitted(admission)
            }
            given_up => {
                drop(kept);
                given_up
            }
        }
    }

    /// Resumes a retracted request: its prefix locked (loaded back from host where the
    /// device lost it) and the pages for its decode input. `groups`: a paged request's
    /// kept tables and its row's first position, admitted after the KV room is made and
    /// acquired with the row.
    fn recovery(
        &mut self,
        tokens: &[Token],
        tail_pages: u32,
        tail_free: u32,
        held: Vec<NodeLock>,
        d: u32,
        groups: Option<(TablesKey, u32)>,
    ) -> Outcome {
        let (reserve_pages, new_tail_free) = grow(tail_free, d, self.page_size());
        let reference = self.is_reference();
        // Cheap first: when even the new pages cannot be freed, no probe can change the
        // answer (a load-back only adds to the need), so the history is not walked. A
        // history too big for the device is then found once there is room to try. (The
        // reference evicts before it knows: it has no such shortcut.)
        if !reference && reserve_pages > 0 && !self.can_free(Tier::Device, reserve_pages, 0) {
            return Outcome::Waits { held, commit: None };
        }
        // Its prefix lock ends where its published tokens do: the path is read from the
        // nodes, not matched token by token (a history of 12,000 tokens, every step).
        let locked = held
            .first()
            .map(NodeLock::node)
            .filter(|&node| self.ends_at(node, tokens));
        let probe = match locked {
            Some(node) => self.probe_path(node),
            None => self.probe(tokens),
        };
        debug_assert_eq!(probe, self.probe(tokens), "the locked path is the tokens'");
        let load_back = probe.host_pages.saturating_sub(probe.device_pages);
        // Exact need: the kept tail page may still have room for the reserved slots.
        let need = load_back + reserve_pages;
        // Its whole footprint: the published prefix, the kept tail pages and the new ones.
        let footprint = probe.device_pages.max(probe.host_pages) + tail_pages + reserve_pages;
        if footprint > self.usable(Tier::Device) {
            drop(held);
            return Outcome::TooBig;
        }
        // The reference makes room for whole fresh pages of the load-back and the decode
        // reserve, ignoring the tail page's room, and evicts even when that cannot
        // suffice (its eviction is not transactional); the pages taken are the same.
        let room = if reference {
            load_back + d.div_ceil(self.page_size())
        } else {
            need
        };
        if !reference && !self.can_free(Tier::Device, need, probe.device_unlocked_pages) {
            return Outcome::Waits { held, commit: None };
        }
        let m = match locked {
            Some(node) => self.match_path(node),
            None => self.match_prefix(tokens),
        };
        // The reference's order: room for the KV (its eviction stays even when the
        // groups then refuse), the groups' admission, then the load-back.
        let Some(guard) = self.make_room(m.device, room) else {
            return Outcome::Waits { held, commit: None };
        };
        // The group row spans the decode input from its first position.
        if let Some((key, first)) = groups
            && !self.admit_groups(key, first, first + d, None)
        {
            self.unlock(guard);
            return Outcome::Waits { held, commit: None };
        }
        let Some(pinned) = self.pin_path(m, guard, true) else {
            return Outcome::Waits { held, commit: None };
        };
        for lock in held {
            self.unlock(lock);
        }
        let begin_pages = m.device_pages.max(m.host_pages);
        let shape = ChunkShape::recovery(begin_pages, reserve_pages, new_tail_free);
        let mut outcome = self.admitted(pinned, &shape, None);
        if let (Some((key, first)), Outcome::Admitted(admission)) = (groups, &mut outcome) {
            self.acquire_groups(key, first, first + d);
            admission.groups = self.group_view(key);
        }
        outcome
    }

    /// Locks the device match, makes `need` pages free, and locks the path the request
    /// will read: with a deeper host match, device pages are attached to the host-only
    /// nodes (the load-back) and both tiers are locked. `None` with nothing changed.
    fn pin_prefix(&mut self, m: Match, need: u32, use_host: bool) -> Option<Pinned> {
        let guard = self.make_room(m.device, need)?;
        self.pin_path(m, guard, use_host)
    }

    /// Makes `need` device pages free with `device` locked meanwhile; returns that lock
    /// (the guard), or `None` with nothing locked.
    pub(crate) fn make_room(&mut self, device: NodeId, need: u32) -> Option<NodeLock> {
        let guard = self.lock(device, Tier::Device);
        if !self.ensure_free(Tier::Device, need) {
            // Only the reference's admission (and hybrid admission) tries without a
            // probe first.
            debug_assert!(
                self.is_reference() || self.has_states() || self.has_snapshots(),
                "admission probe promised {need} pages"
            );
            self.unlock(guard);
            return None;
        }
        Some(guard)
    }

    /// Locks the path the request will read, the room for it made (`guard` goes): with
    /// a deeper host match, device pages are attached to the host-only nodes (the
    /// load-back) and both tiers are locked. `None` with nothing changed.
    pub(crate) fn pin_path(&mut self, m: Match, guard: NodeLock, use_host: bool) -> Option<Pinned> {
        let pinned = if use_host && m.host_pages > m.device_pages {
            let host_lock = self.lock(m.host, Tier::Host);
            let nodes = self.nodes_without(Tier::Device, m.host);
            match self.attach_for_load_back(&nodes) {
                Some(pairs) => Some((self.lock(m.host, Tier::Device), Some(host_lock), pairs)),
                None => {
                    self.unlock(host_lock);
                    None
                }
            }
        } else {
            Some((self.lock(m.device, Tier::Device), None, Vec::new()))
        };
        self.unlock(guard);
        pinned
    }
}

/// What a first chunk asks of the cache: the prompt's full pages except the last
/// token's, its length, the tokens left in the step's budget, the decode reserve, and
/// whether host pages and prefix reuse may serve it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FirstChunkAsk<'a> {
    pub tokens: &'a TokenRef,
    pub prefill_len: u32,
    pub remaining: u32,
    pub d: u32,
    pub use_host: bool,
    pub reuse: bool,
}

impl FirstChunkAsk<'_> {
    /// The chunk's page arithmetic over a prefix matched `device` pages deep on device
    /// and `host` pages deep on host.
    pub(crate) fn shape(&self, device: u32, host: u32, ps: u32) -> ChunkShape {
        ChunkShape::new(device, host, self.prefill_len, self.remaining, self.d, ps)
    }
}

/// A pinned path: the device lock, the host lock on a load-back source, and the
/// load-back's copies.
pub(crate) type Pinned = (NodeLock, Option<NodeLock>, Vec<TransferPair>);

/// The page arithmetic of a first chunk over a prefix matched `device` pages deep on
/// device and `host` pages deep on host (or of a recovery: no tokens, the decode
/// reserve's pages).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkShape {
    /// Prefix pages reused.
    pub begin_pages: u32,
    /// Tokens of the chunk.
    pub tokens: u32,
    /// Pages of the request's own (chunk and decode reserve).
    pub own_pages: u32,
    /// Free slots left in the last of them.
    pub tail_free: u32,
    /// Device pages to make free: the load-back and the own pages.
    pub need: u32,
}

impl ChunkShape {
    pub(crate) fn new(
        device: u32,
        host: u32,
        prefill_len: u32,
        budget: u32,
        d: u32,
        ps: u32,
    ) -> Self {
        let begin_pages = device.max(host);
        let load_back = host.saturating_sub(device);
        let tokens = budget.min(prefill_len - begin_pages * ps);
        let (chunk_pages, tail) = grow(0, tokens, ps);
        let (reserve_pages, tail_free) = grow(tail, d, ps);
        Self {
            begin_pages,
            tokens,
            own_pages: chunk_pages + reserve_pages,
            tail_free,
            need: load_back + chunk_pages + reserve_pages,
        }
    }

    /// A recovery's: its history `begin_pages` deep, `reserve_pages` new pages for its
    /// next decode leaving `tail_free` slots.
    pub(crate) fn recovery(begin_pages: u32, reserve_pages: u32, tail_free: u32) -> Self {
        Self {
            begin_pages,
            tokens: 0,
            own_pages: reserve_pages,
            tail_free,
            need: reserve_pages,
        }
    }
}

impl Intent {
    /// The intent not admitted: its handles come back.
    fn unused(self) -> Outcome {
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

#[cfg(test)]
mod tests {
    use super::grow;

    #[test]
    fn grow_uses_the_tail_first() {
        assert_eq!(grow(3, 2, 4), (0, 1));
        assert_eq!(grow(3, 3, 4), (0, 0));
        assert_eq!(grow(1, 5, 4), (1, 0));
        assert_eq!(grow(1, 6, 4), (2, 3));
        assert_eq!(grow(0, 0, 4), (0, 0));
    }
}
