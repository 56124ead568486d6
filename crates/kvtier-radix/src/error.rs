//! The error type of this crate.

use std::fmt;

use kvtier_types::{PageId, Tier};

use crate::NodeId;

/// Errors raised by the radix cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RadixError {
    /// Token count not a multiple of the page size.
    #[error("{tokens} tokens is not a whole number of {page_size}-token pages")]
    Unaligned {
        /// Tokens given.
        tokens: usize,
        /// Page size.
        page_size: u32,
    },
    /// Insert was given a page list that does not cover exactly the new pages.
    #[error(
        "insert of {total} pages with a {prefix}-page prefix needs {expected} pages, got {got}"
    )]
    PageCountMismatch {
        /// Pages of the insert.
        total: u32,
        /// Pages already owned on the path.
        prefix: u32,
        /// Pages that should have been passed.
        expected: u32,
        /// Pages passed.
        got: usize,
    },
    /// The claimed prefix is not resident on the tier.
    #[error("the first {prefix} pages are not all resident on the inserted tier")]
    PrefixNotResident {
        /// Claimed prefix pages.
        prefix: u32,
    },
    /// A node id that no longer names a live node.
    #[error("stale or unknown tree node")]
    StaleNode,
    /// A host lease that is not exactly the host pool's usable pages.
    #[error("the host tier needs a lease of pages 1..={expected}, got {got} pages")]
    HostLease {
        /// Usable host pages of the config.
        expected: u32,
        /// Pages leased.
        got: u32,
    },
    /// A family registered where the cache hosts one already: the Mamba or paged family
    /// its config names, or one registered before (a model has one).
    #[error(
        "cache family {registered:?} registered where {hosted:?} is hosted: a model has one family"
    )]
    TwoFamilies {
        /// The registered family's name.
        registered: &'static str,
        /// The family the cache hosts already.
        hosted: &'static str,
    },
    /// Pages from another pool were passed.
    #[error(transparent)]
    Pool(#[from] kvtier_host::HostError),
    /// The structural check found a broken invariant (a bug, never bad input).
    #[error("radix invariant broken: {0}")]
    Invariant(Violation),
}

/// A broken structural invariant of the radix cache, as found by
/// [`RadixCore::check_invariants`](crate::RadixCore::check_invariants).
///
/// Each variant names the invariant of the crate docs it breaks, with the page or node
/// that shows it, so a failing test says what went wrong without a debugger.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// A page id outside the pool's usable range `1..total`.
    PageOutOfRange {
        /// The pool.
        tier: Tier,
        /// The page.
        page: PageId,
        /// Where it was found.
        owner: PageOwner,
    },
    /// A page found in two places (the second is named).
    PageOwnedTwice {
        /// The pool.
        tier: Tier,
        /// The page.
        page: PageId,
        /// Where it was found the second time.
        owner: PageOwner,
    },
    /// A usable page that is neither free, nor in the tree, nor held outside.
    PageLeaked {
        /// The pool.
        tier: Tier,
        /// The page.
        page: PageId,
    },
    /// The root holds pages.
    RootHoldsPages,
    /// A node other than the root has no parent, or a removed one.
    Orphan(NodeId),
    /// A node's label is empty or not whole pages.
    Label {
        /// The node.
        node: NodeId,
        /// Tokens in its label.
        tokens: usize,
    },
    /// A node does not start where its parent ends.
    Misplaced {
        /// The node.
        node: NodeId,
        /// Its first page.
        start_page: u32,
        /// The page its parent ends at.
        parent_end: u32,
    },
    /// A node is not a child of its parent under the key of its first page.
    NotKeyed(NodeId),
    /// A node's copy on a tier has the wrong number of pages.
    TierPages {
        /// The node.
        node: NodeId,
        /// The tier.
        tier: Tier,
        /// Pages held.
        held: usize,
        /// Pages of its label.
        expected: u32,
    },
    /// A tier present on a node but not on its parent.
    TierNotClosed {
        /// The node.
        node: NodeId,
        /// The tier.
        tier: Tier,
    },
    /// A node locked more than its parent on a tier.
    LockedAboveParent {
        /// The node.
        node: NodeId,
        /// The tier.
        tier: Tier,
    },
    /// A node's leaf status and its LRU membership disagree.
    Lru {
        /// The node.
        node: NodeId,
        /// The tier.
        tier: Tier,
    },
    /// A leaf that holds nothing on any tier (a zombie).
    Zombie(NodeId),
    /// A node with page hashes for a different number of pages.
    PageHashes {
        /// The node.
        node: NodeId,
        /// Hashes held.
        hashes: usize,
        /// Pages of its label.
        pages: u32,
    },
    /// A tier's cached or locked page counters disagree with the tree.
    CountersDrifted {
        /// The tier.
        tier: Tier,
        /// Cached pages counted in the tree, then kept by the counter.
        cached: [u64; 2],
        /// Locked pages counted in the tree, then kept by the counter.
        locked: [u64; 2],
    },
    /// A tier's LRU set size differs from its number of leaves.
    LruSize {
        /// The tier.
        tier: Tier,
        /// Entries in the set.
        entries: usize,
        /// Leaves of the tier.
        leaves: usize,
    },
    /// The recurrent-state family's slots or attachments are inconsistent (hybrid
    /// models): a slot neither free, held, attached nor reserved, or a state off a page
    /// boundary or on a removed node.
    States(String),
    /// A page-group snapshot sits on a removed node, a node without device KV, or off
    /// a multiple of the alignment (window and compressed-state models).
    Snapshot(String),
    /// A registered cache family's own invariant.
    Family {
        /// The family's name.
        family: &'static str,
        /// What it found.
        detail: String,
    },
}

/// Where the invariant check found a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOwner {
    /// The pool's free list.
    FreeList,
    /// A tree node.
    Tree,
    /// Held outside the tree (by a request).
    Outside,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Family { family, detail } => write!(f, "cache family {family}: {detail}"),
            Violation::PageOutOfRange { tier, page, owner } => {
                write!(f, "{tier:?} page {page} out of range ({owner:?})")
            }
            Violation::PageOwnedTwice { tier, page, owner } => {
                write!(f, "{tier:?} page {page} owned twice (last by {owner:?})")
            }
            Violation::PageLeaked { tier, page } => {
                write!(f, "{tier:?} page {page} leaked: neither free nor owned")
            }
            Violation::RootHoldsPages => f.write_str("the root holds pages"),
            Violation::Orphan(node) => write!(f, "{node:?} has no live parent"),
            Violation::Label { node, tokens } => write!(f, "{node:?} label of {tokens} tokens"),
            Violation::Misplaced {
                node,
                start_page,
                parent_end,
            } => write!(
                f,
                "{node:?} starts at page {start_page} under a parent ending at {parent_end}"
            ),
            Violation::NotKeyed(node) => write!(f, "{node:?} not keyed under its parent"),
            Violation::TierPages {
                node,
                tier,
                held,
                expected,
            } => write!(f, "{node:?} holds {held} {tier:?} pages for {expected}"),
            Violation::TierNotClosed { node, tier } => {
                write!(f, "{node:?} on {tier:?} under a parent without it")
            }
            Violation::LockedAboveParent { node, tier } => {
                write!(f, "{node:?} locked on {tier:?} more than its parent")
            }
            Violation::Lru { node, tier } => {
                write!(f, "{node:?} {tier:?} leaf status and LRU entry disagree")
            }
            Violation::Zombie(node) => write!(f, "{node:?} is a resource-less leaf (zombie)"),
            Violation::PageHashes {
                node,
                hashes,
                pages,
            } => {
                write!(f, "{node:?} has {hashes} page hashes for {pages} pages")
            }
            Violation::CountersDrifted {
                tier,
                cached,
                locked,
            } => write!(
                f,
                "{tier:?} counters drifted: cached {} vs {}, locked {} vs {}",
                cached[0], cached[1], locked[0], locked[1]
            ),
            Violation::LruSize {
                tier,
                entries,
                leaves,
            } => write!(
                f,
                "{tier:?} LRU set has {entries} entries for {leaves} leaves"
            ),
            Violation::States(what) => write!(f, "recurrent states: {what}"),
            Violation::Snapshot(what) => write!(f, "page-group snapshot {what}"),
        }
    }
}
