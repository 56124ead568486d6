//! Where the cache decides differently from the reference scheduler: one named rule per
//! difference, so the default path reads straight through and each difference is found
//! by its name.
//!
//! kvtier's own policy (`Policy::Default`) answers `false` to every rule; the reference
//! builds (`Policy::Reference`, `Policy::ReferenceWheel`) answer `true`. The larger paths
//! that only the reference takes live in the `reference` modules (`src/reference.rs`,
//! `src/cache/reference.rs`), beside the code they alter. None of these rules lets the
//! reference lose or corrupt data: they change which request runs or what is evicted.

use kvtier_types::Policy;

/// The cache's side of a [`Policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CachePolicy {
    reference: bool,
}

impl CachePolicy {
    pub fn new(policy: Policy) -> Self {
        Self {
            reference: policy.is_reference(),
        }
    }

    // ----- the tree: LRU order, eviction, pruning ---------------------------------------

    /// A leaf is keyed in the LRU order by its node's last access when it becomes a leaf
    /// or is unlocked, and a touch alone does not move it (spec/cache-core.md §5.2).
    /// kvtier re-keys on every touch: exact LRU.
    pub fn keys_leaves_lazily(self) -> bool {
        self.reference
    }

    /// An eviction that cannot make all the room asked for evicts what it can. kvtier's
    /// eviction is transactional: all or nothing.
    pub fn evicts_without_a_fit(self) -> bool {
        self.reference
    }

    /// Nodes evicted together are pruned only from those whose parent survived, so a
    /// chain keeps resource-less nodes below its top (their boundaries decide how later
    /// inserts split). kvtier prunes children first and leaves no such node.
    pub fn keeps_evicted_chains(self) -> bool {
        self.reference
    }

    // ----- admission ----------------------------------------------------------------------

    /// A candidate's match is committed (split, touched) and its room made before it is
    /// known to fit. kvtier probes read-only and checks the need against what can be
    /// freed first, so a refused candidate changes nothing.
    pub fn commits_before_it_fits(self) -> bool {
        self.reference
    }

    /// Room is made for whole fresh pages, ignoring the free slots of the tail page.
    pub fn rooms_whole_pages(self) -> bool {
        self.reference
    }

    /// A paged request's KV room is made before its groups are admitted, and stays when
    /// the groups then refuse. kvtier admits the groups first.
    pub fn admits_groups_after_the_room(self) -> bool {
        self.reference
    }

    /// A decode row's group tables span its own input only (#583), not the whole KV
    /// reserve the engine asked for.
    pub fn groups_span_the_input_only(self) -> bool {
        self.reference
    }

    /// An admission program's group admissions count against the free counts read when
    /// it began (the reference's `InitialSimulatedFree`), refreshed only after a prune.
    /// kvtier reads the live pools.
    pub fn counts_groups_against_the_program(self) -> bool {
        self.reference
    }

    // ----- hybrid (Mamba) admission ---------------------------------------------------------

    /// A hybrid first chunk makes the room the reference's view of its match asks for
    /// (every cached state counted, the host prefix reused past the state), with that
    /// view's terminal locked meanwhile.
    pub fn makes_room_for_its_own_view(self) -> bool {
        self.reference
    }

    /// The room made for a request's state slots spares no source state (the slot may
    /// come back as the row's own), and a request short of slots waits. kvtier keeps the
    /// source and falls back to a shallower state.
    pub fn spares_no_state_source(self) -> bool {
        self.reference
    }

    /// A recovery resumes from the state its search finds, and gives the request up
    /// when it finds none.
    pub fn recovers_from_the_state_it_finds(self) -> bool {
        self.reference
    }

    /// A request's states settle by the reference's rules (recurrent states cached at
    /// prefill chunk ends only).
    pub fn settles_states_as_the_reference(self) -> bool {
        self.reference
    }

    // ----- finish and retraction ------------------------------------------------------------

    /// With prefix reuse off, a finishing request's state goes to the root (its reuse
    /// match ends there).
    pub fn finishes_without_reuse_at_the_root(self) -> bool {
        self.reference
    }

    /// A finishing request's state is cached only when it published pages at the end.
    pub fn caches_a_finish_state_with_pages_only(self) -> bool {
        self.reference
    }

    /// A finish matches (touches) its prefix even when it writes nothing back.
    pub fn matches_every_finished_prefix(self) -> bool {
        self.reference
    }

    /// A publication's terminal is never locked (a retraction locks its path only to
    /// copy it), so releasing such a lock does not re-key the LRU order.
    pub fn never_locks_a_publication(self) -> bool {
        self.reference
    }

    /// A retracted request's state is cached after its write-back, so it has no host
    /// copy. kvtier caches it first and the copy takes it along.
    pub fn caches_a_retracted_state_after_the_copy(self) -> bool {
        self.reference
    }

    /// A retraction that finds no host room aborts its request, states freed; a paged
    /// request too. kvtier keeps a paged request's prefix on device, where its snapshots
    /// make it reusable, and recomputes from there.
    pub fn aborts_a_retraction_without_host_room(self) -> bool {
        self.reference
    }

    /// A retraction whose whole prefix is on host already leaves the device copy cached
    /// for eviction to take (kvtier frees it now), and completes as if its copy were
    /// acknowledged at once: idle device states with host copies go.
    pub fn completes_an_empty_retraction_at_once(self) -> bool {
        self.reference
    }
}
