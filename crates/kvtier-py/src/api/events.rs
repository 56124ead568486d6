//! What the engine reports back: one class per event, each turned into kvtier's
//! `EngineEvent` on the way in.

use kvtier_types::EngineEvent;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// Tokens whose KV is now stable history: the first sampled token after a request's
/// last prefill chunk, then each decode step's accepted tokens.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendResult {
    request_id: String,
    tokens: Vec<i32>,
}

#[pymethods]
impl ExtendResult {
    #[new]
    fn new(request_id: String, tokens: Vec<i32>) -> Self {
        Self { request_id, tokens }
    }

    fn __repr__(&self) -> String {
        format!("ExtendResult({:?}, {:?})", self.request_id, self.tokens)
    }
}

/// The request is done: its pages are published and written back.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finish {
    request_id: String,
}

#[pymethods]
impl Finish {
    #[new]
    fn new(request_id: String) -> Self {
        Self { request_id }
    }

    fn __repr__(&self) -> String {
        format!("Finish({:?})", self.request_id)
    }
}

/// The client gave up on the request: everything it holds is released.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Abort {
    request_id: String,
}

#[pymethods]
impl Abort {
    #[new]
    fn new(request_id: String) -> Self {
        Self { request_id }
    }

    fn __repr__(&self) -> String {
        format!("Abort({:?})", self.request_id)
    }
}

/// Token slots the request's next decode reserves (speculative decoding).
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpdateReserve {
    request_id: String,
    tokens: u32,
}

#[pymethods]
impl UpdateReserve {
    #[new]
    fn new(request_id: String, tokens: u32) -> Self {
        Self { request_id, tokens }
    }

    fn __repr__(&self) -> String {
        format!("UpdateReserve({:?}, {})", self.request_id, self.tokens)
    }
}

/// A write-back's copies ended; a failed one leaves the device copy authoritative.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteBackDone {
    op_id: u32,
    success: bool,
}

#[pymethods]
impl WriteBackDone {
    #[new]
    #[pyo3(signature = (op_id, success=true))]
    fn new(op_id: u32, success: bool) -> Self {
        Self { op_id, success }
    }

    fn __repr__(&self) -> String {
        format!(
            "WriteBackDone({}, success={})",
            self.op_id,
            py_bool(self.success)
        )
    }
}

/// A load-back's copy failed: the rows reading its pages are void and their requests
/// run again as cache misses. Report it in the `advance` after its plan.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBackFailed {
    op_id: u32,
}

#[pymethods]
impl LoadBackFailed {
    #[new]
    fn new(op_id: u32) -> Self {
        Self { op_id }
    }

    fn __repr__(&self) -> String {
        format!("LoadBackFailed({})", self.op_id)
    }
}

/// An L3 prefetch ended, with its leading `completed_pages` written.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchDone {
    op_id: u32,
    request_id: String,
    success: bool,
    completed_pages: u32,
}

#[pymethods]
impl PrefetchDone {
    #[new]
    fn new(op_id: u32, request_id: String, success: bool, completed_pages: u32) -> Self {
        Self {
            op_id,
            request_id,
            success,
            completed_pages,
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "PrefetchDone({}, {:?}, success={}, completed_pages={})",
            self.op_id,
            self.request_id,
            py_bool(self.success),
            self.completed_pages
        )
    }
}

/// An L3 backup ended.
#[pyclass(module = "kvtier", frozen, eq, get_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupDone {
    op_id: u32,
    success: bool,
}

#[pymethods]
impl BackupDone {
    #[new]
    #[pyo3(signature = (op_id, success=true))]
    fn new(op_id: u32, success: bool) -> Self {
        Self { op_id, success }
    }

    fn __repr__(&self) -> String {
        format!(
            "BackupDone({}, success={})",
            self.op_id,
            py_bool(self.success)
        )
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// kvtier's event for one of these objects.
pub fn engine_event(event: &Bound<'_, PyAny>) -> PyResult<EngineEvent> {
    if let Ok(e) = event.cast::<ExtendResult>() {
        let e = e.get();
        return Ok(EngineEvent::ExtendResult {
            request_id: e.request_id.as_str().into(),
            tokens: e.tokens.clone(),
        });
    }
    if let Ok(e) = event.cast::<Finish>() {
        return Ok(EngineEvent::Finish {
            request_id: e.get().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<Abort>() {
        return Ok(EngineEvent::Abort {
            request_id: e.get().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<UpdateReserve>() {
        let e = e.get();
        return Ok(EngineEvent::UpdateReserve {
            request_id: e.request_id.as_str().into(),
            tokens: e.tokens,
        });
    }
    if let Ok(e) = event.cast::<WriteBackDone>() {
        let e = e.get();
        return Ok(EngineEvent::WriteBackDone {
            op_id: e.op_id,
            success: e.success,
        });
    }
    if let Ok(e) = event.cast::<LoadBackFailed>() {
        return Ok(EngineEvent::LoadBackFailed {
            op_id: e.get().op_id,
        });
    }
    if let Ok(e) = event.cast::<PrefetchDone>() {
        let e = e.get();
        return Ok(EngineEvent::PrefetchDone {
            op_id: e.op_id,
            request_id: e.request_id.as_str().into(),
            success: e.success,
            completed_pages: e.completed_pages,
        });
    }
    if let Ok(e) = event.cast::<BackupDone>() {
        let e = e.get();
        return Ok(EngineEvent::BackupDone {
            op_id: e.op_id,
            success: e.success,
        });
    }
    Err(PyTypeError::new_err(format!(
        "not a kvtier event: {}",
        event.get_type().name()?
    )))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ExtendResult>()?;
    m.add_class::<Finish>()?;
    m.add_class::<Abort>()?;
    m.add_class::<UpdateReserve>()?;
    m.add_class::<WriteBackDone>()?;
    m.add_class::<LoadBackFailed>()?;
    m.add_class::<PrefetchDone>()?;
    m.add_class::<BackupDone>()?;
    Ok(())
}
