//! RAII node locks.

use kvtier_host::Releaser;
use kvtier_types::Tier;

use crate::NodeId;

/// A lock on one tier of a node and all its ancestors: while it lives, none of those
/// copies is evicted or demoted. Move-only; dropping it sends the release to the cache,
/// which applies it before its next operation. [`crate::RadixCore::unlock`] releases at
/// once.
#[derive(Debug)]
#[must_use = "dropping a lock releases it"]
pub struct NodeLock {
    pub(crate) node: NodeId,
    pub(crate) tier: Tier,
    pub(crate) home: Option<Releaser<(NodeId, Tier)>>,
}

impl NodeLock {
    /// The locked node (deepest node of the locked path).
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The locked tier.
    pub fn tier(&self) -> Tier {
        self.tier
    }
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            home.release((self.node, self.tier));
        }
    }
}
