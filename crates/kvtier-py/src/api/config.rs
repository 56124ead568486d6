//! `Config`, its hybrid parts (`Mamba`, `Group`), and `Request`.

use kvtier_types::{GroupRole, GroupSpec, MambaSettings, PagedSettings, Policy, Role};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The scheduler's configuration, validated when built.
#[pyclass(module = "kvtier", frozen)]
#[derive(Debug, Clone)]
pub struct Config {
    pub inner: kvtier_types::SchedulerConfig,
}

#[pymethods]
impl Config {
    #[new]
    #[pyo3(signature = (
        *, device_pages, page_size=64, host_pages=0, max_scheduled_tokens=8192,
        max_batch_size=160, decode_input_tokens=1, disable_l2_cache=None,
        enable_l3_storage=false, prefetch_threshold=4, enable_kv_cache_events=false,
        enable_mixed_prefill_decode=false, disable_prefix_cache=false,
        publish_prefix_mid_flight=true, track_lost_hits=false, policy="kvtier",
        mamba=None, groups=None, required_groups=None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        device_pages: u32,
        page_size: u32,
        host_pages: u32,
        max_scheduled_tokens: u32,
        max_batch_size: u32,
        decode_input_tokens: u32,
        disable_l2_cache: Option<bool>,
        enable_l3_storage: bool,
        prefetch_threshold: u32,
        enable_kv_cache_events: bool,
        enable_mixed_prefill_decode: bool,
        disable_prefix_cache: bool,
        publish_prefix_mid_flight: bool,
        track_lost_hits: bool,
        policy: &str,
        mamba: Option<PyRef<'_, Mamba>>,
        groups: Option<Vec<PyRef<'_, Group>>>,
        required_groups: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let policy = match policy {
            "kvtier" => Policy::Default,
            "reference" => Policy::Reference,
            "reference-wheel" => Policy::ReferenceWheel,
            other => {
                return Err(PyValueError::new_err(format!(
                    "policy must be \"kvtier\", \"reference\" or \"reference-wheel\", not {other:?}"
                )));
            }
        };
        let paged = groups.map(|groups| PagedSettings {
            groups: groups.iter().map(|g| g.inner.clone()).collect(),
            required: required_groups.unwrap_or_default(),
        });
        let inner = kvtier_types::SchedulerConfig {
            page_size,
            device_pages,
            host_pages,
            max_scheduled_tokens,
            max_batch_size,
            decode_input_tokens,
            // No host pool: no L2 (unless asked otherwise, which validation refuses).
            disable_l2_cache: disable_l2_cache.unwrap_or(host_pages < 2),
            enable_l3_storage,
            prefetch_threshold,
            enable_kv_cache_events,
            enable_mixed_prefill_decode,
            role: Role::Fused,
            disable_prefix_cache,
            publish_prefix_mid_flight,
            track_lost_hits,
            policy,
            mamba: mamba.map(|m| m.inner),
            paged,
            ..kvtier_types::SchedulerConfig::default()
        };
        inner
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    #[getter]
    fn page_size(&self) -> u32 {
        self.inner.page_size
    }

    #[getter]
    fn device_pages(&self) -> u32 {
        self.inner.device_pages
    }

    #[getter]
    fn host_pages(&self) -> u32 {
        self.inner.host_pages
    }

    #[getter]
    fn max_scheduled_tokens(&self) -> u32 {
        self.inner.max_scheduled_tokens
    }

    #[getter]
    fn max_batch_size(&self) -> u32 {
        self.inner.max_batch_size
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// The recurrent-state side of a hybrid (Mamba) model.
#[pyclass(module = "kvtier", frozen)]
#[derive(Debug, Clone)]
pub struct Mamba {
    inner: MambaSettings,
}

#[pymethods]
impl Mamba {
    #[new]
    #[pyo3(signature = (*, device_slots=64, host_slots=0, chunk=64))]
    fn new(device_slots: u32, host_slots: u32, chunk: u32) -> Self {
        Self {
            inner: MambaSettings {
                device_slots,
                host_slots,
                chunk,
            },
        }
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// One paged-cache group of a window or compressed-state model.
#[pyclass(module = "kvtier", frozen)]
#[derive(Debug, Clone)]
pub struct Group {
    inner: GroupSpec,
}

#[pymethods]
impl Group {
    #[new]
    #[pyo3(signature = (id, *, rows_per_page, total_pages, entry_stride_tokens=1, window=None, state=false))]
    fn new(
        id: &str,
        rows_per_page: u32,
        total_pages: u32,
        entry_stride_tokens: u32,
        window: Option<u32>,
        state: bool,
    ) -> PyResult<Self> {
        let role = if state {
            GroupRole::State
        } else {
            GroupRole::History
        };
        let inner = match window {
            Some(w) => {
                GroupSpec::sliding(id, rows_per_page, entry_stride_tokens, total_pages, w, role)
            }
            None if state => {
                return Err(PyValueError::new_err(format!(
                    "group `{id}`: a state group needs a window"
                )));
            }
            None => GroupSpec::full_history(id, rows_per_page, entry_stride_tokens, total_pages),
        };
        inner
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(Self { inner })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// A request: its id and prompt.
#[pyclass(module = "kvtier", frozen, eq)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    #[pyo3(get)]
    pub id: String,
    #[pyo3(get)]
    pub tokens: Vec<i32>,
}

#[pymethods]
impl Request {
    #[new]
    fn new(id: String, tokens: Vec<i32>) -> Self {
        Self { id, tokens }
    }

    fn __repr__(&self) -> String {
        format!(
            "Request(id={:?}, tokens=<{} tokens>)",
            self.id,
            self.tokens.len()
        )
    }
}

impl Request {
    /// kvtier's request.
    pub fn spec(&self) -> kvtier_types::RequestSpec {
        kvtier_types::RequestSpec::new(self.id.as_str(), self.tokens.clone())
    }
}
