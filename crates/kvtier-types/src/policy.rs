//! Whose decisions the scheduler makes where kvtier and the reference scheduler differ,
//! and each difference by name.
//!
//! Every method of [`Policy`] but [`Policy::is_reference`] names one place where the
//! reference's behaviour differs from kvtier's own: kvtier's policy answers `false`, the
//! reference builds answer `true`. The code at each place asks by that name, so the
//! default path reads straight through and a difference is found by its name; the
//! larger paths only the reference takes live in `reference` modules beside the code
//! they alter (`kvtier-radix`: `src/reference.rs`, `src/cache/reference.rs`).

/// Whose decisions the scheduler makes where kvtier and the reference scheduler differ.
///
/// kvtier fixes the reference's known defects (docs/scheduler.md). Some of those fixes
/// change *which* requests run or what gets evicted without any being wrong, so runs
/// cannot be compared decision for decision with the reference. `Reference` keeps the
/// reference's choices there, for conformance runs against it (the hybrid benchmark
/// digests); it never reproduces a defect that loses or corrupts data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Policy {
    /// kvtier's own decisions: exact LRU, read-only probes, transactional eviction,
    /// decode-phase recurrent states cached.
    #[default]
    Default,
    /// The reference's decisions (TokenSpeed scheduler at 350cf505): LRU keys taken when
    /// a node becomes a leaf or is unlocked (a touch alone does not reorder), committing
    /// matches and eviction even for requests that are then not admitted, recurrent
    /// states cached at prefill chunk ends only.
    Reference,
    /// The reference as the PyPI wheel `tokenspeed-scheduler==0.1.0` builds it (what
    /// the drop-in Python module is compared with): [`Policy::Reference`] with the
    /// wheel's later upstream change that alters decisions, #460's detach of
    /// superseded state windows, by the wheel's rule.
    ReferenceWheel,
}

impl Policy {
    /// Whether decisions follow a reference build (either).
    pub fn is_reference(self) -> bool {
        matches!(self, Policy::Reference | Policy::ReferenceWheel)
    }

    // ----- the tree: LRU order, eviction, pruning ---------------------------------------

    /// A leaf is keyed in the LRU order by its node's last access when it becomes a leaf
    /// or is unlocked, and a touch alone does not move it (spec/cache-core.md §5.2).
    /// kvtier re-keys on every touch: exact LRU.
    pub fn keys_leaves_lazily(self) -> bool {
        self.is_reference()
    }

    /// An eviction that cannot make all the room asked for evicts what it can. kvtier's
    /// eviction is transactional: all or nothing.
    pub fn evicts_without_a_fit(self) -> bool {
        self.is_reference()
    }

    /// Nodes evicted together are pruned only from those whose parent survived, so a
    /// chain keeps resource-less nodes below its top (their boundaries decide how later
    /// inserts split). kvtier prunes children first and leaves no such node.
    pub fn keeps_evicted_chains(self) -> bool {
        self.is_reference()
    }

    // ----- admission ----------------------------------------------------------------------

    /// A candidate's match is committed (split, touched) and its room made before it is
    /// known to fit. kvtier probes read-only and checks the need against what can be
    /// freed first, so a refused candidate changes nothing.
    pub fn commits_before_it_fits(self) -> bool {
        self.is_reference()
    }

    /// Room is made for whole fresh pages, ignoring the free slots of the tail page.
    pub fn rooms_whole_pages(self) -> bool {
        self.is_reference()
    }

    /// A paged request's KV room is made before its groups are admitted, and stays when
    /// the groups then refuse. kvtier admits the groups first.
    pub fn admits_groups_after_the_room(self) -> bool {
        self.is_reference()
    }

    /// A decode row's group tables span its own input only (#583), not the whole KV
    /// reserve the engine asked for.
    pub fn groups_span_the_input_only(self) -> bool {
        self.is_reference()
    }

    /// An admission program's group admissions count against the free counts read when
    /// it began (the reference's `InitialSimulatedFree`), refreshed only after a prune.
    /// kvtier reads the live pools.
    pub fn counts_groups_against_the_program(self) -> bool {
        self.is_reference()
    }

    // ----- hybrid (Mamba) admission ---------------------------------------------------------

    /// A hybrid first chunk makes the room the reference's view of its match asks for
    /// (every cached state counted, the host prefix reused past the state), with that
    /// view's terminal locked meanwhile.
    pub fn makes_room_for_its_own_view(self) -> bool {
        self.is_reference()
    }

    /// The room made for a request's state slots spares no source state (the slot may
    /// come back as the row's own), and a request short of slots waits. kvtier keeps the
    /// source and falls back to a shallower state.
    pub fn spares_no_state_source(self) -> bool {
        self.is_reference()
    }

    /// A recovery resumes from the state its search finds, and gives the request up
    /// when it finds none.
    pub fn recovers_from_the_state_it_finds(self) -> bool {
        self.is_reference()
    }

    /// A request's states settle by the reference's rules (recurrent states cached at
    /// prefill chunk ends only).
    pub fn settles_states_as_the_reference(self) -> bool {
        self.is_reference()
    }

    // ----- finish and retraction ------------------------------------------------------------

    /// With prefix reuse off, a finishing request's state goes to the root (its reuse
    /// match ends there).
    pub fn finishes_without_reuse_at_the_root(self) -> bool {
        self.is_reference()
    }

    /// A finishing request's state is cached only when it published pages at the end.
    pub fn caches_a_finish_state_with_pages_only(self) -> bool {
        self.is_reference()
    }

    /// A finish matches (touches) its prefix even when it writes nothing back.
    pub fn matches_every_finished_prefix(self) -> bool {
        self.is_reference()
    }

    /// A publication's terminal is never locked (a retraction locks its path only to
    /// copy it), so releasing such a lock does not re-key the LRU order.
    pub fn never_locks_a_publication(self) -> bool {
        self.is_reference()
    }

    /// A retracted request's state is cached after its write-back, so it has no host
    /// copy. kvtier caches it first and the copy takes it along.
    pub fn caches_a_retracted_state_after_the_copy(self) -> bool {
        self.is_reference()
    }

    /// A retraction that finds no host room aborts its request, states freed; a paged
    /// request too. kvtier keeps a paged request's prefix on device, where its snapshots
    /// make it reusable, and recomputes from there.
    pub fn aborts_a_retraction_without_host_room(self) -> bool {
        self.is_reference()
    }

    /// A retraction whose whole prefix is on host already leaves the device copy cached
    /// for eviction to take (kvtier frees it now), and completes as if its copy were
    /// acknowledged at once: idle device states with host copies go.
    pub fn completes_an_empty_retraction_at_once(self) -> bool {
        self.is_reference()
    }

    // ----- the scheduler's step and events ----------------------------------------------

    /// A hybrid or paged request's chunk is committed (its pages published, its
    /// checkpoint settled, its group tables snapshotted) when its next row is admitted,
    /// so what it computed since its last commit is not cached when it stops. kvtier
    /// commits at the start of the next plan, and at a stop.
    pub fn commits_chunks_at_the_next_row(self) -> bool {
        self.is_reference()
    }

    /// A paged decode row admits and acquires its groups one position further on, as
    /// if the row computed the token after the newest.
    pub fn admits_decode_groups_a_position_on(self) -> bool {
        self.is_reference()
    }

    /// A hybrid request's first decode gets a checkpoint slot (which it never fills);
    /// kvtier gives one to a decode whose new length ends a page.
    pub fn checkpoints_the_first_decode(self) -> bool {
        self.is_reference()
    }

    /// A decode's checkpoint is published only where the prefill-chunk rule says so for
    /// its tokens, and freed otherwise; no older state is retired for it.
    pub fn checkpoints_decodes_by_the_chunk_rule(self) -> bool {
        self.is_reference()
    }

    /// A row's new page-table entries begin at the table's old length, even where a
    /// publication swapped earlier entries (an engine updating its tables incrementally
    /// would miss those); kvtier reports the first changed entry.
    pub fn reports_allocated_pages_only(self) -> bool {
        self.is_reference()
    }

    /// A stopped request's group tables stay until it is forgotten at the next plan.
    pub fn keeps_stopped_tables_to_the_next_plan(self) -> bool {
        self.is_reference()
    }

    /// A request that stops in the batch of its own decode publication hands its lock
    /// to that publication, which the stop then releases.
    pub fn hands_a_finish_lock_to_its_publication(self) -> bool {
        self.is_reference()
    }

    /// A retracted paged request keeps its group tables and resumes as a decode from
    /// them; kvtier recomputes it from its deepest snapshot.
    pub fn resumes_a_retracted_request_from_its_tables(self) -> bool {
        self.is_reference()
    }

    /// The deadlock breaker waits for a fixed point: the second plan in a row with
    /// nothing for the engine and no submission or event in between.
    pub fn breaks_deadlocks_at_a_fixed_point(self) -> bool {
        self.is_reference()
    }

    // ----- the Mamba family's states ------------------------------------------------------

    /// A hybrid match is capped as the reference's search finds states: with no device
    /// match it looks from the host terminal (#612), and without host states its
    /// branching point counts the device tier's KV only.
    pub fn caps_hybrid_matches_by_its_search(self) -> bool {
        self.is_reference()
    }

    /// State leaves are tracked incrementally (direct children only, nothing derived
    /// again on a split), and an eviction follows a leaf's parent in the same pass.
    /// kvtier derives the leaves afresh: states with no device state below.
    pub fn tracks_state_leaves_incrementally(self) -> bool {
        self.is_reference()
    }

    /// Every state whose KV is locked on device is kept from eviction (a running
    /// request's whole path). kvtier keeps only what a row of this plan copies from and
    /// what a write-back reads.
    pub fn pins_every_state_on_a_locked_path(self) -> bool {
        self.is_reference()
    }

    /// A state published on a node that holds one replaces it, and the old slot is
    /// freed at once (where no row of this plan copies it).
    pub fn replaces_a_node_state_at_once(self) -> bool {
        self.is_reference()
    }
}
