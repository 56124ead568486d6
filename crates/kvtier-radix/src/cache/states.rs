//! The recurrent-state family hosted on the tree (hybrid models): the radix cache owns
//! the Mamba family's slot pools and tells it of every change to a node that holds a
//! state (KV evicted, demoted, node removed). Admission needs the KV tree and the states
//! on its nodes in one place: each decision depends on both as the candidates before it
//! left them (docs/mamba.md).

use kvtier_mamba::{MambaFamily, SlotId, StateTree};
use kvtier_types::{Tier, Token, TransferPair};

use super::{CacheFamily, Hosted, RadixCore, TreeEvent, TreeStats};
use crate::{NodeId, Violation};

/// The recurrent states' hooks: a state cannot be reused without the KV of its prefix,
/// so it goes with that KV (a demoted device state only where a host copy stays).
impl CacheFamily for MambaFamily<NodeId> {
    fn name(&self) -> &'static str {
        "mamba"
    }

    fn begin_plan(&mut self, tree: &RadixCore, released: bool) {
        MambaFamily::begin_plan(self);
        if released {
            self.demote_idle(tree);
        }
    }

    fn copies_settled(&mut self, tree: &RadixCore) {
        self.demote_idle(tree);
    }

    fn on_tree_event(&mut self, tree: &RadixCore, event: TreeEvent) {
        match event {
            TreeEvent::KvLeft {
                node,
                tier: Tier::Device,
                evicted: true,
            } => self.on_device_evicted(tree, node),
            TreeEvent::KvLeft {
                node,
                tier: Tier::Host,
                evicted: true,
            } => self.on_host_evicted(node),
            TreeEvent::Demoting(node) => self.on_device_demoted(tree, node),
            TreeEvent::Removing(node) => self.on_node_removed(tree, node),
            // A split keeps the node, and so its state, on the suffix.
            TreeEvent::KvLeft { .. } | TreeEvent::Split { .. } => {}
        }
    }

    fn prepare_write_back(
        &mut self,
        tree: &RadixCore,
        nodes: &[NodeId],
    ) -> (Vec<TransferPair>, Vec<NodeId>) {
        MambaFamily::prepare_write_back(self, tree, nodes)
    }

    fn write_back_done(&mut self, tree: &RadixCore, nodes: &[NodeId], success: bool) {
        MambaFamily::write_back_done(self, tree, nodes, success);
    }

    fn report(&mut self, _tree: &RadixCore, stats: &mut TreeStats) {
        stats.states = Some(self.stats());
    }

    fn check_invariants(&mut self, tree: &RadixCore) -> Result<(), Violation> {
        MambaFamily::check_invariants(self, tree, |node| tree.is_live(node))
            .map_err(|e| Violation::States(e.to_string()))
    }
}

impl StateTree for RadixCore {
    fn children(&self, node: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.node(node).children.iter().map(|&(_, c)| c)
    }

    fn on_device(&self, node: NodeId) -> bool {
        self.node(node).tiers[0].present()
    }

    fn host_locked(&self, node: NodeId) -> bool {
        let h = &self.node(node).tiers[1];
        h.present() && h.refs > 0
    }

    fn index(&self, node: NodeId) -> usize {
        node.idx as usize
    }

    fn index_bound(&self) -> usize {
        self.gens.len()
    }
}

impl RadixCore {
    /// Whether the tree hosts a recurrent-state family.
    pub fn has_states(&self) -> bool {
        matches!(self.family, Hosted::Mamba(_))
    }

    /// Runs `f` on the state family with the tree to read; `None` without a family.
    pub fn with_states<R>(
        &mut self,
        f: impl FnOnce(&mut MambaFamily<NodeId>, &RadixCore) -> R,
    ) -> Option<R> {
        let mut family = match std::mem::replace(&mut self.family, Hosted::Dense) {
            Hosted::Mamba(family) => family,
            other => {
                self.family = other;
                return None;
            }
        };
        let result = f(&mut family, self);
        self.family = Hosted::Mamba(family);
        Some(result)
    }

    /// The state family, read-only.
    pub fn states(&self) -> Option<&MambaFamily<NodeId>> {
        match &self.family {
            Hosted::Mamba(family) => Some(family.as_ref()),
            _ => None,
        }
    }

    /// The states cached along the longest cached prefix of `tokens` (nodes matched
    /// whole), root first, without touching anything: each node's depth in pages and its
    /// device and host state slots. Empty without a state family.
    pub fn cached_states(&self, tokens: &[Token]) -> Vec<CachedState> {
        let Some(family) = self.states() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut pages = 0;
        for (node, matched) in self.cached_path(tokens) {
            if matched < self.node(node).pages(self.page_size) as usize {
                break;
            }
            pages += matched as u32;
            let (device, host) = (family.device_slot(node), family.host_slot(node));
            if device.is_some() || host.is_some() {
                out.push(CachedState {
                    pages,
                    device,
                    host,
                });
            }
        }
        out
    }
}

/// A state cached on a node (see [`RadixCore::cached_states`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachedState {
    /// The node's depth in pages: the state follows that many pages of tokens.
    pub pages: u32,
    /// Its device state slot.
    pub device: Option<SlotId>,
    /// Its host state slot.
    pub host: Option<SlotId>,
}
