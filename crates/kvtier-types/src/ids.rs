//! Identifiers shared across the workspace.

use std::fmt;
use std::sync::Arc;

/// A token id. Engines use `-1` as a placeholder (shifted input ids, decode input ids).
pub type Token = i32;

/// Id of one page in a physical page pool (device or host). Page 0 is reserved in every pool.
pub type PageId = u32;

/// Request-pool slot (the engine's per-request row index). Slot 0 is reserved.
pub type SlotId = u32;

/// Id of an asynchronous cache operation (write-back, load-back, prefetch, backup).
/// One counter shared by every kind, starting at 1.
pub type OpId = u32;

/// A memory tier of the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// L1: accelerator memory.
    Device,
    /// L2: host DRAM.
    Host,
}

impl Tier {
    /// Both tiers, device first.
    pub const ALL: [Tier; 2] = [Tier::Device, Tier::Host];

    /// Index for per-tier arrays.
    #[inline]
    pub const fn index(self) -> usize {
        match self {
            Tier::Device => 0,
            Tier::Host => 1,
        }
    }

    /// The other tier.
    #[inline]
    pub const fn other(self) -> Tier {
        match self {
            Tier::Device => Tier::Host,
            Tier::Host => Tier::Device,
        }
    }
}

/// Request id. Cheap to clone (shared string); ordered by its bytes, which is the
/// scheduler's tie-break order between requests of the same priority class.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// Creates an id from any string.
    pub fn new(id: impl AsRef<str>) -> Self {
        Self(Arc::from(id.as_ref()))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for RequestId {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for RequestId {
    fn from(s: String) -> Self {
        Self(Arc::from(s))
    }
}

impl std::borrow::Borrow<str> for RequestId {
    fn borrow(&self) -> &str {
        &self.0
    }
}
