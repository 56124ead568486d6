//! The structural invariant check used by tests and debug builds: page conservation, label
//! shape, tier closure, lock counts, LRU membership and counters, the recurrent-state
//! family's slots (hybrid models) and where page-group snapshots sit.

use kvtier_types::{PageId, Tier};

use super::RadixCore;
use crate::node::page_key;
use crate::{NodeId, PageOwner, RadixError, Violation};

impl RadixCore {
    /// Checks the structural invariants. `outside` gives, per tier, the page ids held
    /// outside the tree (request-local pages); with it, page conservation is checked
    /// exactly: every usable page is free, in one node, or held outside, once.
    pub fn check_invariants(&mut self, outside: [&[PageId]; 2]) -> Result<(), RadixError> {
        self.check(outside).map_err(RadixError::Invariant)
    }

    fn check(&mut self, outside: [&[PageId]; 2]) -> Result<(), Violation> {
        self.drain_releases();
        let ps = self.page_size;
        for (t, tier) in Tier::ALL.into_iter().enumerate() {
            let total = self.pools[t].total() as usize;
            let mut owner = vec![0u8; total.max(1)];
            let mut mark = |page: PageId, by: PageOwner| -> Result<(), Violation> {
                let p = page as usize;
                if p == 0 || p >= total {
                    return Err(Violation::PageOutOfRange {
                        tier,
                        page,
                        owner: by,
                    });
                }
                owner[p] += 1;
                if owner[p] > 1 {
                    return Err(Violation::PageOwnedTwice {
                        tier,
                        page,
                        owner: by,
                    });
                }
                Ok(())
            };
            for &p in self.pools[t].free_list() {
                mark(p, PageOwner::FreeList)?;
            }
            for (_, n) in self.nodes.iter() {
                for &p in &n.tiers[t].pages {
                    mark(p, PageOwner::Tree)?;
                }
            }
            for &p in outside[t] {
                mark(p, PageOwner::Outside)?;
            }
            if let Some(p) = (1..total).find(|&p| owner[p] == 0) {
                return Err(Violation::PageLeaked {
                    tier,
                    page: p as PageId,
                });
            }
        }
        let mut cached = [0u64; 2];
        let mut locked = [0u64; 2];
        let mut leaves = [0usize; 2];
        for (idx, n) in self.nodes.iter() {
            let id = NodeId {
                idx: idx as u32,
                gen_: self.gens[idx],
            };
            if id == self.root {
                if n.tiers.iter().any(|r| r.present()) {
                    return Err(Violation::RootHoldsPages);
                }
                continue;
            }
            let parent = n.parent.ok_or(Violation::Orphan(id))?;
            if !self.is_live(parent) {
                return Err(Violation::Orphan(id));
            }
            let p = self.node(parent);
            if n.tokens.is_empty() || !n.tokens.len().is_multiple_of(ps) {
                return Err(Violation::Label {
                    node: id,
                    tokens: n.tokens.len(),
                });
            }
            let parent_end = if parent == self.root {
                0
            } else {
                p.end_page(ps)
            };
            if n.start_page != parent_end {
                return Err(Violation::Misplaced {
                    node: id,
                    start_page: n.start_page,
                    parent_end,
                });
            }
            if !p
                .children
                .iter()
                .any(|&(k, c)| c == id && k == page_key(&n.tokens[..ps]))
            {
                return Err(Violation::NotKeyed(id));
            }
            for (t, res) in n.tiers.iter().enumerate() {
                let tier = Tier::ALL[t];
                if res.present() && res.pages.len() != n.pages(ps) as usize {
                    return Err(Violation::TierPages {
                        node: id,
                        tier,
                        held: res.pages.len(),
                        expected: n.pages(ps),
                    });
                }
                if res.present() && parent != self.root && !p.tiers[t].present() {
                    return Err(Violation::TierNotClosed { node: id, tier });
                }
                if res.refs > 0 && parent != self.root && p.tiers[t].refs < res.refs {
                    return Err(Violation::LockedAboveParent { node: id, tier });
                }
                cached[t] += res.pages.len() as u64;
                if res.refs > 0 {
                    locked[t] += res.pages.len() as u64;
                }
                if self.is_leaf(id, tier) != res.lru.is_some() {
                    return Err(Violation::Lru { node: id, tier });
                }
                if let Some(key) = res.lru {
                    if !self.lru[t].contains(&key) {
                        return Err(Violation::Lru { node: id, tier });
                    }
                    leaves[t] += 1;
                }
            }
            // (The reference's pruning leaves such nodes behind: `Policy::Reference`.)
            if !self.policy.keeps_evicted_chains()
                && n.children.is_empty()
                && n.tiers
                    .iter()
                    .all(|r| !r.present() && r.refs == 0 && r.pending == 0)
            {
                return Err(Violation::Zombie(id));
            }
            if !n.page_hashes.is_empty() && n.page_hashes.len() != n.pages(ps) as usize {
                return Err(Violation::PageHashes {
                    node: id,
                    hashes: n.page_hashes.len(),
                    pages: n.pages(ps),
                });
            }
        }
        for (t, tier) in Tier::ALL.into_iter().enumerate() {
            if cached[t] != self.cached_pages[t] || locked[t] != self.locked_pages[t] {
                return Err(Violation::CountersDrifted {
                    tier,
                    cached: [cached[t], self.cached_pages[t]],
                    locked: [locked[t], self.locked_pages[t]],
                });
            }
            if leaves[t] != self.lru[t].len() {
                return Err(Violation::LruSize {
                    tier,
                    entries: self.lru[t].len(),
                    leaves: leaves[t],
                });
            }
        }
        self.with_family(|family, tree| family.check_invariants(tree))
    }
}
