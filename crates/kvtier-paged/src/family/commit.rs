//! Commits: a chunk's tables become a snapshot on a node (adopted, built, or a terminal
//! continuation), and the snapshots a commit supersedes are detached.

use std::collections::BTreeSet;
use std::fmt::Debug;

use kvtier_types::PageId;

use super::*;
use crate::{GroupRole, PagedError, Snapshot};

impl<N: Copy + Ord + Debug> PagedFamily<N> {
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

    pub(super) fn preflight(&self, tables: &RequestTables, target: u32) -> bool {
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
    pub(super) fn adopt(
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
    pub(super) fn detach_state(&mut self, node: N) -> bool {
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
    pub(super) fn detach(&mut self, node: N) -> bool {
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
}
