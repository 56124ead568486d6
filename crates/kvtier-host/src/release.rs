//! The return path of RAII handles.
//!
//! A handle that lives outside its owner (pages, locks, slots) holds a [`Releaser`];
//! dropping the handle sends what it held back to the owner's [`ReleaseQueue`], which the
//! owner drains before its next operation. A shared counter lets the owner skip the
//! channel entirely when nothing was dropped, which is the common case on the hot path.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The owner's end: drains released items.
#[derive(Debug)]
pub struct ReleaseQueue<T> {
    tx: flume::Sender<T>,
    rx: flume::Receiver<T>,
    pending: Arc<AtomicUsize>,
}

/// A handle's end: sends one released item home.
#[derive(Debug)]
pub struct Releaser<T> {
    tx: flume::Sender<T>,
    pending: Arc<AtomicUsize>,
}

impl<T> Clone for Releaser<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            pending: Arc::clone(&self.pending),
        }
    }
}

impl<T> Default for ReleaseQueue<T> {
    fn default() -> Self {
        let (tx, rx) = flume::unbounded();
        Self {
            tx,
            rx,
            pending: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl<T> ReleaseQueue<T> {
    /// A new, empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A sender for a new handle.
    pub fn releaser(&self) -> Releaser<T> {
        Releaser {
            tx: self.tx.clone(),
            pending: Arc::clone(&self.pending),
        }
    }

    /// Calls `f` on every released item, in release order.
    #[inline]
    pub fn drain(&self, mut f: impl FnMut(T)) {
        if self.pending.load(Ordering::Acquire) == 0 {
            return;
        }
        while let Ok(item) = self.rx.try_recv() {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            f(item);
        }
    }
}

impl<T> Releaser<T> {
    /// Sends `item` home. If the owner is gone, its resources went with it.
    pub fn release(&self, item: T) {
        if self.tx.send(item).is_ok() {
            self.pending.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// One item held outside its owner. Move-only; dropping it sends the item home, where
/// the owner takes it back before its next operation.
#[derive(Debug)]
#[must_use = "dropping the lease returns what it holds"]
pub struct Lease<T: Copy> {
    item: T,
    home: Option<Releaser<T>>,
}

impl<T: Copy> Lease<T> {
    /// `item`, returned through `home` when dropped.
    pub fn new(item: T, home: Releaser<T>) -> Self {
        Self {
            item,
            home: Some(home),
        }
    }

    /// What it holds.
    pub fn get(&self) -> T {
        self.item
    }

    /// What it holds, no longer returned on drop: its owner takes it back another way.
    pub fn into_inner(mut self) -> T {
        self.home = None;
        self.item
    }
}

impl<T: Copy> Drop for Lease<T> {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.release(self.item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_items_arrive_in_order() {
        let queue = ReleaseQueue::new();
        let a = queue.releaser();
        let b = a.clone();
        a.release(1);
        b.release(2);
        let mut got = Vec::new();
        queue.drain(|x| got.push(x));
        assert_eq!(got, [1, 2]);
        queue.drain(|x| got.push(x));
        assert_eq!(got, [1, 2], "drained items are not delivered twice");
    }

    #[test]
    fn release_after_owner_is_gone_is_harmless() {
        let queue = ReleaseQueue::new();
        let r = queue.releaser();
        drop(queue);
        r.release(5u32);
    }

    #[test]
    fn a_dropped_lease_goes_home_and_a_taken_one_does_not() {
        let queue = ReleaseQueue::new();
        let kept = Lease::new(7u32, queue.releaser());
        assert_eq!(kept.get(), 7);
        drop(Lease::new(3u32, queue.releaser()));
        assert_eq!(kept.into_inner(), 7);
        let mut got = Vec::new();
        queue.drain(|x| got.push(x));
        assert_eq!(got, [3]);
    }
}
