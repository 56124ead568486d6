//! The op table: engine ops in flight, keyed by op id, and the id counter.
//!
//! Write-backs and L3 backups keep cache handles (a write-back ticket, a host pin) until
//! the engine acknowledges them, so they outlive the request that issued them.
//! Prefetches and load-backs take ids here too. A prefetch's bookkeeping lives in its
//! request's state; a load-back is not acknowledged, but the last plan's are kept here
//! (with their device pages) so that a failure can name one.

use std::collections::BTreeMap;

use kvtier_radix::{BackupSource, NodeId, NodeLock, WriteBackTicket};
use kvtier_types::{BackupOp, OpId, PageId, RequestId, hash::PageHash};

/// What a load-back wrote: device pages, and device state slots (hybrid models).
#[derive(Debug, Default)]
pub(crate) struct FailedLoad {
    pub pages: Vec<PageId>,
    pub states: Vec<u32>,
}

/// A write-back in flight. Its cache ticket pins the copy's source and destination pages
/// until acknowledged, so it survives the request that issued it (an abort cannot free
/// pages that a copy is still reading or writing).
#[derive(Debug)]
pub(crate) struct WriteBackInFlight {
    /// The request that issued it; `None` once that request is aborted.
    pub request: Option<RequestId>,
    /// Pins the copy's source and destination pages until acknowledged.
    pub ticket: WriteBackTicket,
    /// The device node whose path is copied (demoted on success, kept on a failed
    /// retract copy).
    pub device_node: NodeId,
    pub is_retract: bool,
    /// Earlier write-backs of the same plan that carry some of its pairs (a plan emits
    /// each pair once): its copy is whole only if they succeed too.
    pub depends_on: Vec<OpId>,
    /// Its span under the request's, from the plan that carries it to its resolution.
    pub span: tracing::Span,
}

/// A span for a copy done for a request, under `parent` (none when nobody listens).
pub(crate) fn copy_span(parent: &tracing::Span, name: &'static str, pages: usize) -> tracing::Span {
    if parent.is_disabled() {
        return tracing::Span::none();
    }
    tracing::info_span!(parent: parent, "copy", otel.name = name, kvtier.pages = pages as i64)
}

/// Ops in flight and the next op id.
#[derive(Debug)]
pub(crate) struct OpTable {
    write_backs: BTreeMap<OpId, WriteBackInFlight>,
    /// Write-backs acknowledged (with the engine's answer) that wait for the write-backs
    /// they depend on.
    parked: BTreeMap<OpId, (WriteBackInFlight, bool)>,
    /// Write-backs others depend on: how many dependents are unresolved, and the
    /// outcome once it is known.
    depended_on: BTreeMap<OpId, (usize, Option<bool>)>,
    /// Written-back host pages waiting for their L3 backup op, pinned on host.
    pending_backups: Vec<(BackupSource, tracing::Span)>,
    /// Backups in flight: the host lock pinning each one's source pages until acked.
    backups: BTreeMap<OpId, Backup>,
    /// The last plan's load-backs: their device pages and state slots, and whether a
    /// failure was taken.
    load_backs: BTreeMap<OpId, (FailedLoad, bool, tracing::Span)>,
    /// The last plan's rows that copied a cached state into their working slot: the
    /// request and the device state slot (hybrid models).
    copies: Vec<(RequestId, u32)>,
    /// The id the next op gets; ids below it (and above 0) were issued.
    next: OpId,
}

/// An L3 backup in flight: the pin on its host pages, and (with KV events) the rolling
/// hashes of the pages it stores.
#[derive(Debug)]
pub(crate) struct Backup {
    pub pin: NodeLock,
    pub page_hashes: Vec<PageHash>,
    /// Its span, under its write-back's; ends when the backup is done.
    pub span: tracing::Span,
}

impl Default for OpTable {
    fn default() -> Self {
        Self {
            write_backs: BTreeMap::new(),
            parked: BTreeMap::new(),
            depended_on: BTreeMap::new(),
            pending_backups: Vec::new(),
            backups: BTreeMap::new(),
            load_backs: BTreeMap::new(),
            copies: Vec::new(),
            // 0 is never issued: an acknowledgement for op 0 is always unknown.
            next: 1,
        }
    }
}

impl OpTable {
    /// A fresh op id (never 0).
    pub fn next_id(&mut self) -> OpId {
        let id = self.next;
        self.next = self.next.wrapping_add(1).max(1);
        id
    }

    /// Whether `op_id` was issued: an answer for an issued op that is no longer in
    /// flight is stale (late or repeated), any other is unknown.
    pub fn was_issued(&self, op_id: OpId) -> bool {
        op_id != 0 && op_id < self.next
    }

    /// A new plan starts: the last plan's load-backs can no longer fail.
    pub fn forget_load_backs(&mut self) {
        self.load_backs.clear();
        self.copies.clear();
    }

    /// Records a load-back of this plan onto device `pages` and state slots `states`
    /// under a fresh id, which it returns.
    /// under a fresh id, which it returns; `span` lasts until the next plan.
    pub fn issue_load_back(
        &mut self,
        pages: Vec<PageId>,
        states: Vec<u32>,
        span: tracing::Span,
    ) -> OpId {
        let op_id = self.next_id();
        self.load_backs
            .insert(op_id, (FailedLoad { pages, states }, false, span));
        op_id
    }

    /// A row of this plan copies the cached state in device slot `slot` (hybrid models).
    pub fn record_copy(&mut self, request: RequestId, slot: u32) {
        self.copies.push((request, slot));
    }

    /// The requests whose rows of the last plan copied one of these state slots.
    pub fn copied_from(&self, slots: &[u32]) -> Vec<RequestId> {
        self.copies
            .iter()
            .filter(|(_, slot)| slots.contains(slot))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Whether the last plan had load-backs (a failure can only name one of those).
    pub fn has_load_backs(&self) -> bool {
        !self.load_backs.is_empty()
    }

    /// A load-back of the last plan failed: its device pages, the first time it is
    /// reported (taken: a second report needs none). `Err(true)`: reported before (stale); `Err(false)`: not a load-back of
    /// the last plan.
    pub fn load_back_failed(&mut self, op_id: OpId) -> Result<FailedLoad, bool> {
        match self.load_backs.get_mut(&op_id) {
            Some((_, true, _)) => Err(true),
            Some((load, reported, _)) => {
                *reported = true;
                Ok(std::mem::take(load))
            }
            None => Err(false),
        }
    }

    /// Records a write-back under a fresh id, which it returns.
    pub fn issue_write_back(&mut self, write_back: WriteBackInFlight) -> OpId {
        let op_id = self.next_id();
        self.debug_check_free(op_id);
        self.write_backs.insert(op_id, write_back);
        op_id
    }

    /// Write-back `op_id` relies on `earlier` ops of its plan for some of its pairs.
    pub fn depends_on(&mut self, op_id: OpId, earlier: Vec<OpId>) {
        for &op in &earlier {
            self.depended_on.entry(op).or_insert((0, None)).0 += 1;
        }
        if let Some(write_back) = self.write_backs.get_mut(&op_id) {
            write_back.depends_on = earlier;
        }
    }

    /// The engine acknowledged write-back `op_id` with `success`. Returns the
    /// write-backs this resolves, in op order, each with its outcome: its own success
    /// and that of every write-back it depends on (a pair it relied on another op to
    /// copy was only copied if that op succeeded). A write-back waits, acknowledged,
    /// until those are resolved. `None` if `op_id` is not in flight.
    pub fn acknowledge_write_back(
        &mut self,
        op_id: OpId,
        success: bool,
    ) -> Option<Vec<(WriteBackInFlight, bool)>> {
        let write_back = self.write_backs.remove(&op_id)?;
        self.parked.insert(op_id, (write_back, success));
        let mut resolved = Vec::new();
        while let Some(op) = self.next_resolvable() {
            let Some((write_back, own)) = self.parked.remove(&op) else {
                break;
            };
            let mut outcome = own;
            for dep in &write_back.depends_on {
                let Some((left, dep_outcome)) = self.depended_on.get_mut(dep) else {
                    continue;
                };
                outcome &= dep_outcome.unwrap_or(false);
                *left -= 1;
                if *left == 0 {
                    self.depended_on.remove(dep);
                }
            }
            if let Some((_, known)) = self.depended_on.get_mut(&op) {
                *known = Some(outcome);
            }
            resolved.push((write_back, outcome));
        }
        Some(resolved)
    }

    /// The first parked write-back whose dependencies all have outcomes.
    fn next_resolvable(&self) -> Option<OpId> {
        self.parked
            .iter()
            .find(|(_, (write_back, _))| {
                write_back.depends_on.iter().all(|dep| {
                    self.depended_on
                        .get(dep)
                        .is_none_or(|(_, outcome)| outcome.is_some())
                })
            })
            .map(|(&op, _)| op)
    }

    /// The request of write-back `op_id` is gone; the copy stays pinned by its ticket
    /// until acknowledged (and resolved).
    pub fn detach_request(&mut self, op_id: OpId) {
        if let Some(write_back) = self.write_backs.get_mut(&op_id) {
            write_back.request = None;
        }
        if let Some((write_back, _)) = self.parked.get_mut(&op_id) {
            write_back.request = None;
        }
    }

    /// Queues the backup sources of acknowledged write-backs for the next plan, each
    /// with a span under `parent` (the write-back's) that lasts until `BackupDone`.
    pub fn queue_backups(
        &mut self,
        sources: impl IntoIterator<Item = BackupSource>,
        parent: &tracing::Span,
    ) {
        self.pending_backups.extend(sources.into_iter().map(|s| {
            let span = copy_span(parent, "backup", s.pages.len());
            (s, span)
        }));
    }

    /// Emits the queued backups into `out`; each keeps its source pages pinned until
    /// `BackupDone`. With `keep_hashes` (KV events) each remembers its page hashes, to
    /// publish what it stored.
    pub fn issue_backups(&mut self, out: &mut Vec<BackupOp>, keep_hashes: bool) {
        for (backup, span) in std::mem::take(&mut self.pending_backups) {
            let op_id = self.next_id();
            let page_hashes = if keep_hashes {
                backup.hashes.clone()
            } else {
                Vec::new()
            };
            out.push(BackupOp {
                op_id,
                src_pages: backup.pages,
                page_hashes: backup.hashes,
                states: backup.states,
            });
            self.debug_check_free(op_id);
            self.backups.insert(
                op_id,
                Backup {
                    pin: backup.pin,
                    page_hashes,
                    span,
                },
            );
        }
    }

    /// Backup `op_id` is done: its pin and the page hashes it kept (`None` if it is not
    /// in flight). Done or failed, its source pages are free to go once the pin is
    /// released: a failed backup is only a future L3 miss.
    pub fn backup_done(&mut self, op_id: OpId) -> Option<Backup> {
        self.backups.remove(&op_id)
    }

    /// Write-backs issued and not acknowledged (their acks free device pages).
    pub fn write_backs_in_flight(&self) -> usize {
        self.write_backs.len() + self.parked.len()
    }

    /// Write-backs and backups issued and not acknowledged, and backups queued.
    pub fn in_flight(&self) -> usize {
        self.write_backs.len() + self.parked.len() + self.backups.len() + self.pending_backups.len()
    }

    pub fn is_empty(&self) -> bool {
        self.write_backs.is_empty()
            && self.parked.is_empty()
            && self.pending_backups.is_empty()
            && self.backups.is_empty()
    }

    /// Debug builds: a fresh id names no op in flight (one table entry per op).
    fn debug_check_free(&self, op_id: OpId) {
        debug_assert!(
            op_id != 0
                && !self.write_backs.contains_key(&op_id)
                && !self.parked.contains_key(&op_id)
                && !self.backups.contains_key(&op_id),
            "op id {op_id} issued twice"
        );
    }
}
