//! Tree nodes and their per-tier resources.

use kvtier_types::{PageId, Token, hash::PageHash};

/// Generation-checked id of a tree node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    pub(crate) idx: u32,
    pub(crate) gen_: u32,
}

/// LRU key: logical time, then creation order (deterministic tie-break), then node.
pub(crate) type LruKey = (u64, u64, NodeId);

/// One tier's copy of a node's pages.
#[derive(Debug, Default)]
pub(crate) struct TierRes {
    /// One page id per label page; empty when the tier holds no copy.
    pub pages: Vec<PageId>,
    /// Locks on this tier covering this node (a lock on a node covers its ancestors).
    pub refs: u32,
    /// Present while the node is a leaf of this tier.
    pub lru: Option<LruKey>,
    /// In-flight write-backs filling this host copy (host tier only).
    pub pending: u16,
    /// Whether the copy holds valid data (false while a first write-back is in flight).
    pub valid: bool,
}

impl TierRes {
    #[inline]
    pub fn present(&self) -> bool {
        !self.pages.is_empty()
    }

    /// Present and readable.
    #[inline]
    pub fn usable(&self) -> bool {
        self.valid && !self.pages.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct Node {
    pub parent: Option<NodeId>,
    /// Children keyed by a hash of their first page, sorted by key.
    pub children: Vec<(u64, NodeId)>,
    /// Label: whole pages of tokens.
    pub tokens: Vec<Token>,
    /// Absolute index of the label's first page.
    pub start_page: u32,
    pub tiers: [TierRes; 2],
    /// Creation order, the LRU tie-break.
    pub seq: u64,
    pub last_access: u64,
    /// SHA-256 rolling hash per page (when page hashes are kept).
    pub page_hashes: Vec<PageHash>,
    /// FNV-1a block hash per page (when KV events are on).
    pub block_hashes: Vec<u64>,
}

impl Node {
    #[inline]
    pub fn pages(&self, page_size: usize) -> u32 {
        (self.tokens.len() / page_size) as u32
    }

    #[inline]
    pub fn end_page(&self, page_size: usize) -> u32 {
        self.start_page + self.pages(page_size)
    }
}

/// Hash of a page used as a child key (collisions are resolved by comparing tokens).
#[inline]
pub(crate) fn page_key(page: &[Token]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in page {
        h = (h.rotate_left(5) ^ u64::from(t as u32)).wrapping_mul(0x5851_f42d_4c95_7f2d);
    }
    h
}
