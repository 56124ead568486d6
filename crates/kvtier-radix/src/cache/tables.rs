//! The store of running requests' group tables (paged models): each request holds a
//! [`GroupTables`] lease naming its tables by key; the tables stay here, beside the
//! group pools they draw from, and go back to them when the lease is dropped.

use kvtier_host::{Lease, ReleaseQueue};
use kvtier_paged::{PagedFamily, RequestTables};

use super::RadixCore;
use crate::NodeId;

/// Names a request's group tables inside the cache (plain data: it travels in intents
/// and publications; the [`GroupTables`] lease owns them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TablesKey(pub(crate) u32);

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

/// Paged models: running requests' group tables by key (a free key is reused last freed
/// first), the return path of their leases, and the budget an admission program's
/// groups are counted against.
#[derive(Debug, Default)]
pub(super) struct TableStore {
    tables: Vec<Option<RequestTables>>,
    free: Vec<TablesKey>,
    releases: ReleaseQueue<TablesKey>,
    /// Under the reference policies, the group free counts an admission program's
    /// admissions are counted against: read when it began, debited by each admission,
    /// read again only after a prune (the reference's `InitialSimulatedFree`). kvtier's
    /// own policy reads the live pools, which the program's KV evictions may have
    /// refilled.
    budget: Option<Vec<u32>>,
}

impl TableStore {
    /// Every running request's tables.
    pub(super) fn all(&self) -> impl Iterator<Item = &RequestTables> {
        self.tables.iter().flatten()
    }
}

impl RadixCore {
    fn store_tables(&mut self, tables: RequestTables) -> TablesKey {
        let store = &mut self.tables;
        match store.free.pop() {
            Some(key) => {
                store.tables[key.0 as usize] = Some(tables);
                key
            }
            None => {
                store.tables.push(Some(tables));
                TablesKey(store.tables.len() as u32 - 1)
            }
        }
    }

    pub(crate) fn tables_of(&self, key: TablesKey) -> Option<&RequestTables> {
        self.tables.tables.get(key.0 as usize)?.as_ref()
    }

    /// Starts an admission program's group budget (the reference policies only).
    pub(crate) fn begin_group_budget(&mut self) {
        self.tables.budget = None;
        if self.policy.counts_groups_against_the_program() && self.has_snapshots() {
            self.drain_releases();
            self.tables.budget = self.snapshots_mut().map(PagedFamily::available);
        }
    }

    /// Runs an admission with the family against the group free counts it is counted
    /// against, which it debits: the admission program's budget under the reference
    /// policies, the live pools under kvtier's own. `None` without a paged family.
    pub(crate) fn with_group_budget<R>(
        &mut self,
        admit: impl FnOnce(&mut PagedFamily<NodeId>, &mut RadixCore, &mut [u32]) -> R,
    ) -> Option<R> {
        let mut budget = self.tables.budget.take();
        let admitted = self.with_snapshots(|family, tree| match budget.as_mut() {
            Some(free) => admit(family, tree, free),
            None => {
                let mut live = family.available();
                admit(family, tree, &mut live)
            }
        });
        self.tables.budget = budget;
        admitted
    }

    /// Takes the tables out to work on them with the family ([`Self::put_tables`]
    /// puts them back under the same key).
    pub(crate) fn take_tables(&mut self, key: TablesKey) -> Option<RequestTables> {
        self.tables.tables.get_mut(key.0 as usize)?.take()
    }

    pub(crate) fn put_tables(&mut self, key: TablesKey, tables: RequestTables) {
        self.tables.tables[key.0 as usize] = Some(tables);
    }

    pub(crate) fn device_unpinned(&self) -> u64 {
        self.device_unpinned
    }

    /// Gives dropped leases' tables back to the group pools.
    pub(super) fn drain_table_releases(&mut self) {
        let mut keys = Vec::new();
        self.tables.releases.drain(|key| keys.push(key));
        for key in keys {
            self.release_tables(key);
        }
    }

    /// Frees a lease's tables now (a released lease's come back through the drain).
    fn release_tables(&mut self, key: TablesKey) {
        if let Some(mut tables) = self.take_tables(key) {
            self.with_snapshots(|family, _| family.release(&mut tables));
            self.tables.free.push(key);
        }
    }

    /// Leases fresh tables to the request they were admitted for.
    pub(crate) fn lease_tables(&mut self, tables: RequestTables) -> GroupTables {
        let key = self.store_tables(tables);
        GroupTables(Lease::new(key, self.tables.releases.releaser()))
    }
}
