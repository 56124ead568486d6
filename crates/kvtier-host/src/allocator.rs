//! The host (L2) allocator: the Host allocator actor's core.

use crate::{HostError, OwnedPages, PagePool};

/// Counters of the host allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Usable host pages.
    pub usable_pages: u32,
    /// Pages not leased to anyone.
    pub free_pages: u32,
    /// Pages held by clients (the radix cache's host tier, transfer staging).
    pub leased_pages: u32,
}

/// Owns the host page ids. Clients lease pages as [`OwnedPages`] of this pool; a dropped
/// lease comes back before the allocator answers its next call.
///
/// The radix cache's host tier is one lease, taken whole at start-up; later clients (L3
/// staging, the device actor) draw from what is left.
#[derive(Debug)]
pub struct HostCore {
    pool: PagePool,
}

impl HostCore {
    /// An allocator over `total` host pages (page 0 reserved).
    pub fn new(total: u32) -> Self {
        Self {
            pool: PagePool::new(total),
        }
    }

    /// Leases exactly `n` pages, or fails with nothing leased.
    pub fn lease(&mut self, n: u32) -> Result<OwnedPages, HostError> {
        let free = self.pool.available();
        self.pool
            .allocate(n as usize)
            .ok_or(HostError::NotEnoughPages {
                wanted: n as usize,
                held: free as usize,
            })
    }

    /// Counters.
    pub fn stats(&mut self) -> HostStats {
        let free = self.pool.available();
        let usable = self.pool.usable();
        HostStats {
            usable_pages: usable,
            free_pages: free,
            leased_pages: usable - free,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_return_on_drop() {
        let mut host = HostCore::new(9);
        let lease = host.lease(5).unwrap();
        assert_eq!(host.stats().leased_pages, 5);
        assert!(host.lease(4).is_err(), "only 3 left");
        assert_eq!(host.stats().free_pages, 3, "a refused lease takes nothing");
        drop(lease);
        assert_eq!(host.stats().free_pages, 8);
    }
}
