//! The page allocator and the RAII page set.

use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_types::PageId;

use crate::{HostError, ReleaseQueue, Releaser};

/// Distinguishes pools so page sets from different pools are never mixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolId(u32);

static NEXT_POOL: AtomicU32 = AtomicU32::new(1);

/// A LIFO page allocator with page 0 reserved.
#[derive(Debug)]
pub struct PagePool {
    id: PoolId,
    total: u32,
    free: Vec<PageId>,
    returns: ReleaseQueue<Vec<PageId>>,
    /// Debug builds track which pages are free to catch double frees.
    #[cfg(debug_assertions)]
    is_free: Vec<bool>,
}

impl PagePool {
    /// A pool of `total` pages; ids `1..total` are usable (none when `total <= 1`).
    pub fn new(total: u32) -> Self {
        let free: Vec<PageId> = (1..total.max(1)).collect();
        Self {
            id: PoolId(NEXT_POOL.fetch_add(1, Ordering::Relaxed)),
            total,
            #[cfg(debug_assertions)]
            is_free: (0..total).map(|p| p != 0).collect(),
            free,
            returns: ReleaseQueue::new(),
        }
    }

    /// This pool's identity.
    pub fn id(&self) -> PoolId {
        self.id
    }

    /// Pool size including the reserved page 0.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Usable pages (`total - 1`).
    pub fn usable(&self) -> u32 {
        self.total.saturating_sub(1)
    }

    /// Free pages right now (after taking back dropped page sets).
    pub fn available(&mut self) -> u32 {
        self.drain_returns();
        self.free.len() as u32
    }

    /// Free pages without draining returns (a lower bound of [`Self::available`]).
    pub fn available_hint(&self) -> u32 {
        self.free.len() as u32
    }

    /// Takes back every page set dropped since the last call.
    pub fn drain_returns(&mut self) {
        let Self { returns, free, .. } = self;
        #[cfg(debug_assertions)]
        let is_free = &mut self.is_free;
        returns.drain(|pages| {
            #[cfg(debug_assertions)]
            for &p in &pages {
                debug_assert!(!is_free[p as usize], "page {p} freed twice");
                is_free[p as usize] = true;
            }
            free.extend_from_slice(&pages);
        });
    }

    /// Allocates exactly `n` pages, or none at all. `n == 0` gives an empty set.
    pub fn allocate(&mut self, n: usize) -> Option<OwnedPages> {
        self.allocate_ids(n).map(|ids| self.wrap(ids))
    }

    /// Allocates `n` raw page ids (for owners that keep ids themselves, like the tree).
    pub fn allocate_ids(&mut self, n: usize) -> Option<Vec<PageId>> {
        if n > self.free.len() {
            self.drain_returns();
            if n > self.free.len() {
                return None;
            }
        }
        let at = self.free.len() - n;
        let ids: Vec<PageId> = self.free.drain(at..).rev().collect();
        #[cfg(debug_assertions)]
        for &p in &ids {
            debug_assert!(self.is_free[p as usize], "page {p} handed out twice");
            self.is_free[p as usize] = false;
        }
        Some(ids)
    }

    /// Wraps raw ids of this pool into an owned set.
    pub fn wrap(&self, ids: Vec<PageId>) -> OwnedPages {
        OwnedPages {
            ids,
            home: Some(Home {
                pool: self.id,
                tx: self.returns.releaser(),
            }),
        }
    }

    /// Returns raw ids to the free stack, in order.
    pub fn free_ids(&mut self, ids: &[PageId]) {
        #[cfg(debug_assertions)]
        for &p in ids {
            debug_assert!(p != 0 && p < self.total, "page {p} out of range");
            debug_assert!(!self.is_free[p as usize], "page {p} freed twice");
            self.is_free[p as usize] = true;
        }
        self.free.extend_from_slice(ids);
    }

    /// Returns an owned set to the pool now (without the channel round trip).
    pub fn free(&mut self, mut pages: OwnedPages) -> Result<(), HostError> {
        self.check_home(&pages)?;
        let ids = std::mem::take(&mut pages.ids);
        self.free_ids(&ids);
        Ok(())
    }

    /// Takes an owned set's ids out of RAII custody: the caller now owns them as raw ids
    /// (the tree does this when it adopts pages).
    pub fn adopt(&self, mut pages: OwnedPages) -> Result<Vec<PageId>, HostError> {
        self.check_home(&pages)?;
        Ok(std::mem::take(&mut pages.ids))
    }

    fn check_home(&self, pages: &OwnedPages) -> Result<(), HostError> {
        match &pages.home {
            Some(home) if home.pool != self.id => {
                Err(HostError::PoolMismatch(home.pool.0, self.id.0))
            }
            _ => Ok(()),
        }
    }

    /// Checks that `page` is a usable id of this pool.
    pub fn check_range(&self, page: PageId) -> Result<(), HostError> {
        if page == 0 || page >= self.total {
            return Err(HostError::PageOutOfRange {
                page,
                total: self.total,
            });
        }
        Ok(())
    }

    /// The free page ids, in stack order (diagnostics and invariant checks).
    pub fn free_list(&mut self) -> &[PageId] {
        self.drain_returns();
        &self.free
    }
}

#[derive(Debug, Clone)]
struct Home {
    pool: PoolId,
    tx: Releaser<Vec<PageId>>,
}

/// Pages held outside their pool. Move-only; dropping returns them to the pool.
#[derive(Debug, Default)]
pub struct OwnedPages {
    ids: Vec<PageId>,
    home: Option<Home>,
}

impl OwnedPages {
    /// An empty set belonging to no pool.
    pub fn empty() -> Self {
        Self::default()
    }

    /// The page ids, in order.
    pub fn ids(&self) -> &[PageId] {
        &self.ids
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the set holds no page.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Splits off the first `n` pages (order kept).
    pub fn take_first(&mut self, n: usize) -> Result<OwnedPages, HostError> {
        if n > self.ids.len() {
            return Err(HostError::NotEnoughPages {
                wanted: n,
                held: self.ids.len(),
            });
        }
        let rest = self.ids.split_off(n);
        let first = std::mem::replace(&mut self.ids, rest);
        Ok(OwnedPages {
            ids: first,
            home: self.home.clone(),
        })
    }

    /// Splits off the last `n` pages (order kept).
    pub fn take_last(&mut self, n: usize) -> Result<OwnedPages, HostError> {
        if n > self.ids.len() {
            return Err(HostError::NotEnoughPages {
                wanted: n,
                held: self.ids.len(),
            });
        }
        let at = self.ids.len() - n;
        Ok(OwnedPages {
            ids: self.ids.split_off(at),
            home: self.home.clone(),
        })
    }

    /// Appends `other`'s pages after this set's; `other` is left empty.
    pub fn append(&mut self, other: &mut OwnedPages) -> Result<(), HostError> {
        match (&self.home, &other.home) {
            (Some(a), Some(b)) if a.pool != b.pool => {
                return Err(HostError::PoolMismatch(a.pool.0, b.pool.0));
            }
            (None, Some(b)) => self.home = Some(b.clone()),
            _ => {}
        }
        self.ids.append(&mut other.ids);
        Ok(())
    }
}

impl Drop for OwnedPages {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        if let Some(home) = &self.home {
            home.tx.release(std::mem::take(&mut self.ids));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_order_and_reserved_page_zero() {
        let mut pool = PagePool::new(10);
        assert_eq!(pool.available(), 9);
        let pages = pool.allocate(3).unwrap();
        assert_eq!(pages.ids(), &[9, 8, 7]);
        assert_eq!(pool.available(), 6);
    }

    #[test]
    fn all_or_nothing() {
        let mut pool = PagePool::new(4);
        assert!(pool.allocate(4).is_none());
        assert_eq!(pool.available(), 3);
        assert!(pool.allocate(0).unwrap().is_empty());
        assert_eq!(PagePool::new(1).usable(), 0);
        assert!(PagePool::new(0).allocate(1).is_none());
    }

    #[test]
    fn drop_returns_pages() {
        let mut pool = PagePool::new(10);
        {
            let _pages = pool.allocate(3).unwrap();
        }
        assert_eq!(pool.available(), 9);
    }

    #[test]
    fn take_first_and_last_keep_order() {
        let mut pool = PagePool::new(10);
        let mut pages = pool.allocate(5).unwrap();
        let first = pages.take_first(2).unwrap();
        let last = pages.take_last(2).unwrap();
        assert_eq!(first.ids(), &[9, 8]);
        assert_eq!(last.ids(), &[6, 5]);
        assert_eq!(pages.ids(), &[7]);
        assert!(pages.take_first(2).is_err());
        drop((first, last, pages));
        assert_eq!(pool.available(), 9);
    }

    #[test]
    fn append_merges_and_rejects_foreign_pools() {
        let mut pool = PagePool::new(10);
        let mut other_pool = PagePool::new(10);
        let mut a = pool.allocate(2).unwrap();
        let mut b = pool.allocate(2).unwrap();
        a.append(&mut b).unwrap();
        assert_eq!(a.ids(), &[9, 8, 7, 6]);
        assert!(b.is_empty());
        let mut empty = OwnedPages::empty();
        empty.append(&mut a).unwrap();
        assert_eq!(empty.len(), 4);
        let mut foreign = other_pool.allocate(1).unwrap();
        assert!(matches!(
            empty.append(&mut foreign),
            Err(HostError::PoolMismatch(..))
        ));
        drop((empty, foreign));
        assert_eq!(pool.available(), 9);
        assert_eq!(other_pool.available(), 9);
    }

    #[test]
    fn explicit_free_and_adopt() {
        let mut pool = PagePool::new(10);
        let pages = pool.allocate(3).unwrap();
        pool.free(pages).unwrap();
        assert_eq!(pool.available(), 9);
        let pages = pool.allocate(2).unwrap();
        let ids = pool.adopt(pages).unwrap();
        assert_eq!(
            pool.available(),
            7,
            "adopted ids are no longer returned on drop"
        );
        pool.free_ids(&ids);
        assert_eq!(pool.available(), 9);
        assert!(pool.check_range(0).is_err());
        assert!(pool.check_range(10).is_err());
        assert!(pool.check_range(9).is_ok());
    }
}
