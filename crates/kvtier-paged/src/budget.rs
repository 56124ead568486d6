//! Group pool sizes for a serving budget (TokenSpeed's
//! `compute_paged_cache_group_page_counts`).

use crate::GroupSpec;

/// What a serving configuration lets run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolBudget {
    /// Requests alive at once (`max_batch_size`).
    pub max_live_requests: u32,
    /// Tokens one plan schedules (`max_scheduled_tokens`).
    pub max_scheduled_tokens: u32,
    /// Tokens the device KV pool holds (usable pages × page size).
    pub max_total_tokens: u32,
    /// The longest context.
    pub max_context_len: u32,
    /// Extra pages for sliding groups only (0 in production; H2's `h2-roomy` adds 1024).
    pub sliding_safety_margin: u32,
}

impl PoolBudget {
    /// Pages (dummy page included) for `group`:
    /// * full history: `ceil(total / tpp) + live + 1`;
    /// * sliding: `live · ceil(min(W − 1, ctx) / tpp) + ceil(min(sched, total) / tpp)
    ///   + live + 1` (+ the safety margin), where `tpp` is the group's tokens per page.
    ///
    /// The sliding formula budgets live requests only: pages that snapshots hold are
    /// not in it (the reference's state pools fill up with them, HYBRID-WORKLOADS §4.4).
    pub fn pool_pages(&self, group: &GroupSpec) -> u32 {
        let tpp = group.tokens_per_page();
        let live = self.max_live_requests;
        match group.window() {
            None => self.max_total_tokens.div_ceil(tpp) + live + 1,
            Some(window) => {
                let in_window = window.saturating_sub(1).min(self.max_context_len);
                let scheduled = self.max_scheduled_tokens.min(self.max_total_tokens);
                live * in_window.div_ceil(tpp)
                    + scheduled.div_ceil(tpp)
                    + live
                    + 1
                    + self.sliding_safety_margin
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GroupRole;

    /// The pool sizes of HYBRID-WORKLOADS.md H2 (`h2-main` and `h2-roomy`).
    #[test]
    fn h2_pool_sizes() {
        let main = PoolBudget {
            max_live_requests: 16,
            max_scheduled_tokens: 4096,
            max_total_tokens: 160 * 256,
            max_context_len: 32_768,
            sliding_safety_margin: 0,
        };
        let roomy = PoolBudget {
            sliding_safety_margin: 1024,
            ..main
        };
        let cases = [
            (
                GroupSpec::sliding("v4.swa_kv", 64, 1, 0, 128, GroupRole::State),
                113,
                1137,
            ),
            (
                GroupSpec::sliding("v4.c4a.compressor_state", 4, 1, 0, 8, GroupRole::State),
                1073,
                2097,
            ),
            (
                GroupSpec::full_history("v4.c4a.compressed_kv", 64, 4, 0),
                177,
                177,
            ),
            (
                GroupSpec::sliding("v4.c128a.compressor_state", 8, 1, 0, 128, GroupRole::State),
                785,
                1809,
            ),
            (
                GroupSpec::full_history("v4.c128a.compressed_kv", 2, 128, 0),
                177,
                177,
            ),
        ];
        for (group, main_pages, roomy_pages) in cases {
            assert_eq!(main.pool_pages(&group), main_pages, "{}", group.id);
            assert_eq!(roomy.pool_pages(&group), roomy_pages, "{}", group.id);
        }
    }
}
