//! `SchedulerConfig`, `RequestSpec`, the paged-cache group configuration and
//! `SchedulerStats`, with the reference's field names and defaults, and their
//! translation into kvtier's configuration.

use kvtier_types::{GroupRole, GroupSpec, MambaSettings, PagedSettings, Policy, Retention};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::{enum_member, enum_value};

/// The reference's configuration: every field read/write, the reference's defaults
/// (zero sizes included: an engine sets them).
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug)]
pub struct SchedulerConfig {
    #[pyo3(get, set)]
    page_size: i32,
    #[pyo3(get, set)]
    max_scheduled_tokens: i32,
    #[pyo3(get, set)]
    max_batch_size: i32,
    #[pyo3(get, set)]
    decode_input_tokens: i32,
    #[pyo3(get, set)]
    overlap_schedule_depth: i32,
    role: i32,
    #[pyo3(get, set)]
    num_device_pages: i32,
    #[pyo3(get, set)]
    num_host_pages: i32,
    groups: Vec<Py<PagedCacheGroupConfig>>,
    adjunct: Option<Py<PrefixCacheAdjunctSpec>>,
    #[pyo3(get, set)]
    disable_l2_cache: bool,
    #[pyo3(get, set)]
    enable_l3_storage: bool,
    #[pyo3(get, set)]
    prefetch_threshold: i32,
    #[pyo3(get, set)]
    enable_kv_cache_events: bool,
    #[pyo3(get, set)]
    enable_mixed_prefill_decode: bool,
    #[pyo3(get, set)]
    disable_prefix_cache: bool,
    #[pyo3(get, set)]
    enable_mamba: bool,
    #[pyo3(get, set)]
    mamba_cache_chunk_size: i32,
    #[pyo3(get, set)]
    mamba_pool_total_chunks: i32,
    #[pyo3(get, set)]
    enable_mamba_l2: bool,
    #[pyo3(get, set)]
    mamba_l2_host_slots: i32,
    /// kvtier's own field: `"reference"` (the default here) makes the reference's choices
    /// where kvtier's differ without either being wrong, as the 0.1.0 module this one
    /// replaces makes them (`Policy::ReferenceWheel`); `"kvtier"` makes kvtier's (exact
    /// LRU, read-only probes, transactional eviction).
    #[pyo3(get)]
    kvtier_policy: String,
}

#[pymethods]
impl SchedulerConfig {
    #[new]
    pub fn new() -> Self {
        Self {
            page_size: 0,
            max_scheduled_tokens: 0,
            max_batch_size: 0,
            decode_input_tokens: 1,
            overlap_schedule_depth: 0,
            role: 2,
            num_device_pages: 0,
            num_host_pages: 0,
            groups: Vec::new(),
            adjunct: None,
            disable_l2_cache: false,
            enable_l3_storage: false,
            prefetch_threshold: 4,
            enable_kv_cache_events: false,
            enable_mixed_prefill_decode: false,
            disable_prefix_cache: false,
            enable_mamba: false,
            mamba_cache_chunk_size: 64,
            mamba_pool_total_chunks: 0,
            enable_mamba_l2: false,
            mamba_l2_host_slots: 0,
            kvtier_policy: "reference".into(),
        }
    }

    /// `SchedulerConfig.Role`, the disaggregation role enum.
    #[classattr]
    #[pyo3(name = "Role")]
    fn role_enum(py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(super::enum_class(py, "Role")?.unbind())
    }

    #[getter]
    fn role(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        enum_member(py, "Role", self.role)
    }

    #[setter]
    fn set_role(&mut self, role: &Bound<'_, PyAny>) -> PyResult<()> {
        self.role = enum_value(role, "Role")?;
        Ok(())
    }

    /// The groups themselves (not copies): `cfg.paged_cache_groups[0].total_pages = 9`
    /// changes the configuration, `cfg.paged_cache_groups.append(g)` does not.
    #[getter]
    fn paged_cache_groups(&self, py: Python<'_>) -> Vec<Py<PagedCacheGroupConfig>> {
        self.groups.iter().map(|g| g.clone_ref(py)).collect()
    }

    /// Copies the groups in.
    #[setter]
    fn set_paged_cache_groups(
        &mut self,
        py: Python<'_>,
        groups: Vec<PyRef<'_, PagedCacheGroupConfig>>,
    ) -> PyResult<()> {
        self.groups = groups
            .iter()
            .map(|g| Py::new(py, (**g).clone()))
            .collect::<PyResult<_>>()?;
        Ok(())
    }

    #[getter]
    fn prefix_cache_adjunct(&self, py: Python<'_>) -> Option<Py<PrefixCacheAdjunctSpec>> {
        self.adjunct.as_ref().map(|a| a.clone_ref(py))
    }

    #[setter]
    fn set_prefix_cache_adjunct(
        &mut self,
        py: Python<'_>,
        adjunct: Option<PyRef<'_, PrefixCacheAdjunctSpec>>,
    ) -> PyResult<()> {
        self.adjunct = adjunct.map(|a| Py::new(py, (*a).clone())).transpose()?;
        Ok(())
    }

    #[setter]
    fn set_kvtier_policy(&mut self, policy: String) -> PyResult<()> {
        match policy.as_str() {
            "reference" | "kvtier" => {
                self.kvtier_policy = policy;
                Ok(())
            }
            _ => Err(PyValueError::new_err(format!(
                "kvtier_policy must be \"reference\" or \"kvtier\", not {policy:?}"
            ))),
        }
    }
}

fn non_negative(value: i32, field: &'static str) -> PyResult<u32> {
    u32::try_from(value).map_err(|_| {
        PyValueError::new_err(format!("SchedulerConfig.{field} must be >= 0, not {value}"))
    })
}

impl SchedulerConfig {
    /// kvtier's configuration for this one, checked the way the reference's constructor
    /// checks it (same messages), then by kvtier's validation.
    pub fn to_kvtier(&self, py: Python<'_>) -> PyResult<kvtier_types::SchedulerConfig> {
        if self.decode_input_tokens < 0 {
            return Err(PyValueError::new_err(
                "Scheduler: decode_input_tokens must be >= 0",
            ));
        }
        if !matches!(self.overlap_schedule_depth, 0 | 1) {
            return Err(PyValueError::new_err(
                "Scheduler: overlap_schedule_depth must be 0 or 1",
            ));
        }
        if self.overlap_schedule_depth == 1 && self.decode_input_tokens == 0 {
            return Err(PyValueError::new_err(
                "Scheduler: overlapped decode requires decode_input_tokens > 0",
            ));
        }
        let mut groups = Vec::with_capacity(self.groups.len());
        for group in &self.groups {
            let group = group.borrow(py);
            group.validate()?;
            if groups.iter().any(|g: &GroupSpec| g.id == group.group_id) {
                return Err(PyValueError::new_err(format!(
                    "HybridPrefixCache::RegisterPagedCacheGroup: duplicate group_id: {}",
                    group.group_id
                )));
            }
            groups.push(group.to_kvtier()?);
        }
        let required = match &self.adjunct {
            None => Vec::new(),
            Some(adjunct) => {
                let required = adjunct.borrow(py).required_groups.clone();
                if required.is_empty() {
                    return Err(PyValueError::new_err(
                        "Scheduler: prefix_cache_adjunct.required_groups must be non-empty",
                    ));
                }
                if let Some(missing) = required
                    .iter()
                    .find(|r| !groups.iter().any(|g| &&g.id == r))
                {
                    return Err(PyValueError::new_err(format!(
                        "Scheduler: prefix_cache_adjunct required group_id '{missing}' not found in paged_cache_groups"
                    )));
                }
                required
            }
        };
        let role = match self.role {
            2 => kvtier_types::Role::Fused,
            0 => kvtier_types::Role::Prefill,
            _ => kvtier_types::Role::Decode,
        };
        let host_pages = non_negative(self.num_host_pages, "num_host_pages")?;
        // The reference: a host pool of fewer than two pages (page 0 is reserved) is no
        // L2 at all, and L3 rides on L2.
        let host_tier = host_pages >= 2;
        let mamba = (self.enable_mamba && self.mamba_pool_total_chunks > 0)
            .then(|| -> PyResult<MambaSettings> {
                Ok(MambaSettings {
                    device_slots: non_negative(
                        self.mamba_pool_total_chunks,
                        "mamba_pool_total_chunks",
                    )?,
                    host_slots: if self.enable_mamba_l2 && host_tier && !self.disable_l2_cache {
                        non_negative(self.mamba_l2_host_slots, "mamba_l2_host_slots")?
                    } else {
                        0
                    },
                    chunk: non_negative(self.mamba_cache_chunk_size, "mamba_cache_chunk_size")?,
                })
            })
            .transpose()?;
        Ok(kvtier_types::SchedulerConfig {
            page_size: non_negative(self.page_size, "page_size")?,
            device_pages: non_negative(self.num_device_pages, "num_device_pages")?,
            host_pages: if host_tier { host_pages } else { 0 },
            max_scheduled_tokens: non_negative(self.max_scheduled_tokens, "max_scheduled_tokens")?,
            max_batch_size: non_negative(self.max_batch_size, "max_batch_size")?,
            decode_input_tokens: non_negative(self.decode_input_tokens, "decode_input_tokens")?,
            disable_l2_cache: self.disable_l2_cache || !host_tier,
            enable_l3_storage: self.enable_l3_storage && host_tier,
            prefetch_threshold: non_negative(self.prefetch_threshold, "prefetch_threshold")?,
            enable_kv_cache_events: self.enable_kv_cache_events,
            enable_mixed_prefill_decode: self.enable_mixed_prefill_decode,
            role,
            disable_prefix_cache: self.disable_prefix_cache,
            // 0.1.0 publishes a plain model's prefix at finish (and retraction) only.
            publish_prefix_mid_flight: false,
            policy: if self.kvtier_policy == "kvtier" {
                Policy::Default
            } else {
                Policy::ReferenceWheel
            },
            mamba,
            paged: (!groups.is_empty()).then_some(PagedSettings { groups, required }),
            ..kvtier_types::SchedulerConfig::default()
        })
    }
}

/// One request: id, prompt, and what the engine found in L3 for it.
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug, Clone, Default)]
pub struct RequestSpec {
    #[pyo3(get, set)]
    pub request_id: String,
    #[pyo3(get, set)]
    pub tokens: Vec<i32>,
    #[pyo3(get, set)]
    pub rolling_hashes: Vec<String>,
    #[pyo3(get, set)]
    pub storage_hit_pages: i32,
}

#[pymethods]
impl RequestSpec {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// The groups a reusable prefix needs.
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug, Clone, Default)]
pub struct PrefixCacheAdjunctSpec {
    #[pyo3(get, set)]
    required_groups: Vec<String>,
}

#[pymethods]
impl PrefixCacheAdjunctSpec {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// One paged-cache group (sliding window, compressed state, ...).
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug, Clone, Default)]
pub struct PagedCacheGroupConfig {
    #[pyo3(get, set)]
    pub group_id: String,
    #[pyo3(get, set)]
    rows_per_page: i32,
    #[pyo3(get, set)]
    entry_stride_tokens: i32,
    #[pyo3(get, set)]
    total_pages: i32,
    retention: i32,
    #[pyo3(get, set)]
    sliding_window_tokens: Option<i32>,
    family: i32,
}

#[pymethods]
impl PagedCacheGroupConfig {
    #[new]
    #[pyo3(signature = (group_id=None, rows_per_page=0, entry_stride_tokens=0, total_pages=0, retention=None, sliding_window_tokens=None, family=None))]
    fn new(
        group_id: Option<String>,
        rows_per_page: i32,
        entry_stride_tokens: i32,
        total_pages: i32,
        retention: Option<&Bound<'_, PyAny>>,
        sliding_window_tokens: Option<i32>,
        family: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self {
            group_id: group_id.unwrap_or_default(),
            rows_per_page,
            entry_stride_tokens,
            total_pages,
            retention: retention
                .map(|r| enum_value(r, "PagedCacheRetention"))
                .transpose()?
                .unwrap_or(0),
            sliding_window_tokens,
            family: family
                .map(|f| enum_value(f, "PagedCacheGroupFamily"))
                .transpose()?
                .unwrap_or(0),
        })
    }

    #[getter]
    fn retention(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        enum_member(py, "PagedCacheRetention", self.retention)
    }

    #[setter]
    fn set_retention(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.retention = enum_value(value, "PagedCacheRetention")?;
        Ok(())
    }

    #[getter]
    fn family(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        enum_member(py, "PagedCacheGroupFamily", self.family)
    }

    #[setter]
    fn set_family(&mut self, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.family = enum_value(value, "PagedCacheGroupFamily")?;
        Ok(())
    }

    fn raw_tokens_per_page(&self) -> i64 {
        i64::from(self.rows_per_page) * i64::from(self.entry_stride_tokens)
    }

    /// Raises `ValueError` with the reference's messages, in its order.
    fn validate(&self) -> PyResult<()> {
        let bad = |what: &str| {
            Err(PyValueError::new_err(format!(
                "PagedCacheGroupConfig: {what}"
            )))
        };
        if self.group_id.is_empty() {
            return bad("group_id must be non-empty");
        }
        if self.rows_per_page <= 0 {
            return bad("rows_per_page must be > 0");
        }
        if self.entry_stride_tokens <= 0 {
            return bad("entry_stride_tokens must be > 0");
        }
        if self.total_pages < 1 {
            return bad("total_pages must include the dummy page");
        }
        if self.retention == 1 && self.sliding_window_tokens.is_none_or(|w| w <= 0) {
            return bad("sliding_window_tokens must be > 0 for sliding groups");
        }
        Ok(())
    }
}

impl PagedCacheGroupConfig {
    /// kvtier's group (after [`Self::validate`]).
    fn to_kvtier(&self) -> PyResult<GroupSpec> {
        let retention = match (self.retention, self.sliding_window_tokens) {
            (1, Some(window)) => Retention::SlidingWindow {
                window: window.unsigned_abs(),
            },
            _ => Retention::FullHistory,
        };
        let spec = GroupSpec {
            id: self.group_id.clone(),
            rows_per_page: self.rows_per_page.unsigned_abs(),
            entry_stride_tokens: self.entry_stride_tokens.unsigned_abs(),
            total_pages: self.total_pages.unsigned_abs(),
            retention,
            role: if self.family == 1 {
                GroupRole::State
            } else {
                GroupRole::History
            },
        };
        spec.validate()
            .map_err(|e| PyValueError::new_err(format!("PagedCacheGroupConfig: {e}")))?;
        Ok(spec)
    }
}

/// The reference's counters class (exported, never returned by its scheduler at 0.1.0;
/// kvtier's `Scheduler.stats()` fills one).
#[pyclass(module = "tokenspeed_scheduler", get_all)]
#[derive(Debug, Clone, Default)]
pub struct SchedulerStats {
    pub total_batches: u64,
    pub mixed_batches: u64,
    pub retract_count: u64,
    pub abort_count: u64,
    pub schedule_latency_count: u64,
    pub schedule_latency_sum_us: u64,
    pub schedule_latency_max_us: u64,
    pub prefix_cache_hit_tokens: u64,
    pub prefix_cache_req_tokens: u64,
    pub pending_queue_size: u64,
    pub plan_queue_size: u64,
    pub event_queue_size: u64,
    pub active_requests: u64,
}

#[pymethods]
impl SchedulerStats {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}
