//! The seam between the radix cache and the cache family it hosts.
//!
//! A model keeps one family of per-prefix state beside its KV pages: nothing more (full
//! attention), recurrent states on nodes (Mamba hybrids), page-group snapshots on nodes
//! (window and compressed-state models), or a family registered by its user
//! ([`RadixCore::hosting`]). The cache lends its family the tree at every hook: it tells
//! it of each change to the tree ([`TreeEvent`]), of each step and each acknowledged
//! copy, asks it for its counters and invariants, and, at admission, how deep a match it
//! can resume from and what a request needs of it.
//!
//! The built-in families are matched by variant (static dispatch, no allocation for a
//! dense model); a registered one is called through the trait object.

use std::fmt;

use kvtier_host::Lease;
use kvtier_mamba::MambaFamily;
use kvtier_paged::PagedFamily;
use kvtier_types::{Tier, TransferPair};

use super::{CacheConfig, Match, RadixCore, TreeStats};
use crate::{NodeId, RadixError, Violation};

/// One family of per-prefix state a radix cache hosts beside its KV.
///
/// Every hook has a default that does nothing, so a family implements only what it
/// keeps. The request-side hooks (`cap_match` … `release`) are those of the admission
/// skeleton; the built-in Mamba and paged families run their own admission, which
/// reproduces the reference scheduler's order step by step (`hybrid.rs`, `paged.rs`).
pub trait CacheFamily: fmt::Debug + Send + Sync {
    /// Its name, in errors and reports.
    fn name(&self) -> &'static str;

    // ----- per step ----------------------------------------------------------------

    /// An admission program begins; `released`: requests finished since the last one.
    fn begin_plan(&mut self, _tree: &RadixCore, _released: bool) {}

    /// Write-back acknowledgements were applied: copies now readable elsewhere may go.
    fn copies_settled(&mut self, _tree: &RadixCore) {}

    // ----- a request's part ---------------------------------------------------------

    /// Caps a first chunk's KV match at the depth the family can resume from.
    fn cap_match(&mut self, _tree: &RadixCore, m: Match) -> Match {
        m
    }

    /// Makes room for one more request's part (the KV room is made and `m` locked):
    /// `false` when it cannot, and the request waits.
    fn reserve(&mut self, _tree: &RadixCore, _m: &Match) -> bool {
        true
    }

    /// Gives an admitted request its part, room for it made: the family's number for it.
    fn grant(&mut self, _tree: &RadixCore) -> u32 {
        0
    }

    /// A running request's next `tokens`: `false` when its part cannot grow, and it waits.
    fn grow(&mut self, _tree: &RadixCore, _request: u32, _tokens: u32) -> bool {
        true
    }

    /// A request stops (finishes or is retracted) with its prefix published up to
    /// `terminal`; `publish` false where the policy keeps nothing of it.
    fn settle(&mut self, _tree: &RadixCore, _request: u32, _terminal: NodeId, _publish: bool) {}

    /// A request's part comes back without a publication (its lease was dropped).
    fn release(&mut self, _request: u32) {}

    // ----- the tree and its copies ----------------------------------------------------

    /// A change to the tree, heard before the next one.
    fn on_tree_event(&mut self, _tree: &RadixCore, _event: TreeEvent) {}

    /// `nodes` are being copied to host: the family's copies that go with them, and the
    /// nodes whose acknowledgement it waits for.
    fn prepare_write_back(
        &mut self,
        _tree: &RadixCore,
        _nodes: &[NodeId],
    ) -> (Vec<TransferPair>, Vec<NodeId>) {
        (Vec::new(), Vec::new())
    }

    /// The copies prepared for `nodes` landed (`success`) or failed.
    fn write_back_done(&mut self, _tree: &RadixCore, _nodes: &[NodeId], _success: bool) {}

    // ----- observation ----------------------------------------------------------------

    /// Fills the family's part of the tree's counters.
    fn report(&mut self, _tree: &RadixCore, _stats: &mut TreeStats) {}

    /// The family's own invariants against the tree.
    fn check_invariants(&mut self, _tree: &RadixCore) -> Result<(), Violation> {
        Ok(())
    }
}

/// A change to the tree that a family may hold state on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeEvent {
    /// A node's KV left `tier`: `evicted` when it went for room (or a failed load-back),
    /// not when a copy readable elsewhere was demoted or a failed copy rolled back.
    KvLeft {
        node: NodeId,
        tier: Tier,
        evicted: bool,
    },
    /// A node's device KV is about to be demoted (its host copy stays).
    Demoting(NodeId),
    /// A node is about to be removed.
    Removing(NodeId),
    /// A node was split: `prefix` is new, `suffix` keeps its id and what it held.
    Split { prefix: NodeId, suffix: NodeId },
}

/// Full attention: KV only, nothing beside it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dense;

impl CacheFamily for Dense {
    fn name(&self) -> &'static str {
        "dense"
    }
}

/// The cache family a tree hosts: a model has one (`SchedulerConfig::validate` refuses
/// a Mamba family beside paged groups). Boxed, so that lending a family the tree it
/// reads moves a pointer, not the family.
#[derive(Debug)]
pub(crate) enum Hosted {
    /// Full attention: KV only.
    Dense,
    /// The recurrent states attached to nodes (hybrid models).
    Mamba(Box<MambaFamily<NodeId>>),
    /// The page-group snapshots attached to nodes (window and compressed-state models).
    Paged(Box<PagedFamily<NodeId>>),
    /// A family its user registered ([`RadixCore::hosting`]).
    Registered(Box<dyn CacheFamily>),
}

impl Hosted {
    /// The family a cache config asks for; an invalid one hosts none.
    pub(super) fn of(config: &CacheConfig) -> Self {
        use kvtier_types::Policy;
        if let Some(m) = config.mamba {
            debug_assert!(config.paged.is_none(), "a model has one family");
            let family = MambaFamily::new(m);
            debug_assert!(family.is_ok(), "an invalid Mamba config: {family:?}");
            return family.map_or(Hosted::Dense, |family| Hosted::Mamba(Box::new(family)));
        }
        let Some(adjunct) = config.paged.clone() else {
            return Hosted::Dense;
        };
        let aligned = adjunct.alignment().is_multiple_of(config.page_size.max(1));
        debug_assert!(aligned, "snapshots off page boundaries: {adjunct:?}");
        if !aligned {
            return Hosted::Dense;
        }
        // Superseded state windows (#460): kvtier detaches them by its own rule, the
        // 0.1.0 wheel by its, the reference at 350cf505 not at all.
        Hosted::Paged(Box::new(match config.policy {
            // kvtier pins a snapshot only by the locks that may read it.
            Policy::Default => PagedFamily::new(adjunct, true).pinned_by_own_locks(),
            Policy::ReferenceWheel => PagedFamily::new(adjunct, false).detaching_as_the_wheel(),
            Policy::Reference => PagedFamily::new(adjunct, false),
        }))
    }
}

/// A running request's part of a registered family. Move-only; dropping it sends the
/// part back to the family ([`CacheFamily::release`]) before the cache's next operation.
#[derive(Debug)]
#[must_use = "dropping the lease releases the request's part of the family"]
pub struct FamilyLease(Lease<u32>);

impl FamilyLease {
    /// The family's number for the request.
    pub fn request(&self) -> u32 {
        self.0.get()
    }

    /// The number, the lease disarmed: its part is settled instead of released.
    pub(crate) fn settle(self) -> u32 {
        self.0.into_inner()
    }
}

impl RadixCore {
    /// The cache, hosting `family`, registered by its user, beside its KV (its config
    /// names no built-in family: a model has one).
    pub fn hosting(mut self, family: Box<dyn CacheFamily>) -> Result<Self, RadixError> {
        if !matches!(self.family, Hosted::Dense) {
            return Err(RadixError::TwoFamilies {
                registered: family.name(),
                hosted: self.with_family(|hosted, _| hosted.name()),
            });
        }
        self.family = Hosted::Registered(family);
        Ok(self)
    }

    /// Whether the tree hosts a registered family.
    pub(crate) fn has_registered(&self) -> bool {
        matches!(self.family, Hosted::Registered(_))
    }

    /// Runs `hook` on the hosted family with the tree lent to it (`Dense` for a dense
    /// model, which the hooks leave alone).
    #[inline]
    pub(crate) fn with_family<R>(
        &mut self,
        hook: impl FnOnce(&mut dyn CacheFamily, &RadixCore) -> R,
    ) -> R {
        if let Hosted::Dense = self.family {
            return hook(&mut Dense, self);
        }
        let mut family = std::mem::replace(&mut self.family, Hosted::Dense);
        let result = match &mut family {
            Hosted::Dense => hook(&mut Dense, self),
            Hosted::Mamba(f) => hook(f.as_mut(), self),
            Hosted::Paged(f) => hook(f.as_mut(), self),
            Hosted::Registered(f) => hook(f.as_mut(), self),
        };
        self.family = family;
        result
    }

    /// Tells the family of a change to the tree.
    #[inline]
    pub(super) fn tree_event(&mut self, event: TreeEvent) {
        self.with_family(|family, tree| family.on_tree_event(tree, event));
    }

    /// Hands a registered family's request part out as a lease.
    pub(crate) fn lease(&mut self, request: u32) -> FamilyLease {
        FamilyLease(Lease::new(request, self.family_releases.releaser()))
    }

    /// Gives dropped leases' parts back to the registered family.
    pub(super) fn drain_family_releases(&mut self) {
        self.with_family(|family, tree| {
            tree.family_releases
                .drain(|request| family.release(request));
        });
    }
}
