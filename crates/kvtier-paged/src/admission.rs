//! Admission credit (spec §2.6): whether a group can take an op's pages, counting the
//! pages the op itself will free, without touching any table or pool.

use crate::{GroupRole, GroupSpec, PageTable};

/// What admission reads of a request's table in one group: the table it has, or the
/// view a prefix hit would give a fresh one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmitView {
    /// Logical page of column 0.
    pub base: u32,
    /// Borrowed columns.
    pub borrowed: u32,
    /// Owned columns.
    pub owned: u32,
    /// Tokens committed to snapshots.
    pub committed: u32,
    /// Tokens acquired for.
    pub cursor: u32,
}

impl AdmitView {
    /// The view of an existing table.
    pub fn of(table: &PageTable) -> Self {
        Self {
            base: table.base(),
            borrowed: table.borrowed().len() as u32,
            owned: table.owned().len() as u32,
            committed: table.committed(),
            cursor: table.cursor(),
        }
    }

    /// A fresh table that would import a hit of `pages` pages from `base`, covering
    /// `tokens`.
    pub fn from_hit(base: u32, pages: u32, tokens: u32) -> Self {
        Self {
            base,
            borrowed: pages,
            owned: 0,
            committed: tokens,
            cursor: tokens,
        }
    }

    /// A fresh table credited with a retracted request's stale table's owned pages
    /// (`AdmitChunkFromRetracted`): they are freed before the new ones are taken.
    pub fn from_retracted(stale: &PageTable) -> (Self, u32) {
        (Self::default(), stale.owned().len() as u32)
    }

    fn size(&self) -> u32 {
        self.borrowed + self.owned
    }
}

/// One group's verdict on an op: the pages it takes and the owned pages it frees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupNeed {
    /// New pages the op acquires.
    pub new: u32,
    /// Owned pages the op's release (or due checkpoint) frees first.
    pub releasable_owned: u32,
}

impl GroupNeed {
    /// Whether `free` pages (plus `credit` the caller knows will be freed first) cover
    /// it.
    pub fn fits(&self, free: u32, credit: u32) -> bool {
        free + credit + self.releasable_owned >= self.new
    }

    /// The free count after the op: debited by what it takes, credited with what it
    /// frees.
    pub fn apply(&self, free: u32, credit: u32) -> u32 {
        (free + credit + self.releasable_owned).saturating_sub(self.new)
    }
}

/// What one group needs for an op over `[first_pos, target)`, read from the view
/// only (nothing is touched).
///
/// A sliding group frees the *owned* pages below the op's window
/// (`(first_pos − W + 1) / tpp`); an empty table counts its base as moved there. A
/// required state group whose next snapshot is due (`committed + A ≤ cursor`, pass
/// `due_alignment = Some(A)`) is credited instead with the stale owned pages below
/// `max(0, committed + A − W) / tpp` only — the reference credited every owned page
/// below the window there (#249 over-credit).
pub fn group_need(
    group: &GroupSpec,
    view: AdmitView,
    first_pos: u32,
    target: u32,
    due_alignment: Option<u32>,
) -> GroupNeed {
    let tpp = group.tokens_per_page();
    let mut have = view.base + view.size();
    let mut releasable_owned = 0;
    if let Some(window) = group.window() {
        let first_needed = (first_pos + 1).saturating_sub(window) / tpp;
        if view.size() == 0 && first_needed > view.base {
            have = have.max(first_needed);
        }
        let releasable = first_needed.saturating_sub(view.base).min(view.size());
        releasable_owned = releasable.saturating_sub(view.borrowed).min(view.owned);
        if let (Some(alignment), GroupRole::State) = (due_alignment, group.role)
            && view.committed + alignment <= view.cursor
        {
            let live_from = (view.committed + alignment).saturating_sub(window) / tpp;
            let owned_from = view.base + view.borrowed.min(live_from.saturating_sub(view.base));
            releasable_owned = live_from.saturating_sub(owned_from).min(view.owned);
        }
    }
    GroupNeed {
        new: group.pages_for(target).saturating_sub(have),
        releasable_owned,
    }
}

/// The owned pages of a continuation-only state group that a terminal checkpoint at
/// `depth` (a commit due before the op's acquisition) turns into snapshot pages, out of
/// those the op's slide from `first_pos` would otherwise free: the slide no longer
/// returns them to the pool.
pub fn checkpointed_credit(group: &GroupSpec, view: AdmitView, first_pos: u32, depth: u32) -> u32 {
    let (Some(window), tpp) = (group.window(), group.tokens_per_page()) else {
        return 0;
    };
    let aligned = depth.is_multiple_of(tpp) && window.is_multiple_of(tpp);
    if !aligned || depth <= view.committed || depth > view.cursor {
        return 0;
    }
    let owned_begin = view.base + view.borrowed;
    let owned_end = owned_begin + view.owned;
    let slide_end = (first_pos + 1).saturating_sub(window) / tpp;
    let begin = owned_begin.max(depth.saturating_sub(window) / tpp);
    let end = owned_end.min(depth / tpp).min(slide_end);
    end.saturating_sub(begin)
}

/// Decides one group's share of an op against `simulated_free` (the pool's free pages
/// less what earlier admissions of this step took), adding `credit` pages the caller
/// knows will be freed first: on success the count is updated and `true` comes back;
/// on failure nothing changes. (A request's groups are decided together by the family:
/// every group must fit before any is debited.)
pub fn admit_chunk(
    group: &GroupSpec,
    view: AdmitView,
    first_pos: u32,
    target: u32,
    due_alignment: Option<u32>,
    simulated_free: &mut u32,
    credit: u32,
) -> bool {
    let need = group_need(group, view, first_pos, target, due_alignment);
    if !need.fits(*simulated_free, credit) {
        return false;
    }
    *simulated_free = need.apply(*simulated_free, credit);
    true
}
