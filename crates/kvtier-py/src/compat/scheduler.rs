//! `Scheduler`: kvtier's scheduler core over its own radix cache (the direct path), with
//! the reference's methods.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kvtier_fsm::{BatchError, SchedError, StateKind};
use kvtier_types::hash::PageHash;
use kvtier_types::{EngineEvent, GroupTable, RequestId, RequestSpec as Spec};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;

use super::config::{RequestSpec, SchedulerConfig, SchedulerStats};
use super::events::{ExecutionEvent, kv_event};
use super::plan::{ExecutionPlan, PlanData};
use crate::errors::sched_error;

/// The scheduler. Built from a `SchedulerConfig` (copied: later changes to it do not
/// reach the scheduler).
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug)]
pub struct Scheduler {
    inner: kvtier_fsm::Scheduler,
    /// Paged-cache groups in kvtier's order, and whether each slides.
    groups: Arc<[(String, bool)]>,
    /// Each live request's group tables as of its last row (hybrid paged models).
    tables: BTreeMap<RequestId, Vec<GroupTable>>,
}

/// Whether a refused event is one the reference ignores without a word: events for
/// requests it does not know, acknowledgements of ops it never issued.
fn ignored_by_reference(error: &SchedError) -> bool {
    matches!(
        error,
        SchedError::UnknownRequest(_) | SchedError::UnknownOp(_)
    )
}

/// The first refusal that the reference would also raise, as its exception.
fn raise_first(result: Result<(), BatchError>) -> PyResult<()> {
    match result {
        Ok(()) => Ok(()),
        Err(batch) => match batch
            .rejected
            .iter()
            .find(|r| !ignored_by_reference(&r.error))
        {
            Some(first) => Err(sched_error(&first.error)),
            None => Ok(()),
        },
    }
}

impl Scheduler {
    fn count(&self, kinds: &[StateKind]) -> usize {
        self.inner.core().count_in(kinds)
    }

    fn group_index(&self, group_id: &str, method: &str) -> PyResult<usize> {
        if self.groups.is_empty() {
            return Err(PyIndexError::new_err(format!(
                "Scheduler::{method}: group_id not configured"
            )));
        }
        self.groups
            .iter()
            .position(|(id, _)| id == group_id)
            .ok_or_else(|| {
                PyIndexError::new_err(format!(
                    "HybridPrefixCache::{method}: group_id not configured"
                ))
            })
    }

    /// The group's pool: total pages, free pages, failed allocations.
    fn group_stats(&mut self, group_id: &str, method: &str) -> PyResult<(u32, u32, u64)> {
        let index = self.group_index(group_id, method)?;
        let stats = self.inner.stats();
        let group = stats
            .groups
            .as_ref()
            .and_then(|report| report.groups.get(index))
            .ok_or_else(|| {
                PyIndexError::new_err(format!("{method}: no counters for {group_id}"))
            })?;
        Ok((group.total_pages, group.free_pages, group.failed_alloc))
    }

    /// Remembers the group tables of the plan's rows, forgets requests that are gone.
    fn keep_tables(&mut self, plan: &kvtier_types::ExecutionPlan) {
        if self.groups.is_empty() {
            return;
        }
        for (i, row) in plan.forward.rows.iter().enumerate() {
            self.tables
                .insert(row.request_id.clone(), plan.forward.groups_of(i).to_vec());
        }
        let core = self.inner.core();
        self.tables.retain(|id, _| core.request_state(id).is_some());
    }
}

#[pymethods]
impl Scheduler {
    #[new]
    #[pyo3(signature = (config=None))]
    fn new(py: Python<'_>, config: Option<PyRef<'_, SchedulerConfig>>) -> PyResult<Self> {
        let config = match config {
            Some(config) => config.to_kvtier(py)?,
            None => SchedulerConfig::new().to_kvtier(py)?,
        };
        let mut groups: Vec<(String, bool)> = config
            .paged
            .iter()
            .flat_map(|p| &p.groups)
            .map(|g| (g.id.clone(), g.is_sliding()))
            .collect();
        groups.sort();
        let inner = kvtier_fsm::Scheduler::new(config).map_err(|e| sched_error(&e))?;
        Ok(Self {
            inner,
            groups: groups.into(),
            tables: BTreeMap::new(),
        })
    }

    /// Queues requests. kvtier refuses (with `ValueError`) a duplicate id, an empty
    /// prompt, a negative token and a prompt larger than the device pool; the others of
    /// the same call are queued all the same.
    fn submit_requests(&mut self, request_specs: Vec<PyRef<'_, RequestSpec>>) -> PyResult<()> {
        let mut specs = Vec::with_capacity(request_specs.len());
        for spec in &request_specs {
            let rolling_hashes = spec
                .rolling_hashes
                .iter()
                .map(|h| PageHash::from_hex(h))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| PyValueError::new_err(format!("request {}: {e}", spec.request_id)))?;
            specs.push(Spec {
                id: spec.request_id.as_str().into(),
                tokens: spec.tokens.clone(),
                rolling_hashes,
                storage_hit_pages: spec.storage_hit_pages.max(0).unsigned_abs(),
            });
        }
        match self.inner.submit(specs) {
            Ok(()) => Ok(()),
            Err(batch) => Err(batch.rejected.first().map_or_else(
                || PyValueError::new_err("refused"),
                |r| sched_error(&r.error),
            )),
        }
    }

    fn next_execution_plan(&mut self) -> ExecutionPlan {
        let plan = self.inner.next_plan();
        self.keep_tables(&plan);
        ExecutionPlan {
            data: Arc::new(PlanData {
                plan,
                groups: Arc::clone(&self.groups),
            }),
        }
    }

    /// Applies the events in order. Events for unknown requests and acknowledgements of
    /// unknown ops are ignored, as the reference ignores them; the first other refusal
    /// raises (the events after it are still applied: kvtier refuses an event without
    /// changing anything, so the others do not depend on it).
    fn advance(&mut self, event: PyRef<'_, ExecutionEvent>) -> PyResult<()> {
        let events: Vec<EngineEvent> = event.events.clone();
        raise_first(self.inner.advance(events))
    }

    /// The KV events (device tier) since the last call; empty unless
    /// `enable_kv_cache_events`.
    fn drain_kv_events(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let mut out = Vec::new();
        for event in self.inner.drain_kv_events() {
            out.extend(kv_event(py, event)?);
        }
        Ok(out)
    }

    fn waiting_size(&self) -> usize {
        self.count(&[StateKind::Submitted])
    }

    fn prefilling_size(&self) -> usize {
        self.count(&[StateKind::Prefilling, StateKind::PrefillDone])
    }

    fn decoding_size(&self) -> usize {
        self.count(&[StateKind::Decoding])
    }

    fn retract_count(&self) -> usize {
        self.count(&[StateKind::Retracting, StateKind::Retracted])
    }

    /// Free device pages (cached pages are not free).
    fn available_kv_pages(&mut self) -> u32 {
        self.inner.available_pages(kvtier_types::Tier::Device)
    }

    /// Distinct device pages of the requests in prefill or decode.
    fn active_kv_pages(&self) -> usize {
        // `occupied_pages` answers for running requests only.
        let core = self.inner.core();
        let mut pages = BTreeSet::new();
        for id in core.request_ids() {
            pages.extend(core.occupied_pages(&id).unwrap_or_default());
        }
        pages.len()
    }

    /// Prompt plus accepted tokens; -1 for an unknown request.
    fn get_request_token_size(&self, id: &str) -> i64 {
        self.inner
            .request_tokens(&id.into())
            .map_or(-1, |n| n as i64)
    }

    /// SHA-256 rolling hashes of the full pages of `input_tokens`; with `apply_match`,
    /// only those of the pages after the prefix readable on host.
    #[pyo3(signature = (input_tokens, apply_match=false))]
    fn calc_rolling_hash(&self, input_tokens: Vec<i32>, apply_match: bool) -> Vec<String> {
        let hashes = self.inner.rolling_hashes(&input_tokens);
        let skip = if apply_match {
            self.inner.cache().probe(&input_tokens).host_pages as usize
        } else {
            0
        };
        hashes.iter().skip(skip).map(PageHash::to_hex).collect()
    }

    /// kvtier's addition: the reference's counters class, filled.
    fn stats(&mut self) -> SchedulerStats {
        let s = self.inner.stats();
        SchedulerStats {
            total_batches: s.plans,
            retract_count: s.retractions,
            abort_count: s.scheduler_aborts,
            prefix_cache_hit_tokens: s.hit_tokens,
            prefix_cache_req_tokens: s.prompt_query_tokens,
            pending_queue_size: s.waiting as u64,
            active_requests: (s.prefilling + s.decoding) as u64,
            ..SchedulerStats::default()
        }
    }

    fn paged_cache_group_ids(&self) -> Vec<String> {
        self.groups.iter().map(|(id, _)| id.clone()).collect()
    }

    fn paged_cache_group_total_pages(&mut self, group_id: &str) -> PyResult<u32> {
        Ok(self.group_stats(group_id, "PagedCacheGroupTotalPages")?.0)
    }

    fn paged_cache_group_available_pages(&mut self, group_id: &str) -> PyResult<u32> {
        Ok(self
            .group_stats(group_id, "PagedCacheGroupAvailablePages")?
            .1)
    }

    fn paged_cache_group_failed_alloc_count(&mut self, group_id: &str) -> PyResult<u64> {
        Ok(self
            .group_stats(group_id, "PagedCacheGroupFailedAllocCount")?
            .2)
    }

    /// The request's pages of the group from its base page, as of its last row.
    fn get_request_paged_cache_page_ids(
        &self,
        request_id: &str,
        group_id: &str,
    ) -> PyResult<Vec<u32>> {
        let g = self.group_index(group_id, "GetRequestPagedCachePageIds")?;
        Ok(self
            .tables
            .get(&RequestId::from(request_id))
            .and_then(|t| t.get(g))
            .map(|t| t.pages.clone())
            .unwrap_or_default())
    }

    /// The request's first held page of the group (0 for full-history groups).
    fn get_request_paged_cache_base_logical_page(
        &self,
        request_id: &str,
        group_id: &str,
    ) -> PyResult<u32> {
        let g = self.group_index(group_id, "GetRequestPagedCacheBaseLogicalPage")?;
        Ok(self
            .tables
            .get(&RequestId::from(request_id))
            .and_then(|t| t.get(g))
            .map_or(0, |t| t.base))
    }
}
