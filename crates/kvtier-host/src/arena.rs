//! The host (L2) arena: the memory behind the host page ids.
//!
//! Like pinned host memory in a real engine, the arena is reached by two movers at once:
//! the device actor's copy kernels (write-backs fill host pages, load-backs read them) and
//! the L3 actor (prefetches fill host pages, backups read them). The scheduler's pins keep
//! the two on disjoint pages, and the arena checks it: every access first borrows its
//! pages, shared for reading or exclusive for writing, with one atomic word per page. A
//! conflicting borrow is a typed error, never a data race, so a bug in the pins becomes a
//! failed transfer (a cache miss), not wrong KV.
//!
//! Layout: page-first. Page `p` is the `page_bytes` starting at `p × page_bytes`; page 0
//! is reserved and can never be borrowed. The arena is page-aligned and zeroed, allocated
//! once, so an L3 backend can register the whole region for zero-copy transfers.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use kvtier_types::PageId;

use crate::HostError;

/// Alignment of the arena (a page of memory, for DMA and registration).
const ALIGN: usize = 4096;
/// Borrow state of a page held for writing.
const WRITER: u32 = u32::MAX;

/// The host arena. Share it as `Arc<HostArena>`; the memory lives until the last clone
/// is dropped.
pub struct HostArena {
    base: NonNull<u8>,
    layout: Layout,
    pages: u32,
    page_bytes: usize,
    /// Per page: 0 free, `n` readers, or [`WRITER`].
    borrows: Box<[AtomicU32]>,
}

// SAFETY: the arena's bytes are only reached through `PagesRead` / `PagesWrite`, whose
// per-page borrow words enforce readers-or-one-writer across threads; `region()` hands out
// an address for registration and for the C++ kernels, whose callers hold a borrow of every
// page they touch for the duration of the copy.
#[allow(unsafe_code, reason = "raw arena memory shared under per-page borrows")]
unsafe impl Send for HostArena {}
#[allow(unsafe_code, reason = "raw arena memory shared under per-page borrows")]
unsafe impl Sync for HostArena {}

impl std::fmt::Debug for HostArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostArena")
            .field("pages", &self.pages)
            .field("page_bytes", &self.page_bytes)
            .finish()
    }
}

impl HostArena {
    /// Allocates `pages` pages (page 0 included) of `page_bytes` each, zeroed.
    pub fn new(pages: u32, page_bytes: u64) -> Result<Self, HostError> {
        let bytes = u64::from(pages)
            .checked_mul(page_bytes)
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b > 0 && page_bytes > 0)
            .ok_or(HostError::ArenaAllocation { pages, page_bytes })?;
        let layout = Layout::from_size_align(bytes, ALIGN)
            .map_err(|_| HostError::ArenaAllocation { pages, page_bytes })?;
        // SAFETY: the layout has a non-zero size (checked above).
        #[allow(unsafe_code, reason = "the arena's one allocation")]
        let raw = unsafe { alloc_zeroed(layout) };
        let base = NonNull::new(raw).ok_or(HostError::ArenaAllocation { pages, page_bytes })?;
        Ok(Self {
            base,
            layout,
            pages,
            page_bytes: page_bytes as usize,
            borrows: (0..pages).map(|_| AtomicU32::new(0)).collect(),
        })
    }

    /// Pages in the arena, page 0 included.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// Bytes of one page.
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Address and length of the whole region: for registering it with an L3 backend
    /// (zero-copy) and for the copy kernels. Touch the bytes only under a borrow.
    pub fn region(&self) -> (u64, u64) {
        (self.base.as_ptr() as u64, self.layout.size() as u64)
    }

    fn check(&self, page: PageId) -> Result<usize, HostError> {
        if page == 0 || page >= self.pages {
            return Err(HostError::PageOutOfRange {
                page,
                total: self.pages,
            });
        }
        Ok(page as usize)
    }

    /// Borrows `pages` for reading (other readers may share them). All or nothing.
    pub fn read(&self, pages: &[PageId]) -> Result<PagesRead<'_>, HostError> {
        for (i, &page) in pages.iter().enumerate() {
            let taken = self.check(page).and_then(|p| {
                self.borrows[p]
                    .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                        (n < WRITER - 1).then(|| n + 1)
                    })
                    .map_err(|_| HostError::PageBusy { page })
            });
            if let Err(e) = taken {
                self.unread(&pages[..i]);
                return Err(e);
            }
        }
        Ok(PagesRead {
            arena: self,
            pages: pages.to_vec(),
        })
    }

    /// Borrows `pages` for writing (exclusively; a page named twice is busy). All or
    /// nothing.
    pub fn write(&self, pages: &[PageId]) -> Result<PagesWrite<'_>, HostError> {
        for (i, &page) in pages.iter().enumerate() {
            let taken = self.check(page).and_then(|p| {
                self.borrows[p]
                    .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
                    .map(drop)
                    .map_err(|_| HostError::PageBusy { page })
            });
            if let Err(e) = taken {
                self.unwrite(&pages[..i]);
                return Err(e);
            }
        }
        Ok(PagesWrite {
            arena: self,
            pages: pages.to_vec(),
        })
    }

    fn unread(&self, pages: &[PageId]) {
        for &page in pages {
            let before = self.borrows[page as usize].fetch_sub(1, Ordering::Release);
            debug_assert!(
                before > 0 && before != WRITER,
                "page {page} was not read-borrowed"
            );
        }
    }

    fn unwrite(&self, pages: &[PageId]) {
        for &page in pages {
            let before = self.borrows[page as usize].swap(0, Ordering::Release);
            debug_assert_eq!(before, WRITER, "page {page} was not write-borrowed");
        }
    }

    /// The bytes of `page`; the caller holds a borrow of it.
    fn bytes(&self, page: PageId) -> *mut u8 {
        // In bounds: `page < pages` was checked when the page was borrowed.
        self.base
            .as_ptr()
            .wrapping_add(page as usize * self.page_bytes)
    }
}

impl Drop for HostArena {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; no borrow can outlive `&self`.
        #[allow(unsafe_code, reason = "the arena's one allocation")]
        unsafe {
            dealloc(self.base.as_ptr(), self.layout);
        }
    }
}

/// Pages borrowed for reading; released on drop.
#[derive(Debug)]
pub struct PagesRead<'a> {
    arena: &'a HostArena,
    pages: Vec<PageId>,
}

impl PagesRead<'_> {
    /// The borrowed pages, in the order asked.
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// The bytes of the `i`-th borrowed page.
    pub fn page(&self, i: usize) -> &[u8] {
        let p = self.arena.bytes(self.pages[i]);
        // SAFETY: the page is read-borrowed for as long as `self` lives, so no writer
        // can reach it; it lies inside the allocation.
        #[allow(unsafe_code, reason = "a read-borrowed arena page")]
        unsafe {
            std::slice::from_raw_parts(p, self.arena.page_bytes)
        }
    }

    /// Every borrowed page's bytes, in order.
    pub fn slices(&self) -> Vec<&[u8]> {
        (0..self.pages.len()).map(|i| self.page(i)).collect()
    }
}

impl Drop for PagesRead<'_> {
    fn drop(&mut self) {
        self.arena.unread(&self.pages);
    }
}

/// Pages borrowed for writing; released on drop.
#[derive(Debug)]
pub struct PagesWrite<'a> {
    arena: &'a HostArena,
    pages: Vec<PageId>,
}

impl PagesWrite<'_> {
    /// The borrowed pages, in the order asked.
    pub fn pages(&self) -> &[PageId] {
        &self.pages
    }

    /// Every borrowed page's bytes, in order, for writing.
    pub fn slices_mut(&mut self) -> Vec<&mut [u8]> {
        let len = self.arena.page_bytes;
        self.pages
            .iter()
            .map(|&page| {
                // SAFETY: each page is write-borrowed (exclusively, and named once, or the
                // borrow would have failed) while `self` is mutably borrowed, so these
                // slices are disjoint and unaliased; each lies inside the allocation.
                #[allow(unsafe_code, reason = "write-borrowed, pairwise distinct arena pages")]
                unsafe {
                    std::slice::from_raw_parts_mut(self.arena.bytes(page), len)
                }
            })
            .collect()
    }

    /// The bytes of the `i`-th borrowed page.
    pub fn page(&self, i: usize) -> &[u8] {
        // SAFETY: the page is write-borrowed by `self`; `&self` allows no writer.
        #[allow(unsafe_code, reason = "a write-borrowed arena page, read")]
        unsafe {
            std::slice::from_raw_parts(self.arena.bytes(self.pages[i]), self.arena.page_bytes)
        }
    }

    /// The bytes of the `i`-th borrowed page, for writing.
    pub fn page_mut(&mut self, i: usize) -> &mut [u8] {
        let len = self.arena.page_bytes;
        // SAFETY: as in `slices_mut`, for one page.
        #[allow(unsafe_code, reason = "a write-borrowed arena page")]
        unsafe {
            std::slice::from_raw_parts_mut(self.arena.bytes(self.pages[i]), len)
        }
    }
}

impl Drop for PagesWrite<'_> {
    fn drop(&mut self) {
        self.arena.unwrite(&self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_zeroed_aligned_and_writable() {
        let arena = HostArena::new(4, 64).unwrap();
        let (addr, len) = arena.region();
        assert_eq!(addr % ALIGN as u64, 0);
        assert_eq!(len, 256);
        let mut w = arena.write(&[1, 3]).unwrap();
        for (i, page) in w.slices_mut().into_iter().enumerate() {
            assert!(page.iter().all(|&b| b == 0));
            page.fill(i as u8 + 7);
        }
        drop(w);
        let r = arena.read(&[3, 1]).unwrap();
        assert_eq!(r.page(0)[63], 8);
        assert_eq!(r.page(1)[0], 7);
    }

    #[test]
    fn readers_share_writers_exclude() {
        let arena = HostArena::new(4, 8).unwrap();
        let r1 = arena.read(&[1, 2]).unwrap();
        let r2 = arena.read(&[2]).unwrap();
        assert_eq!(
            arena.write(&[3, 2]).unwrap_err(),
            HostError::PageBusy { page: 2 }
        );
        // The failed borrow took nothing: page 3 is still free.
        drop(arena.write(&[3]).unwrap());
        drop((r1, r2));
        let w = arena.write(&[2]).unwrap();
        assert_eq!(
            arena.read(&[2]).unwrap_err(),
            HostError::PageBusy { page: 2 }
        );
        drop(w);
        assert!(arena.read(&[2]).is_ok());
    }

    #[test]
    fn a_page_named_twice_cannot_be_written_and_page_zero_is_reserved() {
        let arena = HostArena::new(4, 8).unwrap();
        assert_eq!(
            arena.write(&[1, 1]).unwrap_err(),
            HostError::PageBusy { page: 1 }
        );
        assert!(arena.write(&[1]).is_ok());
        assert!(matches!(
            arena.read(&[0]),
            Err(HostError::PageOutOfRange { page: 0, .. })
        ));
        assert!(matches!(
            arena.write(&[4]),
            Err(HostError::PageOutOfRange { page: 4, .. })
        ));
        assert!(HostArena::new(0, 8).is_err());
        assert!(HostArena::new(4, 0).is_err());
    }

    #[test]
    fn borrows_cross_threads() {
        let arena = std::sync::Arc::new(HostArena::new(9, 32).unwrap());
        let workers: Vec<_> = (1..9u32)
            .map(|page| {
                let arena = std::sync::Arc::clone(&arena);
                std::thread::spawn(move || {
                    arena.write(&[page]).unwrap().page_mut(0).fill(page as u8);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        let all: Vec<PageId> = (1..9).collect();
        let r = arena.read(&all).unwrap();
        for (i, page) in r.slices().into_iter().enumerate() {
            assert!(page.iter().all(|&b| b == i as u8 + 1));
        }
    }
}
