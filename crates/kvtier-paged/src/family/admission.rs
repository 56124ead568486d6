//! All-or-nothing admission of a request's group pages, their acquisition, rewind and
//! release.

use std::fmt::Debug;

use super::*;
use crate::{
    AdmitView, GroupNeed, GroupRole, PagedError, PagedHit, checkpointed_credit, group_need,
};

impl<N: Copy + Ord + Debug> PagedFamily<N> {
    /// What each group needs for an op over `[first_pos, target)` of a request with
    /// `tables` (a fresh request: the hit's view).
    pub(super) fn needs(
        &self,
        tables: &RequestTables,
        first_pos: u32,
        target: u32,
        hit: Option<&PagedHit>,
        pending: Option<PendingCommit<N>>,
    ) -> Vec<GroupNeed> {
        let fresh = tables.is_fresh();
        // A continuation-only group the terminal's snapshot lacks gets the checkpoint.
        let checkpointed = |i: usize| {
            let p = pending.filter(|_| !fresh)?;
            let has = p
                .terminal
                .and_then(|n| self.snapshots.get(&n))
                .is_some_and(|s| s.segments[i].is_some());
            let due = p.depth.is_multiple_of(self.adjunct.alignment().max(1));
            let only = self.adjunct.continuation_only().any(|c| c == i);
            (only && due && !has).then_some(p.depth)
        };
        let a = self.adjunct.alignment();
        self.adjunct
            .groups()
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let view = match (fresh, hit) {
                    (false, _) => AdmitView::of(&tables.tables[i]),
                    // As `acquire` imports it: a segment without pages is not imported,
                    // so the table starts empty (its base moved by the slide).
                    (true, Some(hit)) => hit
                        .groups
                        .iter()
                        .find(|h| h.group == i && !h.ids.is_empty())
                        .map_or(AdmitView::default(), |h| {
                            AdmitView::from_hit(h.base, h.ids.len() as u32, hit.prefix_len)
                        }),
                    (true, None) => AdmitView::default(),
                };
                let due = (g.role == GroupRole::State && self.adjunct.is_required(i)).then_some(a);
                let mut need = group_need(g, view, first_pos, target, due);
                if let Some(depth) = checkpointed(i) {
                    need.releasable_owned = need
                        .releasable_owned
                        .saturating_sub(checkpointed_credit(g, view, first_pos, depth));
                }
                need
            })
            .collect()
    }

    /// Admits an op over `[first_pos, target)` against the step's simulated free
    /// counts (`simulated_free`, one per group), pruning snapshots no running request
    /// pins when a group is short, for at most as many rounds as there are snapshots.
    /// The path to `hit_node` (where the candidate's own hit ends) is never pruned:
    /// the hit's pages must outlive its admission. All groups or none: on success
    /// every count is debited; on refusal the counts are the live ones after any
    /// prunes.
    pub fn admit<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        tables: &RequestTables,
        first_pos: u32,
        target: u32,
        hit: Option<(&PagedHit, N)>,
        simulated_free: &mut [u32],
    ) -> bool {
        self.admit_op(
            tree,
            tables,
            (first_pos, target),
            (hit, None),
            simulated_free,
        )
    }

    /// [`Self::admit`] for a running request's op whose `pending` commit comes between
    /// the admission and the acquisition: a terminal checkpoint it makes in a
    /// continuation-only group is not credited as freed by the op's slide.
    pub fn admit_before_commit<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        tables: &RequestTables,
        (first_pos, target): (u32, u32),
        pending: Option<PendingCommit<N>>,
        simulated_free: &mut [u32],
    ) -> bool {
        self.admit_op(
            tree,
            tables,
            (first_pos, target),
            (None, pending),
            simulated_free,
        )
    }

    fn admit_op<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        tables: &RequestTables,
        (first_pos, target): (u32, u32),
        (hit, pending): (Option<(&PagedHit, N)>, Option<PendingCommit<N>>),
        simulated_free: &mut [u32],
    ) -> bool {
        let (hit, hit_node) = match hit {
            Some((hit, node)) => (Some(hit), Some(node)),
            None => (None, None),
        };
        let rounds = self.snapshots.len();
        let mut round = 0;
        loop {
            let needs = self.needs(tables, first_pos, target, hit, pending);
            let failed: Vec<usize> = (0..needs.len())
                .filter(|&i| !needs[i].fits(simulated_free[i], 0))
                .collect();
            if failed.is_empty() {
                for (free, need) in simulated_free.iter_mut().zip(&needs) {
                    *free = need.apply(*free, 0);
                }
                return true;
            }
            let kind = self.starved(&failed);
            let pruned =
                round < rounds && kind.is_some_and(|kind| self.prune_sparing(tree, kind, hit_node));
            if !pruned {
                self.stats.admission_denied += 1;
                return false;
            }
            round += 1;
            for (free, live) in simulated_free.iter_mut().zip(self.available()) {
                *free = live;
            }
        }
    }

    /// What the failed groups need a prune to free (`None`: a transport-only group
    /// that no prune can help).
    pub(super) fn starved(&self, failed: &[usize]) -> Option<Starved> {
        let history = failed.iter().any(|&i| {
            self.adjunct.is_required(i) && self.adjunct.groups()[i].role == GroupRole::History
        });
        let state = failed
            .iter()
            .any(|&i| self.adjunct.groups()[i].role == GroupRole::State);
        match (history, state) {
            (true, _) => Some(Starved::History),
            (false, true) => Some(Starved::State),
            (false, false) => None,
        }
    }

    /// Gives a request the pages of an op over `[first_pos, target)`: a fresh request
    /// first imports the hit, sliding groups release what the op's first token no
    /// longer attends, then each table is topped up. Checked first for every group:
    /// on a refusal nothing changed.
    pub fn acquire(
        &mut self,
        tables: &mut RequestTables,
        first_pos: u32,
        target: u32,
        hit: Option<&PagedHit>,
    ) -> Result<(), PagedError> {
        let needs = self.needs(tables, first_pos, target, hit, None);
        for (i, need) in needs.iter().enumerate() {
            let free = self.pools[i].available();
            // The sliding release frees owned pages before the acquisition.
            if free + self.sliding_credit(tables, i, first_pos) < need.new {
                return Err(PagedError::OutOfPages {
                    group: self.adjunct.groups()[i].id.clone(),
                    needed: need.new,
                    free,
                });
            }
        }
        if tables.is_fresh()
            && let Some(hit) = hit.filter(|h| h.prefix_len > 0)
        {
            for h in &hit.groups {
                if !h.ids.is_empty() {
                    let g = &self.adjunct.groups()[h.group];
                    tables.tables[h.group].import_borrowed(g, &h.ids, h.base, hit.prefix_len)?;
                }
            }
        }
        for (i, g) in self.adjunct.groups().iter().enumerate() {
            let released = tables.tables[i].release_skipped(g, &mut self.pools[i], first_pos);
            self.stats.release_skipped_owned += u64::from(released.owned);
            self.stats.release_skipped_borrowed += u64::from(released.borrowed);
            tables.tables[i].acquire(g, &mut self.pools[i], target)?;
        }
        Ok(())
    }

    /// [`Self::acquire`] for a running request's op already admitted, pruning snapshots
    /// no running request pins when a group falls short. The admission foresees the
    /// commit between them ([`Self::admit_before_commit`]); should that commit still
    /// keep more than foreseen, the op is not refused after its admission.
    pub fn acquire_admitted<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        tables: &mut RequestTables,
        first_pos: u32,
        target: u32,
    ) -> Result<(), PagedError> {
        // At most one prune per snapshot; each round retries the whole acquisition.
        let mut rounds = self.snapshots.len();
        loop {
            let short = match self.acquire(tables, first_pos, target, None) {
                Err(PagedError::OutOfPages { group, .. }) if rounds > 0 => group,
                done => return done,
            };
            rounds -= 1;
            let failed: Vec<usize> = (0..self.adjunct.groups().len())
                .filter(|&i| self.adjunct.groups()[i].id == short)
                .collect();
            let pruned = self
                .starved(&failed)
                .is_some_and(|kind| self.prune_sparing(tree, kind, None));
            if !pruned {
                return self.acquire(tables, first_pos, target, None);
            }
        }
    }

    /// Owned pages group `i`'s sliding release would free before an op at `first_pos`.
    fn sliding_credit(&self, tables: &RequestTables, i: usize, first_pos: u32) -> u32 {
        let g = &self.adjunct.groups()[i];
        let t = &tables.tables[i];
        match g.window() {
            None => 0,
            Some(w) => {
                let first_page = (first_pos + 1).saturating_sub(w) / g.tokens_per_page();
                let drop = first_page.saturating_sub(t.base()).min(t.len());
                drop.saturating_sub(t.borrowed().len() as u32)
            }
        }
    }

    /// Frees the owned tail pages beyond `accepted` tokens (rejected draft tokens).
    pub fn rewind(&mut self, tables: &mut RequestTables, accepted: u32) {
        for (i, g) in self.adjunct.groups().iter().enumerate() {
            let freed = tables.tables[i].rewind_tail(g, &mut self.pools[i], accepted);
            self.stats.rewind_owned += u64::from(freed);
        }
    }

    /// Releases every table of a finished or aborted request (snapshot pages stay with
    /// their snapshots).
    pub fn release(&mut self, tables: &mut RequestTables) {
        // Its locks go with it: snapshots it pinned may be pruned now.
        self.changes += 1;
        for (t, pool) in tables.tables.iter_mut().zip(&mut self.pools) {
            t.release_all(pool);
        }
    }

    /// Gives back the tables of a first chunk refused after their acquisition (its KV
    /// could not be had): each pool's free list is as before, as if they had never
    /// been taken (the reference takes them only once the KV is there).
    pub fn undo_acquisition(&mut self, tables: &mut RequestTables) {
        self.changes += 1;
        for (t, pool) in tables.tables.iter_mut().zip(&mut self.pools) {
            t.undo_acquisition(pool);
        }
    }
}
