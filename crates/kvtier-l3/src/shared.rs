//! One store behind several L3 cores in one process (instances of a cluster replay that
//! share an embedded store): each core holds a [`SharedStore`] handle, and calls take
//! turns on the store. Mooncake needs none of this: each instance is a client of its own.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Capabilities, L3Backend, L3Error, L3Key, L3Stats, PutOutcome};

/// A handle on a store shared by several cores.
#[derive(Clone)]
pub struct SharedStore(Arc<Mutex<Box<dyn L3Backend>>>);

impl std::fmt::Debug for SharedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedStore").finish_non_exhaustive()
    }
}

impl SharedStore {
    /// Shares `store`; clone the handle for each core.
    pub fn new(store: Box<dyn L3Backend>) -> Self {
        Self(Arc::new(Mutex::new(store)))
    }

    fn store(&self) -> MutexGuard<'_, Box<dyn L3Backend>> {
        // A core that panicked mid-call leaves the store as the call left it; the store's
        // own invariants do not depend on the call finishing (objects are write-once).
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl L3Backend for SharedStore {
    fn capabilities(&self) -> Capabilities {
        self.store().capabilities()
    }

    fn exists(&mut self, keys: &[L3Key], prefetch_to_memory: bool) -> Result<usize, L3Error> {
        self.store().exists(keys, prefetch_to_memory)
    }

    fn get(&mut self, keys: &[L3Key], buffers: &mut [&mut [u8]]) -> Result<Vec<bool>, L3Error> {
        self.store().get(keys, buffers)
    }

    fn put(&mut self, keys: &[L3Key], buffers: &[&[u8]]) -> Result<Vec<PutOutcome>, L3Error> {
        self.store().put(keys, buffers)
    }

    fn remove(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        self.store().remove(keys)
    }

    fn stats(&self) -> L3Stats {
        self.store().stats()
    }
}
