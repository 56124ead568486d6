//! Whether a model may publish a request's prefix while it still runs, and how much of
//! it (spec/hybrid-l3.md §6; the reference's unmerged PR381).
//!
//! Publishing mid-flight lets a sibling reuse a prefix before its first request
//! finishes. It is exact for full attention. For sliding-window attention a reused
//! prefix is exact only while the window still covers it from the start, so a plain
//! window model publishes at most its first `floor(W / P)` pages. A paged hybrid
//! publishes only when its snapshots carry the state a resumed request needs: a
//! required state group that slides. The decision is an explicit flag derived from the
//! model's cache shape: the reference signalled it with a missing pointer, which an
//! always-present hybrid facade silently bypassed (Codex P1 on PR381).

/// The cache shape the gate decides on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheShape {
    /// No sliding window anywhere (full attention, and Mamba hybrids: their states are
    /// published with the pages by their own family).
    NoWindow,
    /// Every attention layer slides over `window` tokens, in the ordinary KV cache.
    /// A window of 0 is how a model is flagged unsafe to publish (sinks, mixed
    /// layers, draft models: gpt-oss, Kimi K2.5).
    PlainWindow {
        /// Tokens the window spans; 0: flagged unsafe.
        window: u32,
    },
    /// A paged-cache hybrid (DeepSeek-V4 style).
    PagedHybrid {
        /// Whether the family runs with a prefix-cache adjunct at all (without one its
        /// groups are transport-only: nothing to publish into).
        adjunct: bool,
        /// Whether a required group is a sliding state group (PR381's V4 setup).
        required_sliding_state: bool,
    },
}

/// The gate's decision: an explicit flag and a cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MidflightGate {
    /// Whether prefixes are published mid-flight at all.
    pub enabled: bool,
    /// The most pages of a request's prefix that may be published mid-flight (`None`:
    /// no cap). Meaningless when disabled.
    pub max_pages: Option<u32>,
}

impl MidflightGate {
    /// Publication off.
    pub const OFF: MidflightGate = MidflightGate {
        enabled: false,
        max_pages: None,
    };
    /// Publication on, uncapped.
    pub const UNCAPPED: MidflightGate = MidflightGate {
        enabled: true,
        max_pages: None,
    };

    /// The gate for a cache shape and KV page size (tokens).
    pub fn for_shape(shape: CacheShape, page_size: u32) -> Self {
        match shape {
            CacheShape::NoWindow => Self::UNCAPPED,
            CacheShape::PlainWindow { window: 0 } => Self::OFF,
            CacheShape::PlainWindow { window } => MidflightGate {
                enabled: true,
                max_pages: Some(window / page_size.max(1)),
            },
            CacheShape::PagedHybrid {
                adjunct: true,
                required_sliding_state: true,
            } => Self::UNCAPPED,
            CacheShape::PagedHybrid { .. } => Self::OFF,
        }
    }

    /// Pages of a prefix of `pages` pages that may be published now.
    pub fn publishable(&self, pages: u32) -> u32 {
        match (self.enabled, self.max_pages) {
            (false, _) => 0,
            (true, None) => pages,
            (true, Some(cap)) => pages.min(cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate table of spec §6, row by row.
    #[test]
    fn the_gate_table() {
        let p = 16;
        assert_eq!(
            MidflightGate::for_shape(CacheShape::NoWindow, p),
            MidflightGate::UNCAPPED
        );
        let plain = MidflightGate::for_shape(CacheShape::PlainWindow { window: 100 }, p);
        assert_eq!(
            plain,
            MidflightGate {
                enabled: true,
                max_pages: Some(6)
            }
        );
        assert_eq!(plain.publishable(4), 4);
        assert_eq!(plain.publishable(9), 6);
        assert_eq!(
            MidflightGate::for_shape(CacheShape::PlainWindow { window: 0 }, p),
            MidflightGate::OFF
        );
        for (adjunct, required_sliding_state, enabled) in [
            (false, false, false),
            (false, true, false),
            (true, false, false),
            (true, true, true),
        ] {
            let gate = MidflightGate::for_shape(
                CacheShape::PagedHybrid {
                    adjunct,
                    required_sliding_state,
                },
                p,
            );
            assert_eq!(
                gate.enabled, enabled,
                "adjunct {adjunct}, state {required_sliding_state}"
            );
            assert_eq!(gate.max_pages, None);
        }
        assert_eq!(MidflightGate::OFF.publishable(10), 0);
    }
}
