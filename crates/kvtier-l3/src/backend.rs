//! The trait every L3 store implements.

use crate::{L3Error, L3Key};

/// What a backend can really do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `exists(.., prefetch_to_memory = true)` promotes slow-tier objects in the
    /// background. A backend without it ignores the hint and says so here.
    pub prefetch_on_exist: bool,
}

/// The outcome of one put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored now.
    Stored,
    /// An object with this key exists; objects are write-once, so it was kept.
    AlreadyPresent,
    /// Not stored (no room, or an I/O failure): a later get misses.
    Failed,
}

/// Counters of a store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L3Stats {
    /// Objects and bytes in the fast (memory) tier.
    pub memory_objects: u64,
    /// Bytes in the memory tier.
    pub memory_bytes: u64,
    /// Objects on disk.
    pub disk_objects: u64,
    /// Bytes on disk.
    pub disk_bytes: u64,
    /// Gets that returned data.
    pub get_hits: u64,
    /// Gets that missed (absent, corrupt, evicted, or not ready by the deadline).
    pub get_misses: u64,
    /// Objects found corrupt (checksum mismatch) and dropped.
    pub corrupt_objects: u64,
    /// Promotions to memory dispatched by prefetch-on-exist hints.
    pub promotions_started: u64,
    /// Promotions that failed (their entries are cleared).
    pub promotions_failed: u64,
    /// Hints dropped because the same key was promoted within the TTL or is in flight.
    pub hints_deduplicated: u64,
    /// Times a batch get blocked waiting for promotions (at most once per batch).
    pub get_waits: u64,
}

/// An L3 store. Calls block; the L3 actor runs them off the scheduler's thread.
pub trait L3Backend: Send {
    /// What the backend can do.
    fn capabilities(&self) -> Capabilities;

    /// How many of `keys`, from the first, exist consecutively. With
    /// `prefetch_to_memory`, a capable backend starts promoting the hits to its fast tier.
    fn exists(&mut self, keys: &[L3Key], prefetch_to_memory: bool) -> Result<usize, L3Error>;

    /// Reads each object into its buffer (exactly the buffer's length). `true` per key
    /// that was read whole and verified; `false` is a miss and the buffer is untouched.
    fn get(&mut self, keys: &[L3Key], buffers: &mut [&mut [u8]]) -> Result<Vec<bool>, L3Error>;

    /// Stores each buffer under its key (write-once).
    fn put(&mut self, keys: &[L3Key], buffers: &[&[u8]]) -> Result<Vec<PutOutcome>, L3Error>;

    /// Removes objects; returns how many existed.
    fn remove(&mut self, keys: &[L3Key]) -> Result<usize, L3Error>;

    /// Counters.
    fn stats(&self) -> L3Stats;
}

/// Checks that a batch pairs each key with one buffer.
pub(crate) fn check_batch(keys: usize, buffers: usize) -> Result<(), L3Error> {
    if keys == buffers {
        Ok(())
    } else {
        Err(L3Error::BatchMismatch { keys, buffers })
    }
}
