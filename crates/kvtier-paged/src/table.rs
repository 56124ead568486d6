//! A request's page table in one group (spec/hybrid-l3.md §2.2).
//!
//! The table's *compact view* is `borrowed ++ owned`: column `c` is absolute (logical)
//! page `base + c`, and the worker reads position `p` at column `p / tpp − base`.
//! Borrowed ids belong to snapshots on the request's pinned path (the table keeps only
//! the index); owned pages are the request's own, returned to the pool when freed or
//! dropped. Sliding groups drop pages off the front as the window moves on, advancing
//! `base`; full-history groups keep `base` at 0.

use kvtier_host::OwnedPages;
use kvtier_types::PageId;

use crate::{GroupPool, GroupRole, GroupSpec, PagedError};

/// The pages a snapshot owns in one group: logical pages `base ..` of a prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Page ids, owned by the snapshot (raw: the family frees them).
    pub pages: Vec<PageId>,
    /// The logical page of `pages[0]`.
    pub base: u32,
}

impl Segment {
    /// One past the last logical page.
    pub fn end(&self) -> u32 {
        self.base + self.pages.len() as u32
    }
}

/// What a sliding release freed (the reference's probe counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// Owned pages returned to the pool.
    pub owned: u32,
    /// Borrowed ids dropped from the index.
    pub borrowed: u32,
}

/// A request's table in one group.
#[derive(Debug, Default)]
pub struct PageTable {
    borrowed: Vec<PageId>,
    owned: OwnedPages,
    base: u32,
    /// Tokens the table has been acquired for.
    cursor: u32,
    /// Tokens committed to snapshots (a multiple of the alignment).
    committed: u32,
}

impl PageTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The logical page of column 0.
    pub fn base(&self) -> u32 {
        self.base
    }

    /// Columns in the compact view.
    pub fn len(&self) -> u32 {
        (self.borrowed.len() + self.owned.len()) as u32
    }

    /// Whether the compact view is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Logical pages covered: `base + len`.
    pub fn pages_have(&self) -> u32 {
        self.base + self.len()
    }

    /// Tokens acquired for.
    pub fn cursor(&self) -> u32 {
        self.cursor
    }

    /// Tokens committed to snapshots.
    pub fn committed(&self) -> u32 {
        self.committed
    }

    /// Borrowed (snapshot-owned) ids, front of the view.
    pub fn borrowed(&self) -> &[PageId] {
        &self.borrowed
    }

    /// The request's own pages, back of the view.
    pub fn owned(&self) -> &[PageId] {
        self.owned.ids()
    }

    /// The compact view: `borrowed ++ owned`.
    pub fn ids(&self) -> Vec<PageId> {
        let mut ids = Vec::with_capacity(self.len() as usize);
        ids.extend_from_slice(&self.borrowed);
        ids.extend_from_slice(self.owned.ids());
        ids
    }

    /// The logical page the first owned page sits at.
    fn owned_base(&self) -> u32 {
        self.base + self.borrowed.len() as u32
    }

    fn refuse(group: &GroupSpec, problem: String) -> PagedError {
        PagedError::Table {
            group: group.id.clone(),
            problem,
        }
    }

    /// Pages [`Self::acquire`] would allocate for `tokens`.
    pub fn pages_to_acquire(&self, group: &GroupSpec, tokens: u32) -> u32 {
        group.pages_for(tokens).saturating_sub(self.pages_have())
    }

    /// Tops the table up to cover `tokens` positions (a target at or below the cursor
    /// changes nothing). On a shortfall the pool counts a failed allocation and the
    /// table is left exactly as it was.
    pub fn acquire(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        tokens: u32,
    ) -> Result<(), PagedError> {
        if tokens <= self.cursor {
            return Ok(());
        }
        let need = self.pages_to_acquire(group, tokens);
        if need > 0 {
            let mut pages = pool.allocate(group, need)?;
            self.owned
                .append(&mut pages)
                .map_err(|e| Self::refuse(group, e.to_string()))?;
        }
        self.cursor = tokens;
        Ok(())
    }

    /// Starts a fresh table from a prefix hit: the snapshot pages as borrowed ids from
    /// logical page `base`, covering `tokens` committed tokens.
    pub fn import_borrowed(
        &mut self,
        group: &GroupSpec,
        ids: &[PageId],
        base: u32,
        tokens: u32,
    ) -> Result<(), PagedError> {
        if !self.is_empty() || self.cursor > 0 || self.base > 0 || self.committed > 0 {
            return Err(Self::refuse(
                group,
                "a hit is imported into a fresh table only".into(),
            ));
        }
        self.borrowed.extend_from_slice(ids);
        self.base = base;
        self.cursor = tokens;
        self.committed = tokens;
        Ok(())
    }

    /// Drops up to `n` columns off the front: borrowed ids first (index only), then
    /// owned pages (freed); the base moves on by as many.
    fn drop_front(&mut self, pool: &mut GroupPool, n: u32) -> Released {
        let n = n.min(self.len());
        let borrowed = n.min(self.borrowed.len() as u32);
        self.borrowed.drain(..borrowed as usize);
        let owned = n - borrowed;
        if owned > 0
            && let Ok(front) = self.owned.take_first(owned as usize)
        {
            pool.free(front);
        }
        self.base += n;
        Released { owned, borrowed }
    }

    /// The sliding release before an op whose first new token is at `first_pos`
    /// (`ReleaseSkipped`): drops the pages wholly below `first_pos − W + 1`, which that
    /// token no longer attends (spec §2.7: the bound is the op's *first* position,
    /// never its target). An empty table only moves its base there; `committed` is
    /// unchanged; a second call with the same bound does nothing. Full-history groups
    /// keep everything.
    pub fn release_skipped(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        first_pos: u32,
    ) -> Released {
        let Some(window) = group.window() else {
            return Released::default();
        };
        self.release_below(
            pool,
            (first_pos + 1).saturating_sub(window) / group.tokens_per_page(),
        )
    }

    /// Drops the pages below logical page `first_page` (the core of
    /// [`Self::release_skipped`], for a bound already in pages).
    pub fn release_below(&mut self, pool: &mut GroupPool, first_page: u32) -> Released {
        if first_page <= self.base {
            return Released::default();
        }
        if self.is_empty() {
            self.base = first_page;
            return Released::default();
        }
        self.drop_front(pool, first_page - self.base)
    }

    /// Frees the owned pages beyond what `max(tokens, committed)` positions need (draft
    /// tokens that were not accepted) and moves the cursor back there; returns how
    /// many. Borrowed ids are never touched.
    pub fn rewind_tail(&mut self, group: &GroupSpec, pool: &mut GroupPool, tokens: u32) -> u32 {
        let target = tokens.max(self.committed);
        if target >= self.cursor {
            return 0;
        }
        let owned = self.owned.len() as u32;
        let keep = group
            .pages_for(target)
            .saturating_sub(self.owned_base())
            .min(owned);
        let excess = owned - keep;
        if excess > 0
            && let Ok(tail) = self.owned.take_last(excess as usize)
        {
            pool.free(tail);
        }
        self.cursor = target;
        excess
    }

    /// Whether a commit to `target` tokens can run (CommitChunk's preflight): aligned
    /// committed length and target, target past the committed length and within the
    /// cursor, and for a history group the owned pages starting at the committed page
    /// with enough of them.
    pub fn can_commit(&self, group: &GroupSpec, target: u32) -> Result<(), PagedError> {
        let tpp = group.tokens_per_page();
        if target <= self.committed
            || target > self.cursor
            || !target.is_multiple_of(tpp)
            || !self.committed.is_multiple_of(tpp)
        {
            return Err(Self::refuse(
                group,
                format!(
                    "cannot commit to {target} tokens (committed {}, cursor {}, {tpp} tokens a page)",
                    self.committed, self.cursor
                ),
            ));
        }
        if group.role == GroupRole::History {
            let from = self.committed / tpp;
            let need = (target - self.committed) / tpp;
            if self.owned_base() != from || (self.owned.len() as u32) < need {
                return Err(Self::refuse(
                    group,
                    format!(
                        "owned pages start at {} with {} of them; a commit to {target} needs them at {from} with {need}",
                        self.owned_base(),
                        self.owned.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_target(&self, group: &GroupSpec, target: u32) -> Result<(), PagedError> {
        if target > self.cursor || !target.is_multiple_of(group.tokens_per_page()) {
            return Err(Self::refuse(
                group,
                format!(
                    "cannot snapshot at {target} tokens (cursor {}, {} tokens a page)",
                    self.cursor,
                    group.tokens_per_page()
                ),
            ));
        }
        Ok(())
    }

    /// Moves the owned pages of `[committed, target)` of a history group into a
    /// snapshot segment; the table keeps their ids as borrowed, so its view is
    /// unchanged. `None` when the target is already committed.
    pub fn commit_history(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        target: u32,
    ) -> Result<Option<Segment>, PagedError> {
        if target <= self.committed {
            return Ok(None);
        }
        self.can_commit(group, target)?;
        let n = (target - self.committed) / group.tokens_per_page();
        let segment = self.move_front_to_segment(group, pool, n)?;
        self.committed = target;
        Ok(Some(segment))
    }

    /// Checkpoints a state group at `target`: drops the columns below
    /// `max(0, target − W) / tpp` (outside every window from here on), then moves only
    /// the owned pages below the target's page into the segment (pages already
    /// borrowed belong to earlier snapshots; the segment may be empty). Returns the
    /// segment and the stale owned pages freed; `None` when already committed.
    pub fn checkpoint_state(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        target: u32,
    ) -> Result<Option<(Segment, u32)>, PagedError> {
        let Some(window) = group.window() else {
            return Err(Self::refuse(
                group,
                "only a sliding group checkpoints state".into(),
            ));
        };
        if target <= self.committed {
            return Ok(None);
        }
        self.check_target(group, target)?;
        let tpp = group.tokens_per_page();
        let live_from = target.saturating_sub(window) / tpp;
        let stale = self.drop_front(pool, live_from.saturating_sub(self.base));
        let n = (target / tpp)
            .saturating_sub(self.owned_base())
            .min(self.owned.len() as u32);
        let segment = self.move_front_to_segment(group, pool, n)?;
        self.committed = target;
        Ok(Some((segment, stale.owned)))
    }

    fn move_front_to_segment(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        n: u32,
    ) -> Result<Segment, PagedError> {
        let base = self.owned_base();
        let front = self
            .owned
            .take_first(n as usize)
            .map_err(|e| Self::refuse(group, e.to_string()))?;
        let pages = pool.adopt(group, front)?;
        self.borrowed.extend_from_slice(&pages);
        Ok(Segment { pages, base })
    }

    /// A history group adopts the segment another request committed first at the same
    /// node: its own copies of `[committed, target)` are freed, the canonical ids
    /// borrowed in their place.
    pub fn adopt_history(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        canonical: &[PageId],
        target: u32,
    ) -> Result<(), PagedError> {
        if target <= self.committed {
            return Ok(());
        }
        self.can_commit(group, target)?;
        let n = (target - self.committed) / group.tokens_per_page();
        if canonical.len() as u32 != n {
            return Err(Self::refuse(
                group,
                format!("adopting {} ids for {n} pages", canonical.len()),
            ));
        }
        let duplicates = self
            .owned
            .take_first(n as usize)
            .map_err(|e| Self::refuse(group, e.to_string()))?;
        pool.free(duplicates);
        self.borrowed.extend_from_slice(canonical);
        self.committed = target;
        Ok(())
    }

    /// A state group adopts a canonical segment at logical page `seg_base` ending at the
    /// target's page: the columns before it go (borrowed first, owned freed), the base
    /// moves to `seg_base`, the table's own copies of the segment's pages are dropped
    /// and the canonical ids borrowed at the front.
    pub fn adopt_state(
        &mut self,
        group: &GroupSpec,
        pool: &mut GroupPool,
        canonical: &[PageId],
        seg_base: u32,
        target: u32,
    ) -> Result<(), PagedError> {
        if target <= self.committed {
            return Ok(());
        }
        self.check_target(group, target)?;
        let n = canonical.len() as u32;
        if n == 0
            || (seg_base + n) * group.tokens_per_page() != target
            || seg_base < self.base
            || seg_base - self.base > self.len()
        {
            return Err(Self::refuse(
                group,
                format!(
                    "cannot adopt {n} state pages from {seg_base} for {target} tokens (base {}, {} columns)",
                    self.base,
                    self.len()
                ),
            ));
        }
        self.drop_front(pool, seg_base - self.base);
        if n > self.len() {
            return Err(Self::refuse(
                group,
                format!("adopting {n} state pages over {} columns", self.len()),
            ));
        }
        let base = self.base;
        self.drop_front(pool, n);
        self.base = base;
        self.borrowed.splice(0..0, canonical.iter().copied());
        self.committed = target;
        Ok(())
    }

    /// Drops every page: owned ones to the pool, borrowed ones from the index.
    pub fn release_all(&mut self, pool: &mut GroupPool) {
        self.release_with(pool, GroupPool::free);
    }

    /// [`Self::release_all`] of a table that only a first acquisition filled: the pool
    /// gets its pages back in the order it had them.
    pub fn undo_acquisition(&mut self, pool: &mut GroupPool) {
        self.release_with(pool, GroupPool::undo);
    }

    fn release_with(&mut self, pool: &mut GroupPool, free: fn(&mut GroupPool, OwnedPages)) {
        free(pool, std::mem::take(&mut self.owned));
        self.borrowed.clear();
        self.base = 0;
        self.cursor = 0;
        self.committed = 0;
    }
}
