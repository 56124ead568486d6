//! Insert: attaching whole pages of a token sequence on one tier, after a committing walk,
//! planned leaf→root so a contract violation changes nothing.

use kvtier_host::OwnedPages;
use kvtier_types::{Tier, Token};

use super::RadixCore;
use crate::{NodeId, RadixError};

/// Result of an insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertResult {
    /// The node ending at the inserted length.
    pub last_node: NodeId,
    /// Pages newly attached (the rest were duplicates and went back to the pool).
    pub inserted_pages: u32,
}

impl RadixCore {
    /// Inserts whole pages of `tokens` on `tier`. The first `prefix_pages` pages must
    /// already be resident on `tier` along this path (the caller holds a lock there);
    /// `pages` holds exactly the pages for the rest, in order. The first copy wins:
    /// pages duplicating a resident copy go back to the pool.
    pub fn insert(
        &mut self,
        tier: Tier,
        tokens: &[Token],
        prefix_pages: u32,
        pages: OwnedPages,
    ) -> Result<InsertResult, RadixError> {
        self.insert_at(tier, tokens, prefix_pages, pages, None)
    }

    /// [`Self::insert`] whose walk starts at `at`: a live node holding `tokens`' first
    /// `prefix_pages` pages on device (a node the caller holds locked there; device
    /// inserts only). The path
    /// above it is touched as the walk from the root would, without comparing its labels
    /// again.
    pub(crate) fn insert_at(
        &mut self,
        tier: Tier,
        tokens: &[Token],
        prefix_pages: u32,
        pages: OwnedPages,
        at: Option<NodeId>,
    ) -> Result<InsertResult, RadixError> {
        self.drain_releases();
        self.check_aligned(tokens)?;
        let t = tier.index();
        let ps = self.page_size;
        let total = (tokens.len() / ps) as u32;
        let expected = total.saturating_sub(prefix_pages);
        if prefix_pages > total || pages.len() != expected as usize {
            return Err(RadixError::PageCountMismatch {
                total,
                prefix: prefix_pages,
                expected,
                got: pages.len(),
            });
        }
        let mut ids = self.pools[t].adopt(pages)?;
        if total == 0 {
            return Ok(InsertResult {
                last_node: self.root,
                inserted_pages: 0,
            });
        }
        // Walk (splitting and touching), then one new node for whatever remains.
        let start = at.filter(|&n| {
            let valid = tier == Tier::Device
                && self.is_live(n)
                && self.depth_pages(n) == prefix_pages
                && self.node(n).tiers[t].present();
            debug_assert!(
                valid || n == self.root,
                "insert start {n:?} is not the prefix"
            );
            valid
        });
        let (m, mut last, matched) = match start {
            Some(node) => self.walk_from(node, tokens),
            None => self.walk(tokens),
        };
        // The claimed prefix must really be resident on this tier along this path.
        let resident = match tier {
            Tier::Device => m.device_pages,
            Tier::Host => m.host_pages,
        };
        if resident < prefix_pages {
            self.pools[t].free_ids(&ids);
            return Err(RadixError::PrefixNotResident {
                prefix: prefix_pages,
            });
        }
        if matched < total {
            let node = self.new_node(last, tokens[matched as usize * ps..].to_vec(), matched);
            self.add_child(last, node);
            last = node;
        }
        // Plan leaf→root before touching anything, so a contract violation changes nothing.
        let mut plan = Vec::new();
        let mut remaining = total;
        let mut cur = last;
        while cur != self.root && remaining > prefix_pages {
            let n = self.node(cur);
            let lo = remaining - n.pages(ps);
            if n.tiers[t].present() {
                plan.push((cur, false, remaining - lo.max(prefix_pages)));
            } else if lo < prefix_pages {
                self.pools[t].free_ids(&ids);
                self.prune_up(last);
                return Err(RadixError::PrefixNotResident {
                    prefix: prefix_pages,
                });
            } else {
                plan.push((cur, true, n.pages(ps)));
            }
            remaining = lo;
            cur = n.parent.expect("non-root");
        }
        // A copy still being written (pending, not yet valid) may be rolled back: nothing
        // may become readable below it, or a failed write-back would leave a readable
        // copy under a parent without one. Pages for the nodes below go back to the pool
        // (a miss later, never an orphan).
        if let Some(top_pending) = plan.iter().rposition(|&(node, attach, _)| {
            let res = &self.node(node).tiers[t];
            !attach && !res.valid
        }) {
            for step in &mut plan[..top_pending] {
                step.1 = false;
            }
        }
        let mut inserted = 0;
        let mut attached = Vec::new();
        for (node, attach, n) in plan {
            let tail = ids.split_off(ids.len() - n as usize);
            if attach {
                self.attach(node, tier, tail, true);
                inserted += n;
                attached.push(node);
            } else {
                self.pools[t].free_ids(&tail);
            }
        }
        debug_assert!(ids.is_empty());
        self.pools[t].free_ids(&ids);
        // A node made for pages that all went back holds nothing: take it away again.
        let last = self.prune_up(last);
        if self.keep_page_hashes {
            self.ensure_page_hashes(last);
        }
        for &node in attached.iter().rev() {
            self.emit_stored(node, tier.into());
        }
        Ok(InsertResult {
            last_node: last,
            inserted_pages: inserted,
        })
    }
}
