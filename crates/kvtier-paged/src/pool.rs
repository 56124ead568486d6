//! A group's page pool: LIFO ids with page 0 reserved, and the counters the reference
//! exposes (`failed_alloc`, pages handed out).

use kvtier_host::{OwnedPages, PagePool};
use kvtier_types::PageId;

use crate::{GroupSpec, PagedError};

/// One group's pages.
#[derive(Debug)]
pub struct GroupPool {
    pages: PagePool,
    /// Acquisitions refused for want of pages.
    failed_alloc: u64,
    /// Pages handed out over the pool's life.
    allocated: u64,
    /// Pages returned over the pool's life.
    returned: u64,
}

impl GroupPool {
    /// The pool of `group` (`total_pages`, dummy page 0 included).
    pub fn new(group: &GroupSpec) -> Self {
        Self {
            pages: PagePool::new(group.total_pages),
            failed_alloc: 0,
            allocated: 0,
            returned: 0,
        }
    }

    /// Free pages now.
    pub fn available(&mut self) -> u32 {
        self.pages.available()
    }

    /// Usable pages (`total − 1`).
    pub fn usable(&self) -> u32 {
        self.pages.usable()
    }

    /// Refused acquisitions.
    pub fn failed_alloc(&self) -> u64 {
        self.failed_alloc
    }

    /// Pages handed out over the pool's life.
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// Pages returned over the pool's life.
    pub fn returned(&self) -> u64 {
        self.returned
    }

    /// Exactly `n` pages, or a typed refusal that counts a failed allocation.
    pub fn allocate(&mut self, group: &GroupSpec, n: u32) -> Result<OwnedPages, PagedError> {
        match self.pages.allocate(n as usize) {
            Some(pages) => {
                self.allocated += u64::from(n);
                Ok(pages)
            }
            None => {
                self.failed_alloc += 1;
                Err(PagedError::OutOfPages {
                    group: group.id.clone(),
                    needed: n,
                    free: self.pages.available(),
                })
            }
        }
    }

    /// Returns an owned set now.
    pub fn free(&mut self, pages: OwnedPages) {
        // A set of another pool is a caller bug; its pages go home through their own
        // release path when dropped, so nothing leaks either way.
        self.returned += pages.len() as u64;
        let _ = self.pages.free(pages);
    }

    /// Returns an owned set taken by one acquisition, last page first, so the free
    /// list is as it was before (the pool hands out the page freed last first).
    pub fn undo(&mut self, pages: OwnedPages) {
        self.returned += pages.len() as u64;
        if let Ok(mut ids) = self.pages.adopt(pages) {
            ids.reverse();
            self.pages.free_ids(&ids);
        }
    }

    /// Returns raw ids a snapshot owned.
    pub fn free_ids(&mut self, ids: &[PageId]) {
        self.returned += ids.len() as u64;
        self.pages.free_ids(ids);
    }

    /// Takes pages out of RAII custody for a snapshot to own.
    pub fn adopt(
        &mut self,
        group: &GroupSpec,
        pages: OwnedPages,
    ) -> Result<Vec<PageId>, PagedError> {
        self.pages.adopt(pages).map_err(|e| PagedError::Table {
            group: group.id.clone(),
            problem: e.to_string(),
        })
    }

    /// The free ids (invariant checks).
    pub fn free_list(&mut self) -> &[PageId] {
        self.pages.free_list()
    }
}
