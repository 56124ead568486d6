//! Request-pool slots: slot 0 reserved, FIFO reuse, RAII release.

use std::collections::VecDeque;

use kvtier_host::{ReleaseQueue, Releaser};
use kvtier_types::SlotId;

/// The slot allocator. Released slots go to the back of the queue.
#[derive(Debug)]
pub(crate) struct SlotPool {
    free: VecDeque<SlotId>,
    releases: ReleaseQueue<SlotId>,
}

/// A request-pool slot; dropping it returns it to the pool.
#[derive(Debug)]
pub(crate) struct Slot {
    id: SlotId,
    home: Releaser<SlotId>,
}

impl Slot {
    pub fn id(&self) -> SlotId {
        self.id
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.home.release(self.id);
    }
}

impl SlotPool {
    pub fn new(size: u32) -> Self {
        Self {
            free: (1..=size).collect(),
            releases: ReleaseQueue::new(),
        }
    }

    fn drain(&mut self) {
        let free = &mut self.free;
        self.releases.drain(|id| free.push_back(id));
    }

    pub fn available(&mut self) -> usize {
        self.drain();
        self.free.len()
    }

    pub fn allocate(&mut self) -> Option<Slot> {
        self.drain();
        self.free.pop_front().map(|id| Slot {
            id,
            home: self.releases.releaser(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_slot_is_one_and_reuse_is_fifo() {
        let mut pool = SlotPool::new(4);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a.id(), b.id()), (1, 2));
        drop(a);
        // FIFO: 3 and 4 come before the released 1.
        assert_eq!(pool.allocate().unwrap().id(), 3);
    }

    #[test]
    fn dropping_releases_the_slot() {
        let mut pool = SlotPool::new(1);
        let a = pool.allocate().unwrap();
        assert!(pool.allocate().is_none());
        drop(a);
        assert_eq!(pool.available(), 1);
    }
}
