//! Capacity and eviction: free and evictable pages per tier, transactional `ensure_free`
//! / `can_free`, LRU-order eviction with children-first pruning, and `clear`.

use kvtier_types::Tier;

use super::RadixCore;

impl RadixCore {
    /// Free pages of a tier.
    pub fn available(&mut self, tier: Tier) -> u32 {
        self.pools[tier.index()].available()
    }

    /// Pages of a tier held by the tree and locked by nobody: all of them can be
    /// evicted (a lock on a node also locks its ancestors, so an unlocked node has only
    /// unlocked descendants and falls in a cascade).
    pub fn evictable(&self, tier: Tier) -> u64 {
        let t = tier.index();
        self.cached_pages[t] - self.locked_pages[t]
    }

    /// Makes `need` pages free on `tier`, evicting least recently used leaves, but only
    /// when that can succeed: a failed attempt evicts nothing. (Under `Policy::Reference`
    /// a failed attempt evicts what it can, as the reference does.)
    pub fn ensure_free(&mut self, tier: Tier, need: u32) -> bool {
        self.drain_releases();
        let free = self.pools[tier.index()].available();
        if free >= need {
            return true;
        }
        if !self.policy.evicts_without_a_fit()
            && u64::from(free) + self.evictable(tier) < u64::from(need)
        {
            return false;
        }
        self.evict(tier, need - free);
        self.pools[tier.index()].available() >= need
    }

    /// Whether `ensure_free` would succeed, with `extra_locked` more pages about to be
    /// locked.
    pub fn can_free(&mut self, tier: Tier, need: u32, extra_locked: u32) -> bool {
        self.drain_releases();
        let free = u64::from(self.pools[tier.index()].available());
        free >= u64::from(need)
            || free + self.evictable(tier).saturating_sub(u64::from(extra_locked))
                >= u64::from(need)
    }

    /// Evicts at least `pages` pages from `tier` if possible; returns pages freed.
    fn evict(&mut self, tier: Tier, pages: u32) -> u32 {
        self.clock += 1;
        let t = tier.index();
        let mut freed = 0;
        let mut parked = Vec::new();
        let mut evicted = Vec::new();
        while freed < pages {
            let Some(key) = self.lru[t].pop_first() else {
                break;
            };
            let id = key.2;
            self.node_mut(id).tiers[t].lru = None;
            if self.node(id).tiers[t].refs > 0 {
                parked.push(id);
                continue;
            }
            let pages = self.node(id).tiers[t].pages.len() as u32;
            freed += pages;
            self.evicted_pages[t] += u64::from(pages);
            self.detach(id, tier, true);
            evicted.push(id);
        }
        for id in parked {
            self.update_leaf(id, tier);
        }
        if self.policy.keeps_evicted_chains() {
            self.prune_evicted_chains(&evicted);
            return freed;
        }
        // Children were evicted before their parents: prune in that order, skipping
        // nodes an earlier prune already removed, so no resource-less node is left.
        for id in evicted {
            if self.is_live(id) {
                self.prune_up(id);
            }
        }
        freed
    }

    /// Evicts every unlocked page of both tiers (host first, so nodes fall whole).
    pub fn clear(&mut self) {
        self.drain_releases();
        for tier in [Tier::Host, Tier::Device] {
            let n = self.evictable(tier);
            self.evict(tier, u32::try_from(n).unwrap_or(u32::MAX));
        }
    }
}
