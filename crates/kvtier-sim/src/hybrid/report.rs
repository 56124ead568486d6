//! What a hybrid run counts and reports (§2).

use std::collections::BTreeMap;

use serde::Serialize;

/// The plan-observable counters of §2.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HybridCounters {
    /// Steps of the loop (flush plans not included).
    pub steps: u64,
    /// Plans of the flush, the last (empty) one included.
    pub flush_plans: u64,
    /// Turns defined.
    pub turns: u64,
    /// Requests that received Finish.
    pub finished: u64,
    /// Turns dropped by the abort rule.
    pub aborted: u64,
    /// Prefill rows.
    pub prefill_rows: u64,
    /// Prefill rows that were a request's first chunk.
    pub first_chunks: u64,
    /// Prefill rows that were not.
    pub later_chunks: u64,
    /// Decode rows, recovery rows included.
    pub decode_rows: u64,
    /// Decode rows that resumed a retracted request.
    pub retract_recover_rows: u64,
    /// Σ input length of prefill rows.
    pub prefill_tokens: u64,
    /// Σ input length of decode rows.
    pub decode_tokens: u64,
    /// Prompt tokens submitted.
    pub prompt_tokens: u64,
    /// Σ extend-prefix length of first chunks.
    pub hit_tokens: u64,
    /// Hit tokens loaded back from host (page size × KV load-back pages in plans with
    /// prefill rows).
    pub host_hit_tokens: u64,
    /// The rest of the hit tokens.
    pub device_hit_tokens: u64,
    /// Load-back ops.
    pub loadback_ops: u64,
    /// KV pages loaded back.
    pub loadback_kv_pages: u64,
    /// State slots loaded back.
    pub loadback_mamba: u64,
    /// Write-back ops.
    pub writeback_ops: u64,
    /// KV pages written back.
    pub writeback_kv_pages: u64,
    /// State slots written back.
    pub writeback_mamba: u64,
    /// Write-back ops of retractions.
    pub retract_writeback_ops: u64,
    /// Their KV pages.
    pub retract_writeback_kv_pages: u64,
    /// Their state slots.
    pub retract_writeback_mamba: u64,
    /// Fewest free device pages after a step.
    pub min_device_free_pages: u64,
    /// Free device pages at the end.
    pub device_free_pages_end: u64,
}

/// One paged group's counters (§2 `groups.<id>.*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GroupCounters {
    /// Pool size, page 0 included.
    pub total_pages: u64,
    /// Free pages at the end.
    pub free_end: u64,
    /// Allocations the pool refused.
    pub failed_alloc: u64,
    /// Usable pages still held at the end (by snapshots).
    pub held_end: u64,
    /// Σ live entries over all rows.
    pub row_pages: u64,
    /// Most live entries of one row.
    pub max_row_pages: u64,
    /// Largest base offset of a row.
    pub max_base_offset: u64,
}

/// The paged-cache family's counters at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PagedCounters {
    /// Snapshots built by commits.
    pub snapshots_created: u64,
    /// Commits that adopted another request's snapshot.
    pub snapshots_adopted: u64,
    /// Terminal snapshots completed with their continuation groups.
    pub terminal_continuations: u64,
    /// Admission prunes of state only.
    pub prune_state_only: u64,
    /// Admission prunes of whole snapshots.
    pub prune_full: u64,
    /// Descendants dropped with them.
    pub prune_cascade: u64,
    /// Snapshots dropped with their node's device KV.
    pub dropped_kv_evict: u64,
    /// Refused group admissions (attempts).
    pub admission_denied: u64,
    /// Superseded state windows detached (#460).
    pub stale_state_detached: u64,
    /// Snapshots held at the end.
    pub snapshots_end: u64,
    /// Requests' group tables still held at the end (0: only snapshots hold pages).
    pub tables_end: u64,
}

/// The result of a hybrid run.
#[derive(Debug, Clone, Serialize)]
pub struct HybridReport {
    /// The variant.
    pub workload: &'static str,
    /// The path the run drove.
    pub path: &'static str,
    /// `default` or `reference`.
    pub policy: &'static str,
    /// The counters.
    #[serde(flatten)]
    pub counters: HybridCounters,
    /// The decision digest (§2): every decision, every state slot, no page id.
    pub digest: String,
    /// The page digest: also device and host page ids.
    pub digest_pages: String,
    /// Paged models: also the groups' page ids (informational, §2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_all: Option<String>,
    /// Paged models: the family's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paged: Option<PagedCounters>,
    /// Paged models: per group, by id.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, GroupCounters>,
    /// Nanoseconds inside the timed calls (`measured_*`, the calls callgrind counts).
    pub measured_ns: u64,
    /// What `cargo xtask bench --callgrind` divides the count by: steps.
    pub callgrind_divisor: u64,
    /// One line per plan (with `record_plans`): its rows (the digest's fields, then the
    /// page table), write-backs (retract flag, KV and state pairs) and load-backs.
    #[serde(skip)]
    pub plans: Vec<String>,
}
