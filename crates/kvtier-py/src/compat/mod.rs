//! The reference module's API (`tokenspeed_scheduler` 0.1.0), over kvtier's scheduler.
//!
//! Names, fields, defaults, submodules and calling conventions follow the reference
//! (`tools/reference/api-0.1.0.md`); where kvtier behaves differently on purpose, the
//! difference is listed in `docs/python.md`. The classes live in the submodule
//! `kvtier._native.tokenspeed`, which the `tokenspeed_scheduler` package re-exports.

mod config;
mod events;
mod plan;
mod scheduler;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

/// The Python module holding the API's `enum.Enum` classes.
const ENUMS: &str = "kvtier._tokenspeed_enums";

/// One of the API's enum classes (`Role`, `PagedCacheRetention`, ...).
fn enum_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    let module = MODULE.get_or_try_init(py, || py.import(ENUMS).map(Bound::unbind))?;
    module.bind(py).getattr(name)
}

/// The member of enum `class` with `value`.
fn enum_member(py: Python<'_>, class: &str, value: i32) -> PyResult<Py<PyAny>> {
    Ok(enum_class(py, class)?.call1((value,))?.unbind())
}

/// The value of an enum member, or of a plain int (the reference's setters take both).
fn enum_value(value: &Bound<'_, PyAny>, class: &str) -> PyResult<i32> {
    let class_object = enum_class(value.py(), class)?;
    if value.is_instance(&class_object)? {
        return value.getattr("value")?.extract();
    }
    // An int must name a member.
    let raw: i32 = value.extract()?;
    class_object.call1((raw,))?;
    Ok(raw)
}

/// Registers `tokenspeed` (the API) and its submodules on the extension module.
pub fn register(parent: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = parent.py();
    let m = PyModule::new(py, "tokenspeed")?;
    m.add_class::<config::SchedulerConfig>()?;
    m.add_class::<config::RequestSpec>()?;
    m.add_class::<config::PrefixCacheAdjunctSpec>()?;
    m.add_class::<config::PagedCacheGroupConfig>()?;
    m.add_class::<config::SchedulerStats>()?;
    m.add_class::<scheduler::Scheduler>()?;
    m.add_class::<plan::ExecutionPlan>()?;
    m.add_class::<events::ExecutionEvent>()?;
    for name in [
        "DisaggregationMode",
        "PagedCacheRetention",
        "PagedCacheGroupFamily",
    ] {
        m.add(name, enum_class(py, name)?)?;
    }

    let forward = PyModule::new(py, "Forward")?;
    forward.add_class::<plan::FlatForwardOp>()?;
    m.add_submodule(&forward)?;

    let cache = PyModule::new(py, "Cache")?;
    cache.add_class::<plan::WriteBackOp>()?;
    cache.add_class::<plan::LoadBackOp>()?;
    cache.add_class::<plan::PrefetchOp>()?;
    cache.add_class::<plan::BackUpOp>()?;
    cache.add_class::<events::WriteBackDoneEvent>()?;
    cache.add_class::<events::PrefetchDoneEvent>()?;
    cache.add_class::<events::BackUpDoneEvent>()?;
    cache.add("CacheKind", enum_class(py, "CacheKind")?)?;
    m.add_submodule(&cache)?;

    let forward_event = PyModule::new(py, "ForwardEvent")?;
    forward_event.add_class::<events::ExtendResult>()?;
    forward_event.add_class::<events::Finish>()?;
    forward_event.add_class::<events::Abort>()?;
    forward_event.add_class::<events::UpdateReserveNumTokens>()?;
    m.add_submodule(&forward_event)?;

    let pd = PyModule::new(py, "PD")?;
    pd.add_class::<events::BootstrappedEvent>()?;
    pd.add_class::<events::FailedEvent>()?;
    pd.add_class::<events::SucceededEvent>()?;
    pd.add_class::<events::RemotePrefillDoneEvent>()?;
    m.add_submodule(&pd)?;

    let kv_event = PyModule::new(py, "KVEvent")?;
    kv_event.add_class::<events::BlockStored>()?;
    kv_event.add_class::<events::BlockRemoved>()?;
    m.add_submodule(&kv_event)?;

    parent.add_submodule(&m)?;
    Ok(())
}
