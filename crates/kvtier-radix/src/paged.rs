//! Admission and commits for window and compressed-state models: the KV tree and the
//! paged-cache groups decided together (spec/hybrid-l3.md §2.4–§2.7).
//!
//! A request's group tables live in the cache, beside the pools they draw from
//! (`cache/tables.rs`); the request holds a `GroupTables` lease that returns them when
//! dropped. Every op follows the
//! reference's order: the request's computed prefix is committed into snapshots when it
//! is published (before this step's admissions run), then each admitted op releases what
//! its first token no longer attends and tops its tables up to its target. A first chunk
//! reuses KV only as deep as a snapshot makes its groups complete (§2.5).

use kvtier_paged::{PagedFamily, PagedHit, PendingCommit, RequestTables};
use kvtier_types::GroupTable;

use crate::batch::{
    ChunkFamily, ChunkShape, Denial, FamilyGrant, FirstChunkAsk, Halt, Outcome, Pinned, Publication,
};
use crate::{Match, NodeId, NodeLock, RadixCore, TablesKey};

impl RadixCore {
    /// A paged model's first chunk (the skeleton's steps in [`Paged`]).
    pub(crate) fn first_chunk_paged(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        self.first_chunk_with(ask, Paged::default())
    }

    /// Whether every group slides (a window model): its entries at a depth are the last
    /// windows before it, which a first chunk can compute from the tokens.
    fn windows_only(&self) -> bool {
        self.snapshots().is_some_and(|f| f.adjunct().slides_only())
    }

    /// What a refilling first chunk over `device` pages (`host` loaded back) computes:
    /// `[first, target)`, from the widest window before the prefix's end to the chunk's
    /// end, and where each group's refill starts.
    fn refill_span(&self, ask: &FirstChunkAsk<'_>, device: u32, host: u32) -> (u32, u32, Vec<u32>) {
        let ps = self.page_size();
        let shape = ask.shape(device, host, ps);
        let depth = shape.begin_pages * ps;
        let windows: Vec<u32> = self.snapshots().map_or_else(Vec::new, |f| {
            let groups = f.adjunct().groups();
            groups.iter().map(|g| g.window().unwrap_or(0)).collect()
        });
        let widest = windows.iter().copied().max().unwrap_or(0);
        let fill = windows.iter().map(|&w| depth.saturating_sub(w)).collect();
        (depth.saturating_sub(widest), depth + shape.tokens, fill)
    }

    /// Fresh tables for a first chunk over `[first, target)`, admitted (pruning if a
    /// pool is short; never the path to the hit's node) and acquired, the hit imported;
    /// `None`, nothing acquired, when a pool cannot take it.
    pub(crate) fn fresh_tables(
        &mut self,
        first: u32,
        target: u32,
        hit: Option<(&PagedHit, NodeId)>,
    ) -> Option<RequestTables> {
        self.with_group_budget(|family, tree, free| {
            let mut tables = family.new_tables();
            if !family.admit(tree, &tables, first, target, hit, free) {
                return None;
            }
            let acquired = family.acquire(&mut tables, first, target, hit.map(|(h, _)| h));
            debug_assert!(acquired.is_ok(), "admitted, yet {acquired:?}");
            acquired.is_ok().then_some(tables)
        })
        .flatten()
    }

    /// A first chunk that cannot go on with the tables it took: they go back in the
    /// pools' own order.
    fn undo_tables(&mut self, mut tables: RequestTables) {
        self.with_snapshots(|family, _| family.undo_acquisition(&mut tables));
    }

    /// Whether a first chunk refused at `denial` would be refused again now with
    /// `budget` tokens left in the step.
    pub(crate) fn still_denied(&mut self, denial: Denial, budget: u32) -> bool {
        budget >= denial.budget && self.group_version() == denial.version
    }

    /// What a refused first chunk depended on: the family's version, and the locks
    /// that pinned snapshots it could not prune.
    fn group_version(&self) -> u64 {
        self.snapshots().map_or(0, PagedFamily::version) + self.device_unpinned()
    }

    /// Admits a running request's op over `[first, target)` in every group (pruning
    /// unpinned snapshots if a pool is short): `false` when a pool cannot take it.
    /// Nothing is acquired yet: the op's commit comes first ([`Self::acquire_groups`]).
    /// `commit`: the publication due before the acquisition, if any (its terminal
    /// checkpoint keeps state windows the slide would have freed).
    pub(crate) fn admit_groups(
        &mut self,
        key: TablesKey,
        first: u32,
        target: u32,
        commit: Option<&Publication>,
    ) -> bool {
        let pending = commit.and_then(|p| self.pending_commit(p));
        let Some(tables) = self.take_tables(key) else {
            debug_assert!(false, "no tables under {key:?}");
            return false;
        };
        let admitted = self
            .with_group_budget(|family, tree, free| {
                family.admit_before_commit(tree, &tables, (first, target), pending, free)
            })
            .unwrap_or(false);
        self.put_tables(key, tables);
        admitted
    }

    /// Where a publication that commits group tables will end: its depth, and the node
    /// there if the tree has it already (read-only).
    fn pending_commit(&self, p: &Publication) -> Option<PendingCommit<NodeId>> {
        if p.pages.is_empty() || p.tables.is_none() {
            return None;
        }
        let ps = self.page_size() as usize;
        let total = p.tokens.len() / ps;
        let (_, node) = self.probe_resumed(&p.tokens[..total * ps], p.at);
        Some(PendingCommit {
            depth: (total * ps) as u32,
            terminal: (self.depth_pages(node) as usize == total).then_some(node),
        })
    }

    /// Gives an admitted op's tables their pages: the sliding release from its first
    /// position, then the top-up to its target.
    pub(crate) fn acquire_groups(&mut self, key: TablesKey, first: u32, target: u32) {
        let Some(mut tables) = self.take_tables(key) else {
            debug_assert!(false, "no tables under {key:?}");
            return;
        };
        let acquired = self.with_snapshots(|family, tree| {
            family.acquire_admitted(tree, &mut tables, first, target)
        });
        debug_assert!(
            matches!(acquired, Some(Ok(()))),
            "admitted, yet {acquired:?}"
        );
        self.put_tables(key, tables);
    }

    /// The request's tables as a row reads them, in group order.
    pub(crate) fn group_view(&self, key: TablesKey) -> Vec<GroupTable> {
        self.tables_of(key).map_or_else(Vec::new, |tables| {
            tables
                .iter()
                .map(|t| GroupTable {
                    base: t.base(),
                    pages: t.ids(),
                    fill_from: None,
                })
                .collect()
        })
    }

    /// Commits what the request computed, up to `terminal` (its published node), into
    /// snapshots (§2.4); `also_held`: the request's previous device lock, still held.
    pub(crate) fn commit_tables(
        &mut self,
        key: TablesKey,
        terminal: NodeId,
        also_held: Option<NodeId>,
    ) {
        let Some(mut tables) = self.take_tables(key) else {
            debug_assert!(false, "no tables under {key:?}");
            return;
        };
        self.with_snapshots(|family, tree| {
            family.commit_chunk_holding(tree, &mut tables, terminal, also_held)
        });
        self.put_tables(key, tables);
    }

    /// Gives back the owned tail pages of a request's tables past `tokens` tokens.
    pub(crate) fn rewind_tables(&mut self, key: TablesKey, tokens: u32) {
        let Some(mut tables) = self.take_tables(key) else {
            debug_assert!(false, "no tables under {key:?}");
            return;
        };
        self.with_snapshots(|family, _| family.rewind(&mut tables, tokens));
        self.put_tables(key, tables);
    }
}

/// A paged model's first chunk: the KV match capped at the deepest snapshot whose groups
/// are complete; the groups' admission (pruning unpinned snapshots if a pool is short)
/// and their pages; room for the chunk's KV. A window model whose KV match runs deeper
/// than any snapshot (on device, or back from host or L3) computes its windows again
/// instead, over the whole match.
#[derive(Debug, Default)]
struct Paged {
    /// A refilling chunk: where each group's entries are computed again from.
    fill: Option<Vec<u32>>,
}

/// Where a paged first chunk starts its groups.
enum PagedCap {
    /// At the snapshot on `node`, which it imports.
    Hit { hit: PagedHit, node: NodeId },
    /// Before the KV match's end, over `[first, target)`: its windows computed again.
    Refill { first: u32, target: u32 },
}

impl PagedCap {
    /// The positions `[first, target)` its tables cover, and the hit they import.
    fn span(&self, shape: &ChunkShape, ps: u32) -> (u32, u32, Option<(&PagedHit, NodeId)>) {
        match self {
            PagedCap::Hit { hit, node } => {
                let first = shape.begin_pages * ps;
                (first, first + shape.tokens, Some((hit, *node)))
            }
            PagedCap::Refill { first, target } => (*first, *target, None),
        }
    }
}

impl ChunkFamily for Paged {
    type Cap = PagedCap;
    type Held = RequestTables;

    fn cap(
        &mut self,
        core: &mut RadixCore,
        kv: Match,
        ask: FirstChunkAsk<'_>,
    ) -> Result<(Match, PagedCap), Outcome> {
        let Some((hit, node)) =
            core.with_snapshots(|family, tree| family.cap_match(tree, kv.device))
        else {
            return Err(Outcome::waits());
        };
        let pages = core.depth_pages(node);
        debug_assert_eq!(
            hit.prefix_len,
            pages * core.page_size(),
            "a hit ends on its snapshot"
        );
        let host_pages = if ask.use_host { kv.host_pages } else { 0 };
        // Refill the windows over the whole KV match, unless some group could never
        // hold that span (the widest window and the chunk at once): then the chunk
        // starts at the snapshot, which a group holds by the submission check.
        if core.windows_only() && kv.device_pages.max(host_pages) > pages {
            let (first, target, fill) = core.refill_span(&ask, kv.device_pages, host_pages);
            let fits = core
                .with_snapshots(|family, _| family.could_ever_admit(first, target))
                .unwrap_or(true);
            if fits {
                self.fill = Some(fill);
                return Ok((kv, PagedCap::Refill { first, target }));
            }
        }
        let m = Match {
            device: node,
            device_pages: pages,
            host: node,
            host_pages: 0,
        };
        Ok((m, PagedCap::Hit { hit, node }))
    }

    /// kvtier's: the groups first, before the KV room locks the hit. A prune may take
    /// any snapshot but those of the hit's path, and the request's own lock must not pin
    /// the snapshots below its hit that it needs to prune. A refused hit is a denial,
    /// which the request's next intents skip while it stands.
    fn reserve_before_room(
        &mut self,
        core: &mut RadixCore,
        cap: &PagedCap,
        shape: &ChunkShape,
        ask: FirstChunkAsk<'_>,
    ) -> Result<Option<RequestTables>, Outcome> {
        if core.policy().admits_groups_after_the_room() {
            return Ok(None);
        }
        let (first, target, hit) = cap.span(shape, core.page_size());
        match core.fresh_tables(first, target, hit) {
            Some(tables) => Ok(Some(tables)),
            None if hit.is_some() => Err(Outcome::Denied(Denial {
                version: core.group_version(),
                budget: ask.remaining,
            })),
            None => Err(Outcome::waits()),
        }
    }

    /// The reference's order: room for the KV (its eviction frees the evicted nodes'
    /// snapshot pages, and stays even when the groups then refuse), then the tables.
    fn reserve(
        &mut self,
        core: &mut RadixCore,
        _: &Match,
        cap: PagedCap,
        shape: &ChunkShape,
        early: Option<RequestTables>,
        guard: NodeLock,
    ) -> Result<(NodeLock, RequestTables), Halt> {
        if let Some(tables) = early {
            return Ok((guard, tables));
        }
        let (first, target, hit) = cap.span(shape, core.page_size());
        match core.fresh_tables(first, target, hit) {
            Some(tables) => Ok((guard, tables)),
            None => {
                core.unlock(guard);
                Err(Halt::Stop(Outcome::waits()))
            }
        }
    }

    fn unreserve(&mut self, core: &mut RadixCore, tables: RequestTables) {
        core.undo_tables(tables);
    }

    /// The lease, and the row's view of its tables (where each group is computed again
    /// from, for a refill).
    fn grant(
        self,
        core: &mut RadixCore,
        pinned: Pinned,
        shape: &ChunkShape,
        tables: RequestTables,
    ) -> Outcome {
        let lease = core.lease_tables(tables);
        let mut groups = core.group_view(lease.key());
        for (table, from) in groups.iter_mut().zip(self.fill.into_iter().flatten()) {
            table.fill_from = Some(from);
        }
        let mut outcome = core.admitted(pinned, shape, FamilyGrant::Tables(lease));
        if let Outcome::Admitted(a) = &mut outcome {
            a.groups = groups;
        }
        outcome
    }
}
