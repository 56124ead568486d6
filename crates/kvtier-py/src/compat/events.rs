//! `ExecutionEvent` and the events it carries (forward, cache and PD events), and the KV
//! events `drain_kv_events` returns.

use kvtier_types::{EngineEvent, KvEvent, Medium};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// A step's events for `Scheduler.advance`, applied in the order they were added.
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug, Default)]
pub struct ExecutionEvent {
    pub events: Vec<EngineEvent>,
}

#[pymethods]
impl ExecutionEvent {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Copies `event` in; returns this same object, so calls chain.
    fn add_event<'py>(
        mut slf: PyRefMut<'py, Self>,
        event: &Bound<'py, PyAny>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        // `PD.FailedEvent` does nothing in the reference.
        if !event.is_instance_of::<FailedEvent>() {
            let event = engine_event(event)?;
            slf.events.push(event);
        }
        Ok(slf)
    }
}

/// The kvtier event for one of the API's event objects.
fn engine_event(event: &Bound<'_, PyAny>) -> PyResult<EngineEvent> {
    if let Ok(e) = event.cast::<ExtendResult>() {
        let e = e.borrow();
        return Ok(EngineEvent::ExtendResult {
            request_id: e.request_id.as_str().into(),
            tokens: e.tokens.clone(),
        });
    }
    if let Ok(e) = event.cast::<Finish>() {
        return Ok(EngineEvent::Finish {
            request_id: e.borrow().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<Abort>() {
        return Ok(EngineEvent::Abort {
            request_id: e.borrow().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<UpdateReserveNumTokens>() {
        let e = e.borrow();
        return Ok(EngineEvent::UpdateReserve {
            request_id: e.request_id.as_str().into(),
            tokens: e
                .reserve_num_tokens_in_next_schedule_event
                .max(0)
                .unsigned_abs(),
        });
    }
    if let Ok(e) = event.cast::<WriteBackDoneEvent>() {
        let e = e.borrow();
        return Ok(EngineEvent::WriteBackDone {
            op_id: e.op_id,
            success: e.success,
        });
    }
    if let Ok(e) = event.cast::<PrefetchDoneEvent>() {
        let e = e.borrow();
        return Ok(EngineEvent::PrefetchDone {
            op_id: e.op_id,
            request_id: e.request_id.as_str().into(),
            success: e.success,
            completed_pages: e.completed_pages.max(0).unsigned_abs(),
        });
    }
    if let Ok(e) = event.cast::<BackUpDoneEvent>() {
        let e = e.borrow();
        return Ok(EngineEvent::BackupDone {
            op_id: e.op_id,
            success: e.success,
        });
    }
    if let Ok(e) = event.cast::<BootstrappedEvent>() {
        return Ok(EngineEvent::Bootstrapped {
            request_id: e.borrow().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<SucceededEvent>() {
        // The reference applies the request's finish.
        return Ok(EngineEvent::Finish {
            request_id: e.borrow().request_id.as_str().into(),
        });
    }
    if let Ok(e) = event.cast::<RemotePrefillDoneEvent>() {
        let e = e.borrow();
        return Ok(EngineEvent::RemotePrefillDone {
            request_id: e.request_id.as_str().into(),
            token: e.bootstrap_token,
        });
    }
    Err(PyTypeError::new_err(format!(
        "add_event(): incompatible function arguments: {} is not a forward, cache or PD event",
        event.get_type().name()?
    )))
}

/// Tokens a request accepted this step (the first after its prompt, or decode results).
#[pyclass(module = "tokenspeed_scheduler.ForwardEvent")]
#[derive(Debug, Default)]
pub struct ExtendResult {
    #[pyo3(get, set)]
    request_id: String,
    #[pyo3(get, set)]
    tokens: Vec<i32>,
}

#[pymethods]
impl ExtendResult {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// The request is done.
#[pyclass(module = "tokenspeed_scheduler.ForwardEvent")]
#[derive(Debug, Default)]
pub struct Finish {
    #[pyo3(get, set)]
    request_id: String,
}

#[pymethods]
impl Finish {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// The client gave up on the request.
#[pyclass(module = "tokenspeed_scheduler.ForwardEvent")]
#[derive(Debug, Default)]
pub struct Abort {
    #[pyo3(get, set)]
    request_id: String,
}

#[pymethods]
impl Abort {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// Token slots the request's next decode reserves (speculative decoding).
#[pyclass(module = "tokenspeed_scheduler.ForwardEvent")]
#[derive(Debug, Default)]
pub struct UpdateReserveNumTokens {
    #[pyo3(get, set)]
    request_id: String,
    #[pyo3(get, set)]
    reserve_num_tokens_in_next_schedule_event: i32,
}

#[pymethods]
impl UpdateReserveNumTokens {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// A write-back op's copies ended. kvtier reads `success` (the reference ignores it):
/// a failed copy leaves the device copy authoritative and the host pages unused.
#[pyclass(module = "tokenspeed_scheduler.Cache")]
#[derive(Debug, Default)]
pub struct WriteBackDoneEvent {
    #[pyo3(get, set)]
    op_id: u32,
    #[pyo3(get, set)]
    success: bool,
}

#[pymethods]
impl WriteBackDoneEvent {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// An L3 prefetch ended.
#[pyclass(module = "tokenspeed_scheduler.Cache")]
#[derive(Debug, Default)]
pub struct PrefetchDoneEvent {
    #[pyo3(get, set)]
    success: bool,
    #[pyo3(get, set)]
    op_id: u32,
    #[pyo3(get, set)]
    request_id: String,
    #[pyo3(get, set)]
    completed_pages: i32,
}

#[pymethods]
impl PrefetchDoneEvent {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// kvtier's addition: a `Cache.BackUpOp` ended (the reference has no such event, as it
/// never emits backups). A failed backup is only a future L3 miss.
#[pyclass(module = "tokenspeed_scheduler.Cache")]
#[derive(Debug, Default)]
pub struct BackUpDoneEvent {
    #[pyo3(get, set)]
    op_id: u32,
    #[pyo3(get, set)]
    success: bool,
}

#[pymethods]
impl BackUpDoneEvent {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

macro_rules! pd_event {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[pyclass(module = "tokenspeed_scheduler.PD")]
        #[derive(Debug)]
        pub struct $name {
            #[pyo3(get)]
            request_id: String,
        }

        #[pymethods]
        impl $name {
            #[new]
            fn new(request_id: String) -> Self {
                Self { request_id }
            }
        }
    };
}

pd_event!(BootstrappedEvent, "Disaggregation: the peer is ready.");
pd_event!(
    FailedEvent,
    "Disaggregation: the transfer failed (no effect)."
);
pd_event!(
    SucceededEvent,
    "Disaggregation: the request is done (a finish)."
);

/// Disaggregation: the remote prefill finished with this first token.
#[pyclass(module = "tokenspeed_scheduler.PD")]
#[derive(Debug)]
pub struct RemotePrefillDoneEvent {
    #[pyo3(get)]
    request_id: String,
    #[pyo3(get, set)]
    bootstrap_token: i32,
}

#[pymethods]
impl RemotePrefillDoneEvent {
    #[new]
    fn new(request_id: String, bootstrap_token: i32) -> Self {
        Self {
            request_id,
            bootstrap_token,
        }
    }
}

/// A device page became resident (vLLM's `BlockStored`, one page per event).
#[pyclass(module = "tokenspeed_scheduler.KVEvent", get_all)]
#[derive(Debug)]
pub struct BlockStored {
    kind: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<i32>,
    block_size: u32,
}

/// Device pages left the cache.
#[pyclass(module = "tokenspeed_scheduler.KVEvent", get_all)]
#[derive(Debug)]
pub struct BlockRemoved {
    kind: &'static str,
    block_hashes: Vec<u64>,
}

/// The Python object for a device KV event; `None` for the other tiers' events, which
/// the reference does not publish.
pub fn kv_event(py: Python<'_>, event: KvEvent) -> PyResult<Option<Py<PyAny>>> {
    Ok(match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium: Medium::Device,
        } => Some(
            Py::new(
                py,
                BlockStored {
                    kind: "BlockStored",
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                },
            )?
            .into_any(),
        ),
        KvEvent::BlockRemoved {
            block_hashes,
            medium: Medium::Device,
        } => Some(
            Py::new(
                py,
                BlockRemoved {
                    kind: "BlockRemoved",
                    block_hashes,
                },
            )?
            .into_any(),
        ),
        _ => None,
    })
}
