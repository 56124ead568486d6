//! The reference scheduler's paths in the tree, where [`Policy`](kvtier_types::Policy)
//! names a difference.

use std::collections::BTreeSet;

use super::RadixCore;
use crate::NodeId;

impl RadixCore {
    /// Prunes after an eviction as the reference does: from each evicted node whose
    /// parent survived, so a chain evicted together stays as resource-less nodes below
    /// its top (kept for its node boundaries: they decide how later inserts split).
    pub(super) fn prune_evicted_chains(&mut self, evicted: &[NodeId]) {
        let evicted_set: BTreeSet<NodeId> = evicted.iter().copied().collect();
        for &id in evicted {
            let parent = self.node(id).parent;
            if self.is_live(id) && !parent.is_some_and(|p| evicted_set.contains(&p)) {
                self.prune_up(id);
            }
        }
    }
}
