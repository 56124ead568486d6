//! `System`: kvtier's actors (Scheduler, Radix cache, Host allocator) on a thread of
//! their own, behind a blocking handle. Calls release the GIL while they wait.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier::{BlockingHandle, KvError, Runtime};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::RejectedError;
use super::config::{Config, Request};
use super::events::engine_event;
use super::plan::{KvEvent, Plan};
use crate::errors::kv_error;

/// A running actor system. Use it as a context manager, or call `shutdown()`.
#[pyclass(module = "kvtier")]
#[derive(Debug)]
pub struct System {
    handle: Option<BlockingHandle>,
    groups: Arc<[String]>,
}

/// The exception for a failed call: refused items as `RejectedError`, with each item's
/// index and message in `.rejected`.
fn call_error(py: Python<'_>, error: &KvError) -> PyErr {
    if let KvError::Batch(batch) = error {
        let rejected: Vec<(usize, String)> = batch
            .rejected
            .iter()
            .map(|r| (r.index, r.error.to_string()))
            .collect();
        let err = RejectedError::new_err(error.to_string());
        if let Err(e) = err.value(py).setattr("rejected", rejected) {
            return e;
        }
        return err;
    }
    kv_error(error)
}

impl System {
    fn handle(&self) -> PyResult<&BlockingHandle> {
        self.handle
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the system is shut down"))
    }

    /// Runs `call` on the handle without the GIL.
    fn call<T: Send>(
        &self,
        py: Python<'_>,
        call: impl FnOnce(&BlockingHandle) -> Result<T, KvError> + Send,
    ) -> PyResult<T> {
        let handle = self.handle()?;
        py.detach(|| call(handle)).map_err(|e| call_error(py, &e))
    }
}

#[pymethods]
impl System {
    /// Starts the actors. `runtime`: `"actix"` (actors on their own thread), or
    /// `"deterministic"` / `"direct"` (one thread, a fixed delivery order).
    #[new]
    #[pyo3(signature = (config, *, runtime="actix"))]
    fn new(py: Python<'_>, config: PyRef<'_, Config>, runtime: &str) -> PyResult<Self> {
        let runtime = match runtime {
            "actix" => Runtime::Actix,
            "deterministic" => Runtime::Deterministic,
            "direct" => Runtime::Direct,
            other => {
                return Err(PyValueError::new_err(format!(
                    "runtime must be \"actix\", \"deterministic\" or \"direct\", not {other:?}"
                )));
            }
        };
        let mut groups: Vec<String> = config
            .inner
            .paged
            .iter()
            .flat_map(|p| &p.groups)
            .map(|g| g.id.clone())
            .collect();
        groups.sort();
        let scheduler = config.inner.clone();
        let handle = py
            .detach(|| kvtier::System::builder(scheduler).runtime(runtime).start())
            .map_err(|e| call_error(py, &e))?;
        Ok(Self {
            handle: Some(BlockingHandle::new(handle)),
            groups: groups.into(),
        })
    }

    /// Queues requests (`Request`, or `(id, tokens)` pairs). Valid ones are queued even
    /// when others are refused (`RejectedError`).
    fn submit(&self, py: Python<'_>, requests: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let specs = requests
            .iter()
            .map(|r| match r.cast::<Request>() {
                Ok(r) => Ok(r.get().spec()),
                Err(_) => {
                    let (id, tokens): (String, Vec<i32>) = r.extract()?;
                    Ok(kvtier_types::RequestSpec::new(id, tokens))
                }
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.call(py, |h| h.submit(specs))
    }

    /// The next step's plan.
    fn next_plan(&self, py: Python<'_>) -> PyResult<Plan> {
        let plan = self.call(py, BlockingHandle::next_plan)?;
        Ok(Plan::new(plan, Arc::clone(&self.groups)))
    }

    /// Applies the engine's events in order; refused ones raise `RejectedError` after
    /// the others are applied.
    fn advance(&self, py: Python<'_>, events: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let events = events
            .iter()
            .map(engine_event)
            .collect::<PyResult<Vec<_>>>()?;
        self.call(py, |h| h.advance(events))
    }

    /// Aborts one request, whatever its state.
    fn abort(&self, py: Python<'_>, request_id: &str) -> PyResult<()> {
        let id = kvtier_types::RequestId::from(request_id);
        self.call(py, |h| h.abort(id))
    }

    /// KV events of every tier since the last call (with `enable_kv_cache_events`).
    fn kv_events(&self, py: Python<'_>) -> PyResult<Vec<KvEvent>> {
        let events = self.call(py, BlockingHandle::take_kv_events)?;
        Ok(events.into_iter().map(KvEvent::from).collect())
    }

    /// Counters and gauges by name.
    fn stats(&self, py: Python<'_>) -> PyResult<BTreeMap<String, u64>> {
        let stats = self.call(py, BlockingHandle::stats)?;
        let s = &stats.scheduler;
        let mut out = BTreeMap::from([
            ("waiting".to_owned(), s.waiting as u64),
            ("prefilling".to_owned(), s.prefilling as u64),
            ("decoding".to_owned(), s.decoding as u64),
            ("retracted".to_owned(), s.retracted as u64),
            (
                "available_device_pages".to_owned(),
                u64::from(s.available_device_pages),
            ),
            (
                "available_host_pages".to_owned(),
                u64::from(s.available_host_pages),
            ),
            ("cached_device_pages".to_owned(), s.cached_device_pages),
            ("cached_host_pages".to_owned(), s.cached_host_pages),
            ("evicted_device_pages".to_owned(), s.evicted_device_pages),
            ("evicted_host_pages".to_owned(), s.evicted_host_pages),
            ("plans".to_owned(), s.plans),
            ("retractions".to_owned(), s.retractions),
            ("recomputes".to_owned(), s.recomputes),
            ("scheduler_aborts".to_owned(), s.scheduler_aborts),
            ("stale_events".to_owned(), s.stale_events),
            ("failed_write_backs".to_owned(), s.failed_write_backs),
            ("failed_load_backs".to_owned(), s.failed_load_backs),
            ("prompt_tokens".to_owned(), s.prompt_query_tokens),
            ("hit_tokens".to_owned(), s.hit_tokens),
            ("hit_tokens_host".to_owned(), s.hit_tokens_host),
            ("hit_tokens_l3".to_owned(), s.hit_tokens_l3),
        ]);
        for (reason, tokens) in kvtier_fsm::LOST_HIT_REASONS.iter().zip(s.lost_hit_tokens) {
            out.insert(format!("lost_hit_tokens.{reason}"), tokens);
        }
        Ok(out)
    }

    /// The metrics in Prometheus' text format (the families `kvtier replay
    /// --metrics-addr` serves).
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let stats = self.call(py, BlockingHandle::stats)?;
        Ok(kvtier::metrics::prometheus_text(&stats))
    }

    /// Stops the actors; returns what was still held (`live_requests`, `ops_in_flight`,
    /// `held_pages`) and whether every page came home (`conservation_ok`).
    fn shutdown(&mut self, py: Python<'_>) -> PyResult<BTreeMap<&'static str, Py<PyAny>>> {
        let handle = self
            .handle
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("the system is shut down"))?;
        let report = py
            .detach(|| handle.shutdown())
            .map_err(|e| call_error(py, &e))?;
        let live: Vec<String> = report
            .live_requests
            .iter()
            .map(|id| id.as_str().to_owned())
            .collect();
        Ok(BTreeMap::from([
            ("live_requests", live.into_pyobject(py)?.into_any().unbind()),
            (
                "ops_in_flight",
                report.ops_in_flight.into_pyobject(py)?.into_any().unbind(),
            ),
            (
                "held_pages",
                report
                    .held_pages
                    .to_vec()
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            ),
            (
                "conservation_ok",
                pyo3::types::PyBool::new(py, report.conservation.is_ok())
                    .to_owned()
                    .into_any()
                    .unbind(),
            ),
            (
                "leased_host_pages",
                report
                    .host
                    .leased_pages
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            ),
        ]))
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        py: Python<'_>,
        _exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.handle.is_some() {
            self.shutdown(py)?;
        }
        Ok(false)
    }
}

impl Drop for System {
    fn drop(&mut self) {
        // A system dropped without shutdown still stops its actors.
        if let Some(handle) = self.handle.take() {
            let _ = handle.shutdown();
        }
    }
}
