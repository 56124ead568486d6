//! The structural invariant check used by tests and debug builds: page conservation, label
//! shape, tier closure, lock counts, LRU membership and counters.

use kvtier_types::{PageId, Tier};

use super::RadixCache;
use crate::NodeId;
use crate::node::page_key;

impl RadixCache {
    /// Checks the structural invariants. `outside` gives, per tier, the page ids held
    /// outside the tree (request-local pages); with it, page conservation is checked
    /// exactly: every usable page is free, in one node, or held outside, once.
    pub fn check_invariants(&mut self, outside: [&[PageId]; 2]) -> Result<(), String> {
        self.drain_releases();
        let ps = self.page_size;
        for (t, tier) in Tier::ALL.into_iter().enumerate() {
            let total = self.pools[t].total() as usize;
            let mut owner = vec![0u8; total.max(1)];
            let mut mark = |p: PageId, what: &str| -> Result<(), String> {
                let p = p as usize;
                if p == 0 || p >= total {
                    return Err(format!("{tier:?} page {p} out of range ({what})"));
                }
                owner[p] += 1;
                if owner[p] > 1 {
                    return Err(format!("{tier:?} page {p} owned twice (last by {what})"));
                }
                Ok(())
            };
            for &p in self.pools[t].free_list() {
                mark(p, "free list")?;
            }
            for (_, n) in self.nodes.iter() {
                for &p in &n.tiers[t].pages {
                    mark(p, "tree")?;
                }
            }
            for &p in outside[t] {
                mark(p, "outside")?;
            }
            if let Some(p) = (1..total).find(|&p| owner[p] == 0) {
                return Err(format!("{tier:?} page {p} leaked: neither free nor owned"));
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
                    return Err("root holds pages".into());
                }
                continue;
            }
            let parent = n.parent.ok_or("non-root without parent")?;
            if !self.is_live(parent) {
                return Err(format!("{id:?} has a removed parent"));
            }
            let p = self.node(parent);
            if n.tokens.is_empty() || !n.tokens.len().is_multiple_of(ps) {
                return Err(format!("{id:?} label of {} tokens", n.tokens.len()));
            }
            let parent_end = if parent == self.root {
                0
            } else {
                p.end_page(ps)
            };
            if n.start_page != parent_end {
                return Err(format!(
                    "{id:?} starts at page {} under a parent ending at {parent_end}",
                    n.start_page
                ));
            }
            if !p
                .children
                .iter()
                .any(|&(k, c)| c == id && k == page_key(&n.tokens[..ps]))
            {
                return Err(format!("{id:?} not keyed under its parent"));
            }
            for (t, res) in n.tiers.iter().enumerate() {
                if res.present() && res.pages.len() != n.pages(ps) as usize {
                    return Err(format!(
                        "{id:?} tier {t} holds {} pages for {}",
                        res.pages.len(),
                        n.pages(ps)
                    ));
                }
                if res.present() && parent != self.root && !p.tiers[t].present() {
                    return Err(format!("{id:?} tier {t} present under a parent without it"));
                }
                if res.refs > 0 && parent != self.root && p.tiers[t].refs < res.refs {
                    return Err(format!("{id:?} tier {t} locked more than its parent"));
                }
                cached[t] += res.pages.len() as u64;
                if res.refs > 0 {
                    locked[t] += res.pages.len() as u64;
                }
                let tier = Tier::ALL[t];
                if self.is_leaf(id, tier) != res.lru.is_some() {
                    return Err(format!(
                        "{id:?} tier {t} leaf status and LRU entry disagree"
                    ));
                }
                if let Some(key) = res.lru {
                    if !self.lru[t].contains(&key) {
                        return Err(format!("{id:?} tier {t} LRU key missing from the set"));
                    }
                    leaves[t] += 1;
                }
            }
            if n.children.is_empty()
                && n.tiers
                    .iter()
                    .all(|r| !r.present() && r.refs == 0 && r.pending == 0)
            {
                return Err(format!("{id:?} is a resource-less leaf (zombie)"));
            }
            if !n.page_hashes.is_empty() && n.page_hashes.len() != n.pages(ps) as usize {
                return Err(format!(
                    "{id:?} has {} page hashes for {} pages",
                    n.page_hashes.len(),
                    n.pages(ps)
                ));
            }
        }
        for t in 0..2 {
            if cached[t] != self.cached_pages[t] || locked[t] != self.locked_pages[t] {
                return Err(format!(
                    "tier {t} counters drifted: cached {} vs {}, locked {} vs {}",
                    cached[t], self.cached_pages[t], locked[t], self.locked_pages[t]
                ));
            }
            if leaves[t] != self.lru[t].len() {
                return Err(format!(
                    "tier {t} LRU set has {} entries for {} leaves",
                    self.lru[t].len(),
                    leaves[t]
                ));
            }
        }
        Ok(())
    }
}
