//! The trace tools: read a request trace, replay one through kvtier with the oracle
//! engine, run a benchmark workload. Reports come back as dicts (their JSON fields).

use std::sync::Arc;

use kvtier_sim::scenario::{L3Store, ScenarioOptions, TraceWorkload, run_scenario};
use kvtier_sim::trace::{CONVERSATION_TRACE, TraceSlice, parse_trace, read_trace as read_file};
use kvtier_sim::{Path, WorkloadKind, WorkloadOptions, run_workload as run};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use serde::Serialize;

/// One request of a trace (Mooncake's format).
#[pyclass(module = "kvtier", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct TraceRequest {
    /// Arrival, ms from the trace's start.
    timestamp_ms: u64,
    input_length: u32,
    output_length: u32,
    /// One id per 512-token block of the prompt.
    hash_ids: Vec<u64>,
}

#[pymethods]
impl TraceRequest {
    fn __repr__(&self) -> String {
        format!(
            "TraceRequest(timestamp_ms={}, input_length={}, output_length={}, blocks={})",
            self.timestamp_ms,
            self.input_length,
            self.output_length,
            self.hash_ids.len()
        )
    }
}

fn load(path: Option<&str>, limit: Option<usize>) -> PyResult<TraceWorkload> {
    let slice = TraceSlice {
        window_ms: None,
        limit,
    };
    let (name, requests) = match path {
        Some(path) => {
            let path = std::path::Path::new(path);
            let name = path
                .file_stem()
                .map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned());
            (name, read_file(path, &slice))
        }
        None => (
            "conversation_trace".to_owned(),
            parse_trace(CONVERSATION_TRACE, &slice),
        ),
    };
    let requests = requests.map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(TraceWorkload {
        name,
        requests,
        time_scale: 1.0,
    })
}

/// The requests of a trace file (JSON Lines), or of the embedded Mooncake conversation
/// trace when `path` is None; at most `limit`.
#[pyfunction]
#[pyo3(signature = (path=None, *, limit=None))]
pub fn read_trace(path: Option<&str>, limit: Option<usize>) -> PyResult<Vec<TraceRequest>> {
    Ok(load(path, limit)?
        .requests
        .into_iter()
        .map(|r| TraceRequest {
            timestamp_ms: r.timestamp_ms,
            input_length: r.input_length,
            output_length: r.output_length,
            hash_ids: r.hash_ids,
        })
        .collect())
}

/// A report as a dict, through its JSON form.
fn to_dict(py: Python<'_>, report: &impl Serialize) -> PyResult<Py<PyAny>> {
    let json = serde_json::to_string(report).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(py.import("json")?.call_method1("loads", (json,))?.unbind())
}

fn path_named(runtime: &str) -> PyResult<Path> {
    match runtime {
        "direct" => Ok(Path::Core),
        "actix" => Ok(Path::Actors),
        "deterministic" => Ok(Path::Deterministic),
        other => Err(PyValueError::new_err(format!(
            "runtime must be \"direct\", \"actix\" or \"deterministic\", not {other:?}"
        ))),
    }
}

/// Replays a trace (`kvtier replay --trace`): every request through kvtier and the
/// oracle engine on a virtual clock, every KV read checked. Returns the report
/// (hits by tier, TTFT, copies, integrity errors).
#[pyfunction]
#[pyo3(signature = (trace=None, *, limit=2000, device_pages=None, host_pages=None, l3="local", runtime="direct"))]
pub fn replay(
    py: Python<'_>,
    trace: Option<&str>,
    limit: Option<usize>,
    device_pages: Option<u32>,
    host_pages: Option<u32>,
    l3: &str,
    runtime: &str,
) -> PyResult<Py<PyAny>> {
    let l3 = match l3 {
        "off" => L3Store::Off,
        "local" => L3Store::Local,
        other => {
            return Err(PyValueError::new_err(format!(
                "l3 must be \"off\" or \"local\" here, not {other:?}"
            )));
        }
    };
    let workload = load(trace, limit)?;
    let options = ScenarioOptions {
        path: path_named(runtime)?,
        l3,
        device_pages,
        host_pages,
        ..ScenarioOptions::shared_trace(Arc::new(workload))
    };
    let report = py
        .detach(|| run_scenario(&options))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    to_dict(py, &report)
}

/// Runs a benchmark workload (`"w1"`, `"w2"`, `"w3"`; design/WORKLOADS.md) and returns
/// its report, counters included.
#[pyfunction]
#[pyo3(signature = (name, *, requests=None, runtime="direct"))]
pub fn run_workload(
    py: Python<'_>,
    name: &str,
    requests: Option<usize>,
    runtime: &str,
) -> PyResult<Py<PyAny>> {
    let kind = match name {
        "w1" => WorkloadKind::W1,
        "w2" => WorkloadKind::W2,
        "w3" => WorkloadKind::W3,
        other => {
            return Err(PyValueError::new_err(format!(
                "workload must be \"w1\", \"w2\" or \"w3\", not {other:?}"
            )));
        }
    };
    let options = WorkloadOptions {
        requests,
        path: path_named(runtime)?,
        ..WorkloadOptions::new(kind)
    };
    let report = py
        .detach(|| run(&options))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    to_dict(py, &report)
}
