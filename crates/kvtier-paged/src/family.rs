//! The paged-cache family on a prefix tree: snapshots on nodes, the commits that make
//! them, the capped match, admission with pruning, and what happens to snapshots when
//! their node's KV goes (spec/hybrid-l3.md §2.4–§2.7).
//!
//! The tree is the host's (the radix cache): the family reads it and asks it to split
//! through [`SnapshotTree`], and is told when a node's device KV is evicted or a node
//! is removed. A request's tables ([`RequestTables`]) are the request's, held in its
//! state in the scheduler; the family lends them pages and takes snapshot pages out of
//! them.
//!
//! Everything is ordered: snapshot nodes by their ids, prune victims by `(time, deeper
//! first, id)`, groups by id; nothing depends on an address.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use kvtier_types::PageId;

use crate::{
    Adjunct, AdmitView, GroupNeed, GroupPool, GroupRole, PageTable, PagedError, PagedHit, Snapshot,
    cap_match, checkpointed_credit, group_need,
};

/// Prune order: oldest first, deeper first on a tie, then creation order.
type PruneOrder = (u64, std::cmp::Reverse<u32>, u64);

/// What the family reads of the tree that hosts it, and the one change it asks of it.
pub trait SnapshotTree {
    /// A node's identity (stable while the node lives; a split keeps it on the suffix).
    type Node: Copy + Ord + Debug;

    /// The root (depth 0; never holds a snapshot).
    fn root(&self) -> Self::Node;
    /// A node's parent (`None` for the root).
    fn parent(&self, node: Self::Node) -> Option<Self::Node>;
    /// A node's depth in tokens.
    fn depth(&self, node: Self::Node) -> u32;
    /// Device locks on the node (0 when its KV is not on device).
    fn device_refs(&self, node: Self::Node) -> u32;
    /// The node's LRU order: last access time, then creation order.
    fn age(&self, node: Self::Node) -> (u64, u64);
    /// The node ending at `depth` on the path from the root to `below`, splitting the
    /// node that spans it if needed (the split prefix takes the suffix's access time).
    /// The family never asks to split a snapshot node.
    fn split_at(&mut self, below: Self::Node, depth: u32) -> Option<Self::Node>;
    /// Calls `f` with every request's tables the tree's owner keeps (not those taken
    /// out to be committed): the wheel's detach reads which pages they borrow.
    fn for_each_tables(&self, f: &mut dyn FnMut(&RequestTables));
}

/// A request's tables, one per group of the family (in group order). Their owned pages
/// go home when dropped; the family's `release` returns them at once (the radix cache
/// keeps running requests' tables and releases them when the request's lease goes).
#[derive(Debug)]
pub struct RequestTables {
    tables: Vec<PageTable>,
}

impl RequestTables {
    /// Fresh, empty tables for `groups` groups.
    pub fn new(groups: usize) -> Self {
        Self {
            tables: (0..groups).map(|_| PageTable::new()).collect(),
        }
    }

    /// The table of group `i`.
    pub fn get(&self, i: usize) -> &PageTable {
        &self.tables[i]
    }

    /// Every table, in group order.
    pub fn iter(&self) -> impl Iterator<Item = &PageTable> {
        self.tables.iter()
    }

    /// Whether nothing was acquired yet.
    pub fn is_fresh(&self) -> bool {
        self.tables
            .iter()
            .all(|t| t.is_empty() && t.cursor() == 0 && t.base() == 0)
    }
}

/// A commit due between a running request's admission and its acquisition: the depth
/// it publishes to, and the node there when the tree already has one. Its terminal
/// checkpoint takes state windows the op's slide would otherwise have freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingCommit<N> {
    /// Tokens up to the published node.
    pub depth: u32,
    /// The node at that depth, if it exists before the commit.
    pub terminal: Option<N>,
}

/// Why a group failed admission: what a prune must free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starved {
    /// Only state groups failed: strip state from one snapshot.
    State,
    /// A required history group failed: drop a whole snapshot and its descendants.
    History,
}

/// Counters of the family (the reference's probe counters where it has them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PagedStats {
    /// Snapshots built by commits.
    pub snapshots_created: u64,
    /// Commits that adopted a snapshot another request built first.
    pub snapshots_adopted: u64,
    /// Terminal snapshots completed with their continuation groups.
    pub terminal_continuations: u64,
    /// Commits stopped by a table that could not back them.
    pub commit_preflight_fail: u64,
    /// Superseded state windows detached from ancestors after a terminal commit (#460).
    pub stale_state_detached: u64,
    /// Admission prunes that stripped state only.
    pub prune_state_only: u64,
    /// Admission prunes that dropped a whole snapshot.
    pub prune_full: u64,
    /// Descendant snapshots dropped with a pruned one.
    pub prune_cascade: u64,
    /// Snapshots dropped because their node's device KV was evicted.
    pub dropped_kv_evict: u64,
    /// Snapshots dropped with their removed node.
    pub dropped_node_destroy: u64,
    /// Admissions refused (attempts: a waiting request retries every step).
    pub admission_denied: u64,
    /// Owned pages freed by sliding releases.
    pub release_skipped_owned: u64,
    /// Borrowed ids dropped by sliding releases.
    pub release_skipped_borrowed: u64,
    /// Stale owned pages freed by state checkpoints.
    pub checkpoint_stale_owned: u64,
    /// Pages freed by rewinds of rejected draft tokens.
    pub rewind_owned: u64,
}

/// One group's pool gauges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupStats {
    /// The group's id.
    pub id: String,
    /// Its pool size, the reserved page 0 included.
    pub total_pages: u32,
    /// Free pages now.
    pub free_pages: u32,
    /// Allocations refused so far.
    pub failed_alloc: u64,
}

/// The family's counters and its groups' gauges.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PagedReport {
    /// The family's counters.
    pub stats: PagedStats,
    /// Per group, in group order.
    pub groups: Vec<GroupStats>,
    /// Snapshots held.
    pub snapshots: usize,
    /// Running requests' tables (filled in by the tree that holds them).
    pub live_tables: usize,
}

/// The paged-cache family.
#[derive(Debug)]
pub struct PagedFamily<N> {
    adjunct: Adjunct,
    pools: Vec<GroupPool>,
    snapshots: BTreeMap<N, Snapshot>,
    /// Detach superseded state windows of ancestors after a terminal commit (#460;
    /// the reference at 350cf505 does not).
    detach_stale_state: bool,
    /// #460 as the 0.1.0 wheel has it: every state window of an ancestor that only the
    /// committing request holds goes, unless some request's table still borrows its
    /// pages (kvtier's own rule keeps the required windows where others branch off).
    wheel_detach: bool,
    /// A snapshot is pinned when a device lock is on its node or any ancestor (the
    /// reference's test), rather than on its node alone.
    pin_by_path: bool,
    /// Snapshots attached, changed or dropped, and requests gone (their pins with
    /// them), over the family's life: with the pools' returns, what [`Self::version`]
    /// counts.
    changes: u64,
    stats: PagedStats,
}

impl<N: Copy + Ord + Debug> PagedFamily<N> {
    /// The family over the adjunct's groups, each with a fresh pool.
    pub fn new(adjunct: Adjunct, detach_stale_state: bool) -> Self {
        let pools = adjunct.groups().iter().map(GroupPool::new).collect();
        Self {
            adjunct,
            pools,
            snapshots: BTreeMap::new(),
            detach_stale_state,
            wheel_detach: false,
            pin_by_path: true,
            changes: 0,
            stats: PagedStats::default(),
        }
    }

    /// Pins a snapshot only by the locks that may read it: on its node (a lock at or
    /// below a node raises the node's count). The reference also counts a lock on an
    /// ancestor, so a running request pins every snapshot on the branches below its
    /// path, and one whose next op needs their pages waits forever.
    pub fn pinned_by_own_locks(mut self) -> Self {
        self.pin_by_path = false;
        self
    }

    /// Detaches superseded state windows by the 0.1.0 wheel's rule (#460), which spares
    /// the windows whose pages request tables borrow ([`Self::borrowed_state`]).
    pub fn detaching_as_the_wheel(mut self) -> Self {
        self.detach_stale_state = true;
        self.wheel_detach = true;
        self
    }

    /// Whether the family detaches by the wheel's rule, which reads which state pages
    /// request tables borrow.
    pub fn reads_borrowed_state(&self) -> bool {
        self.wheel_detach
    }

    /// The state-group pages request tables borrow, as `(group, page)`: every one of
    /// the tables `tree`'s owner keeps, and all of `committing`'s as the commit left
    /// them. A terminal checkpoint drops the entries below the window; where the
    /// terminal's snapshot already held the window, nothing did, and the wheel spares
    /// the windows those older entries still borrow.
    pub fn borrowed_state<T: SnapshotTree<Node = N>>(
        &self,
        tree: &T,
        committing: &RequestTables,
    ) -> BTreeSet<(usize, PageId)> {
        let state = self.adjunct.continuation();
        let mut borrowed = BTreeSet::new();
        tree.for_each_tables(&mut |t| {
            for &i in state {
                borrowed.extend(t.tables[i].borrowed().iter().map(|&p| (i, p)));
            }
        });
        for &i in state {
            borrowed.extend(committing.tables[i].borrowed().iter().map(|&p| (i, p)));
        }
        borrowed
    }

    /// The groups and the adjunct's choices.
    pub fn adjunct(&self) -> &Adjunct {
        &self.adjunct
    }

    /// Fresh tables for a new request.
    pub fn new_tables(&self) -> RequestTables {
        RequestTables::new(self.adjunct.groups().len())
    }

    /// Whether a fresh request's op over `[first_pos, target)` could be admitted with
    /// every pool wholly free: when not, no pruning or waiting ever admits it.
    pub fn could_ever_admit(&self, first_pos: u32, target: u32) -> bool {
        let needs = self.needs(&self.new_tables(), first_pos, target, None, None);
        self.adjunct
            .groups()
            .iter()
            .zip(&needs)
            .all(|(g, need)| need.fits(g.total_pages.saturating_sub(1), 0))
    }

    /// A version of everything that could turn a refused admission into an admitted
    /// one: it moves whenever a pool gets pages back, a snapshot comes, changes or goes,
    /// or a request's tables are released (the snapshots it pinned become prunable);
    /// allocations only make admission harder. An admission refused at one version is
    /// refused again at the same version, for the same request and no more budget.
    pub fn version(&self) -> u64 {
        let returned: u64 = self.pools.iter().map(GroupPool::returned).sum();
        returned + self.changes
    }

    /// The counters.
    pub fn stats(&self) -> PagedStats {
        self.stats
    }

    /// The counters, the groups' gauges and the snapshots held.
    pub fn report(&mut self) -> PagedReport {
        PagedReport {
            stats: self.stats,
            groups: self.group_stats(),
            snapshots: self.snapshots.len(),
            live_tables: 0,
        }
    }

    /// Group `i`'s pool.
    pub fn pool(&mut self, i: usize) -> &mut GroupPool {
        &mut self.pools[i]
    }

    /// Free pages per group now (the starting point of a step's simulated counts).
    pub fn available(&mut self) -> Vec<u32> {
        self.pools.iter_mut().map(GroupPool::available).collect()
    }

    /// Each group's pool gauges: id, free pages, failed allocations.
    pub fn group_stats(&mut self) -> Vec<GroupStats> {
        let ids = self.adjunct.groups().iter().map(|g| g.id.clone());
        ids.zip(&mut self.pools)
            .map(|(id, pool)| GroupStats {
                id,
                total_pages: pool.usable() + 1,
                free_pages: pool.available(),
                failed_alloc: pool.failed_alloc(),
            })
            .collect()
    }

    /// The snapshot on `node`, if any.
    pub fn snapshot(&self, node: N) -> Option<&Snapshot> {
        self.snapshots.get(&node)
    }

    /// Attaches a snapshot built elsewhere (an L3 prefetch, a test fixture) to `node`,
    /// replacing and freeing any snapshot there. Its pages must be this family's and
    /// held by nothing else.
    pub fn attach(&mut self, node: N, snapshot: Snapshot) {
        self.detach(node);
        self.changes += 1;
        self.snapshots.insert(node, snapshot);
    }

    /// Takes the snapshot off `node` without freeing its pages (the caller now owns
    /// them: a test fixture's downgrade, or a transfer).
    pub fn take_snapshot(&mut self, node: N) -> Option<Snapshot> {
        self.changes += 1;
        self.snapshots.remove(&node)
    }

    /// Whether `node` holds a snapshot (such a node is never split).
    pub fn has_snapshot(&self, node: N) -> bool {
        self.snapshots.contains_key(&node)
    }

    /// Nodes holding snapshots, in id order.
    pub fn snapshot_nodes(&self) -> impl Iterator<Item = N> + '_ {
        self.snapshots.keys().copied()
    }

    fn path<T: SnapshotTree<Node = N>>(tree: &T, node: N) -> Vec<N> {
        let mut path = Vec::new();
        let mut cur = Some(node);
        while let Some(n) = cur {
            if n == tree.root() {
                break;
            }
            path.push(n);
            cur = tree.parent(n);
        }
        path.reverse();
        path
    }

    /// The capped hit on the path to `deepest` (the deepest *token-matched* node of
    /// one tier), with the node the hit ends at (the root for none).
    pub fn cap_match<T: SnapshotTree<Node = N>>(&self, tree: &T, deepest: N) -> (PagedHit, N) {
        let path = Self::path(tree, deepest);
        let nodes: Vec<N> = path
            .iter()
            .copied()
            .filter(|n| self.snapshots.contains_key(n))
            .collect();
        let chain: Vec<&Snapshot> = nodes.iter().map(|n| &self.snapshots[n]).collect();
        let hit = cap_match(&self.adjunct, &chain);
        let node = match hit.snapshots {
            0 => tree.root(),
            k => nodes[k - 1],
        };
        (hit, node)
    }

    /// What each group needs for an op over `[first_pos, target)` of a request with
    /// `tables` (a fresh request: the hit's view).
    fn needs(
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
    fn starved(&self, failed: &[usize]) -> Option<Starved> {
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

    /// Commits the request's computed prefix up to `terminal` (its device node) into
    /// snapshots at every multiple of `A` past what it committed: each step splits the
    /// tree there, checks that every required table can back it, then adopts the
    /// snapshot another request built at that node or builds one. A terminal snapshot
    /// at exactly the terminal's depth is completed with the continuation groups.
    /// Stops at the first step that cannot run, keeping earlier ones; never splits a
    /// snapshot node.
    pub fn commit_chunk<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &mut T,
        tables: &mut RequestTables,
        terminal: N,
    ) {
        self.commit_chunk_holding(tree, tables, terminal, None);
    }

    /// [`Self::commit_chunk`] by a request that also still holds a device lock on
    /// `also_held` (the node it published before, released once this publication's
    /// reply is in): #460's detach counts that lock as the request's own, and keeps
    /// the required state windows from there up.
    pub fn commit_chunk_holding<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &mut T,
        tables: &mut RequestTables,
        terminal: N,
        also_held: Option<N>,
    ) {
        let a = self.adjunct.alignment();
        let Some(&canonical) = self.adjunct.required().first() else {
            return;
        };
        let depth = tree.depth(terminal);
        let mut committed = tables.tables[canonical].committed();
        while committed + a <= depth {
            let target = committed + a;
            if self.spanned_by_snapshot(tree, terminal, target) {
                break;
            }
            let Some(node) = tree.split_at(terminal, target) else {
                break;
            };
            if !self.preflight(tables, target) {
                self.stats.commit_preflight_fail += 1;
                break;
            }
            let done = if self.snapshots.contains_key(&node) {
                self.adopt(tables, node, target)
            } else {
                self.build(tables, node, target)
            };
            if done.is_err() {
                break;
            }
            committed = target;
        }
        if self.terminal_continuation(tables, terminal, depth) && self.detach_stale_state {
            self.detach_superseded_state(tree, tables, terminal, depth, also_held);
        }
    }

    /// Whether the node that spans `target` on the path to `terminal` holds a snapshot
    /// and ends elsewhere (splitting it would cut the snapshot).
    fn spanned_by_snapshot<T: SnapshotTree<Node = N>>(
        &self,
        tree: &T,
        terminal: N,
        target: u32,
    ) -> bool {
        let mut cur = terminal;
        while let Some(parent) = tree.parent(cur) {
            if tree.depth(parent) < target {
                return tree.depth(cur) != target && self.snapshots.contains_key(&cur);
            }
            cur = parent;
        }
        false
    }

    fn preflight(&self, tables: &RequestTables, target: u32) -> bool {
        self.adjunct.required().iter().all(|&i| {
            tables.tables[i]
                .can_commit(&self.adjunct.groups()[i], target)
                .is_ok()
        })
    }

    /// Adopts the snapshot another request built at `node`: its history and state
    /// segments replace the request's duplicates. A required state group the snapshot
    /// lost since (#460's detach, a state-only prune) is checkpointed from the
    /// request's own table into it, so the snapshot is whole again and the request's
    /// commits go on.
    fn adopt(
        &mut self,
        tables: &mut RequestTables,
        node: N,
        target: u32,
    ) -> Result<(), PagedError> {
        let required = self.adjunct.required().to_vec();
        let mut missing = Vec::new();
        for i in required {
            let g = &self.adjunct.groups()[i];
            let t = &mut tables.tables[i];
            match (&self.snapshots[&node].segments[i], g.role) {
                (Some(seg), GroupRole::History) => {
                    let pages = seg.pages.clone();
                    t.adopt_history(g, &mut self.pools[i], &pages, target)?;
                }
                (Some(seg), GroupRole::State) => {
                    let (pages, base) = (seg.pages.clone(), seg.base);
                    t.adopt_state(g, &mut self.pools[i], &pages, base, target)?;
                }
                (None, GroupRole::State) => missing.push(i),
                (None, GroupRole::History) => {
                    return Err(PagedError::Invariant(
                        "a snapshot lacks a required history group".into(),
                    ));
                }
            }
        }
        for i in missing {
            let g = &self.adjunct.groups()[i];
            let checkpoint = tables.tables[i].checkpoint_state(g, &mut self.pools[i], target)?;
            if let Some((segment, stale)) = checkpoint {
                self.stats.checkpoint_stale_owned += u64::from(stale);
                if let Some(snapshot) = self.snapshots.get_mut(&node) {
                    self.changes += 1;
                    snapshot.segments[i] = Some(segment);
                }
            }
        }
        self.stats.snapshots_adopted += 1;
        Ok(())
    }

    fn build(
        &mut self,
        tables: &mut RequestTables,
        node: N,
        target: u32,
    ) -> Result<(), PagedError> {
        let mut snapshot = Snapshot::new(target, self.adjunct.groups().len());
        for &i in self.adjunct.required() {
            let g = &self.adjunct.groups()[i];
            let t = &mut tables.tables[i];
            let segment = match g.role {
                GroupRole::History => t.commit_history(g, &mut self.pools[i], target)?,
                GroupRole::State => {
                    t.checkpoint_state(g, &mut self.pools[i], target)?
                        .map(|(s, stale)| {
                            self.stats.checkpoint_stale_owned += u64::from(stale);
                            s
                        })
                }
            };
            snapshot.segments[i] = segment;
        }
        debug_assert!(
            self.adjunct.completeness(&snapshot).history,
            "a built snapshot holds every required group"
        );
        self.changes += 1;
        self.snapshots.insert(node, snapshot);
        self.stats.snapshots_created += 1;
        Ok(())
    }

    /// Checkpoints the continuation groups a History-complete snapshot at exactly the
    /// terminal's depth lacks; true when the snapshot is then continuation-complete.
    fn terminal_continuation(
        &mut self,
        tables: &mut RequestTables,
        terminal: N,
        depth: u32,
    ) -> bool {
        let continuation = self.adjunct.continuation().to_vec();
        if continuation.is_empty() || depth == 0 {
            return false;
        }
        let Some(snapshot) = self.snapshots.get(&terminal) else {
            return false;
        };
        if snapshot.prefix_len != depth || !self.adjunct.completeness(snapshot).history {
            return false;
        }
        let missing: Vec<usize> = continuation
            .into_iter()
            .filter(|&i| snapshot.segments[i].is_none())
            .collect();
        if missing.is_empty() {
            return true;
        }
        let covers = |i: usize| {
            let g = &self.adjunct.groups()[i];
            let t = &tables.tables[i];
            let tpp = g.tokens_per_page();
            let Some(w) = g.window() else { return false };
            depth.is_multiple_of(tpp)
                && depth <= t.cursor()
                && w.is_multiple_of(tpp)
                && t.base() <= depth.saturating_sub(w) / tpp
                && t.pages_have() >= depth / tpp
        };
        if !missing.iter().all(|&i| covers(i)) {
            return false;
        }
        let mut all = true;
        for i in missing {
            let g = &self.adjunct.groups()[i];
            match tables.tables[i].checkpoint_state(g, &mut self.pools[i], depth) {
                Ok(Some((segment, stale))) if !segment.pages.is_empty() => {
                    self.stats.checkpoint_stale_owned += u64::from(stale);
                    if let Some(s) = self.snapshots.get_mut(&terminal) {
                        self.changes += 1;
                        s.segments[i] = Some(segment);
                    }
                }
                Ok(Some((segment, _))) => {
                    // An empty checkpoint: nothing to keep, the window is incomplete.
                    self.pools[i].free_ids(&segment.pages);
                    all = false;
                    break;
                }
                _ => {
                    all = false;
                    break;
                }
            }
        }
        let complete = self
            .snapshots
            .get(&terminal)
            .is_some_and(|s| self.adjunct.completeness(s).continuation);
        if all && complete {
            self.stats.terminal_continuations += 1;
        }
        all && complete
    }

    /// #460: after a terminal commit, ancestors whose state windows lie wholly below
    /// the new terminal's window, and that only this request pins, drop their state
    /// (otherwise each turn leaks one window from the small state pools).
    ///
    /// A continuation-only group's window is of use at a terminal only, so every such
    /// ancestor drops it. A required state group's window is what makes its depth
    /// reusable (kvtier requires them, PR381): a request that still holds its previous
    /// lock (`also_held`, the node it published before) drops those only from the
    /// snapshots it made since, below that node, which nobody else has reached; the
    /// ones at or above it may be where others branch off (a shared document's end) and
    /// keep their windows until a prune needs them.
    fn detach_superseded_state<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        committing: &RequestTables,
        terminal: N,
        depth: u32,
        also_held: Option<N>,
    ) {
        // The wheel spares windows that request tables borrow.
        let borrowed_state = if self.wheel_detach {
            self.borrowed_state(tree, committing)
        } else {
            BTreeSet::new()
        };
        let max_window = self.adjunct.max_continuation_window();
        let all: Vec<usize> = self.adjunct.continuation().to_vec();
        let only: Vec<usize> = self.adjunct.continuation_only().collect();
        let mut above_previous = false;
        let mut cur = tree.parent(terminal);
        while let Some(node) = cur {
            if node == tree.root() {
                break;
            }
            above_previous |= Some(node) == also_held;
            // The request's own locks on the node: the new one, and the previous one
            // once the walk reached it.
            let own = 1 + u32::from(above_previous);
            let groups = if above_previous && !self.wheel_detach {
                &only
            } else {
                &all
            };
            if !groups.is_empty()
                && self.snapshots.contains_key(&node)
                && !(self.wheel_detach && self.state_borrowed(node, &borrowed_state))
                && tree.depth(node) + max_window <= depth
                && tree.device_refs(node) == own
                && self.detach_groups(node, groups)
            {
                self.stats.stale_state_detached += 1;
            }
            cur = tree.parent(node);
        }
    }

    /// Whether a request table borrows a page of a state segment of `node`'s snapshot.
    fn state_borrowed(&self, node: N, borrowed_state: &BTreeSet<(usize, PageId)>) -> bool {
        self.snapshots.get(&node).is_some_and(|s| {
            self.adjunct.continuation().iter().any(|&i| {
                s.segments[i]
                    .as_ref()
                    .is_some_and(|seg| seg.pages.iter().any(|&p| borrowed_state.contains(&(i, p))))
            })
        })
    }

    /// Strips every state group from the snapshot on `node` (a snapshot left with
    /// nothing goes); whether it held any.
    fn detach_state(&mut self, node: N) -> bool {
        let groups = self.adjunct.continuation().to_vec();
        self.detach_groups(node, &groups)
    }

    /// Strips `groups` from the snapshot on `node` (a snapshot left with nothing
    /// goes); whether it held any of them.
    fn detach_groups(&mut self, node: N, groups: &[usize]) -> bool {
        let Some(snapshot) = self.snapshots.get_mut(&node) else {
            return false;
        };
        self.changes += 1;
        let mut stripped = false;
        for &i in groups {
            if let Some(seg) = snapshot.segments[i].take() {
                self.pools[i].free_ids(&seg.pages);
                stripped = true;
            }
        }
        if snapshot.segments.iter().all(Option::is_none) {
            self.snapshots.remove(&node);
        }
        stripped
    }

    /// Drops the whole snapshot on `node`, freeing its pages; whether there was one.
    fn detach(&mut self, node: N) -> bool {
        let Some(snapshot) = self.snapshots.remove(&node) else {
            return false;
        };
        self.changes += 1;
        for (i, seg) in snapshot.segments.into_iter().enumerate() {
            if let Some(seg) = seg {
                self.pools[i].free_ids(&seg.pages);
            }
        }
        true
    }

    /// The node's device KV was evicted: its snapshot goes with it.
    pub fn on_kv_evicted(&mut self, node: N) {
        if self.detach(node) {
            self.stats.dropped_kv_evict += 1;
        }
    }

    /// The node was removed from the tree.
    pub fn on_node_removed(&mut self, node: N) {
        if self.detach(node) {
            self.stats.dropped_node_destroy += 1;
        }
    }

    /// Whether a running request may read the snapshot on `node`: a device lock on it
    /// (or, as the reference tests, on any ancestor).
    fn pinned<T: SnapshotTree<Node = N>>(&self, tree: &T, node: N) -> bool {
        if !self.pin_by_path {
            return tree.device_refs(node) > 0;
        }
        let mut cur = Some(node);
        while let Some(n) = cur {
            if n == tree.root() {
                return false;
            }
            if tree.device_refs(n) > 0 {
                return true;
            }
            cur = tree.parent(n);
        }
        false
    }

    /// Frees snapshot pages for an admission: oldest snapshot first (deeper first on a
    /// tie), never one a running request pins. State-starved: strip the state groups
    /// of one snapshot that has any. History-starved: drop one snapshot whole, with
    /// every unpinned snapshot below it.
    pub fn prune<T: SnapshotTree<Node = N>>(&mut self, tree: &T, kind: Starved) -> bool {
        self.prune_sparing(tree, kind, None)
    }

    /// [`Self::prune`], never touching the path to `spare`.
    fn prune_sparing<T: SnapshotTree<Node = N>>(
        &mut self,
        tree: &T,
        kind: Starved,
        spare: Option<N>,
    ) -> bool {
        // The hit's path is spared; but a state prune may strip an ancestor whose
        // depth lies a whole window below the hit's: the hit reads no state page of it.
        let window = self.adjunct.max_continuation_window();
        let spared = |n: N| {
            spare.is_some_and(|s| {
                let on_path = s == n || Self::descends_from(tree, s, n);
                let below_window = tree.depth(n) + window <= tree.depth(s);
                on_path && (kind == Starved::History || !below_window)
            })
        };
        let mut candidates: Vec<(PruneOrder, N)> = self
            .snapshots
            .keys()
            .map(|&n| {
                let (time, seq) = tree.age(n);
                ((time, std::cmp::Reverse(tree.depth(n)), seq), n)
            })
            .collect();
        candidates.sort();
        let unpinned = candidates
            .iter()
            .map(|&(_, n)| n)
            .filter(|&n| !self.pinned(tree, n) && !spared(n));
        match kind {
            Starved::State => {
                let victim = unpinned.into_iter().find(|n| {
                    let c = self.adjunct.completeness(&self.snapshots[n]);
                    c.state || c.continuation
                });
                let Some(victim) = victim else {
                    return false;
                };
                self.detach_state(victim);
                self.stats.prune_state_only += 1;
                true
            }
            Starved::History => {
                let Some(victim) = unpinned.into_iter().next() else {
                    return false;
                };
                self.detach(victim);
                self.stats.prune_full += 1;
                let below: Vec<N> = self
                    .snapshots
                    .keys()
                    .copied()
                    .filter(|&n| {
                        Self::descends_from(tree, n, victim) && !self.pinned(tree, n) && !spared(n)
                    })
                    .collect();
                for n in below {
                    self.detach(n);
                    self.stats.prune_cascade += 1;
                }
                true
            }
        }
    }

    fn descends_from<T: SnapshotTree<Node = N>>(tree: &T, node: N, ancestor: N) -> bool {
        let mut cur = tree.parent(node);
        while let Some(n) = cur {
            if n == ancestor {
                return true;
            }
            cur = tree.parent(n);
        }
        false
    }

    /// Checks that every page of every group is in exactly one place: free in its
    /// pool, owned by one of `tables`, or held by one snapshot (borrowed ids must name
    /// snapshot pages).
    pub fn check_invariants<'a>(
        &mut self,
        tables: impl IntoIterator<Item = &'a RequestTables>,
    ) -> Result<(), PagedError> {
        let tables: Vec<&RequestTables> = tables.into_iter().collect();
        for i in 0..self.pools.len() {
            let g = &self.adjunct.groups()[i];
            let total = g.total_pages as usize;
            let mut place = vec![0u8; total];
            let mut held_by_snapshot = vec![false; total];
            let mut mark = |page: u32, what: &str| -> Result<(), PagedError> {
                let p = page as usize;
                if p == 0 || p >= total {
                    return Err(PagedError::Invariant(format!(
                        "group `{}`: page {page} out of range ({what})",
                        g.id
                    )));
                }
                place[p] += 1;
                if place[p] > 1 {
                    return Err(PagedError::Invariant(format!(
                        "group `{}`: page {page} is in two places ({what})",
                        g.id
                    )));
                }
                Ok(())
            };
            for &p in self.pools[i].free_list() {
                mark(p, "free")?;
            }
            for s in self.snapshots.values() {
                if let Some(seg) = &s.segments[i] {
                    for &p in &seg.pages {
                        mark(p, "snapshot")?;
                        held_by_snapshot[p as usize] = true;
                    }
                }
            }
            for t in &tables {
                let table = &t.tables[i];
                for &p in table.owned() {
                    mark(p, "owned")?;
                }
                if let Some(&p) = table
                    .borrowed()
                    .iter()
                    .find(|&&p| !held_by_snapshot.get(p as usize).copied().unwrap_or(false))
                {
                    return Err(PagedError::Invariant(format!(
                        "group `{}`: a table borrows page {p}, which no snapshot holds",
                        g.id
                    )));
                }
            }
            if let Some(p) = (1..total).find(|&p| place[p] == 0) {
                return Err(PagedError::Invariant(format!(
                    "group `{}`: page {p} leaked",
                    g.id
                )));
            }
        }
        Ok(())
    }
}
