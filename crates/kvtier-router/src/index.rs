//! Which instance caches which block, and on which medium: the router's view of the
//! cluster, built only from the instances' KV events.

use std::collections::HashMap;

use crate::RouterError;
use crate::wire::{Event, Medium};

/// The most instances one index tells apart (a bit each).
pub const MAX_WORKERS: usize = 64;

/// Per medium, the instances holding a block (bit `w` for instance `w`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Holders([u64; 3]);

impl Holders {
    fn slot(medium: Medium) -> usize {
        match medium {
            Medium::Gpu => 0,
            Medium::Cpu => 1,
            Medium::Disk => 2,
        }
    }

    fn any(self) -> u64 {
        self.0[0] | self.0[1] | self.0[2]
    }
}

/// Blocks by hash, with their holders. Lookups only in decisions: the map's order never
/// reaches a route.
#[derive(Debug)]
pub struct KvIndex {
    workers: usize,
    blocks: HashMap<u64, Holders>,
}

impl KvIndex {
    /// An empty index of `workers` instances (at most [`MAX_WORKERS`]).
    pub fn new(workers: usize) -> Result<Self, RouterError> {
        if workers == 0 || workers > MAX_WORKERS {
            return Err(RouterError::Workers(workers));
        }
        Ok(Self {
            workers,
            blocks: HashMap::new(),
        })
    }

    /// Instances it tells apart.
    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Takes one event of instance `worker`.
    pub fn apply(&mut self, worker: usize, event: &Event) {
        debug_assert!(worker < self.workers, "worker {worker} of {}", self.workers);
        let bit = 1u64 << worker;
        match event {
            Event::Stored { hashes, medium } => {
                let slot = Holders::slot(*medium);
                for h in hashes {
                    self.blocks.entry(*h).or_default().0[slot] |= bit;
                }
            }
            Event::Removed { hashes, medium } => {
                let slot = Holders::slot(*medium);
                for h in hashes {
                    if let Some(holders) = self.blocks.get_mut(h) {
                        holders.0[slot] &= !bit;
                        if holders.any() == 0 {
                            self.blocks.remove(h);
                        }
                    }
                }
            }
            Event::AllCleared => {
                self.blocks.retain(|_, holders| {
                    for mask in &mut holders.0 {
                        *mask &= !bit;
                    }
                    holders.any() != 0
                });
            }
        }
    }

    /// Per instance, how many of `hashes` (a prompt's blocks, in order) it holds from
    /// the first on, on any medium. With `shared_disk`, a block any instance stored on
    /// `DISK` counts for every instance: they share one L3 store.
    pub fn matched_blocks(&self, hashes: &[u64], shared_disk: bool) -> Vec<u32> {
        let all = if self.workers == MAX_WORKERS {
            u64::MAX
        } else {
            (1u64 << self.workers) - 1
        };
        let mut matched = vec![0u32; self.workers];
        let mut alive = all;
        for h in hashes {
            let Some(holders) = self.blocks.get(h) else {
                break;
            };
            let mut have = holders.0[0] | holders.0[1];
            have |= if shared_disk && holders.0[2] != 0 {
                all
            } else {
                holders.0[2]
            };
            alive &= have;
            if alive == 0 {
                break;
            }
            let mut bits = alive;
            while bits != 0 {
                matched[bits.trailing_zeros() as usize] += 1;
                bits &= bits - 1;
            }
        }
        matched
    }

    /// Blocks indexed.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is indexed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Memory the index holds (its table's buckets and their control bytes).
    pub fn memory_bytes(&self) -> usize {
        self.blocks.capacity() * (std::mem::size_of::<(u64, Holders)>() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hashes: &[u64], medium: Medium) -> Event {
        Event::Stored {
            hashes: hashes.to_vec(),
            medium,
        }
    }

    #[test]
    fn a_prefix_counts_while_every_block_is_held() {
        let mut index = KvIndex::new(3).unwrap();
        index.apply(0, &stored(&[1, 2, 3], Medium::Gpu));
        index.apply(1, &stored(&[1], Medium::Gpu));
        index.apply(1, &stored(&[2], Medium::Cpu));
        index.apply(2, &stored(&[2, 3], Medium::Gpu));
        // Instance 2 lacks block 1: a later block of the prompt does not count.
        assert_eq!(index.matched_blocks(&[1, 2, 3, 4], false), [3, 2, 0]);
        index.apply(
            0,
            &Event::Removed {
                hashes: vec![2],
                medium: Medium::Gpu,
            },
        );
        assert_eq!(index.matched_blocks(&[1, 2, 3], false), [1, 2, 0]);
    }

    #[test]
    fn a_shared_disk_block_counts_for_every_instance() {
        let mut index = KvIndex::new(2).unwrap();
        index.apply(0, &stored(&[7, 8], Medium::Disk));
        assert_eq!(index.matched_blocks(&[7, 8], false), [2, 0]);
        assert_eq!(index.matched_blocks(&[7, 8], true), [2, 2]);
    }

    #[test]
    fn clearing_an_instance_forgets_only_its_blocks() {
        let mut index = KvIndex::new(2).unwrap();
        index.apply(0, &stored(&[1, 2], Medium::Gpu));
        index.apply(1, &stored(&[1], Medium::Cpu));
        index.apply(0, &Event::AllCleared);
        assert_eq!(index.len(), 1);
        assert_eq!(index.matched_blocks(&[1, 2], false), [0, 1]);
        assert!(KvIndex::new(65).is_err() && KvIndex::new(0).is_err());
    }
}
