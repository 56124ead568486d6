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

mod admission;
mod commit;
mod eviction;
mod matching;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;

use kvtier_types::{PageId, TreeView};

use crate::{Adjunct, GroupPool, PageTable, PagedError, Snapshot};

/// Prune order: oldest first, deeper first on a tie, then creation order.
type PruneOrder = (u64, std::cmp::Reverse<u32>, u64);

/// What the family reads of the tree that hosts it beyond what every family reads
/// ([`TreeView`]), and the one change it asks of it.
pub trait SnapshotTree: TreeView {
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
