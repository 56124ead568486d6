//! Admission and commits for window and compressed-state models: the KV tree and the
//! paged-cache groups decided together (spec/hybrid-l3.md §2.4–§2.7).
//!
//! A request's group tables live here, beside the pools they draw from; the request
//! holds a [`GroupTables`] lease that returns them when dropped. Every op follows the
//! reference's order: the request's computed prefix is committed into snapshots when it
//! is published (before this step's admissions run), then each admitted op releases what
//! its first token no longer attends and tops its tables up to its target. A first chunk
//! reuses KV only as deep as a snapshot makes its groups complete (§2.5).

use kvtier_host::Lease;
use kvtier_paged::{PagedFamily, PagedHit, PendingCommit, RequestTables};
use kvtier_types::GroupTable;

use crate::batch::{ChunkShape, FamilyGrant, FirstChunkAsk, Outcome, Publication};
use crate::{Match, NodeId, NodeLock, RadixCore};

/// Names a request's group tables inside the cache (plain data: it travels in intents
/// and publications; the [`GroupTables`] lease owns them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TablesKey(pub(crate) u32);

/// A first chunk the groups refused (default policy): the family's version and the
/// step's budget then. While the version stands and the budget is no smaller, the same
/// request is refused again, so its next intents skip the match and the admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    version: u64,
    budget: u32,
}

/// A running request's group tables. Move-only; dropping it sends the tables back to the
/// cache, which returns their own pages to the group pools before its next operation.
#[derive(Debug)]
#[must_use = "dropping the lease releases the request's group pages"]
pub struct GroupTables(Lease<TablesKey>);

impl GroupTables {
    /// The key that names the tables in intents and publications.
    pub fn key(&self) -> TablesKey {
        self.0.get()
    }
}

impl RadixCore {
    /// A paged model's first chunk: the KV match capped at the deepest snapshot whose
    /// groups are complete; the groups' admission (pruning unpinned snapshots if a pool
    /// is short) and their pages; then room for the chunk's KV. A window model whose KV
    /// match runs deeper than any snapshot (on device, or back from host or L3) computes
    /// its windows again instead ([`Self::first_chunk_refilling`]).
    pub(crate) fn first_chunk_paged(&mut self, ask: FirstChunkAsk<'_>) -> Outcome {
        let FirstChunkAsk {
            tokens,
            use_host,
            reuse,
            ..
        } = ask;
        let ps = self.page_size();
        let kv = self.committed_match(tokens, reuse);
        let Some((hit, node)) =
            self.with_snapshots(|family, tree| family.cap_match(tree, kv.device))
        else {
            return Outcome::waits();
        };
        let pages = self.depth_pages(node);
        debug_assert_eq!(hit.prefix_len, pages * ps, "a hit ends on its snapshot");
        let host_pages = if use_host { kv.host_pages } else { 0 };
        // Refill the windows over the whole KV match, unless some group could never
        // hold that span (the widest window and the chunk at once): then the chunk
        // starts at the snapshot, which a group holds by the submission check.
        if self.windows_only() && kv.device_pages.max(host_pages) > pages {
            let (first, target, _) = self.refill_span(&ask, kv.device_pages, host_pages);
            let fits = self
                .with_snapshots(|family, _| family.could_ever_admit(first, target))
                .unwrap_or(true);
            if fits {
                return self.first_chunk_refilling(ask, kv, host_pages);
            }
        }
        let m = Match {
            device: node,
            device_pages: pages,
            host: node,
            host_pages: 0,
        };
        let shape = ask.shape(pages, 0, ps);
        let (first, target) = (pages * ps, pages * ps + shape.tokens);
        if self.policy().admits_groups_after_the_room() {
            return self.admit_after_room(
                m,
                &shape,
                false,
                (first, target, Some((&hit, node))),
                None,
            );
        }
        // kvtier's: the groups first, before the KV room locks the hit. A prune may
        // take any snapshot but those of the hit's path, and the request's own lock
        // must not pin the snapshots below its hit that it needs to prune.
        let Some(tables) = self.fresh_tables(first, target, Some((&hit, node))) else {
            let version = self.group_version();
            return Outcome::Denied(Denial {
                version,
                budget: ask.remaining,
            });
        };
        self.admit_with_tables(m, &shape, false, tables, None)
    }

    /// Whether every group slides (a window model): its entries at a depth are the last
    /// windows before it, which a first chunk can compute from the tokens.
    fn windows_only(&self) -> bool {
        self.snapshots().is_some_and(|f| f.adjunct().slides_only())
    }

    /// A window model's first chunk over the whole KV match `m` (a host part loaded
    /// back): fresh tables cover each group's window before the prefix's end, which the
    /// row computes again first (`GroupTable::fill_from`), then the chunk.
    fn first_chunk_refilling(
        &mut self,
        ask: FirstChunkAsk<'_>,
        m: Match,
        host_pages: u32,
    ) -> Outcome {
        let ps = self.page_size();
        let use_host = ask.use_host;
        let shape = ask.shape(m.device_pages, host_pages, ps);
        let (first, target, fill) = self.refill_span(&ask, m.device_pages, host_pages);
        if self.policy().admits_groups_after_the_room() {
            return self.admit_after_room(m, &shape, use_host, (first, target, None), Some(fill));
        }
        let Some(tables) = self.fresh_tables(first, target, None) else {
            return Outcome::waits();
        };
        self.admit_with_tables(m, &shape, use_host, tables, Some(fill))
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

    /// The end of a paged first chunk, its tables in hand: room for its KV with the
    /// path to `m` locked (keeping the snapshots the tables borrow from out of the
    /// eviction), the lease, and the row's view (`fill`: where each group's entries
    /// are computed again from).
    fn admit_with_tables(
        &mut self,
        m: Match,
        shape: &ChunkShape,
        use_host: bool,
        tables: RequestTables,
        fill: Option<Vec<u32>>,
    ) -> Outcome {
        let Some(guard) = self.make_room(m.device, shape.need) else {
            return self.undo_tables(tables);
        };
        self.admit_in_room(m, shape, use_host, tables, fill, guard)
    }

    /// A first chunk that cannot go on with the tables it took: they go back in the
    /// pools' own order, and the chunk waits.
    fn undo_tables(&mut self, mut tables: RequestTables) -> Outcome {
        self.with_snapshots(|family, _| family.undo_acquisition(&mut tables));
        Outcome::waits()
    }

    /// [`Self::admit_with_tables`] once the room is made (`guard` locks it).
    pub(crate) fn admit_in_room(
        &mut self,
        m: Match,
        shape: &ChunkShape,
        use_host: bool,
        tables: RequestTables,
        fill: Option<Vec<u32>>,
        guard: NodeLock,
    ) -> Outcome {
        let Some(pinned) = self.pin_path(m, guard, use_host) else {
            return self.undo_tables(tables);
        };
        let lease = self.lease_tables(tables);
        let mut groups = self.group_view(lease.key());
        for (table, from) in groups.iter_mut().zip(fill.into_iter().flatten()) {
            table.fill_from = Some(from);
        }
        let mut outcome = self.admitted(pinned, shape, FamilyGrant::Tables(lease));
        if let Outcome::Admitted(a) = &mut outcome {
            a.groups = groups;
        }
        outcome
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

    /// Frees a lease's tables now (a released lease's come back through the drain).
    pub(crate) fn release_tables(&mut self, key: TablesKey) {
        if let Some(tables) = self.take_tables(key) {
            self.return_tables(tables);
            self.free_table_key(key);
        }
    }

    /// Returns tables that were never leased.
    fn return_tables(&mut self, mut tables: RequestTables) {
        self.with_snapshots(|family, _| family.release(&mut tables));
    }

    fn lease_tables(&mut self, tables: RequestTables) -> GroupTables {
        let key = self.store_tables(tables);
        GroupTables(Lease::new(key, self.table_releaser()))
    }
}
