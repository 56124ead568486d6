//! Page groups of window and compressed-state models: what a group keeps of a
//! request's history and how its pages map to token positions (spec/hybrid-l3.md
//! §2.1). The family that serves them is `kvtier-paged`; the vocabulary lives here so
//! that the scheduler's configuration can name groups.

use crate::TypesError;

/// What a group keeps of a request's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Retention {
    /// Every page of `[0, prefix)`.
    FullHistory,
    /// Only the pages the last `window` tokens sit on: pages wholly below
    /// `first_pos - window + 1` are released while the request runs.
    SlidingWindow {
        /// Tokens the window spans (positive).
        window: u32,
    },
}

/// Whether a group holds history (what a prefix is made of) or state (what resumes
/// computation at a depth: only its trailing window there matters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum GroupRole {
    /// KV-like history pages.
    #[default]
    History,
    /// Compressor or window state: must slide.
    State,
}

/// The three kinds of group the family serves, derived from retention and role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// A chain of pages over the whole prefix.
    FullHistory,
    /// History pages of a sliding window (a window layer's KV; transport-only until an
    /// adjunct makes it required).
    SlidingHistory,
    /// State pages: only the trailing window at a depth matters.
    State,
}

/// One paged-cache group (the reference's `PagedCacheGroupConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// The group's name (`v4.swa_kv`); groups are ordered by it, byte-wise.
    pub id: String,
    /// Entries per page.
    pub rows_per_page: u32,
    /// Tokens per entry (a compressed group keeps one entry per `stride` tokens).
    pub entry_stride_tokens: u32,
    /// Pool size including the reserved page 0 (usable ids `1..total_pages`).
    pub total_pages: u32,
    /// What the group keeps.
    pub retention: Retention,
    /// History or state.
    pub role: GroupRole,
}

impl GroupSpec {
    /// A full-history group.
    pub fn full_history(id: &str, rows_per_page: u32, stride: u32, total_pages: u32) -> Self {
        Self {
            id: id.to_owned(),
            rows_per_page,
            entry_stride_tokens: stride,
            total_pages,
            retention: Retention::FullHistory,
            role: GroupRole::History,
        }
    }

    /// A sliding-window group of the given role.
    pub fn sliding(
        id: &str,
        rows_per_page: u32,
        stride: u32,
        total_pages: u32,
        window: u32,
        role: GroupRole,
    ) -> Self {
        Self {
            id: id.to_owned(),
            rows_per_page,
            entry_stride_tokens: stride,
            total_pages,
            retention: Retention::SlidingWindow { window },
            role,
        }
    }

    /// Checks the fields: positive geometry, a pool with the dummy page, a positive
    /// window for sliding groups, state groups sliding.
    pub fn validate(&self) -> Result<(), TypesError> {
        let bad = |problem: &str| {
            Err(TypesError::InvalidConfig {
                field: "paged.groups",
                problem: format!("group `{}`: {problem}", self.id),
            })
        };
        if self.id.is_empty() {
            return Err(TypesError::InvalidConfig {
                field: "paged.groups",
                problem: "a group needs a non-empty id".into(),
            });
        }
        if self.rows_per_page == 0 {
            return bad("rows_per_page must be positive");
        }
        if self.entry_stride_tokens == 0 {
            return bad("entry_stride_tokens must be positive");
        }
        if self.total_pages == 0 {
            return bad("total_pages must be at least 1 (page 0 is the reserved dummy)");
        }
        if self
            .rows_per_page
            .checked_mul(self.entry_stride_tokens)
            .is_none()
        {
            return bad("rows_per_page × entry_stride_tokens overflows");
        }
        match (self.retention, self.role) {
            (Retention::SlidingWindow { window: 0 }, _) => {
                bad("a sliding-window group needs a positive window")
            }
            (Retention::FullHistory, GroupRole::State) => {
                bad("a state group must slide (only its trailing window matters)")
            }
            _ => Ok(()),
        }
    }

    /// Tokens one page covers (`rows_per_page × entry_stride_tokens`).
    pub fn tokens_per_page(&self) -> u32 {
        self.rows_per_page * self.entry_stride_tokens
    }

    /// Pages needed to cover `tokens` positions: `ceil(ceil(t / stride) / rows)`.
    pub fn pages_for(&self, tokens: u32) -> u32 {
        tokens
            .div_ceil(self.entry_stride_tokens)
            .div_ceil(self.rows_per_page)
    }

    /// The window, for sliding groups.
    pub fn window(&self) -> Option<u32> {
        match self.retention {
            Retention::SlidingWindow { window } => Some(window),
            Retention::FullHistory => None,
        }
    }

    /// Whether pages leave the table while the request runs.
    pub fn is_sliding(&self) -> bool {
        self.window().is_some()
    }

    /// Its kind.
    pub fn kind(&self) -> GroupKind {
        match (self.retention, self.role) {
            (Retention::FullHistory, _) => GroupKind::FullHistory,
            (Retention::SlidingWindow { .. }, GroupRole::History) => GroupKind::SlidingHistory,
            (Retention::SlidingWindow { .. }, GroupRole::State) => GroupKind::State,
        }
    }

    /// The first page a request still needs when its next token is at `first_pos`:
    /// that token attends the `window - 1` tokens before it, so pages wholly below
    /// `first_pos - window + 1` can go (the bound comes from the op's *first*
    /// position, never its target: spec §2.7). Full-history groups keep everything.
    pub fn first_needed_page(&self, first_pos: u32) -> u32 {
        match self.retention {
            Retention::FullHistory => 0,
            Retention::SlidingWindow { window } => {
                (first_pos + 1).saturating_sub(window) / self.tokens_per_page()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_stride_then_rows() {
        // 64 rows of stride 4: 256 tokens a page (the Python test's 1/256/257 → 1/1/2).
        let g = GroupSpec::full_history("c4a", 64, 4, 10);
        assert_eq!(g.tokens_per_page(), 256);
        assert_eq!(g.pages_for(0), 0);
        assert_eq!(g.pages_for(1), 1);
        assert_eq!(g.pages_for(256), 1);
        assert_eq!(g.pages_for(257), 2);
    }

    #[test]
    fn invalid_groups_are_named() {
        let cases = [
            GroupSpec::full_history("a", 0, 1, 4),
            GroupSpec::full_history("a", 1, 0, 4),
            GroupSpec::full_history("a", 1, 1, 0),
            GroupSpec::sliding("a", 1, 1, 4, 0, GroupRole::History),
            GroupSpec {
                role: GroupRole::State,
                ..GroupSpec::full_history("a", 1, 1, 4)
            },
        ];
        for g in cases {
            let err = g.validate().unwrap_err().to_string();
            assert!(err.contains("group `a`"), "{err}");
        }
        assert!(GroupSpec::full_history("", 1, 1, 4).validate().is_err());
    }

    #[test]
    fn release_bound_uses_the_first_position() {
        let g = GroupSpec::sliding("swa", 1, 1, 16, 4, GroupRole::History);
        // Token 7 attends 4..=7: pages 0..4 can go.
        assert_eq!(g.first_needed_page(7), 4);
        assert_eq!(g.first_needed_page(2), 0);
        assert_eq!(
            GroupSpec::full_history("f", 1, 1, 4).first_needed_page(100),
            0
        );
    }
}
